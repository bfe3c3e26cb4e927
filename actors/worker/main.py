"""A worker process: ``python -m actors.worker.main --endpoint ... --identity ... --host-pid ...``.

Threads:
- the IO thread (the main thread) owns the zmq DEALER. It dispatches host
  messages, and handles cancel, permission replies and mode changes itself, so
  none of them waits behind a running turn in an actor's mailbox;
- one :class:`actors.worker.session.SessionActor` thread per session runs turns. Actor
  threads never touch the socket: they hand messages to :class:`Outbox`, which
  wakes the IO thread through an eventfd it polls next to the socket (once per
  burst). The IO thread sends what is queued as one zmq message (one frame,
  the envelopes a line each), so a turn's events cost one send, not one each.

A turn's events are flow-controlled end to end: the turn's thread waits while
its :class:`actors.worker.session.StreamWindow` is used up, and the host grants credit
(:class:`ipc.worker_wire.Credit`) as its client takes the stream. So what is
queued here is bounded by one window per streaming session (256 KiB) plus
control messages, however slow a client is.

The worker says WorkerReady at start and Heartbeat every period, and exits on
Shutdown, or when its host is gone: the parent pid changed (the host was killed
and the worker re-parented) or no Ping came for five periods. It is a child
subreaper and ends every process it started or adopted before it exits
(:mod:`actors.worker.process_tree`). Logs go to stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import logging
import os
import select
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import cast

import pykka
import zmq

from actors.worker import process_tree
from actors.worker.agent_calls import forward_agent_call
from actors.worker.agents import Agent, agent_processes, create_agent, stop_agent_processes
from actors.worker.session import (
    CloseActor,
    PermissionBoard,
    RunTurn,
    SessionActor,
    SessionConfig,
    SessionState,
)
from ipc.worker_wire import (
    AgentCall,
    CancelTurn,
    ClientReply,
    CloseSession,
    Credit,
    Heartbeat,
    HostMessage,
    OpenFailed,
    OpenSession,
    PermissionReply,
    Ping,
    SessionClosed,
    SessionOpened,
    SetMode,
    Shutdown,
    StartTurn,
    TurnEnded,
    TurnEvent,
    TurnFailed,
    UserAnswer,
    WireError,
    WorkerMessage,
    WorkerReady,
    decode,
    encode,
    join_envelopes,
)

__all__ = ["HOST_SILENCE_BEATS", "Outbox", "WorkerProcess", "main"]

logger = logging.getLogger("zeroclaw.worker")

HOST_SILENCE_BEATS = 5
_HWM = 10_000
# plain ints: zmq's IntEnum constants cost a conversion on every use (on every turn)
_EVENTS, _POLLIN, _POLLOUT = int(zmq.EVENTS), int(zmq.POLLIN), int(zmq.POLLOUT)
_TURN_ENDS = (TurnEnded, TurnFailed)
_FRAMES_PER_SEND = 256  # envelopes sent together as one zmq message
_FRAMES_PER_RECEIVE = 256  # host messages handled before the loop beats and flushes again
_STOP_ACTORS_SECS = 2.0
TICK_SECONDS = 0.002
"""How long a streamed event may wait in the :class:`Outbox` for more to join it."""


class Outbox:
    """Messages from any thread to the IO thread: a list plus an eventfd wake-up.

    The eventfd is written once per batch (until the IO thread takes it), not
    once per message: a turn's burst of events costs one wake-up. While the IO
    thread *ticks* (it will look again within :data:`TICK_SECONDS` on its own, see
    :meth:`take_all`), a :class:`ipc.worker_wire.TurnEvent` does not wake it at
    all: streamed events wait for the tick or for the next message that does wake
    it (the turn's end), and leave together. A short turn so costs the IO thread
    one wake-up for all it sends, and it never wakes in the middle of the burst
    to fight the turn's thread for the GIL. An event after a quiet spell of its
    turn (a model's first delta) does wake it (:meth:`wake`, see
    :data:`actors.worker.turn.QUIET_SECONDS`): waiting for more would gain nothing.
    """

    def __init__(self) -> None:
        self._frames: list[bytes] = []
        self._lock = threading.Lock()
        self._closed = False
        self._signalled = False
        self._ticking = False
        self._events_held = False  # TurnEvents queued without a wake-up since the last take
        self.fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)

    def put(self, message: WorkerMessage) -> int:
        """Queue ``message`` for the host (any thread); dropped once the worker is closing.

        Returns the bytes it takes on the wire (a turn's stream window counts
        them). Raises :class:`ipc.worker_wire.EncodeError` on the caller's thread
        when it cannot be encoded: the caller (a turn) fails on it, so nothing
        is dropped unnoticed.
        """
        return self._queue(encode(message), event=type(message) is TurnEvent)

    def put_frame(self, frame: bytes) -> int:
        """:meth:`put` for a message (not a TurnEvent) already encoded (any thread)."""
        return self._queue(frame, event=False)

    def put_event_frame(self, frame: bytes) -> int:
        """:meth:`put` for a :class:`ipc.worker_wire.TurnEvent` already encoded (a
        streamed chunk, see :func:`ipc.worker_wire.encode_chunk`; any thread)."""
        return self._queue(frame, event=True)

    def hold_event_frame(self, frame: bytes) -> int:
        """:meth:`put_event_frame` without waking the IO thread: the caller sends what
        is queued itself, soon (see :meth:`WorkerProcess.send_frame_now`)."""
        return self._queue(frame, event=True, wake=False)

    def _queue(self, frame: bytes, *, event: bool, wake: bool = True) -> int:
        with self._lock:
            if self._closed:
                return 0
            self._frames.append(frame)
            if self._signalled or not wake:
                pass
            elif self._ticking and event:
                self._events_held = True
            else:
                self._signalled = True
                os.eventfd_write(self.fd, 1)
        return len(frame)

    def take_all(self, *, tick: bool = False) -> list[bytes]:
        """Everything queued so far, oldest first (IO thread).

        Says whether the IO thread ticks from now on: when ``tick`` (it just
        started a turn) or when what it takes now are events that waited for a
        tick (a turn is streaming). A turn's end, or a pause in its stream,
        stops the ticking, and the next event wakes the IO thread again.
        """
        with self._lock:
            frames, self._frames = self._frames, []
            self._ticking = tick or (self._events_held and not self._signalled)
            self._events_held = False
            if self._signalled:
                self._signalled = False
                with contextlib.suppress(BlockingIOError):
                    os.eventfd_read(self.fd)
        return frames

    def put_and_take(self, message: WorkerMessage) -> tuple[int, list[bytes]]:
        """Queue ``message`` without waking the IO thread and take everything queued,
        for the caller to send now (holding the DEALER): its size, and the frames."""
        frame = encode(message)
        frames = self.take_queued()
        if self._closed:
            return 0, []
        frames.append(frame)
        return len(frame), frames

    def take_queued(self) -> list[bytes]:
        """Everything queued so far, for a caller that sends it now holding the DEALER
        (any thread): the IO thread's ticking and wake-up state stay as they are."""
        with self._lock:
            if self._closed:
                return []
            frames, self._frames = self._frames, []
            self._events_held = False
        return frames

    def wake(self) -> None:
        """Wake the IO thread (any thread): the DEALER needs it."""
        with self._lock:
            if not self._signalled and not self._closed:
                self._signalled = True
                os.eventfd_write(self.fd, 1)

    @property
    def ticking(self) -> bool:
        """Whether the IO thread promised to look again within a tick (IO thread)."""
        return self._ticking

    def close(self) -> None:
        with self._lock:
            self._closed = True
            os.close(self.fd)


class _RoundSender:
    """Sends a worker's queued frames once per round of one asyncio loop (that loop's
    thread): armed by each frame held for it, it runs after the round's callbacks."""

    def __init__(self, loop: asyncio.AbstractEventLoop, send: Callable[[], None]) -> None:
        self.loop = loop
        self._send = send
        self._armed = False

    def arm(self) -> None:
        if not self._armed:
            self._armed = True
            self.loop.call_soon(self._run)

    def _run(self) -> None:
        self._armed = False
        self._send()


@dataclass(slots=True)
class _LiveSession:
    actor: pykka.ActorRef[SessionActor]
    state: SessionState
    agent: Agent


class WorkerProcess:
    """The IO loop of one worker process (runs on the main thread)."""

    def __init__(self, *, endpoint: str, identity: str, host_pid: int, heartbeat: float) -> None:
        self.endpoint = endpoint
        self.identity = identity
        self.host_pid = host_pid
        self.heartbeat = heartbeat
        self.outbox = Outbox()
        self.permissions = PermissionBoard()
        self.sessions: dict[str, _LiveSession] = {}
        self._backlog: collections.deque[bytes] = collections.deque()
        #: ``sender``: the :class:`_RoundSender` of the loop that the thread runs (see
        #: :meth:`send_frame_now`); it goes with its thread.
        self._round_senders = threading.local()
        self._handoffs: list[tuple[_LiveSession, RunTurn | CloseActor]] = []
        self._exit_code: int | None = None
        self._last_heard = time.monotonic()
        self._next_beat = 0.0
        self._ctx = zmq.Context()
        self._dealer = self._connect()
        self._dealer_fd = cast(int, self._dealer.getsockopt(zmq.FD))
        #: Held by whichever thread uses the DEALER: the IO thread, or a session's
        #: thread sending its turn's end (:meth:`send`). zmq lets a socket move
        #: between threads behind a full memory barrier; the lock is one.
        self._dealer_lock = threading.Lock()

    def _connect(self) -> zmq.Socket[bytes]:
        dealer = self._ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.IDENTITY, self.identity.encode())
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.setsockopt(zmq.SNDHWM, _HWM)
        dealer.setsockopt(zmq.RCVHWM, _HWM)
        dealer.connect(self.endpoint)
        return dealer

    def run(self) -> int:
        """Serve until Shutdown or the host is gone; the process exit code."""
        self.outbox.put(WorkerReady(pid=os.getpid()))
        poller = select.poll()  # plain FDs: it lets go of the GIL at once
        poller.register(self.outbox.fd, select.POLLIN)
        poller.register(self._dealer_fd, select.POLLIN)  # edge-triggered: EVENTS says what
        try:
            while self._exit_code is None:
                self._beat_if_due()
                with self._dealer_lock:
                    started = self._receive_all()
                    self._backlog.extend(self.outbox.take_all(tick=started))
                    self._flush()
                    pending = self._dealer_pending()
                self._check_host()
                timeout = 0 if pending else self._poll_timeout_ms()
                self._hand_off()
                poller.poll(timeout)
        finally:
            self._teardown()
        return self._exit_code

    def send(self, message: WorkerMessage) -> int:
        """Queue ``message`` for the host (any thread; see :meth:`Outbox.put`).

        A turn's end (TurnEnded, TurnFailed) is sent at once by the calling thread
        (the session's), with everything queued before it, when the DEALER is free
        and nothing waits for back-pressure: the IO thread is not woken for it.
        """
        if type(message) not in _TURN_ENDS:
            return self.outbox.put(message)
        frame = encode(message)  # an EncodeError is the caller's, as from put
        if self._send_from_caller(frame):
            return len(frame)
        return self.outbox.put_frame(frame)

    def send_queued_now(self) -> None:
        """Send what the outbox holds now (any thread): from the calling thread when
        the DEALER is free (:meth:`_send_from_caller`), else by waking the IO thread."""
        if not self._send_from_caller(None):
            self.outbox.wake()

    def send_frame_now(self, frame: bytes) -> int:
        """:meth:`Outbox.put_event_frame` of ``frame`` and :meth:`send_queued_now` in one
        (any thread): an event after a quiet spell (a paced model's delta) so leaves
        without waking a second thread to fight for the GIL. Its size on the wire.

        On a thread running an asyncio loop (the model I/O loop, a hosted agent's loop),
        the frame is queued and the loop sends what is queued once its current round of
        callbacks is over: the deltas that the reads of one round brought, whatever
        their sessions, go to the host as one zmq message. Anything else sent meanwhile
        takes the queue first, so a session's order holds."""
        loop = asyncio._get_running_loop()
        if loop is not None:
            size = self.outbox.hold_event_frame(frame)
            self._round_sender(loop).arm()
            return size
        if self._send_from_caller(frame):
            return len(frame)
        size = self.outbox.put_event_frame(frame)
        self.outbox.wake()
        return size

    def _round_sender(self, loop: asyncio.AbstractEventLoop) -> _RoundSender:
        sender: _RoundSender | None = getattr(self._round_senders, "sender", None)
        if sender is None or sender.loop is not loop:
            sender = self._round_senders.sender = _RoundSender(loop, self.send_queued_now)
        return sender

    def _send_from_caller(self, frame: bytes | None) -> bool:
        """Send what the outbox holds, then ``frame``, on the calling thread if the
        DEALER is free and nothing waits for back-pressure; False (nothing taken) if
        not. The IO thread is woken only for what this leaves to it."""
        if not self._dealer_lock.acquire(blocking=False):
            return False
        try:
            if self._backlog or self._dealer.closed:
                return False
            self._backlog.extend(self.outbox.take_queued())
            if frame is not None:
                self._backlog.append(frame)
            self._flush()
            if self._backlog or self._dealer_pending():  # the IO thread must see to it
                self.outbox.wake()
            return True
        finally:
            self._dealer_lock.release()

    def _dealer_pending(self) -> bool:
        """Whether the DEALER has input, or room for a backlog (holding its lock)."""
        events = cast(int, self._dealer.getsockopt(_EVENTS))
        return bool(events & _POLLIN or (self._backlog and events & _POLLOUT))

    def _poll_timeout_ms(self) -> int:
        if self.outbox.ticking:
            return max(1, round(TICK_SECONDS * 1000))
        until_beat = self._next_beat - time.monotonic()
        return max(1, int(min(until_beat, self.heartbeat / 2) * 1000))

    def _beat_if_due(self) -> None:
        now = time.monotonic()
        if now >= self._next_beat:
            self._next_beat = now + self.heartbeat
            self.outbox.put(Heartbeat(pid=os.getpid(), sessions=len(self.sessions),
                                      agents=agent_processes()))
            ended = process_tree.end_adopted()
            if ended:
                logger.warning("ended %d process(es) that outlived their agent's or "
                               "command's process tree", len(ended))

    def _check_host(self) -> None:
        if os.getppid() != self.host_pid:
            logger.warning("host %d is gone (parent is now %d); exiting",
                           self.host_pid, os.getppid())
            self._exit_code = 3
        elif time.monotonic() - self._last_heard > HOST_SILENCE_BEATS * self.heartbeat:
            logger.warning("no word from host %d for %d beats; exiting",
                           self.host_pid, HOST_SILENCE_BEATS)
            self._exit_code = 3

    def _flush(self) -> None:
        """Send the backlog, up to :data:`_FRAMES_PER_SEND` envelopes per zmq message."""
        backlog = self._backlog
        while backlog:
            count = min(len(backlog), _FRAMES_PER_SEND)
            frames = [backlog[i] for i in range(count)]
            try:
                self._dealer.send(join_envelopes(frames), zmq.NOBLOCK)
            except zmq.Again:
                return  # back-pressure: poll for POLLOUT and try again
            for _ in range(count):
                backlog.popleft()

    def _receive_all(self) -> bool:
        """Dispatch what the host sent, at most :data:`_FRAMES_PER_RECEIVE` messages (a
        long burst, e.g. ``session/new`` not waiting for its open, must not hold off
        the heartbeat and the replies, or the host would kill this worker as hung; the
        loop comes back at once for the rest); whether one of them started a turn."""
        started = False
        dealer = self._dealer
        for _ in range(_FRAMES_PER_RECEIVE):
            if not cast(int, dealer.getsockopt(_EVENTS)) & _POLLIN:  # no zmq.Again
                break
            try:
                frame = dealer.recv(zmq.NOBLOCK)
            except zmq.Again:
                break
            self._last_heard = time.monotonic()
            try:
                message = decode(frame)
            except WireError as exc:
                logger.warning("dropped a malformed frame from the host: %s", exc)
                continue
            started = started or type(message) is StartTurn
            try:
                self._dispatch(message)
            except Exception:  # a bug must not take the other sessions down with it
                logger.exception("handling %s failed", type(message).__name__)
        return started

    def _dispatch(self, message: HostMessage | WorkerMessage) -> None:
        match message:
            case OpenSession():
                self._open(message)
            case StartTurn():
                self._start_turn(message)
            case Credit(sid=sid, turn_id=turn_id, nbytes=nbytes):
                self._credit(sid, turn_id, nbytes)
            case CancelTurn(sid=sid):
                self._cancel(sid)
            case UserAnswer(request_id=request_id, answer=answer):
                self.permissions.resolve(request_id, answer)
            case PermissionReply(request_id=request_id, option_id=option_id):
                self.permissions.resolve(request_id, option_id)
            case ClientReply(request_id=request_id):
                self.permissions.resolve(request_id, message)
            case AgentCall(sid=sid):
                live = self.sessions.get(sid)
                forward_agent_call(message, live.agent if live else None, self.outbox.put)
            case SetMode(sid=sid, mode=mode):
                self._set_mode(sid, mode)
            case CloseSession(sid=sid, close_id=close_id, confirm=confirm):
                self._close(sid, close_id, confirm)
            case Ping():
                pass
            case Shutdown():
                self._exit_code = 0
            case _:
                logger.warning("unexpected %s from the host; dropped", type(message).__name__)

    def _open(self, message: OpenSession) -> None:
        for evicted in message.evicted:
            self._close(evicted, 0, confirm=False)
        sid = message.sid
        if sid in self.sessions:
            self.outbox.put(OpenFailed(sid=sid, message="session is already open in this worker"))
            return
        try:
            config = SessionConfig.from_open(message)
            state = SessionState(sid, message.mode)
            agent = create_agent(message.agent)
        except Exception as exc:
            logger.warning("cannot open session %s: %s", sid, exc)
            self.outbox.put(OpenFailed(sid=sid, message=str(exc) or type(exc).__name__))
            return
        actor = SessionActor.start(config=config, state=state, agent=agent,
                                   send=self.send, permissions=self.permissions,
                                   wake=self.send_queued_now,
                                   send_event_frame=self.outbox.put_event_frame,
                                   send_event_frame_now=self.send_frame_now)
        self.sessions[sid] = _LiveSession(actor, state, agent)
        if message.confirm:
            self.outbox.put(SessionOpened(sid=sid))

    def _start_turn(self, message: StartTurn) -> None:
        live = self.sessions.get(message.sid)
        reason = "session is not open in this worker"
        cancel = live.state.begin_turn(message.turn_id) if live else None
        if live and cancel is None:
            reason = "session busy: a turn is already running"
        if live and cancel is not None:
            self._handoffs.append((live, RunTurn(message.turn_id, message.prompt, cancel)))
            return
        self.outbox.put(TurnFailed(sid=message.sid, turn_id=message.turn_id, message=reason))

    def _hand_off(self) -> None:
        """Give the session actors what this round brought them (in arrival order),
        as the last thing before the IO thread sleeps: an actor thread woken now
        finds the GIL free, instead of waking a second time to take it."""
        handoffs, self._handoffs = self._handoffs, []
        for live, message in handoffs:
            try:
                live.actor.tell(message)
            except pykka.ActorDeadError:
                self._actor_gone(live, message)

    def _actor_gone(self, live: _LiveSession, message: RunTurn | CloseActor) -> None:
        sid = live.state.sid
        if isinstance(message, RunTurn):
            live.state.end_turn(message.cancelled)
            self.outbox.put(TurnFailed(sid=sid, turn_id=message.turn_id,
                                       message="session actor is gone"))
        elif message.confirm:
            self.outbox.put(SessionClosed(sid=sid, close_id=message.close_id))

    def _credit(self, sid: str, turn_id: str, nbytes: int) -> None:
        live = self.sessions.get(sid)
        if live is not None:
            live.state.grant(turn_id, nbytes)

    def _cancel(self, sid: str) -> None:
        live = self.sessions.get(sid)
        if live is not None:
            live.state.cancel()
        self.permissions.withdraw_session(sid)

    def _set_mode(self, sid: str, mode: str) -> None:
        live = self.sessions.get(sid)
        if live is None:
            logger.info("set_mode for unknown session %s; ignored", sid)
            return
        try:
            live.state.set_mode(mode)
        except ValueError as exc:
            logger.warning("session %s: %s; mode unchanged", sid, exc)

    def _close(self, sid: str, close_id: int, confirm: bool = True) -> None:
        live = self.sessions.pop(sid, None)
        self._cancel(sid)
        if live is None:
            if confirm:
                self.outbox.put(SessionClosed(sid=sid, close_id=close_id))
            return
        # answers (when asked to) once the turn has ended
        self._handoffs.append((live, CloseActor(close_id, confirm)))

    def _teardown(self) -> None:
        """Cancel every turn, stop the actors (bounded), send what is queued, close."""
        self._hand_off()
        for sid, live in self.sessions.items():
            live.state.cancel()
            self.permissions.withdraw_session(sid)
        stops = [live.actor.stop(block=False) for live in self.sessions.values()]
        deadline = time.monotonic() + _STOP_ACTORS_SECS
        for stop in stops:
            try:
                stop.get(timeout=max(0.0, deadline - time.monotonic()))
            except pykka.Timeout:
                logger.warning("a session actor did not stop in time")
        stop_agent_processes()
        process_tree.end_all()  # what the stopped turns and agents left: nothing outlives us
        with self._dealer_lock:
            self._backlog.extend(self.outbox.take_all())
            self._flush()
            self._dealer.close(linger=0)
        self._ctx.term()
        self.outbox.close()


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m actors.worker.main")
    parser.add_argument("--endpoint", required=True, help="the host's zmq ROUTER endpoint")
    parser.add_argument("--identity", required=True, help="this worker incarnation's id")
    parser.add_argument("--host-pid", type=int, required=True, help="exit when this pid is gone")
    parser.add_argument("--heartbeat", type=float, default=1.0, help="seconds between beats")
    parser.add_argument("--log-level", default=os.environ.get("ZEROCLAW_LOG") or "warning")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse_args(argv)
    logging.basicConfig(
        stream=sys.stderr,
        level=getattr(logging, str(args.log_level).upper(), logging.WARNING),
        format=f"%(asctime)s worker[{os.getpid()}] %(levelname)s %(name)s: %(message)s",
    )
    for signum in (signal.SIGINT, signal.SIGHUP):  # a terminal sends these to the group
        signal.signal(signum, signal.SIG_IGN)  # the host decides when workers stop
    if os.getppid() != args.host_pid:
        logger.warning("host %d is already gone; exiting", args.host_pid)
        return 3
    process_tree.become_subreaper()  # what leaves a session's process tree comes here
    worker = WorkerProcess(endpoint=args.endpoint, identity=args.identity,
                           host_pid=args.host_pid, heartbeat=args.heartbeat)
    return worker.run()


if __name__ == "__main__":
    sys.exit(main())
