"""The Host: assembles the store, the actors and the worker pool behind every transport.

Everything here runs on the asyncio loop thread. The loop owns sockets (clients
and the zmq ROUTER to workers) and the live-session table
(:class:`supervisor.core.live.LiveTable`); the SupervisorActor does the host's slow
process work (starting workers, ending what dead workers left behind), asked with
typed messages (:mod:`actors.bridge`); the PersistenceActor is the only writer. Session
operations live in :mod:`supervisor.host.sessions`; this module is the lifecycle and
the routing of worker messages.
"""

from __future__ import annotations

import asyncio
import logging
import subprocess
import time
from collections.abc import Awaitable, Callable, Collection
from typing import Any, TypeVar

import pykka

from actors.bridge import ask, loop_callback, loop_reply, tell
from actors.persistence import (
    MarkKilled,
    PersistBatch,
    PersistenceActor,
    PersistRequest,
    ReleaseAllLeases,
    ReleaseLease,
    RenewLeases,
    StoreWrite,
    StoreWriteError,
    TakeLease,
    UpdateMeta,
)
from actors.worker.agents import agent_config_problem
from actors.worker.sandbox import SandboxInfo, worker_sandbox_environment
from actors.worker.sandbox import detect as detect_sandbox
from ipc.errors import InternalError, relayed_error
from ipc.events import Event, SessionInfo, TurnRecord, events_from_wire, iso_utc
from ipc.transports import held_writes
from ipc.version import __version__
from ipc.worker_wire import (
    TOOL_RULES_META,
    AgentOpened,
    AgentReply,
    ClientCall,
    CloseSession,
    HostMessage,
    McpServersStatus,
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
from storage.leases import Leases
from storage.store import Store
from supervisor.config.config import Settings
from supervisor.config.gateway_config import tenant_caps
from supervisor.config.protected import host_protected_paths
from supervisor.core.closings import Closings
from supervisor.core.live import Eviction, Limits, LiveTable, workers_wanted
from supervisor.core.pacing import TurnStream
from supervisor.core.peer import Peer
from supervisor.core.routes import Route
from supervisor.core.turn_stats import TurnStats
from supervisor.core.turns import TurnBook
from supervisor.core.usage import UsageTotals
from supervisor.host.lease_keeper import LeaseKeeper
from supervisor.host.shared_store import SharedStoreWatch
from supervisor.host.store_open import open_configured_store
from supervisor.hosted.agent_calls import AgentCalls
from supervisor.hosted.client_relay import ClientRelay
from supervisor.workers.orphans import become_subreaper
from supervisor.workers.supervisor import EndOrphans, StartWorker, SupervisorActor
from supervisor.workers.worker_env import agent_variables
from supervisor.workers.workers import WorkerPool

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
        self.live = LiveTable(Limits(settings.max_sessions, settings.session_timeout_secs,
                                     settings.sessions_per_worker))
        self.live.tenant_caps = tenant_caps(settings.tenants)  # the gateway's, on a reload
        self.store: Store
        self.pool: WorkerPool
        self.sandbox: SandboxInfo  # how shell commands are confined (set by start)
        self.protected = host_protected_paths(settings)  # refused to every session
        self._tasks: set[asyncio.Task[Any]] = set()
        self._sweeper: asyncio.Task[None] | None = None
        self._orphan_sweeper: asyncio.Task[None] | None = None
        self._heartbeat: asyncio.Task[None] | None = None
        self.leases: Leases | None = None
        self.shared: SharedStoreWatch | None = None  # on a store shared with other hosts
        self._closings = Closings()
        self.turns = TurnBook(self, self.live)
        self.client_relay = ClientRelay(self)
        self.agent_calls = AgentCalls(self)
        self.usage = UsageTotals()
        self.turn_stats = TurnStats()  # for /metrics
        self._to_persist: list[PersistRequest] = []  # for the PersistenceActor, held
        self._reading_workers = False  # in _worker_messages: writes wait for its end

    # --- lifecycle ----------------------------------------------------------------

    async def start(self) -> None:
        settings = self.settings
        _log_unusable_agents(settings)
        self.store = await asyncio.to_thread(open_configured_store, settings)
        self.reader = self.store.reader
        self.usage.seed(await asyncio.to_thread(self.reader.usage_totals))
        self.leases = (Leases(settings.host_id, settings.lease_ttl_secs,
                              settings.takeover == "expired")
                       if self.store.backend == "postgresql" else None)
        self.persistence = PersistenceActor.start(self.store, self.leases)
        if self.leases is not None:  # a host of this id that died left its leases
            released = await self.persist(ReleaseAllLeases())
            log.info("host %s on a shared store (%d stale lease(s) released)",
                     self.leases.host_id, released)
        self.supervisor = SupervisorActor.start()
        self.sandbox = await asyncio.to_thread(detect_sandbox, settings.sandbox)
        self.pool = WorkerPool(
            run_dir=settings.data_dir / "run",
            on_message=self._on_worker_message,
            on_events=self._on_turn_events,
            on_worker_exit=self._on_worker_exit,
            on_worker_ready=self.live.pulse,
            around_messages=self._worker_messages,
            start_process=self._start_worker_process,
            max_workers=settings.workers_max,
            inherit=agent_variables(settings.agents.values()),
            env=worker_sandbox_environment(self.sandbox, settings.allow_unsandboxed_shell,
                                           self.protected, settings.data_dir / "agent-homes"),
        )
        become_subreaper()
        await self.pool.start()
        self.pool.scale_to(2)
        self._sweeper = asyncio.create_task(self._sweep_idle())
        self._orphan_sweeper = asyncio.create_task(self._sweep_orphans())
        if self.leases is not None:
            keeper = LeaseKeeper(self.leases.ttl_secs, self._leased_here, self._renew_leases,
                                 self.stop_sessions)
            self._heartbeat = asyncio.create_task(keeper.run())
        if self.store.connect is not None:
            self.shared = SharedStoreWatch(self.store.connect, settings.host_id,
                                           ttl_secs=settings.lease_ttl_secs,
                                           started_at=self.started_at, version=__version__)
            await self.shared.start()

    async def stop(self) -> None:
        """Cancel running turns, let them persist, then stop workers and actors."""
        self.turns.cancel_all()
        await self.turns.wait_all(timeout=10)
        for sweeper in (self._sweeper, self._orphan_sweeper, self._heartbeat):
            if sweeper is not None:
                sweeper.cancel()
        await self.pool.close()
        if self.shared is not None:
            await self.shared.stop()
        if self.leases is not None:
            try:  # another host may take this one's sessions now
                await self.persist(ReleaseAllLeases())
            except Exception as exc:
                log.warning("leases not released (they expire): %s", exc)
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

    def persist(self, write: StoreWrite[R]) -> asyncio.Future[R]:
        """Have the PersistenceActor do ``write``; the future settles once it is committed."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[R] = loop.create_future()
        self._hand_over(PersistRequest(write, loop_reply(loop, future)))
        return future

    def persist_then(self, write: StoreWrite[R],
                     then: Callable[[BaseException | None, R], None]) -> None:
        """Have the PersistenceActor do ``write``, then call ``then(error, value)`` on
        the loop once it is committed (``error`` None) or failed: one hop back, no
        future (a turn's commit, on the way of every prompt)."""
        loop = asyncio.get_running_loop()
        self._hand_over(PersistRequest(write, loop_callback(loop, then)))

    def _hand_over(self, request: PersistRequest) -> None:
        """Send ``request`` to the actor; while worker messages are read, queue it for
        the end of the read (:meth:`_worker_messages`)."""
        self._to_persist.append(request)
        if not self._reading_workers:
            self._send_to_persistence()

    def _worker_messages(self) -> _WorkerRead:
        """Around a read of worker messages (loop thread): the updates they carry go
        to each client in one write, and then the writes they ask for (the turns that
        ended) go to the PersistenceActor as one message, so the writer's thread is
        woken once, with nothing left for the loop to do before it sleeps."""
        return _WorkerRead(self)

    def _send_to_persistence(self) -> None:
        requests, self._to_persist = self._to_persist, []
        if not requests:
            return
        try:
            self.persistence.tell(requests[0] if len(requests) == 1
                                  else PersistBatch(tuple(requests)))
        except pykka.ActorDeadError:
            for request in requests:
                if request.reply is not None:
                    request.reply(StoreWriteError("the store is closed"), None)

    # --- workers ------------------------------------------------------------------------

    def _start_worker_process(self, argv: list[str],
                              env: dict[str, str]) -> asyncio.Future[subprocess.Popen[bytes]]:
        return ask(self.supervisor, StartWorker(tuple(argv), env))

    async def worker_with_room(self) -> str:
        """The ready worker to open a session on (the least loaded with room); waits
        for one to start or to free a place (bounded), growing the pool meanwhile."""
        deadline = time.monotonic() + WORKER_READY_TIMEOUT
        while (worker_id := self.live.place(self.pool.ready_workers())) is None:
            self.scale_workers(unplaced=1)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise InternalError("no worker available")
            if self.pool.ready_workers():
                await self.live.room(remaining)  # every ready worker is full
            else:
                try:
                    await self.pool.wait_ready(remaining)
                except TimeoutError:
                    raise InternalError("no worker available") from None
        return worker_id

    def scale_workers(self, unplaced: int = 0) -> None:
        """Grow the pool as :func:`supervisor.core.live.workers_wanted` says."""
        self.pool.scale_to(workers_wanted(self.live.workers_in_use(), unplaced,
                                          self.settings.sessions_per_worker))

    def close_evicted(self, evictions: list[Eviction], *,
                      told: str | None = None) -> list[str]:
        """Have the evicted sessions' actors closed, without waiting; those on worker
        ``told`` are left to the message the caller sends it next (their ids are
        returned, see ``OpenSession.evicted``)."""
        left = []
        for eviction in evictions:
            if eviction.route.worker_id == told:
                self.release_lease(eviction.sid)
                self.client_relay.session_gone(eviction.sid)
                left.append(eviction.sid)
            else:
                self.drop_on_worker(eviction.route)
            log.info("evicted idle session %s", eviction.sid)
        return left

    async def evict(self, sid: str) -> bool:
        """Drop a live idle session from memory, as the LRU rule does (it stays in the
        store; a prompt restores it). False when it is not live and IDLE."""
        eviction = self.live.evict(sid)
        if eviction is None:
            return False
        self.close_evicted([eviction])
        return True

    async def _sweep_idle(self) -> None:
        period = max(0.5, min(self.settings.session_timeout_secs / 4, 30.0))
        while True:
            await asyncio.sleep(period)
            try:
                self.close_evicted(self.live.sweep())
            except Exception:
                log.exception("idle sweep failed")

    async def _sweep_orphans(self) -> None:
        while True:
            await asyncio.sleep(ORPHAN_SWEEP_SECS)
            tell(self.supervisor, EndOrphans())

    def _on_worker_exit(self, worker_id: str) -> None:
        tell(self.supervisor, EndOrphans())
        self.agent_calls.worker_gone(worker_id)
        dropped = self.live.worker_exited(worker_id)
        for entry, route in dropped:
            route.agent_opened.set()  # nobody waits for its agent any more
            turn = entry.turn
            if turn is not None and turn.route is route and self.turns.worker_exited(turn):
                # the record says so until the next load or resume; nobody waits on it
                self.persist(MarkKilled(entry.sid)).add_done_callback(_log_write_failure)
        self._closings.worker_gone(worker_id)
        if dropped:
            log.warning("worker %s exited; %d session(s) dropped (restorable)", worker_id,
                        len(dropped))

    # --- messages from workers ----------------------------------------------------------

    def _on_turn_events(self, worker_id: str, events: list[TurnEvent], nbytes: int) -> None:
        """One turn's events that came together: paced to the turn's client (see
        :mod:`supervisor.core.pacing`)."""
        sid, turn_id = events[0].sid, events[0].turn_id
        turn = self.turns.get(sid, turn_id)
        if turn is None or turn.failure is not None:
            self.pool.grant(worker_id, sid, turn_id, nbytes)  # nobody takes them: dropped
            return
        if turn.stream is None:
            turn.stream = TurnStream(
                sid, turn.peer,
                lambda n: self.pool.grant(worker_id, sid, turn_id, n),
                lambda reason: self.turns.fail(turn, reason),
            )
        turn.stream.deliver_all(_events_from_wire(events), nbytes)

    def _on_worker_message(self, worker_id: str, message: WorkerMessage) -> None:
        match message:
            case TurnEnded(sid=sid, turn_id=turn_id, record=wire):
                turn = self.turns.get(sid, turn_id)
                if turn is not None:
                    self.turns.ended(turn, TurnRecord.from_wire(wire))
            case TurnFailed(sid=sid, turn_id=turn_id, message=text, record=wire, error=error):
                turn = self.turns.get(sid, turn_id)
                if turn is not None:
                    answer = (InternalError(turn.failure) if turn.failure
                              else relayed_error(error, text))
                    self.turns.failed(turn, answer, None if wire is None
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
                route = self.live.route(sid)
                if route is not None:
                    route.agent_modes = modes
                    route.agent_opened.set()
            case McpServersStatus(sid=sid, servers=servers):
                route = self.live.route(sid)
                if route is not None:
                    route.status["mcpServers"] = servers
                    route.touch()
            case PermissionRules(sid=sid, rules=rules):
                self.persist(UpdateMeta(sid, {TOOL_RULES_META: rules})).add_done_callback(
                    _log_write_failure)
            case SessionClosed(close_id=close_id):
                self._closings.confirmed(close_id)
            case OpenFailed(sid=sid, message=text):
                log.error("worker %s could not open session %s: %s", worker_id, sid, text)
                self._drop_broken(sid, text)
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

    def _drop_broken(self, sid: str, text: str) -> None:
        route = self.live.route(sid)
        if route is None:
            return
        self.live.drop(route)
        route.agent_opened.set()  # nobody waits for its agent any more
        turn = self.turns.get(sid)
        if turn is not None and turn.route is route:
            self.turns.settle(turn, error=InternalError(f"session could not start: {text}"))

    # --- helpers for session operations --------------------------------------------------

    def drop_on_worker(self, route: Route) -> None:
        """Close the session's actor on its worker without waiting for it."""
        self.release_lease(route.sid)
        self._send_close(route.worker_id, route.sid, wait=False)

    # --- leases (a shared PostgreSQL store) ----------------------------------------------

    async def take_lease(self, sid: str) -> None:
        """Own ``sid`` before it opens here; -32004 naming the owner while another live
        host owns it. Nothing to do on a store of one host's (SQLite)."""
        if self.leases is not None:
            await self.persist(TakeLease(sid))

    def release_lease(self, sid: str) -> None:
        """``sid`` left this host (closed, evicted, or its open failed); no wait."""
        if self.leases is not None:
            self._hand_over(PersistRequest(ReleaseLease(sid)))

    def _leased_here(self) -> list[str]:
        """The sessions live or opening here: those whose leases the heartbeat renews."""
        return [sid for sid, entry in self.live.entries.items()
                if entry.route is not None or entry.opening is not None]

    def _renew_leases(self, live: tuple[str, ...]) -> asyncio.Future[list[str]]:
        return self.persist(RenewLeases(live))

    def stop_sessions(self, sids: Collection[str], reason: str) -> None:
        """Sessions whose leases this host may lose (:mod:`supervisor.host.lease_keeper`): a
        running turn fails with ``reason`` (-32603, not kept), an idle session is
        evicted (its next prompt restores it, taking its lease first); one opening or
        closing is left to end."""
        for sid in sids:
            entry = self.live.get(sid)
            if entry is None or entry.opening is not None or entry.closing is not None:
                continue
            if entry.turn is not None:
                if not entry.turn.recorded:  # a recorded one: its commit checks the lease
                    self.turns.fail(entry.turn, reason)
                continue
            eviction = self.live.evict(sid)
            if eviction is not None:
                self.close_evicted([eviction])

    async def close_on_worker(self, route: Route) -> None:
        """Drop the session's actor and wait (bounded) for the worker to confirm."""
        self.release_lease(route.sid)
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
        if not self.pool.send(worker_id, CloseSession(sid, close_id, confirm=wait)):
            return close_id, None
        if not wait:
            return close_id, None  # nobody waits: the worker does not answer it
        return close_id, self._closings.sent(close_id, worker_id, wait=True)

    def session_info_event(self, title: str | None, parent: str | None = None) -> SessionInfo:
        """A ``session_info_update``; ``parent``: ``_meta.zeroclaw.parentSessionId``."""
        meta = {"zeroclaw": {"parentSessionId": parent}} if parent is not None else None
        return SessionInfo(title=title, updated_at=iso_utc(time.time()), meta=meta)


class _WorkerRead:
    """The context of :meth:`Host._worker_messages` (loop thread): a plain class, not
    a generator, as it is entered on every read of worker messages."""

    __slots__ = ("_host", "_writes")

    def __init__(self, host: Host) -> None:
        self._host = host
        self._writes = held_writes()

    def __enter__(self) -> None:
        self._host._reading_workers = True
        self._writes.__enter__()

    def __exit__(self, *exc_info: object) -> None:
        try:
            self._writes.__exit__(*exc_info)
        finally:
            self._host._reading_workers = False
            self._host._send_to_persistence()


def _events_from_wire(messages: list[TurnEvent]) -> list[Event]:
    """The events of ``messages``; one that does not parse is logged and left out."""
    events = []
    for message in messages:
        try:
            events += events_from_wire(message.event)
        except (KeyError, TypeError, AttributeError) as exc:
            log.warning("session %s: dropped a malformed event: %r", message.sid, exc)
    return events


def _log_unusable_agents(settings: Settings) -> None:
    """Say at start which configured agents ``session/new`` will refuse, and why."""
    for agent in settings.agents.values():
        problem = agent_config_problem(agent.to_wire()) if agent.enabled else None
        if problem is not None:
            log.warning("agent %s cannot be used: %s", agent.alias, problem)


def _log_write_failure(future: asyncio.Future[Any]) -> None:
    if not future.cancelled() and future.exception() is not None:
        log.warning("%s", future.exception())  # the error says "store write failed: ..."


