"""The Host: assembles the store, the actors and the worker pool behind every transport.

Everything here runs on the asyncio loop thread. The loop owns sockets (clients
and the zmq ROUTER to workers); the SupervisorActor owns the session table and is
reached with :func:`actors.bridge.call`; the PersistenceActor is the only
writer. Session operations live in :mod:`supervisor.sessions`; this module is the
lifecycle and the routing of worker messages.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from actors.agents import agent_config_problem
from actors.bridge import call, loop_reply, tell
from actors.persistence import (
    MarkKilled,
    PersistenceActor,
    PersistRequest,
    StoreWrite,
    UpdateMeta,
)
from actors.sandbox import SandboxInfo, worker_sandbox_environment
from actors.sandbox import detect as detect_sandbox
from ipc.errors import InternalError, SessionNotFound
from ipc.events import SessionInfo, TurnRecord, event_from_wire, iso_utc
from ipc.worker_wire import (
    TOOL_RULES_META,
    AgentOpened,
    AgentReply,
    ClientCall,
    CloseSession,
    HostMessage,
    OpenFailed,
    PermissionAsk,
    PermissionReply,
    PermissionRules,
    SessionClosed,
    SessionOpened,
    TurnEnded,
    TurnEvent,
    TurnFailed,
    UserAnswer,
    UserAsk,
    WorkerMessage,
)
from storage.store import Store, open_store
from supervisor.agent_calls import AgentCalls
from supervisor.client_relay import ClientRelay
from supervisor.closings import Closings
from supervisor.config import Settings
from supervisor.orphans import become_subreaper, end_orphans
from supervisor.pacing import TurnStream
from supervisor.routes import Peer, Route
from supervisor.supervisor import Eviction, Limits, SupervisorActor, workers_wanted
from supervisor.turn_stats import TurnStats
from supervisor.turns import TurnBook
from supervisor.usage import UsageTotals
from supervisor.worker_env import agent_variables
from supervisor.workers import WorkerPool

__all__ = ["Host"]

log = logging.getLogger("zeroclaw.host")

WORKER_READY_TIMEOUT = 30.0
ORPHAN_SWEEP_SECS = 2.0
R = TypeVar("R")
CLOSE_CONFIRM_SECS = 10.0  # a worker that takes longer to drop a session is not waited for
#: The key of a session's stored ``meta`` that keeps its always-answers to permission requests.


class Host:
    """One host process's shared machinery. Create, ``await start()``, ``await stop()``."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.started_at = time.time()
        self.routes: dict[str, Route] = {}
        self.store: Store
        self.pool: WorkerPool
        self.sandbox: SandboxInfo  # how shell commands are confined (set by start)
        self._tasks: set[asyncio.Task[Any]] = set()
        self._sweeper: asyncio.Task[None] | None = None
        self._orphan_sweeper: asyncio.Task[None] | None = None
        self._closings = Closings()
        self.turns = TurnBook(self)
        self.client_relay = ClientRelay(self)
        self.agent_calls = AgentCalls(self)
        self.usage = UsageTotals()
        self.turn_stats = TurnStats()  # for /metrics

    # --- lifecycle ----------------------------------------------------------------

    async def start(self) -> None:
        settings = self.settings
        _log_unusable_agents(settings)
        self.store = await asyncio.to_thread(open_store, settings.store_path)
        self.reader = self.store.reader
        self.usage.seed(await asyncio.to_thread(self.reader.usage_totals))
        self.persistence = PersistenceActor.start(self.store)
        limits = Limits(settings.max_sessions, settings.session_timeout_secs,
                        settings.sessions_per_worker)
        self.supervisor = SupervisorActor.start(limits)
        self.sandbox = await asyncio.to_thread(detect_sandbox, settings.sandbox)
        self.pool = WorkerPool(
            run_dir=settings.data_dir / "run",
            on_message=self._on_worker_message,
            on_event=self._on_turn_event,
            on_worker_exit=self._on_worker_exit,
            max_workers=settings.workers_max,
            inherit=agent_variables(settings.agents.values()),
            env=worker_sandbox_environment(self.sandbox, settings.allow_unsandboxed_shell,
                                           (settings.data_dir, settings.socket_path)),
        )
        become_subreaper()
        await self.pool.start()
        self.pool.scale_to(2)
        self._sweeper = asyncio.create_task(self._sweep_idle())
        self._orphan_sweeper = asyncio.create_task(self._sweep_orphans())

    async def stop(self) -> None:
        """Cancel running turns, let them persist, then stop workers and actors."""
        self.turns.cancel_all()
        await self.turns.wait_all(timeout=10)
        for sweeper in (self._sweeper, self._orphan_sweeper):
            if sweeper is not None:
                sweeper.cancel()
        await self.pool.close()
        await asyncio.to_thread(self._stop_actors)

    def _stop_actors(self) -> None:
        self.supervisor.stop(timeout=5)
        self.persistence.stop(timeout=30)  # queued writes finish first
        self.store.close()

    def spawn(self, coro: Any) -> asyncio.Task[Any]:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # --- calls to the actors ---------------------------------------------------------

    async def supervise(self, method: str, *args: Any) -> Any:
        return await call(self.supervisor, method, *args)

    def inform(self, method: str, *args: Any) -> None:
        """Tell the supervisor something without waiting (a failure is logged there)."""
        tell(self.supervisor, method, *args)

    def touch(self, sid: str) -> None:
        """Activity on a session: its LRU place (the supervisor's) and, when it is live,
        its ``lastActivity`` (its route's)."""
        self.inform("touch", sid)
        route = self.routes.get(sid)
        if route is not None:
            route.touch()

    def persist(self, write: StoreWrite[R]) -> asyncio.Future[R]:
        """Have the PersistenceActor do ``write``; the future settles once it is committed."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[R] = loop.create_future()
        self.persistence.tell(PersistRequest(write, loop_reply(loop, future)))
        return future

    # --- workers ------------------------------------------------------------------------

    async def ready_workers(self) -> list[str]:
        ready = self.pool.ready_workers()
        if not ready:
            ready = [await self.pool.wait_ready(WORKER_READY_TIMEOUT)]
        return ready

    def scale_workers(self) -> None:
        """Grow the pool as the supervisor's rule says, from the loop's own routes."""
        in_use = len({r.worker_id for r in self.routes.values()})
        self.pool.scale_to(workers_wanted(in_use, 0, self.settings.sessions_per_worker))

    def apply_evictions(self, evictions: list[Eviction] | tuple[Eviction, ...]) -> None:
        for eviction in evictions:
            self.routes.pop(eviction.sid, None)
            if eviction.worker_id:
                self._send_close(eviction.worker_id, eviction.sid, wait=False)
            log.info("evicted idle session %s", eviction.sid)

    async def evict(self, sid: str) -> bool:
        """Drop a live idle session from memory, as the LRU rule does (it stays in the
        store; a prompt restores it). False when it is not live or is running a turn."""
        route = self.routes.get(sid)
        if route is None or sid in self.turns.running:
            return False
        self.apply_evictions([Eviction(sid, route.worker_id)])  # before any await
        with contextlib.suppress(SessionNotFound):
            await self.supervise("release", sid)
        return True

    async def _sweep_idle(self) -> None:
        period = max(0.5, min(self.settings.session_timeout_secs / 4, 30.0))
        while True:
            await asyncio.sleep(period)
            try:
                self.apply_evictions(await self.supervise("sweep"))
            except Exception:
                log.exception("idle sweep failed")

    async def _sweep_orphans(self) -> None:
        while True:
            await asyncio.sleep(ORPHAN_SWEEP_SECS)
            end_orphans()

    def _on_worker_exit(self, worker_id: str) -> None:
        end_orphans()
        self.agent_calls.worker_gone(worker_id)
        self.spawn(self._fail_worker_sessions(worker_id))

    async def _fail_worker_sessions(self, worker_id: str) -> None:
        sids = await self.supervise("worker_exited", worker_id)
        for sid in sids:
            route = self.routes.pop(sid, None)
            if route is not None:
                route.agent_opened.set()  # nobody waits for its agent any more
            turn = self.turns.get(sid)
            if turn is not None and turn.route is route and self.turns.worker_exited(turn):
                # the record says so until the next load or resume; nobody waits on it
                self.persist(MarkKilled(sid)).add_done_callback(_log_write_failure)
        self._closings.worker_gone(worker_id)
        if sids:
            log.warning("worker %s exited; %d session(s) dropped (restorable)", worker_id,
                        len(sids))

    # --- messages from workers ----------------------------------------------------------

    def _on_turn_event(self, worker_id: str, message: TurnEvent, nbytes: int) -> None:
        """One streamed event: paced to the turn's client (see :mod:`supervisor.pacing`)."""
        sid, turn_id = message.sid, message.turn_id
        turn = self.turns.get(sid, turn_id)
        if turn is None or turn.failure is not None:
            self.pool.grant(worker_id, sid, turn_id, nbytes)  # nobody takes it: dropped
            return
        if turn.stream is None:
            turn.stream = TurnStream(
                sid, turn.peer,
                lambda n: self.pool.grant(worker_id, sid, turn_id, n),
                lambda reason: self.turns.fail(turn, reason),
            )
        turn.stream.deliver(event_from_wire(message.event), nbytes)

    def _on_worker_message(self, worker_id: str, message: WorkerMessage) -> None:
        match message:
            case TurnEnded(sid=sid, turn_id=turn_id, record=wire):
                turn = self.turns.get(sid, turn_id)
                if turn is not None:
                    self.turns.ended(turn, TurnRecord.from_wire(wire))
            case TurnFailed(sid=sid, turn_id=turn_id, message=text, record=wire):
                turn = self.turns.get(sid, turn_id)
                if turn is not None:
                    self.turns.failed(turn, turn.failure or text, None if wire is None
                                      else TurnRecord.from_wire(wire))
            case PermissionAsk():
                self._ask_permission(worker_id, message)
            case UserAsk():
                self._ask_user(worker_id, message)
            case ClientCall():
                self.client_relay.on_call(worker_id, message)
            case AgentReply():
                self.agent_calls.settle(message)
            case AgentOpened(sid=sid, modes=modes):
                route = self.routes.get(sid)
                if route is not None:
                    route.agent_modes = modes
                    route.agent_opened.set()
            case PermissionRules(sid=sid, rules=rules):
                self.persist(UpdateMeta(sid, {TOOL_RULES_META: rules})).add_done_callback(
                    _log_write_failure)
            case SessionClosed(close_id=close_id):
                self._closings.confirmed(close_id)
            case OpenFailed(sid=sid, message=text):
                log.error("worker %s could not open session %s: %s", worker_id, sid, text)
                self.spawn(self._drop_broken(sid, text))
            case SessionOpened():
                pass

    def _ask_permission(self, worker_id: str, ask: PermissionAsk) -> None:
        timeout = self.settings.session_timeout_secs
        self._relay_to_user(
            worker_id, ask.sid, ask.turn_id,
            lambda peer: peer.ask_permission(ask.sid, ask, timeout),
            lambda option: PermissionReply(ask.sid, ask.request_id, option),
        )

    def _ask_user(self, worker_id: str, ask: UserAsk) -> None:
        timeout = self.settings.session_timeout_secs
        self._relay_to_user(
            worker_id, ask.sid, ask.turn_id,
            lambda peer: peer.ask_user(ask.sid, ask.message, ask.schema, timeout),
            lambda answer: UserAnswer(ask.sid, ask.request_id, answer),
        )

    def _relay_to_user(
        self,
        worker_id: str,
        sid: str,
        turn_id: str,
        ask_peer: Callable[[Peer], Awaitable[Any]],
        reply: Callable[[Any], HostMessage],
    ) -> None:
        """Ask the turn's client; the worker always gets a reply (None: no answer).

        The asking task is one of the turn's ``permission_tasks``, so a cancel
        withdraws it and the agent is answered at once.
        """
        turn = self.turns.get(sid, turn_id)
        if turn is None or turn.cancel_requested:
            self.pool.send(worker_id, reply(None))
            return
        if turn.stream is not None:
            turn.stream.flush()  # the ask follows the updates before it
        task = self.spawn(self._relay(worker_id, sid, turn_id, turn.peer, ask_peer, reply))
        turn.permission_tasks.add(task)
        task.add_done_callback(turn.permission_tasks.discard)

    async def _relay(
        self,
        worker_id: str,
        sid: str,
        turn_id: str,
        peer: Peer,
        ask_peer: Callable[[Peer], Awaitable[Any]],
        reply: Callable[[Any], HostMessage],
    ) -> None:
        answer: Any = None
        try:
            answer = await ask_peer(peer)
        except TypeError as exc:  # orjson.JSONEncodeError: the ask cannot be encoded
            turn = self.turns.get(sid, turn_id)
            if turn is not None:
                self.turns.fail(turn, f"a request to the client cannot be encoded: {exc}")
        finally:  # cancelled (session/cancel) or failed: no answer
            self.pool.send(worker_id, reply(answer))

    async def _drop_broken(self, sid: str, text: str) -> None:
        route = self.routes.pop(sid, None)
        if route is not None:
            route.agent_opened.set()  # nobody waits for its agent any more
        turn = self.turns.get(sid)
        if route is not None and turn is not None and turn.route is route:
            self.turns.settle(turn, error=InternalError(f"session could not start: {text}"))
        with contextlib.suppress(SessionNotFound):
            await self.supervise("release", sid)

    # --- helpers for session operations --------------------------------------------------

    async def close_on_worker(self, route: Route) -> None:
        """Drop the session's actor and wait (bounded) for the worker to confirm."""
        close_id, waiter = self._send_close(route.worker_id, route.sid, wait=True)
        if waiter is None:
            return  # the worker is gone: nothing to close there
        try:
            await asyncio.wait_for(waiter, timeout=CLOSE_CONFIRM_SECS)
        except TimeoutError:
            self._closings.forget(close_id)
            log.warning("worker did not confirm closing %s", route.sid)

    def _send_close(self, worker_id: str, sid: str, *,
                    wait: bool) -> tuple[int, asyncio.Future[None] | None]:
        """Send a numbered ``CloseSession``; its number, and a future for its
        confirmation when ``wait`` (None when the send failed)."""
        close_id = self._closings.number()
        self.client_relay.session_gone(sid)
        if not self.pool.send(worker_id, CloseSession(sid, close_id)):
            return close_id, None
        return close_id, self._closings.sent(close_id, worker_id, wait=wait)

    def session_info_event(self, title: str | None) -> SessionInfo:
        return SessionInfo(title=title, updated_at=iso_utc(time.time()))


def _log_unusable_agents(settings: Settings) -> None:
    """Say at start which configured agents ``session/new`` will refuse, and why."""
    for agent in settings.agents.values():
        problem = agent_config_problem(agent.to_wire()) if agent.enabled else None
        if problem is not None:
            log.warning("agent %s cannot be used: %s", agent.alias, problem)


def _log_write_failure(future: asyncio.Future[Any]) -> None:
    if not future.cancelled() and future.exception() is not None:
        log.warning("%s", future.exception())  # the error says "store write failed: ..."


def canonical_dir(path: str, base: str | None = None) -> str | None:
    """``path`` resolved (symlinks, ``..``) when it is a usable directory, else None.

    Plain ``os.path`` strings: this is on the way of every ``session/new``.
    """
    candidate = path if os.path.isabs(path) else os.path.join(base or os.getcwd(), path)
    try:
        resolved = os.path.realpath(candidate)
        usable = os.path.isdir(resolved) and os.access(resolved, os.R_OK | os.X_OK)
    except (ValueError, OSError):  # an embedded NUL, a name too long
        return None
    return resolved if usable else None
