"""What every tool is: a name, an ACP kind, whether it mutates, and a ``run``.

Tools run on the session actor's thread, one call at a time per session. A
tool reports a problem the agent should see by raising :class:`ToolError` (the
call fails, the turn goes on), and watches ``ToolEnv.cancelled`` so a
cancelled turn stops it promptly.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeAlias

from actors.worker.tools.paths import PathDenied, PathPolicy
from ipc.events import ToolContent, ToolLocation

__all__ = [
    "AskUser",
    "Tool",
    "ToolEnv",
    "ToolError",
    "ToolResult",
    "optional_int",
    "path_location",
    "require_str",
]

#: Asks the user a question (a message and a JSON schema); ``{action, content}`` or None.
AskUser: TypeAlias = Callable[[str, dict[str, Any]], dict[str, Any] | None]


def _no_user(message: str, schema: dict[str, Any]) -> dict[str, Any] | None:
    return None


class ToolError(Exception):
    """The tool call failed; the message is shown to the agent and the client."""


@dataclass(frozen=True, slots=True)
class ToolEnv:
    """What a tool may use: the session's path policy, the turn's cancel flag, and the
    variables the agent's configuration (``[agents.NAME] env``) gives its commands."""

    paths: PathPolicy
    cancelled: threading.Event
    agent_env: Mapping[str, str] = field(default_factory=dict)
    ask_user: AskUser = _no_user


@dataclass(frozen=True, slots=True)
class ToolResult:
    """A finished call: ``text`` for people and models, ``raw_output`` as structured data.

    ``ok`` False marks a call that ran but did not succeed (a non-zero exit).
    ``content`` (a diff, a delivered file) and ``locations`` are for the client;
    ``title``, when set, replaces the call's title.
    """

    text: str
    raw_output: Any
    ok: bool = True
    content: tuple[ToolContent, ...] = ()
    locations: tuple[ToolLocation, ...] = ()
    title: str | None = None


class Tool(ABC):
    """One tool. Subclasses set the class attributes and implement :meth:`run`."""

    name: ClassVar[str]
    kind: ClassVar[str]
    mutating: ClassVar[bool]

    def title(self, args: dict[str, Any]) -> str:
        """A one-line label for the tool call (what the client shows)."""
        return self.name

    def locations(self, args: dict[str, Any], paths: PathPolicy) -> tuple[ToolLocation, ...]:
        """The files the call will touch, for the client to follow (none by default)."""
        return ()

    def preview(self, args: dict[str, Any], paths: PathPolicy) -> tuple[ToolContent, ...]:
        """What the call would change, shown when it asks permission (a diff); nothing
        by default, and nothing when it cannot be worked out (the call reports why)."""
        return ()

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


def optional_int(args: dict[str, Any], key: str, *, minimum: int, default: int | None,
                 maximum: int | None = None) -> int | None:
    """``args[key]`` as an int of at least ``minimum`` (capped at ``maximum``), else
    ``default`` when absent; a :class:`ToolError` naming the argument otherwise."""
    value = args.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ToolError(f"argument {key!r} must be an integer of at least {minimum}")
    return value if maximum is None else min(value, maximum)


def path_location(args: dict[str, Any], paths: PathPolicy, key: str = "path",
                  line: int | None = None) -> tuple[ToolLocation, ...]:
    """``args[key]`` as a location (canonical), or none when it is missing or not allowed."""
    given = args.get(key)
    if not isinstance(given, str):
        return ()
    try:
        return (ToolLocation(str(paths.resolve(given)), line),)
    except PathDenied:
        return ()
