"""The worker pool: spawn worker processes, route envelopes, notice death, replace.

Everything here runs on the host's asyncio loop thread. The pool binds one zmq
ROUTER (``ipc://`` under ``run_dir``, unique per host process) and reads it with
``loop.add_reader`` on the socket's (edge-triggered) FD; sends never block
(``zmq.Again`` is back-pressure: :meth:`WorkerPool.send` returns False). A
message from a worker is its identity followed by one or more envelopes
(a worker sends what it has queued in one message).

Workers are started with ``subprocess.Popen`` off the loop, by ``start_process``
(the host's SupervisorActor; by default the loop's executor). A start costs
70-100 ms before the worker says WorkerReady; it never sits on a request's path.
Death is seen two ways: a pidfd per worker on the loop (SIGKILL noticed in
milliseconds) and heartbeats (a worker silent for three periods is declared hung
and SIGKILLed). A dead worker is reaped, ``on_worker_exit`` is called once, and a
replacement starts in the background.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import zmq

from ipc.worker_wire import (
    AgentOpened,
    AgentProcessEntry,
    AgentReply,
    ClientCall,
    Credit,
    Heartbeat,
    HostMessage,
    McpServersStatus,
    OpenFailed,
    PermissionAsk,
    PermissionRules,
    Ping,
    SessionClosed,
    SessionOpened,
    Shutdown,
    TurnEnded,
    TurnEvent,
    TurnFailed,
    UserAsk,
    WireError,
    WorkerMessage,
    WorkerReady,
    decode_all,
    encode,
    split_envelopes,
)
from supervisor.workers.ipc_path import IpcClaim, claim_ipc_path
from supervisor.workers.worker_env import worker_environment

__all__ = ["HUNG_AFTER_BEATS", "StartProcess", "WorkerPool", "WorkerStatus",
           "start_worker_process"]

log = logging.getLogger("zeroclaw.workers")

HUNG_AFTER_BEATS = 3
_HWM = 10_000
# plain ints: zmq's IntEnum constants cost a conversion on every use (on every turn)
_EVENTS, _POLLIN = int(zmq.EVENTS), int(zmq.POLLIN)
_DRAIN_BATCH = 1000
_SHUTDOWN_GRACE_SECS = 1.0
_PROJECT_ROOT = Path(__file__).resolve().parent.parent
_FORWARDED = (SessionOpened, OpenFailed, TurnEvent, PermissionAsk, UserAsk, ClientCall,
              AgentReply, AgentOpened, McpServersStatus, PermissionRules, TurnEnded, TurnFailed,
              SessionClosed)


#: ``start_process(argv, env)``: a started worker process, started off the loop.
StartProcess = Callable[[list[str], dict[str, str]], Awaitable[subprocess.Popen[bytes]]]


def start_worker_process(argv: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
    """Start one worker process (blocks for the fork and exec: never on the loop)."""
    return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, env=env)


@dataclass(frozen=True, slots=True)
class WorkerStatus:
    """One worker as the pool sees it; ``last_beat`` is ``time.monotonic()`` seconds;
    ``agents`` its agent processes as of its last heartbeat."""

    worker_id: str
    pid: int
    ready: bool
    sessions: int
    last_beat: float
    alive: bool
    agents: tuple[AgentProcessEntry, ...] = ()


@dataclass(slots=True, eq=False)
class _Worker:
    worker_id: str
    started_at: float
    proc: subprocess.Popen[bytes] | None = None
    pidfd: int | None = None
    ready: bool = False
    sessions: int = 0
    last_beat: float = 0.0
    alive: bool = True
    agents: tuple[AgentProcessEntry, ...] = ()

    @property
    def pid(self) -> int:
        return self.proc.pid if self.proc else 0


class WorkerPool:
    """Worker processes of one host. Create, ``await start()``, ``scale_to(n)``, ``await close()``.

    ``on_message(worker_id, message)`` gets every worker message except
    WorkerReady and Heartbeat; TurnEvents go to ``on_events(worker_id, events,
    nbytes)`` instead when it is given: the consecutive events of one turn that
    came in one zmq message, in order (``nbytes``: their encoded size, which the
    stream credit counts, see :meth:`grant`); ``on_worker_exit(worker_id)`` is called once per
    dead worker (not during :meth:`close`), ``on_worker_ready()`` each time one becomes
    ready. ``around_messages()`` is entered around each read of what the workers
    sent (the handlers' writes to clients can then go out together). ``env`` holds
    extra environment variables for the workers; of the host's own they get only what
    :func:`supervisor.workers.worker_env.worker_environment` keeps, plus ``inherit``.
    """

    def __init__(
        self,
        *,
        run_dir: Path,
        on_message: Callable[[str, WorkerMessage], None],
        on_worker_exit: Callable[[str], None],
        max_workers: int,
        on_events: Callable[[str, list[TurnEvent], int], None] | None = None,
        on_worker_ready: Callable[[], None] | None = None,
        around_messages: Callable[[], AbstractContextManager[None]] = contextlib.nullcontext,
        start_process: StartProcess | None = None,
        heartbeat_secs: float = 1.0,
        env: dict[str, str] | None = None,
        inherit: frozenset[str] = frozenset(),
        start_timeout: float = 15.0,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.max_workers = max(0, max_workers)
        self.heartbeat_secs = heartbeat_secs
        self.start_timeout = start_timeout
        self._on_message = on_message
        self._on_events = on_events
        self._on_worker_exit = on_worker_exit
        self._on_worker_ready = on_worker_ready
        self._around_messages = around_messages
        self._start_process = start_process
        self._env = env or {}
        self._inherit = inherit
        self._workers: dict[str, _Worker] = {}
        self._target = 0
        self._seq = 0
        self._early_deaths = 0
        self._closing = False
        self._claim: IpcClaim | None = None
        self._ctx: zmq.Context[zmq.Socket[bytes]] | None = None
        self._sock: zmq.Socket[bytes] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ready_changed = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        self._drain_scheduled = False
        self._heartbeats: asyncio.Task[None] | None = None

    @property
    def endpoint(self) -> str:
        if self._claim is None:
            raise RuntimeError("the pool is not started")
        return f"ipc://{self._claim.path}"

    # --- lifecycle -----------------------------------------------------------------------

    async def start(self) -> None:
        """Bind the ROUTER and start one worker in the background; returns at once."""
        self._loop = asyncio.get_running_loop()
        self._claim = claim_ipc_path(self.run_dir)
        self._ctx = zmq.Context()
        sock = self._ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDHWM, _HWM)
        sock.setsockopt(zmq.RCVHWM, _HWM)
        self._sock = sock
        try:
            sock.bind(self.endpoint)
        except zmq.ZMQError:
            self._unbind()
            raise
        self._loop.add_reader(sock.fileno(), self._drain)
        self._heartbeats = self._spawn_task(self._watch_heartbeats())
        self.scale_to(max(self._target, 1))

    async def close(self) -> None:
        """Shut the workers down (Shutdown, a short grace, then SIGKILL), reap, unbind."""
        if self._closing:
            return
        self._closing = True
        self._ready_changed.set()  # wake wait_ready() callers: they get TimeoutError
        if self._heartbeats is not None:
            self._heartbeats.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for worker in list(self._workers.values()):
            if worker.ready:
                self.send(worker.worker_id, Shutdown())
            elif worker.proc is not None:
                _kill(worker.proc)  # still starting: it holds no session and cannot hear us
        await self._wait_all_exited(_SHUTDOWN_GRACE_SECS)
        for worker in list(self._workers.values()):
            if worker.proc is not None and worker.alive:
                log.warning("worker %s did not shut down; killing it", worker.worker_id)
                _kill(worker.proc)
        await self._wait_all_exited(_SHUTDOWN_GRACE_SECS)
        for worker in list(self._workers.values()):
            self._reap(worker, wait=True)
        self._unbind()

    async def _wait_all_exited(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while self._workers and time.monotonic() < deadline:
            for worker in list(self._workers.values()):
                if worker.proc is not None and worker.proc.poll() is not None:
                    self._reap(worker)
            await asyncio.sleep(0.01)

    def _unbind(self) -> None:
        if self._sock is not None and self._loop is not None:
            self._loop.remove_reader(self._sock.fileno())
            self._sock.close(linger=0)
            self._sock = None
        if self._ctx is not None:
            self._ctx.term()
            self._ctx = None
        if self._claim is not None:
            self._claim.release()

    # --- public queries and commands -------------------------------------------------------

    def scale_to(self, n: int) -> None:
        """Make sure at least ``min(n, max_workers)`` workers exist or are starting."""
        self._target = max(self._target, min(n, self.max_workers))
        if self._sock is not None:
            self._fill_up()

    def ready_workers(self) -> list[str]:
        return [w.worker_id for w in self._workers.values() if w.ready and w.alive]

    async def wait_ready(self, timeout: float) -> str:
        """A ready worker (the least loaded); waits for one to start. Raises TimeoutError."""
        self.scale_to(max(self._target, 1))
        deadline = time.monotonic() + timeout
        while True:
            ready = self.ready_workers()
            if ready:
                return min(ready, key=lambda wid: self._workers[wid].sessions)
            remaining = deadline - time.monotonic()
            if remaining <= 0 or self._closing:
                raise TimeoutError(f"no worker became ready within {timeout:g}s")
            self._ready_changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._ready_changed.wait(), remaining)

    def send(self, worker_id: str, message: HostMessage) -> bool:
        """Queue ``message`` for a worker; False if it is gone, unknown or its pipe is full."""
        worker = self._workers.get(worker_id)
        if worker is None or not worker.alive or self._sock is None:
            return False
        try:
            self._sock.send_multipart([worker_id.encode(), encode(message)], zmq.NOBLOCK)
        except zmq.Again:
            log.warning("worker %s: send queue full (back-pressure); %s not sent",
                        worker_id, type(message).__name__)
            return False
        except zmq.ZMQError as exc:  # EHOSTUNREACH: not connected (yet, or any more)
            log.info("worker %s: unreachable (%s); %s not sent", worker_id, exc,
                     type(message).__name__)
            return False
        finally:
            self._schedule_drain_if_pending()
        return True

    def grant(self, worker_id: str, sid: str, turn_id: str, nbytes: int) -> None:
        """Give a turn's stream ``nbytes`` of credit back (its events were passed on)."""
        self.send(worker_id, Credit(sid, turn_id, nbytes))

    def info(self) -> list[WorkerStatus]:
        """Workers that have a process (started or ready), in start order."""
        return [
            WorkerStatus(w.worker_id, w.pid, w.ready, w.sessions, w.last_beat, w.alive,
                         w.agents)
            for w in self._workers.values()
            if w.proc is not None
        ]

    def pids(self) -> list[int]:
        return [w.pid for w in self._workers.values() if w.alive and w.proc is not None]

    # --- spawning ---------------------------------------------------------------------------

    def _fill_up(self) -> None:
        while not self._closing and len(self._workers) < self._target:
            self._seq += 1
            worker_id = f"w{self._seq}-{os.getpid()}-{secrets.token_hex(3)}"
            worker = _Worker(worker_id, started_at=time.monotonic())
            self._workers[worker_id] = worker  # before Popen: its WorkerReady may come fast
            self._spawn_task(self._launch(worker))

    def _spawn_task(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _launch(self, worker: _Worker) -> None:
        assert self._loop is not None
        argv, env = self._worker_argv(worker.worker_id), self._worker_env()
        try:
            if self._start_process is not None:
                proc = await self._start_process(argv, env)
            else:
                proc = await self._loop.run_in_executor(None, start_worker_process, argv, env)
        except OSError:
            log.exception("cannot start worker %s", worker.worker_id)
            self._workers.pop(worker.worker_id, None)
            self._replace_later(early=True)
            return
        worker.proc = proc
        if self._closing:
            _kill(proc)
            proc.wait()
            self._workers.pop(worker.worker_id, None)
            return
        self._watch_pid(worker)
        log.info("worker %s started, pid %d", worker.worker_id, proc.pid)

    def _worker_argv(self, worker_id: str) -> list[str]:
        level = logging.getLevelName(logging.getLogger("zeroclaw").getEffectiveLevel())
        return [
            # -P: the host's cwd is not on sys.path
            sys.executable, "-P", "-m", "actors.worker.main",
            "--endpoint", self.endpoint,
            "--identity", worker_id,
            "--host-pid", str(os.getpid()),
            "--heartbeat", repr(self.heartbeat_secs),
            "--log-level", str(level).lower(),
        ]

    def _worker_env(self) -> dict[str, str]:
        env = {**worker_environment(os.environ, self._inherit), **self._env}
        paths = [str(_PROJECT_ROOT), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
        env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
        return env

    def _watch_pid(self, worker: _Worker) -> None:
        assert self._loop is not None and worker.proc is not None
        try:
            worker.pidfd = os.pidfd_open(worker.proc.pid)
        except OSError:  # old kernel, or already reaped: the heartbeat watch polls instead
            log.debug("no pidfd for worker %s; polling", worker.worker_id)
            return
        self._loop.add_reader(worker.pidfd, self._on_exit, worker)

    def _replace_later(self, *, early: bool) -> None:
        """Refill the pool; back off when workers die before they are ready (a crash loop)."""
        if self._closing or self._loop is None:
            return
        self._early_deaths = self._early_deaths + 1 if early else 0
        delay = min(5.0, 0.1 * 2 ** self._early_deaths) if early else 0.0
        self._loop.call_later(delay, self._fill_up)

    # --- death ---------------------------------------------------------------------------------

    def _on_exit(self, worker: _Worker) -> None:
        """The worker's process ended (pidfd readable, or seen by polling)."""
        if not worker.alive:
            return
        self._drain()  # take what it sent before dying
        was_ready = worker.ready
        self._reap(worker)
        if self._closing:
            return
        code = worker.proc.returncode if worker.proc else None
        log.warning("worker %s (pid %d) exited with %s", worker.worker_id, worker.pid, code)
        try:
            self._on_worker_exit(worker.worker_id)
        except Exception:
            log.exception("on_worker_exit(%s) raised", worker.worker_id)
        self._replace_later(early=not was_ready)

    def _reap(self, worker: _Worker, *, wait: bool = False) -> None:
        """Forget a worker whose process has ended (or is being killed) and collect it."""
        worker.alive = False
        worker.ready = False
        self._workers.pop(worker.worker_id, None)
        if worker.pidfd is not None:
            if self._loop is not None:
                self._loop.remove_reader(worker.pidfd)
            os.close(worker.pidfd)
            worker.pidfd = None
        if worker.proc is not None:
            if wait:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    worker.proc.wait(timeout=1.0)
            else:
                worker.proc.poll()

    async def _watch_heartbeats(self) -> None:
        seq = 0
        while True:
            await asyncio.sleep(self.heartbeat_secs)
            self._drain()
            seq += 1
            now = time.monotonic()
            for worker in list(self._workers.values()):
                self._check_worker(worker, now, seq)

    def _check_worker(self, worker: _Worker, now: float, seq: int) -> None:
        proc = worker.proc
        if proc is None or not worker.alive:
            return
        if worker.pidfd is None and proc.poll() is not None:
            self._on_exit(worker)
        elif worker.ready and now - worker.last_beat > HUNG_AFTER_BEATS * self.heartbeat_secs:
            log.error("worker %s (pid %d) missed %d heartbeats: hung, killing it",
                      worker.worker_id, proc.pid, HUNG_AFTER_BEATS)
            _kill(proc)
        elif not worker.ready and now - worker.started_at > self.start_timeout:
            log.error("worker %s (pid %d) not ready after %gs: killing it",
                      worker.worker_id, proc.pid, self.start_timeout)
            _kill(proc)
        elif worker.ready:
            self.send(worker.worker_id, Ping(seq=seq))

    # --- receiving ------------------------------------------------------------------------------

    def _schedule_drain_if_pending(self) -> None:
        """The ROUTER FD is edge-triggered: after a send, check for input it will not signal."""
        sock = self._sock
        if sock is None or self._drain_scheduled or self._loop is None:
            return
        if cast(int, sock.getsockopt(_EVENTS)) & _POLLIN:
            self._drain_scheduled = True
            self._loop.call_soon(self._drain)

    def _drain(self) -> None:
        """Read what the ROUTER holds, a batch at a time so the loop stays responsive.
        Asks ``EVENTS`` before each read: cheaper than the ``zmq.Again`` an empty
        socket raises, and it re-arms the edge-triggered FD."""
        self._drain_scheduled = False
        with self._around_messages():
            self._read_batch()

    def _read_batch(self) -> None:
        sock = self._sock
        budget = _DRAIN_BATCH  # envelopes, not zmq messages (one may carry many)
        while sock is not None and cast(int, sock.getsockopt(_EVENTS)) & _POLLIN:
            if budget <= 0:
                self._schedule_drain_if_pending()
                return
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            budget -= self._on_frames(frames)
            sock = self._sock  # a handler may have closed the pool

    def _on_frames(self, frames: list[bytes]) -> int:
        """One zmq message: the worker's identity, then its envelopes (see
        :func:`ipc.worker_wire.join_envelopes`); how many there were. A run of one
        turn's events among them is handed on at once (``on_events``)."""
        if len(frames) != 2:
            log.warning("dropped a malformed message (%d frames)", len(frames))
            return 1
        worker_id = frames[0].decode("utf-8", errors="replace")
        worker = self._workers.get(worker_id)
        if worker is None or not worker.alive:
            log.debug("dropped a message from unknown or dead worker %r", worker_id)
            return 1
        worker.last_beat = time.monotonic()
        envelopes = split_envelopes(frames[1])
        run: list[TurnEvent] = []
        run_bytes = 0
        for envelope, message in zip(envelopes, decode_all(envelopes), strict=True):
            if isinstance(message, WireError):
                log.warning("worker %s: dropped a malformed frame: %s", worker_id, message)
                continue
            if type(message) is TurnEvent and self._on_events is not None:
                if run and (run[0].sid != message.sid or run[0].turn_id != message.turn_id):
                    self._hand_on(worker_id, run, run_bytes)
                    run, run_bytes = [], 0
                run.append(message)
                run_bytes += len(envelope)
                continue
            if run:
                self._hand_on(worker_id, run, run_bytes)
                run, run_bytes = [], 0
            if not worker.alive:
                return len(envelopes)
            self._on_envelope(worker, worker_id, message)
        if run:
            self._hand_on(worker_id, run, run_bytes)
        return len(envelopes)

    def _hand_on(self, worker_id: str, events: list[TurnEvent], nbytes: int) -> None:
        assert self._on_events is not None
        try:
            self._on_events(worker_id, events, nbytes)
        except Exception:
            log.exception("on_events raised for events from %s", worker_id)

    def _on_envelope(self, worker: _Worker, worker_id: str,
                     message: HostMessage | WorkerMessage) -> None:
        if isinstance(message, WorkerReady):
            self._on_ready(worker, message)
        elif isinstance(message, Heartbeat):
            worker.sessions = message.sessions
            worker.agents = tuple(message.agents)
        elif isinstance(message, _FORWARDED):
            try:
                self._on_message(worker_id, message)
            except Exception:
                log.exception("on_message raised for %s from %s", type(message).__name__,
                              worker_id)
        else:
            log.warning("worker %s: dropped a host-side %s", worker_id, type(message).__name__)

    def _on_ready(self, worker: _Worker, message: WorkerReady) -> None:
        worker.ready = True
        self._early_deaths = 0
        self._ready_changed.set()
        if self._on_worker_ready is not None:
            self._on_worker_ready()
        log.info("worker %s (pid %d) ready after %.0f ms", worker.worker_id, message.pid,
                 (time.monotonic() - worker.started_at) * 1000)


def _kill(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(proc.pid, signal.SIGKILL)
