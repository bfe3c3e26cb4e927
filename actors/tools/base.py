"""What every tool is: a name, an ACP kind, whether it mutates, and a ``run``.

Tools run on the session actor's thread, one call at a time per session. A
tool reports a problem the agent should see by raising :class:`ToolError` (the
call fails, the turn goes on), and watches ``ToolEnv.cancelled`` so a
cancelled turn stops it promptly.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from actors.tools.paths import PathPolicy

__all__ = ["Tool", "ToolEnv", "ToolError", "ToolResult", "require_str"]


class ToolError(Exception):
    """The tool call failed; the message is shown to the agent and the client."""


@dataclass(frozen=True, slots=True)
class ToolEnv:
    """What a tool may use: the session's path policy, the turn's cancel flag, and the
    variables the agent's configuration (``[agents.NAME] env``) gives its commands."""

    paths: PathPolicy
    cancelled: threading.Event
    agent_env: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ToolResult:
    """A finished call: ``text`` for people and models, ``raw_output`` as structured data.

    ``ok`` False marks a call that ran but did not succeed (a non-zero exit).
    """

    text: str
    raw_output: Any
    ok: bool = True


class Tool(ABC):
    """One tool. Subclasses set the class attributes and implement :meth:`run`."""

    name: ClassVar[str]
    kind: ClassVar[str]
    mutating: ClassVar[bool]

    def title(self, args: dict[str, Any]) -> str:
        """A one-line label for the tool call (what the client shows)."""
        return self.name

    def unavailable(self) -> str | None:
        """Why the tool cannot run here at all (asked before a permission request), or None."""
        return None

    @abstractmethod
    def run(self, args: dict[str, Any], env: ToolEnv) -> ToolResult:
        """Do the work; raise :class:`ToolError` for a failure the caller should see."""


def require_str(args: dict[str, Any], key: str, *, allow_empty: bool = False) -> str:
    """``args[key]`` as a string, or a :class:`ToolError` naming the argument."""
    value = args.get(key)
    if not isinstance(value, str):
        raise ToolError(f"argument {key!r} is required and must be a string")
    if not allow_empty and not value:
        raise ToolError(f"argument {key!r} must not be empty")
    return value
