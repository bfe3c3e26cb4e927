"""SessionActor: one live session inside a worker process, running its turns.

Threads:
- the session's actor thread (pykka) runs turns: the agent, its tools, and the
  waits for permission replies;
- the worker's IO thread creates the actor, and touches only the thread-safe
  parts: :class:`SessionState` (mode, the running turn's cancel flag) and the
  :class:`PermissionBoard` (it completes or withdraws permission waits).

Outgoing messages go through ``send``, a thread-safe callable that hands them
to the IO thread.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from actors.bridge import SimpleInboxActor
from actors.worker.agents.base import (
    Agent,
    AgentFailure,
    AgentRefused,
    ClientChannel,
    SessionSetup,
    TurnResult,
    history_tokens,
)
from actors.worker.cancel import TurnCancel
from actors.worker.tools import PathPolicy, Tool, default_tools
from actors.worker.turn import ActorTurnContext, TurnRecorder
from ipc.events import TurnItem, TurnRecord, item_from_wire
from ipc.modes import MODE_IDS
from ipc.worker_wire import (
    STREAM_WINDOW_BYTES,
    AgentOpened,
    ClientCall,
    EncodeError,
    McpServersStatus,
    OpenSession,
    SessionClosed,
    TurnEnded,
    TurnFailed,
    WorkerMessage,
    stored_tool_rules,
)

__all__ = [
    "CloseActor",
    "PermissionBoard",
    "RunTurn",
    "SessionActor",
    "SessionConfig",
    "SessionState",
    "StreamWindow",
]

logger = logging.getLogger("zeroclaw.session")

SendFn = Callable[[WorkerMessage], int | None]
"""Queue a message for the host; the bytes it takes on the wire (None: not counted).
Raises :class:`ipc.worker_wire.EncodeError` for a message that cannot be encoded."""


def _no_wake() -> None:
    """Nothing to wake: messages are delivered as they are sent."""


def check_mode(mode: str) -> str:
    if mode not in MODE_IDS:
        raise ValueError(f"unknown mode {mode!r} (known: {', '.join(MODE_IDS)})")
    return mode


class StreamWindow:
    """Flow control of one turn's stream: the bytes of its events that the host has
    not yet confirmed passing on to its client (:class:`ipc.worker_wire.Credit`).

    Thread-safe: spent on the turn's thread, which waits while the window is used
    up, so a client that does not read slows its own session's agent instead of
    growing a queue; granted on the IO thread; opened for good when the turn is
    cancelled, so a waiting turn ends promptly.
    """

    def __init__(self, size: int = STREAM_WINDOW_BYTES,
                 changed: threading.Condition | None = None) -> None:
        """``changed``: the condition to wait on, shared by the windows of one session's
        turns (only its running turn ever waits), so a turn does not build its own."""
        self.size = size
        self._spent = 0  # written by the thread streaming the turn (one at a time)
        self._granted = 0  # written under the lock by the IO thread only
        self._open = False
        self._changed = changed if changed is not None else threading.Condition(threading.Lock())

    def spend(self, nbytes: int) -> None:
        """Count ``nbytes`` just queued; wait while the window is full (turn thread).
        Takes no lock while there is room: this is on the way of every event."""
        self._spent += nbytes
        if self._spent - self._granted < self.size or self._open:
            return
        with self._changed:
            while self._spent - self._granted >= self.size and not self._open:
                self._changed.wait()

    def spend_nowait(self, nbytes: int) -> bool:
        """Count ``nbytes`` just queued, without waiting: whether there is still room."""
        self._spent += nbytes
        return self._spent - self._granted < self.size or self._open

    def grant(self, nbytes: int) -> None:
        """The host passed ``nbytes`` on (IO thread)."""
        with self._changed:
            self._granted += nbytes
            self._changed.notify_all()

    def open(self) -> None:
        """Stop waiting for credit (the turn was cancelled or the session closes)."""
        with self._changed:
            self._open = True
            self._changed.notify_all()


class SessionState:
    """The part of a session the IO thread may touch while a turn runs. Thread-safe."""

    def __init__(self, sid: str, mode: str) -> None:
        self.sid = sid
        self._mode = check_mode(mode)
        self._lock = threading.Lock()
        self._turn_cancel: threading.Event | None = None
        self._turn_id = ""
        self._window_changed = threading.Condition(threading.Lock())
        self._window = StreamWindow(changed=self._window_changed)

    @property
    def mode(self) -> str:
        return self._mode

    def set_mode(self, mode: str) -> None:
        """Takes effect at the next tool call; raises ValueError for an unknown mode."""
        self._mode = check_mode(mode)

    @property
    def busy(self) -> bool:
        return self._turn_cancel is not None

    @property
    def window(self) -> StreamWindow:
        """The running (or last) turn's stream window."""
        return self._window

    def begin_turn(self, turn_id: str = "") -> threading.Event | None:
        """The new turn's cancel flag, or None if a turn is already running (IO thread).
        The turn gets a fresh :class:`StreamWindow`."""
        with self._lock:
            if self._turn_cancel is not None:
                return None
            self._turn_cancel = TurnCancel()
            self._turn_id = turn_id
            self._window = StreamWindow(changed=self._window_changed)
            return self._turn_cancel

    def grant(self, turn_id: str, nbytes: int) -> None:
        """Credit from the host for ``turn_id``'s stream; ignored for an older turn."""
        with self._lock:
            window = self._window if turn_id == self._turn_id else None
        if window is not None:
            window.grant(nbytes)

    def end_turn(self, cancel: threading.Event) -> None:
        """Forget the running turn (actor thread), before its result is sent."""
        with self._lock:
            if self._turn_cancel is cancel:
                self._turn_cancel = None

    def cancel(self) -> bool:
        """Set the running turn's cancel flag; False when no turn runs."""
        with self._lock:
            if self._turn_cancel is None:
                return False
            self._turn_cancel.set()
            self._window.open()
            return True


class PermissionBoard:
    """Pending waits on the user (permissions, questions) of one worker, by request id.

    Thread-safe: opened on session threads, resolved on the IO thread. A wait's
    value is the client's answer (an option id, or an ``{action, content}`` map);
    None means no answer (cancelled, withdrawn, or the client is gone).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waits: dict[str, tuple[str, Future[Any]]] = {}

    def open(self, sid: str, request_id: str) -> Future[Any]:
        future: Future[Any] = Future()
        with self._lock:
            self._waits[request_id] = (sid, future)
        return future

    def resolve(self, request_id: str, option_id: Any) -> bool:
        """Complete one wait with the client's answer; False if it is not pending."""
        with self._lock:
            entry = self._waits.pop(request_id, None)
        if entry is None:
            return False
        entry[1].set_result(option_id)
        return True

    def withdraw_session(self, sid: str) -> int:
        """Deny every pending wait of ``sid`` (its turn was cancelled); how many there were."""
        with self._lock:
            ids = [rid for rid, (owner, _) in self._waits.items() if owner == sid]
            futures = [self._waits.pop(rid)[1] for rid in ids]
        for future in futures:
            future.set_result(None)
        return len(futures)

    def discard(self, request_id: str) -> None:
        with self._lock:
            self._waits.pop(request_id, None)


@dataclass(frozen=True, slots=True)
class SessionConfig:
    """What a session is, fixed when it opens (built on the IO thread)."""

    sid: str
    agent: dict[str, Any]
    paths: PathPolicy
    permission_timeout: float
    history: tuple[TurnItem, ...]
    mcp_servers: tuple[Any, ...] = ()
    meta: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_open(cls, message: OpenSession) -> SessionConfig:
        """Raises ValueError (bad history, paths) for the worker to answer OpenFailed."""
        try:
            history = tuple(item_from_wire(item) for item in message.history)
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"bad history item: {exc.__class__.__name__}") from None
        tenant = bool(message.meta.get("tenant"))
        paths = PathPolicy.build(message.cwd, message.workspace_dir, message.forbidden_paths,
                                 tenant=tenant, network=message.sandbox_network)
        return cls(
            sid=message.sid,
            agent=message.agent,
            paths=paths,
            permission_timeout=float(message.permission_timeout),
            history=history,
            mcp_servers=tuple(message.mcp_servers),
            meta=dict(message.meta),
        )


@dataclass(frozen=True, slots=True)
class RunTurn:
    """Actor message: run one turn; ``cancelled`` came from :meth:`SessionState.begin_turn`."""

    turn_id: str
    prompt: str
    cancelled: threading.Event


@dataclass(frozen=True, slots=True)
class CloseActor:
    """Actor message: answer SessionClosed (when ``confirm``) and stop (queued behind
    any running turn)."""

    close_id: int = 0
    confirm: bool = True


class SessionActor(SimpleInboxActor):
    """One session: runs turns one at a time on its own (daemon) thread."""

    use_daemon_thread = True

    def __init__(
        self,
        *,
        config: SessionConfig,
        state: SessionState,
        agent: Agent,
        send: SendFn,
        permissions: PermissionBoard,
        tools: dict[str, Tool] | None = None,
        wake: Callable[[], None] | None = None,
        send_event_frame: Callable[[bytes], int | None] | None = None,
        send_event_frame_now: Callable[[bytes], int | None] | None = None,
    ) -> None:
        super().__init__()
        self.config = config
        self.state = state
        self.agent = agent
        self.send = send
        #: Wakes the IO thread to send what is queued now (any thread; see
        #: :data:`actors.worker.turn.QUIET_SECONDS`).
        self.wake = wake or _no_wake
        #: Queues an encoded TurnEvent (a streamed chunk) as ``send`` would queue the
        #: message; without it, chunks go through ``send`` as TurnEvents.
        self.send_event_frame = send_event_frame
        #: ``send_event_frame`` and ``wake`` in one, for an event after a quiet spell
        #: (any thread); without it, the two are called.
        self.send_event_frame_now = send_event_frame_now
        self.permissions = permissions
        self.tools = tools if tools is not None else default_tools()
        self.history: list[TurnItem] = list(config.history)
        self.history_tokens = history_tokens(self.history)
        #: Remembered permission answers: tool name to allow_always / reject_always.
        self.tool_rules: dict[str, str] = stored_tool_rules(dict(config.meta))

    def on_start(self) -> None:
        config = self.config
        try:
            self.agent.open(SessionSetup(
                sid=config.sid, paths=config.paths, mode=lambda: self.state.mode,
                mcp_servers=config.mcp_servers, has_history=bool(config.history),
                meta=config.meta, client=ClientChannel(self._call_client,
                                                       config.permission_timeout,
                                                       self._notify_client),
                modes_changed=self._report_agent_modes, tools=self.tools,
                report_mcp=self._report_mcp,
            ))
        except Exception:  # the first turn reports what is wrong
            logger.exception("session %s: agent could not open", config.sid)
        if self.agent.reports_open:  # the host waits for it (the agent's own modes)
            self._report_agent_modes()

    def _report_agent_modes(self) -> None:
        """Tell the host the agent's own modes: once open, and whenever the agent
        switches its mode itself (any thread: a hosted agent's loop thread)."""
        self.send(AgentOpened(sid=self.config.sid, modes=self.agent.own_modes()))

    def _report_mcp(self, servers: list[dict[str, Any]]) -> None:
        """The session's MCP servers, for the host's ``status`` (any thread)."""
        self.send(McpServersStatus(sid=self.config.sid, servers=servers))

    def _call_client(self, method: str, params: dict[str, Any]) -> Future[Any]:
        """Send a :class:`ClientCall` for the host to relay (any thread: a hosted agent's
        loop thread); the future settles when the IO thread gets its ClientReply, or
        with None when the session's waits are withdrawn. Raises EncodeError."""
        request_id = f"client-{uuid.uuid4().hex[:16]}"
        future = self.permissions.open(self.config.sid, request_id)
        try:
            self.send(ClientCall(sid=self.config.sid, request_id=request_id, method=method,
                                 params=params))
        except EncodeError:
            self.permissions.discard(request_id)
            raise
        return future

    def _notify_client(self, method: str, params: dict[str, Any]) -> None:
        """Send a :class:`ClientCall` notification for the host to pass on (any thread);
        nothing answers it. Raises EncodeError."""
        self.send(ClientCall(sid=self.config.sid, request_id="", method=method,
                             params=params, notification=True))

    def on_stop(self) -> None:
        try:
            self.agent.close()
        except Exception:
            logger.exception("session %s: agent could not close", self.config.sid)

    def on_receive(self, message: Any) -> Any:
        if isinstance(message, RunTurn):
            self._run_turn(message)
        elif isinstance(message, CloseActor):
            if message.confirm:
                self.send(SessionClosed(sid=self.config.sid, close_id=message.close_id))
            self.stop()
        else:
            logger.warning("session %s: unexpected actor message %r", self.config.sid, message)
        return None

    def _run_turn(self, turn: RunTurn) -> None:
        started = time.time()
        recorder = TurnRecorder(turn.prompt)
        ctx = ActorTurnContext(self, turn.turn_id, turn.cancelled, recorder, self.state.window)
        result, failure = self._play(turn, ctx)
        cancelled = turn.cancelled.is_set()
        if ctx.failure is not None or (failure is not None and not cancelled):
            reason = ctx.failure or failure or "turn failed"
            partial = (recorder.build(self.config.sid, cancelled=False, started_at=started,
                                      failure=reason) if recorder.streamed else None)
            self._fail(turn.turn_id, reason, partial, None if ctx.failure else ctx.agent_error)
            return
        result = result or TurnResult()
        extra = {name: value for name, value in (("meta", result.meta),
                                                  ("session_meta", result.session_meta)) if value}
        record = recorder.build(self.config.sid, cancelled=cancelled, started_at=started,
                                stop_reason=result.stop_reason, extra=extra)
        try:
            self.send(TurnEnded(sid=self.config.sid, turn_id=turn.turn_id,
                                record=record.to_wire()))
        except EncodeError as exc:
            self._fail(turn.turn_id, f"the turn cannot be recorded: {exc}")
            return
        self._remember(record)

    def _play(self, turn: RunTurn, ctx: ActorTurnContext) -> tuple[TurnResult | None, str | None]:
        """Run the agent: what it returned, and why it failed (None: it did not).
        The turn is over for the IO thread after."""
        sid = self.config.sid
        try:
            return self.agent.run_turn(turn.prompt, ctx), None
        except AgentRefused as exc:
            ctx.agent_error = exc.error
            return None, str(exc)
        except AgentFailure as exc:
            return None, str(exc) or "agent failed"
        except Exception as exc:
            logger.exception("session %s: agent raised", sid)
            return None, f"agent error: {type(exc).__name__}: {exc}"
        finally:
            self.permissions.withdraw_session(sid)
            self.state.end_turn(turn.cancelled)

    def _fail(self, turn_id: str, reason: str, partial: TurnRecord | None = None,
              error: dict[str, Any] | None = None) -> None:
        """The turn failed (the host answers -32603 with ``reason``, or the agent's own
        ``error``). ``partial``, what it streamed before, goes along to be kept, unless
        it cannot be encoded either."""
        if partial is not None:
            try:
                self.send(TurnFailed(sid=self.config.sid, turn_id=turn_id, message=reason,
                                     record=partial.to_wire(), error=error))
            except EncodeError:
                logger.warning("session %s: the failed turn's output cannot be kept",
                               self.config.sid)
            else:
                self._remember(partial)
                return
        self.send(TurnFailed(sid=self.config.sid, turn_id=turn_id, message=reason, error=error))

    def _remember(self, record: TurnRecord) -> None:
        self.history.extend(record.items)
        self.history_tokens += history_tokens(record.items)
