"""Agents by provider name (the ``provider`` key of an ``[agents.<alias>]`` section).

``echo`` (offline), ``openai`` / ``anthropic`` (zeroclaw's own agent loop on a
model API) and ``acp`` (an external ACP agent process). :func:`create_agent` runs
on the worker's IO thread when a session opens; :func:`agent_config_problem` on the
host, when the config is read and at ``session/new``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from actors.worker.agents.acp import AcpAgent, agent_processes, stop_agent_processes
from actors.worker.agents.base import (
    Agent,
    AgentFailure,
    SessionSetup,
    ToolCallOutcome,
    TurnContext,
    TurnResult,
    TurnStop,
)
from actors.worker.agents.echo import EchoAgent
from actors.worker.agents.llm.anthropic_messages import AnthropicAgent
from actors.worker.agents.llm.openai_chat import OpenAIAgent

__all__ = [
    "AGENTS",
    "Agent",
    "AgentFailure",
    "SessionSetup",
    "ToolCallOutcome",
    "TurnContext",
    "TurnResult",
    "TurnStop",
    "UnknownProvider",
    "agent_config_problem",
    "agent_processes",
    "create_agent",
    "stop_agent_processes",
]

AGENTS: dict[str, type[Agent]] = {
    cls.provider: cls for cls in (EchoAgent, OpenAIAgent, AnthropicAgent, AcpAgent)
}


class UnknownProvider(ValueError):
    """The agent config names a provider no agent class implements."""


def _agent_class(config: Mapping[str, Any]) -> type[Agent]:
    provider = config.get("provider", "echo")
    cls = AGENTS.get(provider) if isinstance(provider, str) else None
    if cls is None:
        known = ", ".join(sorted(AGENTS))
        raise UnknownProvider(f"unknown agent provider {provider!r} (known: {known})")
    return cls


def agent_config_problem(
    config: Mapping[str, Any], env: Mapping[str, str] | None = None
) -> str | None:
    """Why an agent config cannot work (unknown provider, missing key variable, …), or None."""
    try:
        cls = _agent_class(config)
    except UnknownProvider as exc:
        return str(exc)
    return cls.config_problem(config, os.environ if env is None else env)


def create_agent(config: dict[str, Any]) -> Agent:
    """A new agent for one session; ``provider`` defaults to ``echo``.

    Raises :class:`UnknownProvider`, or ValueError when the config cannot work.
    """
    cls = _agent_class(config)
    problem = cls.config_problem(config, os.environ)
    if problem is not None:
        raise ValueError(problem)
    return cls(config)
