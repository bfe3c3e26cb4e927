"""Agents by provider name (the ``provider`` key of an ``[agents.<alias>]`` section).

Only ``echo`` exists yet; ``openai`` and ``acp`` will register here. Called on
the worker's IO thread when a session opens.
"""

from __future__ import annotations

from typing import Any

from actors.agents.base import Agent, AgentFailure, ToolCallOutcome, TurnContext
from actors.agents.echo import EchoAgent

__all__ = [
    "AGENTS",
    "Agent",
    "AgentFailure",
    "ToolCallOutcome",
    "TurnContext",
    "UnknownProvider",
    "create_agent",
]

AGENTS: dict[str, type[Agent]] = {EchoAgent.provider: EchoAgent}


class UnknownProvider(ValueError):
    """The agent config names a provider no agent class implements."""


def create_agent(config: dict[str, Any]) -> Agent:
    """A new agent for one session; ``provider`` defaults to ``echo``."""
    provider = config.get("provider", "echo")
    cls = AGENTS.get(provider) if isinstance(provider, str) else None
    if cls is None:
        known = ", ".join(sorted(AGENTS))
        raise UnknownProvider(f"unknown agent provider {provider!r} (known: {known})")
    return cls(config)
