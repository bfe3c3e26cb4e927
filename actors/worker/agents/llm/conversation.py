"""The conversation a model agent sends, independent of any provider's wire format.

A session's stored history (:class:`~ipc.events.TextItem` / :class:`~ipc.events.ToolItem`)
becomes :data:`Message` values grouped by turn; :func:`fit_history` drops the oldest
turns until the request fits the context window; :func:`system_prompt` says where the
tools work and who the agent is (``IDENTITY.md``, ``SOUL.md`` from its workspace).

Pure functions over frozen data (the system prompt reads two small files): run on
the session actor's thread.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeAlias

import orjson

from actors.worker.agents.base import estimate_tokens
from ipc.events import FAILURE_MARKER_START, TextItem, ToolItem, TurnItem

__all__ = [
    "INTERRUPTED_NOTE",
    "AssistantMessage",
    "Message",
    "ToolCallRequest",
    "ToolResultMessage",
    "UserMessage",
    "arguments_text",
    "fit_history",
    "history_turns",
    "messages_tokens",
    "system_prompt",
]

PERSONA_FILES = ("IDENTITY.md", "SOUL.md")
INTERRUPTED_NOTE = "[this reply was interrupted: the turn failed]"
"""What the model is told in place of a failed turn's error line."""
PERSONA_MAX_BYTES = 64 * 1024


@dataclass(frozen=True, slots=True)
class ToolCallRequest:
    """A tool call the model asked for; ``arguments`` is its JSON text."""

    call_id: str
    name: str
    arguments: str


@dataclass(frozen=True, slots=True)
class UserMessage:
    text: str


@dataclass(frozen=True, slots=True)
class AssistantMessage:
    text: str
    tool_calls: tuple[ToolCallRequest, ...] = ()


@dataclass(frozen=True, slots=True)
class ToolResultMessage:
    call_id: str
    name: str
    text: str
    is_error: bool = False


Message: TypeAlias = UserMessage | AssistantMessage | ToolResultMessage
Turn: TypeAlias = tuple[Message, ...]


def arguments_text(arguments: Any) -> str:
    """Stored tool arguments as JSON text (a model's unparsable text stays as it was)."""
    if isinstance(arguments, str):
        return arguments
    return orjson.dumps(arguments if arguments is not None else {}).decode()


class _TurnBuilder:
    """Folds one stored turn's items into messages, in order."""

    def __init__(self, prompt: str) -> None:
        self.messages: list[Message] = [UserMessage(prompt)]
        self.text: list[str] = []
        self.calls: list[ToolCallRequest] = []
        self.results: list[ToolResultMessage] = []
        self.step = 0  # the model reply the pending calls came from

    def add(self, item: TurnItem) -> None:
        if isinstance(item, ToolItem):
            if self.calls and item.step != self.step:  # the next reply, even with no text
                self.flush()
            self.step = item.step
            self.calls.append(ToolCallRequest(item.tool_call_id, item.name,
                                              arguments_text(item.arguments)))
            self.results.append(ToolResultMessage(item.tool_call_id, item.name, item.result,
                                                  item.outcome != "completed"))
        elif item.role == "assistant":
            if self.calls:
                self.flush()
            self.text.append(_without_failure(item.text))

    def flush(self) -> None:
        text = "".join(self.text)
        if text or self.calls:
            self.messages.append(AssistantMessage(text, tuple(self.calls)))
        self.messages.extend(self.results)
        self.text, self.calls, self.results = [], [], []


def _without_failure(text: str) -> str:
    """An assistant text as the model is sent it: the failure line that ends a failed
    turn's kept text (the error as the client was told it: an exception's text, the
    API's URL) becomes :data:`INTERRUPTED_NOTE`."""
    at = text.rfind(FAILURE_MARKER_START)
    if at < 0 or not text.endswith("]") or (at and text[at - 1] != "\n"):
        return text
    return text[:at] + INTERRUPTED_NOTE


def history_turns(items: Iterable[TurnItem]) -> list[Turn]:
    """Stored items as turns of messages (thoughts are not sent back to the model)."""
    turns: list[Turn] = []
    builder: _TurnBuilder | None = None
    for item in items:
        if isinstance(item, TextItem) and item.role == "user":
            if builder is not None:
                builder.flush()
                turns.append(tuple(builder.messages))
            builder = _TurnBuilder(item.text)
        elif builder is not None:
            builder.add(item)
    if builder is not None:
        builder.flush()
        turns.append(tuple(builder.messages))
    return turns


def _message_tokens(message: Message) -> int:
    if isinstance(message, AssistantMessage):
        calls = sum(estimate_tokens(c.name + c.arguments) for c in message.tool_calls)
        return estimate_tokens(message.text) + calls + 4
    return estimate_tokens(message.text) + 4


def messages_tokens(messages: Iterable[Message]) -> int:
    """A rough token count of ``messages`` (about four characters per token)."""
    return sum(_message_tokens(m) for m in messages)


def fit_history(turns: Sequence[Turn], budget: int) -> tuple[list[Message], int]:
    """The newest whole turns that fit in ``budget`` tokens, and how many were dropped."""
    kept: list[Turn] = []
    used = 0
    for turn in reversed(turns):
        cost = messages_tokens(turn)
        if used + cost > budget:
            break
        kept.append(turn)
        used += cost
    messages = [m for turn in reversed(kept) for m in turn]
    return messages, len(turns) - len(kept)


def _persona(agent_workspace: str) -> list[str]:
    sections = []
    for name in PERSONA_FILES:
        path = Path(agent_workspace) / name
        try:
            with path.open("rb") as handle:
                text = handle.read(PERSONA_MAX_BYTES).decode("utf-8", "replace").strip()
        except OSError:
            continue
        if text:
            sections.append(f"## {name}\n\n{text}")
    return sections


def system_prompt(alias: str, session_workspace: Path, agent_workspace: str) -> str:
    """Where the tools work (the session's workspace) and who the agent is."""
    lines = [
        f"You are {alias or 'an agent'}, a coding agent run by zeroclaw inside the user's "
        "editor. Use the tools to inspect and change files and to run commands; answer "
        "concisely.",
        "",
        f"Working directory: {session_workspace}",
        "File and shell tools operate there: relative paths resolve against it, and the "
        "shell starts in it. Paths outside it are refused, except your own agent "
        f"workspace ({agent_workspace}).",
    ]
    persona = _persona(agent_workspace) if agent_workspace else []
    if persona:
        lines += ["", "\n\n".join(persona)]
    return "\n".join(lines)
