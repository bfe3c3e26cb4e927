"""Envelopes between the host and its worker processes, over ZeroMQ.

The host binds a ROUTER, each worker connects a DEALER whose identity names the
worker incarnation. An envelope is an orjson map ``{"t": <type>, ...fields}``,
one line (orjson never writes a raw newline). A zmq message from the host is one
frame holding one envelope; from a worker, one frame (after the ROUTER identity
on the host side) holding one or more envelopes, a newline between them
(:func:`join_envelopes`, :func:`split_envelopes`): a burst of events is one zmq
frame, not one each.

Each message type is a frozen dataclass below; ``T`` is its wire tag. Nested
data (events, turn records, history) travels as plain dicts made by
:mod:`ipc.events`. Pure data: safe from any thread.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, Final, TypeAlias, TypedDict, cast

import orjson

__all__ = [
    "LARGE_FRAME_BYTES",
    "STREAM_WINDOW_BYTES",
    "TOOL_RULES_META",
    "AgentCall",
    "AgentOpened",
    "AgentProcessEntry",
    "AgentReply",
    "CancelTurn",
    "ClientCall",
    "ClientReply",
    "CloseSession",
    "Credit",
    "EncodeError",
    "Envelope",
    "Heartbeat",
    "HostMessage",
    "OpenFailed",
    "OpenSession",
    "PermissionAsk",
    "PermissionReply",
    "PermissionRules",
    "Ping",
    "SessionClosed",
    "SessionOpened",
    "SetMode",
    "Shutdown",
    "StartTurn",
    "TurnEnded",
    "TurnEvent",
    "TurnFailed",
    "UserAnswer",
    "UserAsk",
    "WireError",
    "WorkerMessage",
    "WorkerReady",
    "chunk_frame_prefix",
    "decode",
    "decode_all",
    "encode",
    "encode_chunk",
    "encode_chunk_run",
    "join_envelopes",
    "split_envelopes",
    "stored_tool_rules",
]


STREAM_WINDOW_BYTES = 256 * 1024
"""Encoded bytes of a turn's :class:`TurnEvent` frames the worker may send before the
host grants them back with :class:`Credit` (the turn's agent waits meanwhile)."""


class AgentProcessEntry(TypedDict):
    """One external agent process of a worker (``provider = "acp"``), as its heartbeat
    reports it: ``sessions`` are the agent sessions it holds, ``restarts`` how often the
    worker started it again (after a crash or a turn it would not cancel), ``confinement``
    the sandbox backend that confines it (``bwrap``, ``landlock``) or ``none``."""

    alias: str
    pid: int
    sessions: int
    restarts: int
    confinement: str


class WireError(ValueError):
    """A frame that is not a known envelope."""


class EncodeError(ValueError):
    """A message that cannot be put on the wire (a value orjson refuses: nested past
    its depth limit, a lone surrogate, an integer past 64 bits, an unknown type)."""


# --- host -> worker ----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class OpenSession:
    """Create the session actor. ``agent`` is the agent's config section plus ``alias``.

    ``history`` is the stored conversation as :func:`ipc.events.item_to_wire` dicts,
    so a model-backed agent can continue it. ``permission_timeout`` is in seconds.
    ``mcp_servers`` is the client's list from ``session/new`` (an ACP agent gets it).
    ``meta`` is the stored session's meta (an ACP agent finds its session id there).
    ``confirm``: answer :class:`SessionOpened` (a failure is answered OpenFailed either
    way); the host's opens do not wait for it and say False. ``evicted``: sessions of
    this worker evicted to make room for this one, closed first (as an unconfirmed
    :class:`CloseSession` would), so that one message does both. ``sandbox_network``
    False: the session's confined commands (shell, a hosted agent's jail) get a
    network namespace with only loopback.
    """

    T: ClassVar[str] = "open"
    sid: str
    agent: dict[str, Any]
    workspace_dir: str
    cwd: str
    mode: str
    forbidden_paths: list[str]
    permission_timeout: float
    history: list[dict[str, Any]] = field(default_factory=list)
    mcp_servers: list[Any] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)
    confirm: bool = True
    evicted: list[str] = field(default_factory=list)
    sandbox_network: bool = True


@dataclass(frozen=True, slots=True)
class StartTurn:
    """Run one turn with the assembled prompt text."""

    T: ClassVar[str] = "turn"
    sid: str
    turn_id: str
    prompt: str


@dataclass(frozen=True, slots=True)
class CancelTurn:
    """Stop the running turn promptly; handled on the worker's IO thread."""

    T: ClassVar[str] = "cancel"
    sid: str


@dataclass(frozen=True, slots=True)
class PermissionReply:
    """The client's answer; ``option_id`` None means cancelled, timed out or gone."""

    T: ClassVar[str] = "perm_reply"
    sid: str
    request_id: str
    option_id: str | None


@dataclass(frozen=True, slots=True)
class UserAnswer:
    """The user's answer to a :class:`UserAsk`: ``{action, content}``, or None (none came)."""

    T: ClassVar[str] = "user_answer"
    sid: str
    request_id: str
    answer: dict[str, Any] | None


@dataclass(frozen=True, slots=True)
class ClientReply:
    """The answer to a :class:`ClientCall`. ``relayed`` False: the session's holder did
    not advertise the capability (or there is none), so the worker serves the request
    itself; else ``error`` (``{code, message}``: the client's error, or why no answer
    came: the client went away, timed out) or ``result``. None to the worker's wait
    means withdrawn (the turn was cancelled)."""

    T: ClassVar[str] = "client_reply"
    sid: str
    request_id: str
    relayed: bool
    result: Any = None
    error: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class AgentCall:
    """A client's ``_``-prefixed extension request for the session's hosted agent;
    answered by an :class:`AgentReply` with the same ``request_id``. ``notification``:
    the client sent a notification; it goes on as one and nothing answers it."""

    T: ClassVar[str] = "agent_call"
    sid: str
    request_id: str
    method: str
    params: dict[str, Any]
    notification: bool = False


@dataclass(frozen=True, slots=True)
class SetMode:
    T: ClassVar[str] = "set_mode"
    sid: str
    mode: str


@dataclass(frozen=True, slots=True)
class CloseSession:
    """Cancel any running turn, then drop the actor; answered by a SessionClosed
    carrying the same ``close_id`` (the host's number for this close), unless
    ``confirm`` is False (an eviction: nobody waits for it)."""

    T: ClassVar[str] = "close"
    sid: str
    close_id: int = 0
    confirm: bool = True


@dataclass(frozen=True, slots=True)
class Credit:
    """The host took ``nbytes`` more of the turn's :class:`TurnEvent` frames (their
    encoded size) off to its client: the worker may send that much more of the turn.
    Each turn starts with a full window; credit for another turn is ignored."""

    T: ClassVar[str] = "credit"
    sid: str
    turn_id: str
    nbytes: int


@dataclass(frozen=True, slots=True)
class Ping:
    """Host heartbeat; a worker that hears none for a while exits."""

    T: ClassVar[str] = "ping"
    seq: int


@dataclass(frozen=True, slots=True)
class Shutdown:
    T: ClassVar[str] = "shutdown"


# --- worker -> host ----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class WorkerReady:
    T: ClassVar[str] = "ready"
    pid: int


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """``agents``: the worker's hosted agent processes, each an :class:`AgentProcessEntry`."""

    T: ClassVar[str] = "beat"
    pid: int
    sessions: int
    agents: list[AgentProcessEntry] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class SessionOpened:
    T: ClassVar[str] = "opened"
    sid: str


@dataclass(frozen=True, slots=True)
class OpenFailed:
    T: ClassVar[str] = "open_failed"
    sid: str
    message: str


@dataclass(frozen=True, slots=True)
class TurnEvent:
    """One event of a running turn, as :func:`ipc.events.event_to_wire` made it."""

    T: ClassVar[str] = "event"
    sid: str
    turn_id: str
    event: dict[str, Any]


@dataclass(frozen=True, slots=True)
class PermissionAsk:
    """A tool call needs the user's approval before it runs. ``content`` previews what
    it would do (:func:`ipc.events.content_to_wire` dicts: a file tool's diff).
    ``request``: a hosted agent's own ``session/request_permission`` params as it sent
    them (without ``sessionId``): an ACP client gets those, and its chosen
    ``optionId`` comes back as it is."""

    T: ClassVar[str] = "perm_ask"
    sid: str
    turn_id: str
    request_id: str
    tool_call_id: str
    tool_name: str
    title: str
    kind: str
    raw_input: Any
    content: list[dict[str, Any]] = field(default_factory=list)
    request: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class UserAsk:
    """The agent asks the user a question (``ask_user``): a message and a JSON schema."""

    T: ClassVar[str] = "user_ask"
    sid: str
    turn_id: str
    request_id: str
    message: str
    schema: dict[str, Any]


@dataclass(frozen=True, slots=True)
class ClientCall:
    """A hosted agent's request for its client (``fs/*``, ``terminal/*``), for the host
    to relay to the connection that holds the session now, when that connection
    advertised the capability. ``params`` carry zeroclaw's session id.
    ``notification``: the agent sent an extension notification (``_name``); it goes
    on as one and nothing answers it."""

    T: ClassVar[str] = "client_call"
    sid: str
    request_id: str
    method: str
    params: dict[str, Any]
    notification: bool = False


@dataclass(frozen=True, slots=True)
class AgentReply:
    """The hosted agent's answer to an :class:`AgentCall`: ``error`` (``{code,
    message}``) or ``result``."""

    T: ClassVar[str] = "agent_reply"
    sid: str
    request_id: str
    result: Any = None
    error: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class AgentOpened:
    """A hosted agent's session is there (or could not be had: it is then retried at the
    first prompt): ``modes`` is the agent's own ``{currentModeId, availableModes}``
    when it offers modes, else None. Sent again whenever the agent switches its mode
    itself (its ``current_mode_update``), with the new current mode."""

    T: ClassVar[str] = "agent_opened"
    sid: str
    modes: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class McpServersStatus:
    """The MCP servers of a session of zeroclaw's own model agent, for ``status``: one
    ``{name, transport, state, pid?, tools, problem?}`` each. Sent when the session
    opens (``starting``) and after each turn when something changed."""

    T: ClassVar[str] = "mcp_servers"
    sid: str
    servers: list[dict[str, Any]] = field(default_factory=list)


#: Where a stored session's ``meta`` keeps its remembered permission answers.
TOOL_RULES_META = "toolPermissions"
_TOOL_RULES = ("allow_always", "reject_always")


def stored_tool_rules(meta: dict[str, Any]) -> dict[str, str]:
    """The remembered permission answers in a stored session's ``meta`` (others dropped)."""
    rules = meta.get(TOOL_RULES_META)
    if not isinstance(rules, dict):
        return {}
    return {name: rule for name, rule in rules.items()
            if isinstance(name, str) and rule in _TOOL_RULES}


@dataclass(frozen=True, slots=True)
class PermissionRules:
    """The session's remembered permission answers changed: tool name to
    ``allow_always`` or ``reject_always``, the whole map (the host stores it)."""

    T: ClassVar[str] = "perm_rules"
    sid: str
    rules: dict[str, str]


@dataclass(frozen=True, slots=True)
class TurnEnded:
    """The turn finished (completed or cancelled); ``record`` is a TurnRecord wire dict."""

    T: ClassVar[str] = "turn_end"
    sid: str
    turn_id: str
    record: dict[str, Any]


@dataclass(frozen=True, slots=True)
class TurnFailed:
    """The turn failed; the session stays usable. ``record`` (a TurnRecord wire dict,
    stop reason ``failed``) holds what the turn streamed before it failed, to be kept;
    None when nothing was streamed (nothing is kept). ``error``: the JSON-RPC error a
    hosted agent answered the turn with (``{code, message, data?}``), for the client
    instead of -32603 with ``message``."""

    T: ClassVar[str] = "turn_failed"
    sid: str
    turn_id: str
    message: str
    record: dict[str, Any] | None = None
    error: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class SessionClosed:
    T: ClassVar[str] = "closed"
    sid: str
    close_id: int = 0


HostMessage: TypeAlias = (
    OpenSession
    | StartTurn
    | CancelTurn
    | PermissionReply
    | UserAnswer
    | ClientReply
    | AgentCall
    | SetMode
    | CloseSession
    | Credit
    | Ping
    | Shutdown
)
WorkerMessage: TypeAlias = (
    WorkerReady
    | Heartbeat
    | SessionOpened
    | OpenFailed
    | TurnEvent
    | PermissionAsk
    | UserAsk
    | ClientCall
    | AgentReply
    | AgentOpened
    | McpServersStatus
    | PermissionRules
    | TurnEnded
    | TurnFailed
    | SessionClosed
)

_TYPES: dict[str, type[Any]] = {
    cls.T: cls
    for cls in (
        OpenSession,
        StartTurn,
        CancelTurn,
        PermissionReply,
        UserAnswer,
        ClientReply,
        AgentCall,
        SetMode,
        CloseSession,
        Credit,
        Ping,
        Shutdown,
        WorkerReady,
        Heartbeat,
        SessionOpened,
        OpenFailed,
        TurnEvent,
        PermissionAsk,
        UserAsk,
        ClientCall,
        AgentReply,
        AgentOpened,
        McpServersStatus,
        PermissionRules,
        TurnEnded,
        TurnFailed,
        SessionClosed,
    )
}


_FIELD_NAMES: dict[type[Any], tuple[str, ...]] = {
    cls: tuple(f.name for f in fields(cls)) for cls in _TYPES.values()
}


def encode(message: HostMessage | WorkerMessage) -> bytes:
    """One zmq frame for ``message``; raises :class:`EncodeError` when it has a value
    orjson refuses (the caller decides what that means: a turn fails on it)."""
    if type(message) is TurnEvent:  # the common case, on the way of every event
        payload = {"sid": message.sid, "turn_id": message.turn_id, "event": message.event}
    else:
        payload = {name: getattr(message, name) for name in _FIELD_NAMES[type(message)]}
    payload["t"] = message.T
    try:
        return orjson.dumps(payload)
    except TypeError as exc:  # orjson.JSONEncodeError is a TypeError
        raise EncodeError(f"{type(message).__name__} cannot be encoded: {exc}") from None


def chunk_frame_prefix(sid: str, turn_id: str, kind: str, *, run: bool = False) -> bytes:
    """What :func:`encode` makes of a :class:`TurnEvent` of ``sid``'s turn ``turn_id``
    whose event is a text chunk of ``kind``, up to the chunk's text (see
    :func:`encode_chunk`; ``run``: a run of such chunks, up to their texts, see
    :func:`encode_chunk_run`): a turn builds it once, not per chunk."""
    key, empty = ("texts", []) if run else ("text", "")
    head = orjson.dumps({"sid": sid, "turn_id": turn_id, "event": {"k": kind, key: empty}})
    return head[: -len(orjson.dumps(empty)) - 2]


_CHUNK_FRAME_END: Final = b'},"t":"' + TurnEvent.T.encode() + b'"}'


def encode_chunk(prefix: bytes, text: str) -> bytes:
    """The frame :func:`encode` makes of a text chunk's :class:`TurnEvent` (``prefix``
    from :func:`chunk_frame_prefix`), without building the message or its dict: the
    way of every streamed chunk. Raises :class:`EncodeError` as :func:`encode` does."""
    try:
        return prefix + orjson.dumps(text) + _CHUNK_FRAME_END
    except TypeError as exc:  # e.g. a lone surrogate
        raise EncodeError(f"TurnEvent cannot be encoded: {exc}") from None


def encode_chunk_run(prefix: bytes, texts: list[str]) -> bytes:
    """One frame for a run of text chunks of one kind (``prefix`` from
    :func:`chunk_frame_prefix` with ``run``): the host reads it back as one event per
    chunk (:func:`ipc.events.events_from_wire`), so a burst of thousands of chunks is
    one envelope to decode, not thousands. Raises :class:`EncodeError`."""
    try:
        return prefix + orjson.dumps(texts) + _CHUNK_FRAME_END
    except TypeError as exc:
        raise EncodeError(f"TurnEvent cannot be encoded: {exc}") from None


def join_envelopes(frames: list[bytes]) -> bytes:
    """Encoded envelopes as the one frame of a worker's zmq message."""
    return frames[0] if len(frames) == 1 else b"\n".join(frames)


LARGE_FRAME_BYTES = 1024 * 1024
"""A frame this big (a long turn's end: its record and answer) is read in place,
envelope by envelope: no copy of it is made to split or to join its envelopes."""

Envelope: TypeAlias = bytes | memoryview


def split_envelopes(frame: Envelope) -> list[Envelope]:
    """The envelopes of a frame made by :func:`join_envelopes` (views into a large one)."""
    if len(frame) >= LARGE_FRAME_BYTES:
        view, start = memoryview(frame), 0
        envelopes: list[Envelope] = []
        for newline in _NEWLINE.finditer(view):
            envelopes.append(view[start:newline.start()])
            start = newline.end()
        envelopes.append(view[start:])
        return envelopes
    whole = bytes(frame)  # the same object when it is bytes already
    if b"\n" not in whole:
        return [whole]
    return cast("list[Envelope]", whole.split(b"\n"))


_NEWLINE = re.compile(b"\n")


def decode(frame: Envelope) -> HostMessage | WorkerMessage:
    """Parse one frame; raises :class:`WireError` for anything unknown or malformed."""
    try:
        return _message(orjson.loads(frame))
    except orjson.JSONDecodeError as exc:
        raise WireError(f"bad worker envelope: {exc.__class__.__name__}") from None


def decode_all(envelopes: list[Envelope]) -> list[HostMessage | WorkerMessage | WireError]:
    """:func:`decode` of each of ``envelopes`` (those of one frame), the error in
    place of a message that does not parse: a burst of small ones is parsed by one
    orjson call, a large frame's envelopes one by one (no joined copy of it)."""
    if len(envelopes) > 1 and isinstance(envelopes[0], bytes):
        try:
            payloads = orjson.loads(b"[" + b",".join(envelopes) + b"]")
        except orjson.JSONDecodeError:
            payloads = None
        if isinstance(payloads, list) and len(payloads) == len(envelopes):
            return [_message_or_error(payload) for payload in payloads]
    return [_decoded_or_error(envelope) for envelope in envelopes]


def _decoded_or_error(envelope: Envelope) -> HostMessage | WorkerMessage | WireError:
    try:
        return decode(envelope)
    except WireError as exc:
        return exc


def _message_or_error(payload: Any) -> HostMessage | WorkerMessage | WireError:
    try:
        return _message(payload)
    except WireError as exc:
        return exc


def _message(payload: Any) -> HostMessage | WorkerMessage:
    """The message of a parsed envelope; raises :class:`WireError`."""
    try:
        if payload.get("t") == TurnEvent.T and len(payload) == 4:  # every streamed event
            return TurnEvent(payload["sid"], payload["turn_id"], payload["event"])
        cls = _TYPES[payload.pop("t")]
        message: HostMessage | WorkerMessage = cls(**payload)
    except (KeyError, TypeError, AttributeError) as exc:
        raise WireError(f"bad worker envelope: {exc.__class__.__name__}") from None
    return message
