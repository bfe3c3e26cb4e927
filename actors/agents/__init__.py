"""Agents by provider name (the ``provider`` key of an ``[agents.<alias>]`` section).

``echo`` (offline) and ``acp`` (an external ACP agent process). :func:`create_agent`
is called on the worker's IO thread when a session opens;
:func:`agent_config_problem` on the host, when the config is read and at
``session/new``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from actors.agents.acp import AcpAgent, stop_agent_processes
from actors.agents.base import (
    Agent,
    AgentFailure,
    SessionSetup,
    ToolCallOutcome,
    TurnContext,
    TurnResult,
)
from actors.agents.echo import EchoAgent

__all__ = [
    "AGENTS",
    "Agent",
    "AgentFailure",
    "SessionSetup",
    "ToolCallOutcome",
    "TurnContext",
    "TurnResult",
    "UnknownProvider",
    "agent_config_problem",
    "create_agent",
    "stop_agent_processes",
]

AGENTS: dict[str, type[Agent]] = {cls.provider: cls for cls in (EchoAgent, AcpAgent)}


class UnknownProvider(ValueError):
    """The agent config names a provider no agent class implements."""


def _agent_class(provider: Any) -> type[Agent]:
    cls = AGENTS.get(provider) if isinstance(provider, str) else None
    if cls is None:
        known = ", ".join(sorted(AGENTS))
        raise UnknownProvider(f"unknown agent provider {provider!r} (known: {known})")
    return cls


def agent_config_problem(config: Mapping[str, Any]) -> str | None:
    """Why an agent config cannot work (unknown provider, missing command...), or None."""
    try:
        cls = _agent_class(config.get("provider", "echo"))
    except UnknownProvider as exc:
        return str(exc)
    return cls.config_problem(config)


def create_agent(config: dict[str, Any]) -> Agent:
    """A new agent for one session; ``provider`` defaults to ``echo``."""
    return _agent_class(config.get("provider", "echo"))(config)
