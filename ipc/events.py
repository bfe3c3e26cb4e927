"""The internal event model: what a turn produces, independent of any dialect.

A session actor (in a worker process) produces these events once; the host
renders them for each connection in its dialect (ACP v1 in :mod:`ipc.acp`, the
daemon RPC dialect later). Between processes they travel as plain dicts made by
:func:`event_to_wire` and read back by :func:`event_from_wire`; a run of one kind's
text chunks may travel as one dict (``texts``: a list), read back by
:func:`events_from_wire` as one event per chunk.

The same module defines the items of a finished turn (:class:`TurnRecord`),
which is what the persistence actor writes and what ``session/load`` replays.

Pure data: safe to use from any thread.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, Literal, TypeAlias

__all__ = [
    "CANCEL_MARKER",
    "FAILURE_MARKER_START",
    "AgentUpdate",
    "AvailableCommands",
    "CommandInfo",
    "CurrentMode",
    "DiffContent",
    "Event",
    "MessageChunk",
    "PlanEntry",
    "PlanUpdate",
    "ResourceContent",
    "SessionInfo",
    "StoredTurn",
    "TextItem",
    "ThoughtChunk",
    "ToolCallFinished",
    "ToolCallStarted",
    "ToolContent",
    "ToolItem",
    "ToolLocation",
    "TurnItem",
    "TurnRecord",
    "UsageUpdate",
    "UserChunk",
    "content_from_wire",
    "content_to_wire",
    "event_from_wire",
    "event_to_wire",
    "events_from_wire",
    "iso_utc",
    "item_from_wire",
    "item_to_wire",
]

ToolKind = Literal["read", "edit", "delete", "move", "search", "execute", "think", "fetch", "other"]
StopReason = Literal["end_turn", "cancelled", "max_tokens", "refusal"]

#: What ends the text of a turn the client cancelled (SPEC §3 ``session/cancel``).
CANCEL_MARKER = "[turn cancelled via client]"
FAILURE_MARKER_START = "[turn failed: "
"""How the line starts that ends a failed turn's kept text: ``[turn failed: <error>]``."""


@dataclass(frozen=True, slots=True)
class MessageChunk:
    """A piece of the assistant's answer text."""

    KIND: ClassVar[str] = "message"
    text: str


@dataclass(frozen=True, slots=True)
class ThoughtChunk:
    """A piece of the assistant's reasoning."""

    KIND: ClassVar[str] = "thought"
    text: str


@dataclass(frozen=True, slots=True)
class UserChunk:
    """A piece of a user turn; only produced when replaying a stored session."""

    KIND: ClassVar[str] = "user"
    text: str


@dataclass(frozen=True, slots=True)
class ToolLocation:
    """A file a tool call touches (an absolute path), and the line when one matters."""

    path: str
    line: int | None = None


@dataclass(frozen=True, slots=True)
class DiffContent:
    """A file change a client can show as a diff; ``old_text`` None for a new file."""

    TYPE: ClassVar[str] = "diff"
    path: str
    old_text: str | None
    new_text: str


@dataclass(frozen=True, slots=True)
class ResourceContent:
    """A file handed to the client (``deliver_file``): its ``attachment://`` uri, mime
    type and bytes as base64."""

    TYPE: ClassVar[str] = "resource"
    uri: str
    mime_type: str
    blob: str


ToolContent: TypeAlias = DiffContent | ResourceContent
_CONTENT_TYPES: dict[str, type[Any]] = {cls.TYPE: cls for cls in (DiffContent, ResourceContent)}


@dataclass(frozen=True, slots=True)
class ToolCallStarted:
    """The agent asked for a tool; status is ``pending`` until it finishes."""

    KIND: ClassVar[str] = "tool_call"
    tool_call_id: str
    name: str
    title: str
    kind: str
    raw_input: Any
    locations: tuple[ToolLocation, ...] = ()
    step: int = 0  # which model reply of the turn asked for it (see ToolItem.step)


@dataclass(frozen=True, slots=True)
class ToolCallFinished:
    """A tool call ended. ``status`` is ``in_progress``, ``completed`` or ``failed``.

    ``content`` is what a client shows beside ``text`` (a diff, a delivered file);
    ``locations`` and ``title``, when set, replace the tool call's.
    """

    KIND: ClassVar[str] = "tool_call_update"
    tool_call_id: str
    name: str
    status: str
    raw_output: Any
    text: str
    content: tuple[ToolContent, ...] = ()
    locations: tuple[ToolLocation, ...] = ()
    title: str | None = None


@dataclass(frozen=True, slots=True)
class PlanEntry:
    content: str
    priority: str = "medium"
    status: str = "pending"


@dataclass(frozen=True, slots=True)
class PlanUpdate:
    """The agent's current plan, replacing any earlier one."""

    KIND: ClassVar[str] = "plan"
    entries: tuple[PlanEntry, ...]


@dataclass(frozen=True, slots=True)
class CurrentMode:
    """The session's mode (autonomy level) changed."""

    KIND: ClassVar[str] = "mode"
    mode_id: str


@dataclass(frozen=True, slots=True)
class SessionInfo:
    """Session metadata changed (title, last update as ISO 8601)."""

    KIND: ClassVar[str] = "info"
    title: str | None = None
    updated_at: str | None = None
    meta: dict[str, Any] | None = None  # the update's ``_meta``


@dataclass(frozen=True, slots=True)
class UsageUpdate:
    """Context window use in tokens, and cost when known."""

    KIND: ClassVar[str] = "usage"
    used: int
    size: int
    cost: float | None = None


@dataclass(frozen=True, slots=True)
class CommandInfo:
    """A command the client may offer: ``/name``, what it does, and a hint for its
    argument (None: it takes none)."""

    name: str
    description: str
    hint: str | None = None


@dataclass(frozen=True, slots=True)
class AvailableCommands:
    """The commands a session understands (the host's slash commands). Made by the
    host itself, never by a worker, so it has no wire form between processes."""

    KIND: ClassVar[str] = "commands"
    commands: tuple[CommandInfo, ...]


@dataclass(frozen=True, slots=True)
class AgentUpdate:
    """An ACP ``session/update`` object exactly as it was sent (its ``update``, without
    the ``sessionId`` around it): a hosted agent's, or one replayed from the store.
    Every field, ``_meta`` and unknown ones included: the host sends it on as it is,
    under its own session id, and the store keeps it as it is."""

    KIND: ClassVar[str] = "acp"
    update: dict[str, Any]


Event: TypeAlias = (
    MessageChunk
    | ThoughtChunk
    | UserChunk
    | ToolCallStarted
    | ToolCallFinished
    | PlanUpdate
    | CurrentMode
    | SessionInfo
    | UsageUpdate
    | AvailableCommands
    | AgentUpdate
)

_EVENT_TYPES: dict[str, type[Any]] = {
    cls.KIND: cls
    for cls in (
        MessageChunk,
        ThoughtChunk,
        UserChunk,
        ToolCallStarted,
        ToolCallFinished,
        PlanUpdate,
        CurrentMode,
        SessionInfo,
        UsageUpdate,
        AgentUpdate,
    )
}


_CHUNK_TYPES: dict[str, type[MessageChunk] | type[ThoughtChunk]] = {
    cls.KIND: cls for cls in (MessageChunk, ThoughtChunk)
}
_CHUNK_CLASSES = frozenset(_CHUNK_TYPES.values())
_EVENT_FIELDS: dict[type[Any], tuple[str, ...]] = {}  # each event class's field names


def iso_utc(timestamp: float) -> str:
    """A UNIX time as ISO 8601 in UTC with a ``Z`` (ACP's ``updatedAt``)."""
    stamp = dt.datetime.fromtimestamp(timestamp, dt.UTC).isoformat()
    return stamp.replace("+00:00", "Z")


def _part_to_wire(part: Any) -> dict[str, Any]:
    """A plan entry, location or content item as a dict (content items tagged ``type``)."""
    wire = {f.name: getattr(part, f.name) for f in fields(part)}
    if isinstance(part, DiffContent | ResourceContent):
        wire["type"] = part.TYPE
    return wire


def event_to_wire(event: Event) -> dict[str, Any]:
    """A plain dict (orjson-ready) with the kind under ``k``."""
    if type(event) in _CHUNK_CLASSES:  # the common case, on the way of every chunk
        return {"k": event.KIND, "text": event.text}  # type: ignore[union-attr]
    if type(event) is AgentUpdate:  # as it came: no field of it is looked at
        return {"k": AgentUpdate.KIND, "update": event.update}
    wire: dict[str, Any] = {"k": event.KIND}
    names = _EVENT_FIELDS.get(type(event))
    if names is None:
        names = _EVENT_FIELDS[type(event)] = tuple(f.name for f in fields(event))
    for name in names:
        value = getattr(event, name)
        if name in ("entries", "content", "locations"):
            value = [_part_to_wire(part) for part in value]
        wire[name] = value
    return wire



def content_to_wire(content: ToolContent) -> dict[str, Any]:
    """A content item as a plain dict tagged with its ``type``."""
    return _part_to_wire(content)


def content_from_wire(wire: dict[str, Any]) -> ToolContent:
    """Inverse of :func:`content_to_wire`; raises ``KeyError``/``TypeError`` on bad input."""
    data = dict(wire)
    content: ToolContent = _CONTENT_TYPES[data.pop("type")](**data)
    return content


def events_from_wire(wire: dict[str, Any]) -> list[Event]:
    """The events of one wire dict: a chunk run's (``{"k": kind, "texts": [...]}``,
    made by :func:`ipc.worker_wire.encode_chunk_run`), one chunk each, else the one
    of :func:`event_from_wire`; raises ``KeyError``/``TypeError`` on bad input."""
    texts = wire.get("texts")
    if texts is None:
        return [event_from_wire(wire)]
    chunk = _CHUNK_TYPES[wire["k"]]
    if len(wire) != 2 or type(texts) is not list or not all(type(t) is str for t in texts):
        raise TypeError("a chunk run's texts must be a list of strings")
    return [chunk(text) for text in texts]


def event_from_wire(wire: dict[str, Any]) -> Event:
    """Inverse of :func:`event_to_wire`; raises ``KeyError``/``TypeError`` on bad input."""
    chunk = _CHUNK_TYPES.get(wire.get("k", ""))
    if chunk is not None and len(wire) == 2:  # the common case, on the way of every chunk
        return chunk(wire["text"])
    if wire.get("k") == AgentUpdate.KIND:
        update = wire["update"]
        if type(update) is not dict:
            raise TypeError("an agent's update must be an object")
        return AgentUpdate(update)
    data = dict(wire)
    cls = _EVENT_TYPES[data.pop("k")]
    if cls is PlanUpdate:
        data["entries"] = tuple(PlanEntry(**e) for e in data["entries"])
    if "locations" in data:
        data["locations"] = tuple(ToolLocation(**loc) for loc in data["locations"])
    if "content" in data:
        data["content"] = tuple(content_from_wire(c) for c in data["content"])
    event: Event = cls(**data)
    return event


# --- finished turns ---------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TextItem:
    """Text of one role within a turn: ``user``, ``assistant`` or ``thought``."""

    role: Literal["user", "assistant", "thought"]
    text: str


@dataclass(frozen=True, slots=True)
class ToolItem:
    """A tool call of a turn with its outcome: ``completed``, ``failed`` or ``denied``.

    ``step`` numbers the model replies of a turn (1, 2, ...): calls of one step were
    asked for together, a later step after their results. 0: the agent has no steps."""

    tool_call_id: str
    name: str
    arguments: Any
    result: str
    outcome: str
    title: str = ""
    kind: str = "other"
    step: int = 0


TurnItem: TypeAlias = TextItem | ToolItem


def item_to_wire(item: TurnItem) -> dict[str, Any]:
    if isinstance(item, TextItem):
        return {"role": item.role, "text": item.text}
    return {
        "role": "tool",
        "tool_call_id": item.tool_call_id,
        "name": item.name,
        "arguments": item.arguments,
        "result": item.result,
        "outcome": item.outcome,
        "title": item.title,
        "kind": item.kind,
        "step": item.step,
    }


def item_from_wire(wire: dict[str, Any]) -> TurnItem:
    data = dict(wire)
    role = data.pop("role")
    if role == "tool":
        return ToolItem(**data)
    return TextItem(role=role, text=data["text"])


@dataclass(frozen=True, slots=True)
class TurnRecord:
    """One finished turn, in order: the user prompt first, then what the agent did.

    ``stop_reason`` is an ACP stop reason, or ``failed`` for a failed turn kept for
    what it streamed (its prompt got an error, never this record); ``content`` is the
    final answer text (for a cancelled turn it ends with ``[turn cancelled via
    client]``, for a failed one with ``[turn failed: <error>]``).
    ``updates`` are the ACP ``session/update`` objects of the turn as its client got
    them live (a hosted agent's as the agent sent them; each run of consecutive
    plain text chunks of one kind and message kept as one :func:`chunk_run` entry):
    what ``session/load`` replays.
    ``items`` are the same turn as text and tool calls: what the store indexes and
    zeroclaw's own agents read back as history. Times are UNIX seconds.
    """

    session_id: str
    items: tuple[TurnItem, ...]
    stop_reason: str
    content: str
    started_at: float
    finished_at: float
    tokens: int = 0
    extra: dict[str, Any] = field(default_factory=dict)
    updates: tuple[dict[str, Any], ...] = ()

    def to_wire(self) -> dict[str, Any]:
        return {
            "session_id": self.session_id,
            "items": [item_to_wire(i) for i in self.items],
            "stop_reason": self.stop_reason,
            "content": self.content,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "tokens": self.tokens,
            "extra": self.extra,
            "updates": list(self.updates),
        }

    @classmethod
    def from_wire(cls, wire: dict[str, Any]) -> TurnRecord:
        data = dict(wire)
        data["items"] = tuple(item_from_wire(i) for i in data["items"])
        data["updates"] = tuple(data.get("updates") or ())
        return cls(**data)


@dataclass(frozen=True, slots=True)
class StoredTurn:
    """A turn read back from the store: its items in order, and the updates its client
    got live (empty for a turn stored before zeroclaw kept them, or one the host made
    itself, such as a slash command's)."""

    items: tuple[TurnItem, ...]
    updates: tuple[dict[str, Any], ...] = ()


CHUNK_PARTS = "zeroclaw.parts"
"""The key of a stored chunk run's texts. A run has no ``content``, which every ACP
text chunk carries, so it is never mistaken for an update an agent sent."""


def chunk_run(kind: str, parts: list[str], message_id: Any = None) -> dict[str, Any]:
    """How a run of plain text chunks (``sessionUpdate`` ``kind``, the texts ``parts``,
    the same ``messageId`` or none) is stored: one entry that keeps every chunk's
    boundary, so a replay sends exactly the chunks sent live, at a few bytes each."""
    if len(parts) == 1:
        run: dict[str, Any] = {"sessionUpdate": kind, "content": _text_content(parts[0])}
    else:
        run = {"sessionUpdate": kind, CHUNK_PARTS: parts}
    if message_id is not None:
        run["messageId"] = message_id
    return run


def stored_updates(stored: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The updates one stored entry stands for: a :func:`chunk_run` as its chunks, any
    other update as itself. Runs on whichever thread replays a session."""
    parts = stored.get(CHUNK_PARTS) if "content" not in stored else None
    if type(parts) is not list:
        yield stored
        return
    kind = stored["sessionUpdate"]
    message_id = stored.get("messageId")
    for text in parts:
        update: dict[str, Any] = {"sessionUpdate": kind, "content": _text_content(text)}
        if message_id is not None:
            update["messageId"] = message_id
        yield update


def _text_content(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}
