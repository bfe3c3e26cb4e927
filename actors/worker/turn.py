"""One turn of a session: what the agent sees (:class:`ActorTurnContext`) and what is kept.

Everything here runs on the session actor's thread. The context streams each
event to the host and into a :class:`TurnRecorder`, applies the session's
autonomy mode to tool calls (asking the client when ``supervised``), and runs
the tools; the recorder turns the stream into the ordered items of a
:class:`ipc.events.TurnRecord`.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from actors.worker.agents.base import AgentFailure, ToolCallOutcome, estimate_tokens
from actors.worker.tools import PathPolicy, Tool, ToolEnv, ToolError, ToolResult
from ipc.acp import update_of
from ipc.acp_items import content_text, tool_result_text
from ipc.events import (
    CANCEL_MARKER,
    FAILURE_MARKER_START,
    AgentUpdate,
    Event,
    MessageChunk,
    TextItem,
    ThoughtChunk,
    ToolCallFinished,
    ToolCallStarted,
    ToolContent,
    ToolItem,
    TurnItem,
    TurnRecord,
    chunk_run,
    content_to_wire,
    event_to_wire,
)
from ipc.worker_wire import (
    EncodeError,
    PermissionAsk,
    PermissionRules,
    TurnEvent,
    UserAsk,
    WorkerMessage,
    chunk_frame_prefix,
    encode_chunk,
    encode_chunk_run,
)

__all__ = [
    "ActorTurnContext", "StreamCredit", "TurnAborted", "TurnRecorder", "TurnSession",
    "failure_marker",
]

logger = logging.getLogger("zeroclaw.turn")

QUIET_SECONDS = 0.0005
"""An event this long after its turn's previous one (or the turn's start) is sent at
once (by the emitting thread when the DEALER is free, else by waking the IO thread): the
stream was quiet (the agent waited on a model, a process), so
nothing would join the event if it waited for the IO thread's tick. A short turn's
burst (the echo agent's) comes faster and leaves with the turn's end, unwoken."""

CHUNK_RUN_LIMIT = 512
"""The most text chunks one frame to the host carries
(:meth:`ActorTurnContext.emit_all_nowait`): a burst's frames stay small beside the
stream window, and the host passes each on without holding up other turns for long."""


def failure_marker(message: str) -> str:
    """What ends the text of a failed turn that is kept for its partial output."""
    return f"{FAILURE_MARKER_START}{message}]"


class TurnAborted(AgentFailure):
    """A message of the turn cannot be put on the wire: the turn fails with this reason."""


@dataclass(slots=True)
class _Text:
    """A run of text of one role (``user``, ``assistant``, ``thought``), or, among a
    recorder's updates, a run of plain text chunks of one ``sessionUpdate`` kind."""

    role: str
    parts: list[str]
    message_id: Any = None  # a run of chunks: the ``messageId`` they all carry


@dataclass(slots=True)
class _Tool:
    call_id: str
    name: str
    title: str
    kind: str
    arguments: Any
    step: int = 0
    result: str = ""
    outcome: str = ""


_CHUNK_KINDS = {MessageChunk: "agent_message_chunk", ThoughtChunk: "agent_thought_chunk"}
_FINAL_STATUSES = ("completed", "failed")


@dataclass(slots=True)
class TurnRecorder:
    """Accumulates a turn as its client gets it: the ACP updates in order (each run of
    plain text chunks of one kind and message as one :func:`chunk_run`), and as items
    (the prompt, then merged text and tool calls) for the store's index and the agent's history."""

    prompt: str
    _items: list[_Text | _Tool] = field(default_factory=list)
    _tools: dict[str, _Tool] = field(default_factory=dict)
    _denied: set[str] = field(default_factory=set)
    _answer: list[str] = field(default_factory=list)
    _updates: list[dict[str, Any] | _Text] = field(default_factory=list)

    def add(self, event: Event) -> None:
        chunk_kind = _CHUNK_KINDS.get(type(event))
        if chunk_kind is not None:  # the way of every streamed chunk
            text: str = event.text  # type: ignore[union-attr]
            self._add_chunk(chunk_kind, text)
            return
        if isinstance(event, AgentUpdate):
            chunk = _joinable_chunk(event.update)
            if chunk is not None:
                self._add_chunk(*chunk)
                return
            self._updates.append(event.update)
            self._index_update(event.update)
            return
        self._updates.append(update_of(event))
        if isinstance(event, ToolCallStarted):
            self._start_tool(event.tool_call_id, event.name, event.title, event.kind,
                             event.raw_input, event.step)
        elif isinstance(event, ToolCallFinished) and event.status in _FINAL_STATUSES:
            self._finish_tool(event.tool_call_id, event.status, event.text)

    @property
    def streamed(self) -> bool:
        """Whether the turn produced anything yet (text, a thought or a tool call)."""
        return bool(self._items)

    def mark_denied(self, tool_call_id: str) -> None:
        """The next failure of this call is recorded as ``denied``."""
        self._denied.add(tool_call_id)

    def _add_chunk(self, kind: str, text: str, message_id: Any = None) -> None:
        last = self._updates[-1] if self._updates else None
        if isinstance(last, _Text) and last.role == kind and last.message_id == message_id:
            last.parts.append(text)
        else:
            self._updates.append(_Text(kind, [text], message_id))
        if kind == "agent_message_chunk":
            self._answer.append(text)
            self._add_text("assistant", text)
        else:
            self._add_text("thought", text)

    def _add_text(self, role: str, text: str) -> None:
        last = self._items[-1] if self._items else None
        if isinstance(last, _Text) and last.role == role:
            last.parts.append(text)
        else:
            self._items.append(_Text(role, [text]))

    def _index_update(self, update: dict[str, Any]) -> None:
        """The items of a hosted agent's update (any optional field may be missing)."""
        kind = update.get("sessionUpdate")
        if kind in ("agent_message_chunk", "agent_thought_chunk"):
            text = content_text(update.get("content"))
            if text and kind == "agent_message_chunk":
                self._answer.append(text)
            if text:
                self._add_text("assistant" if kind == "agent_message_chunk" else "thought", text)
        elif kind in ("tool_call", "tool_call_update"):
            call_id = update.get("toolCallId")
            if isinstance(call_id, str) and call_id:
                self._index_tool_call(call_id, update)

    def _index_tool_call(self, call_id: str, update: dict[str, Any]) -> None:
        tool = self._tools.get(call_id)
        title, kind = update.get("title"), update.get("kind")
        if tool is None:
            title = title if isinstance(title, str) and title else "tool call"
            tool = self._start_tool(call_id, title, title,
                                    kind if isinstance(kind, str) and kind else "other",
                                    update.get("rawInput"))
        else:
            if isinstance(title, str) and title:
                tool.title = title
            if isinstance(kind, str) and kind:
                tool.kind = kind
            if "rawInput" in update:
                tool.arguments = update["rawInput"]
        status = update.get("status")
        if status in _FINAL_STATUSES:
            self._finish_tool(call_id, status, tool_result_text(update))

    def _start_tool(self, call_id: str, name: str, title: str, kind: str, arguments: Any,
                    step: int = 0) -> _Tool:
        tool = self._tools[call_id] = _Tool(call_id, name, title, kind, arguments, step)
        self._items.append(tool)
        return tool

    def _finish_tool(self, call_id: str, status: str, text: str) -> None:
        tool = self._tools.get(call_id)
        if tool is None:
            return
        tool.result = text
        if status == "completed":
            tool.outcome = "completed"
        else:
            tool.outcome = "denied" if call_id in self._denied else "failed"

    def build(self, session_id: str, *, cancelled: bool, started_at: float,
              stop_reason: str | None = None, extra: dict[str, Any] | None = None,
              failure: str | None = None) -> TurnRecord:
        """The finished turn; a cancelled one gets :data:`CANCEL_MARKER` after its text,
        a failed one (``failure``: the error) its :func:`failure_marker`.

        ``stop_reason`` is the agent's (default ``end_turn``; a cancelled turn is
        always ``cancelled``, a failed one ``failed``); ``extra`` is the record's
        ``extra`` (see TurnResult).
        """
        content = "".join(self._answer)
        marker = CANCEL_MARKER if cancelled else None
        if failure is not None and not cancelled:
            marker, stop_reason = failure_marker(failure), "failed"
        if marker is not None:
            separator = "\n" if content and not content.endswith("\n") else ""
            self._add_chunk("agent_message_chunk", separator + marker)
            content = "".join(self._answer)
        items: list[TurnItem] = [TextItem(role="user", text=self.prompt)]
        items.extend(self._item(part, cancelled) for part in self._items)
        tokens = sum(estimate_tokens(i.text if isinstance(i, TextItem) else i.result)
                     for i in items)
        return TurnRecord(
            session_id=session_id,
            items=tuple(items),
            stop_reason="cancelled" if cancelled else (stop_reason or "end_turn"),
            content=content,
            started_at=started_at,
            finished_at=time.time(),
            tokens=tokens,
            extra=extra or {},
            updates=tuple(_stored(update) for update in self._updates),
        )

    @staticmethod
    def _item(part: _Text | _Tool, cancelled: bool) -> TurnItem:
        if isinstance(part, _Text):
            role: Any = part.role
            return TextItem(role=role, text="".join(part.parts))
        unfinished = "cancelled" if cancelled else "no result"
        return ToolItem(
            tool_call_id=part.call_id,
            name=part.name,
            arguments=part.arguments,
            result=part.result if part.outcome else unfinished,
            outcome=part.outcome or "failed",
            title=part.title,
            kind=part.kind,
            step=part.step,
        )


def _stored(update: dict[str, Any] | _Text) -> dict[str, Any]:
    return chunk_run(update.role, update.parts, update.message_id) if isinstance(
        update, _Text) else update


_JOINABLE_KEYS = frozenset({"sessionUpdate", "content", "messageId"})


def _joinable_chunk(update: dict[str, Any]) -> tuple[str, str, Any] | None:
    """``(kind, text, messageId)`` of a hosted agent's text chunk that says nothing but
    its text (and the message it belongs to): runs of those are stored as one entry."""
    kind = update.get("sessionUpdate")
    if kind not in ("agent_message_chunk", "agent_thought_chunk") or not (
            update.keys() <= _JOINABLE_KEYS):
        return None
    content = update.get("content")
    if type(content) is not dict or content.keys() != {"type", "text"}:
        return None
    text = content["text"]
    if content["type"] != "text" or type(text) is not str:
        return None
    return kind, text, update.get("messageId")


class _SessionSettings(Protocol):
    """What a turn reads of its session's fixed settings."""

    @property
    def sid(self) -> str: ...
    @property
    def agent(self) -> Mapping[str, Any]: ...
    @property
    def paths(self) -> PathPolicy: ...
    @property
    def permission_timeout(self) -> float: ...


class _ModeSource(Protocol):
    @property
    def mode(self) -> str: ...


class _UserWaits(Protocol):
    """Pending waits on the user, resolved by the IO thread."""

    def open(self, sid: str, request_id: str) -> Future[Any]: ...
    def discard(self, request_id: str) -> None: ...


class StreamCredit(Protocol):
    """The turn's stream window: :meth:`spend` waits while the client lags behind."""

    def spend(self, nbytes: int) -> None: ...
    def spend_nowait(self, nbytes: int) -> bool: ...


class TurnSession(Protocol):
    """The narrow view of a session that a turn runs against (its session actor
    satisfies it), so that this module does not depend on :mod:`actors.worker.session`."""

    @property
    def config(self) -> _SessionSettings: ...
    @property
    def state(self) -> _ModeSource: ...
    @property
    def permissions(self) -> _UserWaits: ...
    @property
    def tools(self) -> Mapping[str, Tool]: ...
    @property
    def tool_rules(self) -> MutableMapping[str, str]: ...
    @property
    def history(self) -> Sequence[TurnItem]: ...
    @property
    def history_tokens(self) -> int: ...
    def send(self, message: WorkerMessage) -> int | None: ...
    def wake(self) -> None: ...
    @property
    def send_event_frame(self) -> Callable[[bytes], int | None] | None: ...
    @property
    def send_event_frame_now(self) -> Callable[[bytes], int | None] | None: ...


class ActorTurnContext:
    """The :class:`actors.worker.agents.base.TurnContext` of one turn (actor thread)."""

    def __init__(
        self, session: TurnSession, turn_id: str, cancelled: threading.Event,
        recorder: TurnRecorder, window: StreamCredit,
    ) -> None:
        self._session = session
        self._sid = session.config.sid
        self._turn_id = turn_id
        self._cancelled = cancelled
        self._recorder = recorder
        self._window = window
        self._last_event = time.monotonic()
        self._send_frame = session.send_event_frame
        self._send_frame_now = session.send_event_frame_now or self._send_and_wake
        #: Each text chunk kind's frame up to its text (see :func:`encode_chunk`).
        self._chunk_prefixes: dict[type[Any], bytes] = {
            kind: chunk_frame_prefix(self._sid, turn_id, kind.KIND)
            for kind in (MessageChunk, ThoughtChunk)
        }
        #: The same for a run of chunks (:func:`encode_chunk_run`), made when first needed.
        self._run_prefixes: dict[type[Any], bytes] = {}
        self.failure: str | None = None
        """Set when a message of the turn could not be sent: the turn then fails,
        even if the agent caught the :class:`TurnAborted` it got."""
        self.agent_error: dict[str, Any] | None = None
        """The JSON-RPC error a hosted agent failed the turn with, for the client."""

    @property
    def cancelled(self) -> threading.Event:
        return self._cancelled

    @property
    def workspace(self) -> Path:
        return self._session.config.paths.cwd

    @property
    def history(self) -> Sequence[TurnItem]:
        return self._session.history

    @property
    def history_tokens(self) -> int:
        return self._session.history_tokens

    def emit(self, event: Event) -> None:
        """Record ``event`` and stream it; waits while the host's client lags a whole
        stream window behind (see :class:`actors.worker.session.StreamWindow`)."""
        self._recorder.add(event)
        size = self._stream(event)
        if size:
            self._window.spend(size)

    def emit_all_nowait(self, events: Sequence[Event]) -> bool:
        """:meth:`emit` of each of ``events`` without waiting for credit: whether the
        stream window still has room. Consecutive text chunks of one kind go to the
        host as one frame (:func:`encode_chunk_run`; up to :data:`CHUNK_RUN_LIMIT`
        each), which it still sends on one update per chunk. Any thread, while the
        turn's thread does not emit (a hosted agent's loop thread relays its updates
        so)."""
        spent = 0
        run: list[str] = []
        run_kind: type[Any] | None = None
        for event in events:
            self._recorder.add(event)
            kind = type(event)
            if kind is run_kind and len(run) < CHUNK_RUN_LIMIT:
                run.append(event.text)  # type: ignore[union-attr]
                continue
            if run_kind is not None:
                spent += self._stream_run(run_kind, run) or 0
                run, run_kind = [], None
            if kind in self._chunk_prefixes and self._send_frame is not None:
                run, run_kind = [event.text], kind  # type: ignore[union-attr]
            else:
                spent += self._stream(event) or 0
        if run_kind is not None:
            spent += self._stream_run(run_kind, run) or 0
        return self._window.spend_nowait(spent) if spent else True

    def _stream_run(self, kind: type[Any], texts: list[str]) -> int | None:
        """Send a run of ``kind`` chunks: as one chunk's frame when it is one."""
        if len(texts) == 1:
            return self._stream(kind(texts[0]))
        prefix = self._run_prefixes.get(kind)
        if prefix is None:
            prefix = self._run_prefixes[kind] = chunk_frame_prefix(
                self._sid, self._turn_id, kind.KIND, run=True)
        assert self._send_frame is not None
        send = self._send_frame_now if self._note_event() else self._send_frame
        try:
            return send(encode_chunk_run(prefix, texts))
        except EncodeError as exc:
            raise self._unstreamable(exc) from None

    def _note_event(self) -> bool:
        """Note an event sent now; whether it is the first after a quiet spell."""
        now = time.monotonic()
        quiet = now - self._last_event >= QUIET_SECONDS
        self._last_event = now
        return quiet

    def _stream(self, event: Event) -> int | None:
        """Send ``event``; the first after a quiet spell (see :data:`QUIET_SECONDS`)
        goes at once (from this thread when the DEALER is free, else by waking the IO
        thread), where others may wait for the IO thread's tick."""
        quiet = self._note_event()
        prefix = self._chunk_prefixes.get(type(event))
        if prefix is not None and self._send_frame is not None:  # the way of every chunk
            return self._send_chunk(prefix, event.text, now=quiet)  # type: ignore[union-attr]
        size = self._send(TurnEvent(sid=self._sid, turn_id=self._turn_id,
                                    event=event_to_wire(event)))
        if quiet:
            self._session.wake()
        return size

    def _send_chunk(self, prefix: bytes, text: str, *, now: bool) -> int | None:
        """:meth:`_send` for a text chunk, encoded straight to its frame; ``now``: sent
        at once (it came after a quiet spell), not left for the IO thread's tick."""
        assert self._send_frame is not None
        send = self._send_frame_now if now else self._send_frame
        try:
            return send(encode_chunk(prefix, text))
        except EncodeError as exc:
            raise self._unstreamable(exc) from None

    def _send_and_wake(self, frame: bytes) -> int | None:
        """``send_event_frame_now`` for a session without it: queue, then wake."""
        assert self._send_frame is not None
        size = self._send_frame(frame)
        self._session.wake()
        return size

    def _send(self, message: WorkerMessage) -> int | None:
        """Hand ``message`` to the IO thread; raises :class:`TurnAborted` when it
        cannot be encoded (e.g. tool arguments nested past the encoder's limit)."""
        try:
            return self._session.send(message)
        except EncodeError as exc:
            raise self._unstreamable(exc) from None

    def _unstreamable(self, exc: EncodeError) -> TurnAborted:
        """The turn fails: one of its messages cannot be encoded."""
        self.failure = f"this turn cannot be streamed: {exc}"
        logger.warning("session %s: %s", self._sid, self.failure)
        return TurnAborted(self.failure)

    def ask_permission(
        self, tool_call_id: str, tool_name: str, title: str, kind: str, raw_input: Any,
        preview: tuple[ToolContent, ...] = (), *, request: Mapping[str, Any] | None = None,
    ) -> str | None:
        """Ask the client; ``preview`` shows what the call would do (a diff); ``request``
        is a hosted agent's own request, which the client gets instead."""
        answer = self._wait_for_user("perm", lambda request_id: PermissionAsk(
            sid=self._sid, turn_id=self._turn_id, request_id=request_id,
            tool_call_id=tool_call_id, tool_name=tool_name, title=title, kind=kind,
            raw_input=raw_input, content=[content_to_wire(item) for item in preview],
            request=dict(request) if request is not None else None,
        ))
        return answer if isinstance(answer, str) else None

    def ask_user(self, message: str, schema: dict[str, Any]) -> dict[str, Any] | None:
        """Ask the user a question; ``{action, content}``, or None when no answer came."""
        answer = self._wait_for_user("ask", lambda request_id: UserAsk(
            sid=self._sid, turn_id=self._turn_id, request_id=request_id,
            message=message, schema=schema,
        ))
        return answer if isinstance(answer, dict) else None

    def _wait_for_user(self, kind: str, ask: Callable[[str], WorkerMessage]) -> Any:
        """Send ``ask(request_id)`` and block (this turn's thread) until the IO thread
        resolves the wait with the client's answer; None if cancelled or timed out."""
        board = self._session.permissions
        request_id = f"{kind}-{uuid.uuid4().hex[:16]}"
        future = board.open(self._sid, request_id)
        if self._cancelled.is_set():
            board.discard(request_id)
            return None
        try:
            self._send(ask(request_id))
        except TurnAborted:
            board.discard(request_id)
            raise
        try:
            return future.result(timeout=self._session.config.permission_timeout)
        except TimeoutError:
            board.discard(request_id)
            logger.info("session %s: %s timed out", self._sid, request_id)
            return None

    def run_tool(self, name: str, raw_input: Any, call_id: str | None = None,
                 step: int = 0) -> ToolCallOutcome:
        call_id = call_id or f"call_{uuid.uuid4().hex[:16]}"
        tool = self._session.tools.get(name)
        args = raw_input if isinstance(raw_input, dict) else {}
        title = tool.title(args) if tool else name
        kind = tool.kind if tool else "other"
        locations = tool.locations(args, self._session.config.paths) if tool else ()
        self.emit(ToolCallStarted(call_id, name, title, kind, raw_input, locations, step))
        if tool is None:
            known = ", ".join(sorted(self._session.tools))
            return self._finish(call_id, name, "failed", f"unknown tool {name!r} (known: {known})")
        if not isinstance(raw_input, dict):
            return self._finish(call_id, name, "failed", "tool arguments must be a JSON object")
        refusal = self._authorise(tool, call_id, title, raw_input)
        if refusal is not None:
            return self._finish(call_id, name, "denied", refusal)
        return self._execute(tool, call_id, args)

    def _authorise(self, tool: Tool, call_id: str, title: str, args: Any) -> str | None:
        """None when the call may run, else why not (the session mode is read now).

        In ``supervised`` mode an earlier allow-always or reject-always answer for
        the tool stands in for the question."""
        if self._cancelled.is_set():
            return "denied: the turn was cancelled"
        if not tool.mutating:
            return None
        mode = self._session.state.mode
        remembered = self._session.tool_rules.get(tool.name)
        if mode == "full" or (mode == "supervised" and remembered == "allow_always"):
            return None
        if mode != "supervised":
            return f"denied: autonomy is {mode}"
        if remembered == "reject_always":
            return f"denied: the user chose to always reject {tool.name}"
        unavailable = tool.unavailable()  # no point asking for what cannot run
        if unavailable is not None:
            return unavailable
        preview = tool.preview(args, self._session.config.paths)
        choice = self.ask_permission(call_id, tool.name, title, tool.kind, args, preview)
        mode = self._session.state.mode  # set_mode may have come while the client decided
        if mode == "read_only":
            return f"denied: autonomy is {mode}"
        normalized = choice.replace("-", "_") if choice else None
        if normalized in ("allow_always", "reject_always"):
            self._remember_answer(tool.name, normalized)
        if normalized in ("allow_always", "allow_once"):
            return None
        if choice is None:
            return "denied: the permission request was cancelled or timed out"
        return f"denied: the user chose {choice!r}"

    def _remember_answer(self, tool_name: str, decision: str) -> None:
        """Keep an always-answer for the session, and have the host store it."""
        rules = self._session.tool_rules
        rules[tool_name] = decision
        self._send(PermissionRules(sid=self._sid, rules=dict(rules)))

    def _execute(self, tool: Tool, call_id: str, args: dict[str, Any]) -> ToolCallOutcome:
        config = self._session.config
        env = ToolEnv(paths=config.paths, cancelled=self._cancelled,
                      agent_env=config.agent.get("env") or {}, ask_user=self.ask_user)
        self.emit(ToolCallFinished(call_id, tool.name, "in_progress", None, ""))
        try:
            result = tool.run(args, env)
        except ToolError as exc:
            return self._finish(call_id, tool.name, "failed", str(exc))
        except Exception as exc:
            logger.exception("session %s: tool %s raised", self._sid, tool.name)
            return self._finish(call_id, tool.name, "failed",
                                f"tool error: {type(exc).__name__}: {exc}")
        outcome = "completed" if result.ok else "failed"
        return self._finish(call_id, tool.name, outcome, result.text, result.raw_output, result)

    def _finish(
        self, call_id: str, name: str, outcome: str, text: str, raw_output: Any = None,
        result: ToolResult | None = None,
    ) -> ToolCallOutcome:
        if outcome == "denied":
            self._recorder.mark_denied(call_id)
        if raw_output is None and outcome != "completed":
            raw_output = {"error": text}
        status = "completed" if outcome == "completed" else "failed"
        if result is None:
            self.emit(ToolCallFinished(call_id, name, status, raw_output, text))
        else:
            self.emit(ToolCallFinished(call_id, name, status, raw_output, text, result.content,
                                       result.locations, result.title))
        return ToolCallOutcome(call_id, outcome, text, raw_output)
