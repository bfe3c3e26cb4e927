"""The live-session table: every session the host holds, opens, closes or runs a turn
for, in one place with one owner.

Runs on the host's asyncio loop thread only (no locks, no thread hops): a turn,
an open or a close reads and changes its session's entry synchronously, so
nothing needs to be asked of another thread and nothing is polled. Concurrent
requests on one session meet here: each sees the entry's :class:`SessionState`
and either goes on, waits for the entry's ``opening`` or ``closing`` future, or
is answered at once.

The decisions (admission under ``max_sessions`` with LRU eviction, placement on
a worker, the idle sweep, the pool size) are plain functions over the entries,
at the bottom of this module, tested without processes.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import itertools
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from ipc.errors import InvalidParams, SessionBusy, SessionLimitReached, SessionNotFound
from supervisor.core.routes import Route, RunningTurn

__all__ = [
    "Eviction",
    "Limits",
    "LiveSession",
    "LiveTable",
    "SessionState",
    "choose_worker",
    "least_recently_used_idle",
    "stale_sessions",
    "workers_wanted",
]


class SessionState(enum.Enum):
    """Where a session stands; derived from its entry's fields (see :class:`LiveSession`)."""

    OPENING = "opening"  # being opened: its history read, a worker found, then (admitted,
    #                      placed) its row written; evictable once placed, as IDLE is
    IDLE = "idle"  # open on a worker, no turn: what eviction takes
    BUSY = "busy"  # open on a worker, running a turn
    CLOSING = "closing"  # a close or delete is under way: nothing may revive it
    DETACHED = "detached"  # not open: a turn that has not settled yet (its worker died,
    #                        or its prompt is about to restore the session)


@dataclass(frozen=True, slots=True)
class Limits:
    max_sessions: int
    session_timeout_secs: float
    sessions_per_worker: int = 0  # 0 = no limit per worker


@dataclass(frozen=True, slots=True)
class Eviction:
    """An idle session dropped from memory (it stays in the store); its worker must
    close its actor."""

    sid: str
    route: Route


@dataclass(eq=False, slots=True)
class LiveSession:
    """One session's entry. ``route``: open on that worker (set once placed);
    ``turn``: the prompt under way; ``opening``/``closing``: settle when the open
    or the close under way ends (others wait on them, shielded)."""

    sid: str
    last_used: float = field(default_factory=time.monotonic)
    route: Route | None = None
    turn: RunningTurn | None = None
    opening: asyncio.Future[None] | None = None
    closing: asyncio.Future[None] | None = None

    @property
    def state(self) -> SessionState:
        if self.closing is not None:
            return SessionState.CLOSING
        if self.opening is not None:
            return SessionState.OPENING
        if self.route is None:
            return SessionState.DETACHED
        return SessionState.BUSY if self.turn is not None else SessionState.IDLE

    @property
    def holds_place(self) -> bool:
        """Counts under ``max_sessions``: admitted (placed on a worker), not yet dropped."""
        return self.route is not None

    @property
    def evictable(self) -> bool:
        """Open on a worker with no turn and no close under way (IDLE, or OPENING
        while its row is written, as a session the host just opened)."""
        return self.route is not None and self.turn is None and self.closing is None

    @property
    def empty(self) -> bool:
        return (self.route is None and self.turn is None and self.opening is None
                and self.closing is None)


class LiveTable:
    """The host's live sessions, by id. Every method runs on the loop thread and
    never awaits; a transition is one method call."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.entries: dict[str, LiveSession] = {}
        self.by_worker: dict[str, set[str]] = {}
        #: The entries that hold a place under max_sessions, least recently used first
        #: (see :meth:`_used`).
        self._placed: dict[str, LiveSession] = {}
        self._room: asyncio.Future[None] | None = None  # see room() and pulse()
        self.routes_version = 0  # changes whenever a session's route comes or goes
        #: The gateway tenants' own ``max_sessions``, by tenant id (set by the
        #: gateway, again on each tenant reload): admission keeps each under its cap.
        self.tenant_caps: Mapping[str, int] = {}

    # --- reading -----------------------------------------------------------------------

    def get(self, sid: str) -> LiveSession | None:
        return self.entries.get(sid)

    def route(self, sid: str) -> Route | None:
        """The session's route when it is open on a worker."""
        entry = self.entries.get(sid)
        return entry.route if entry is not None else None

    def routes(self) -> list[Route]:
        return [e.route for e in self.entries.values() if e.route is not None]

    def turns(self) -> list[RunningTurn]:
        return [e.turn for e in self.entries.values() if e.turn is not None]

    def workers_in_use(self) -> int:
        return len(self.by_worker)  # a worker's set goes when its last session does

    def touch(self, sid: str) -> None:
        """Activity on a session: its LRU place and its ``lastActivity``."""
        entry = self.entries.get(sid)
        if entry is not None:
            self._used(entry)
            if entry.route is not None:
                entry.route.touch()

    # --- opening ---------------------------------------------------------------------------

    def begin_opening(self, sid: str) -> LiveSession:
        """Mark ``sid`` OPENING (no place taken yet): from now on anything else that
        would open, prompt, close or delete it waits on the entry's ``opening``.
        The caller ends with :meth:`opened` or :meth:`abandon`."""
        entry = self.entries.get(sid)
        if entry is not None and entry.closing is not None:
            raise SessionNotFound(f"Session not found: {sid} (it is being closed)")
        if entry is not None and (entry.opening is not None or entry.route is not None):
            raise InvalidParams(f"session {sid} is already active; call session/close first")
        entry = entry or self.entries.setdefault(sid, LiveSession(sid))
        entry.opening = asyncio.get_running_loop().create_future()
        return entry

    def admit(self, entry: LiveSession, route: Route) -> list[Eviction]:
        """Make room under ``max_sessions`` and the cap of the route's tenant
        (:meth:`make_room`) and place the OPENING ``entry`` on ``route.worker_id``;
        the evicted sessions' actors are the caller's to close. -32001 when every
        live session (of the tenant, at its cap) is busy."""
        evicted = self.make_room(route.tenant)
        self._set_route(entry, route)
        self._used(entry)
        self._refresh(entry)
        return evicted

    def make_room(self, tenant: str | None = None) -> list[Eviction]:
        """Evict least recently used idle sessions until one more fits under
        ``max_sessions`` and, for a ``tenant`` with a cap (:attr:`tenant_caps`),
        under that cap (the tenant's own sessions first, its least recently used
        idle one); their actors are the caller's to close. -32001, with nothing
        evicted, when that cannot be done because the sessions are busy.
        :meth:`place` then sees the loads without them."""
        return [self._evict(victim) for victim in self._victims(tenant)]

    def _victims(self, tenant: str | None) -> list[LiveSession]:
        """The sessions :meth:`make_room` evicts, least recently used first."""
        victims: list[LiveSession] = []
        cap = self.tenant_caps.get(tenant) if tenant else None
        if cap is not None:
            excess = len(self._tenant_placed(tenant)) - cap + 1
            victims = list(itertools.islice(self._idle_in_order(tenant), max(0, excess)))
            if len(victims) < excess:
                raise SessionLimitReached(f"Maximum session limit reached ({cap})")
        excess = len(self._placed) - len(victims) - self.limits.max_sessions + 1
        if excess > 0:
            others = (e for e in self._idle_in_order() if e not in victims)
            more = list(itertools.islice(others, excess))
            if len(more) < excess:
                raise SessionLimitReached(
                    f"Maximum session limit reached ({self.limits.max_sessions})")
            victims += more
        return victims

    def tenant_has_room(self, tenant: str, cap: int, opening: int = 0) -> bool:
        """Whether one more session of ``tenant`` could be admitted under ``cap``
        now: it has fewer than ``cap`` live (``opening`` more not yet admitted), or
        an idle one to evict."""
        own = self._tenant_placed(tenant)
        return len(own) + opening < cap or any(e.evictable for e in own)

    def _tenant_placed(self, tenant: str | None) -> list[LiveSession]:
        """The entries of ``tenant`` that hold a place, least recently used first."""
        return [e for e in self._placed.values()
                if e.route is not None and e.route.tenant == tenant]

    def place(self, ready_workers: Sequence[str]) -> str | None:
        """The least-loaded ready worker with room, if any."""
        return choose_worker(ready_workers, self._load, self.limits.sessions_per_worker)

    def _load(self, worker_id: str) -> int:
        return len(self.by_worker.get(worker_id, ()))

    def opened(self, entry: LiveSession) -> None:
        """The open succeeded: OPENING ends; a prompt waiting for it is BUSY now."""
        self._end_opening(entry)
        if entry.turn is not None and entry.turn.route is None and entry.route is not None:
            self._start_turn(entry, entry.turn)
        self._refresh(entry)

    def abandon(self, entry: LiveSession) -> Route | None:
        """The open failed: its place is freed; returns the route to close, if placed."""
        route = entry.route
        self._set_route(entry, None)
        self._end_opening(entry)
        self._refresh(entry)
        return route

    async def room(self, timeout: float) -> None:
        """Wait (bounded) until a worker may have room: one became ready or a session
        left one (see :meth:`pulse`). The waiter is registered as this is called, so
        a pulse right after the caller's check is not missed."""
        if self._room is None or self._room.done():
            self._room = asyncio.get_running_loop().create_future()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self._room), timeout)

    def pulse(self) -> None:
        """Wake every :meth:`room` waiter (they look again)."""
        if self._room is not None and not self._room.done():
            self._room.set_result(None)

    def _end_opening(self, entry: LiveSession) -> None:
        opening, entry.opening = entry.opening, None
        if opening is not None and not opening.done():
            opening.set_result(None)

    # --- turns -------------------------------------------------------------------------------

    def attach_turn(self, turn: RunningTurn) -> LiveSession:
        """Register ``turn`` on its session now (no await): -32002 when one is already
        running, -32000 while the session is being closed. BUSY at once when the
        session is open; else the turn waits for the open (or restores it)."""
        entry = self.entries.get(turn.sid)
        if entry is None:
            entry = self.entries[turn.sid] = LiveSession(turn.sid)
        elif entry.turn is not None:
            raise SessionBusy(f"Session busy: a turn is already running in {turn.sid}")
        elif entry.closing is not None:
            raise SessionNotFound(f"Session not found: {turn.sid} (it is being closed)")
        entry.turn = turn
        if entry.opening is None and entry.route is not None:
            self._start_turn(entry, turn)
        return entry

    def _start_turn(self, entry: LiveSession, turn: RunningTurn) -> None:
        turn.route = entry.route
        self._used(entry)
        if entry.route is not None:
            entry.route.turn_started()

    def detach_turn(self, turn: RunningTurn) -> None:
        """The turn settled: its session is IDLE again (or goes, if nothing else holds it)."""
        entry = self.entries.get(turn.sid)
        if entry is None or entry.turn is not turn:
            return
        entry.turn = None
        self._used(entry)
        self._refresh(entry)

    # --- dropping ------------------------------------------------------------------------------

    def evict(self, sid: str) -> Eviction | None:
        """Drop ``sid`` from memory if it is IDLE (as the LRU rule does)."""
        entry = self.entries.get(sid)
        if entry is None or entry.state is not SessionState.IDLE:
            return None
        return self._evict(entry)

    def sweep(self) -> list[Eviction]:
        """Evict the idle sessions unused for longer than the session timeout."""
        horizon = time.monotonic() - self.limits.session_timeout_secs
        return [self._evict(e) for e in stale_sessions(self.entries.values(), horizon)]

    def _evict(self, entry: LiveSession) -> Eviction:
        route = entry.route
        assert route is not None
        self._set_route(entry, None)
        self._refresh(entry)
        return Eviction(entry.sid, route)

    def drop(self, route: Route) -> bool:
        """Forget ``route`` (closed, or its worker could not open it); False when the
        session's entry holds another route or none."""
        entry = self.entries.get(route.sid)
        if entry is None or entry.route is not route:
            return False
        self._set_route(entry, None)
        self._refresh(entry)
        return True

    def worker_exited(self, worker_id: str) -> list[tuple[LiveSession, Route]]:
        """Drop every session on a dead worker; their entries and routes."""
        dropped = []
        for sid in sorted(self.by_worker.pop(worker_id, set())):
            entry = self.entries[sid]
            route = entry.route
            if route is not None:
                self._set_route(entry, None)
                self._refresh(entry)
                dropped.append((entry, route))
        return dropped

    # --- closing -------------------------------------------------------------------------------

    def begin_closing(self, sid: str) -> LiveSession:
        """Mark ``sid`` CLOSING (also a session that is not live, for a delete): from
        now on no prompt, load or event revives it. One close at a time: the caller
        waits for ``closing`` of an earlier one first."""
        entry = self.entries.get(sid)
        if entry is None:
            entry = self.entries[sid] = LiveSession(sid)
        assert entry.closing is None, "one close of a session at a time"
        entry.closing = asyncio.get_running_loop().create_future()
        return entry

    def end_closing(self, entry: LiveSession) -> None:
        closing, entry.closing = entry.closing, None
        if closing is not None and not closing.done():
            closing.set_result(None)
        self._refresh(entry)

    # --- bookkeeping -----------------------------------------------------------------------

    def _used(self, entry: LiveSession) -> None:
        """``entry`` is used now: it goes to the end of the order of use (every change of
        ``last_used`` comes here, so ``_placed`` stays sorted by it)."""
        entry.last_used = time.monotonic()
        placed = self._placed
        if placed.pop(entry.sid, None) is not None:
            placed[entry.sid] = entry

    def _least_recently_used_idle(self) -> LiveSession | None:
        """:func:`least_recently_used_idle` of the entries, without a scan of them all:
        the first evictable one in the order of use."""
        return next(self._idle_in_order(), None)

    def _idle_in_order(self, tenant: str | None = None) -> Iterator[LiveSession]:
        """The evictable entries (of ``tenant`` only, when given), least recently used
        first, found lazily."""
        for entry in self._placed.values():
            if entry.evictable and (tenant is None or (
                    entry.route is not None and entry.route.tenant == tenant)):
                yield entry

    def _set_route(self, entry: LiveSession, route: Route | None) -> None:
        self.routes_version += 1
        old = entry.route
        if old is not None:
            sids = self.by_worker.get(old.worker_id)
            if sids is not None:
                sids.discard(entry.sid)
                if not sids:
                    del self.by_worker[old.worker_id]
            self.pulse()
            self._placed.pop(entry.sid, None)
        entry.route = route
        if route is not None:
            self.by_worker.setdefault(route.worker_id, set()).add(entry.sid)
            self._placed[entry.sid] = entry  # last: the caller marks it used now

    def _refresh(self, entry: LiveSession) -> None:
        """Drop the entry once nothing holds it any more."""
        if entry.empty and self.entries.get(entry.sid) is entry:
            del self.entries[entry.sid]


# --- the decisions: plain functions over entries ---------------------------------------------


def least_recently_used_idle(entries: Iterable[LiveSession]) -> LiveSession | None:
    """The evictable session used longest ago (the one admission evicts at the cap)."""
    idle = [e for e in entries if e.evictable]
    return min(idle, key=lambda e: e.last_used) if idle else None


def stale_sessions(entries: Iterable[LiveSession], horizon: float) -> list[LiveSession]:
    """The IDLE sessions last used before ``horizon`` (``time.monotonic()`` seconds)."""
    return [e for e in entries if e.state is SessionState.IDLE and e.last_used < horizon]


def choose_worker(ready_workers: Sequence[str], load: Callable[[str], int],
                  sessions_per_worker: int) -> str | None:
    """The least-loaded of ``ready_workers`` (``load``: its live sessions) that has
    room (``sessions_per_worker``, 0 = no limit); None when none has."""
    loads = {w: load(w) for w in ready_workers}
    cap = sessions_per_worker
    candidates = [w for w in ready_workers if not cap or loads[w] < cap]
    return min(candidates, key=loads.__getitem__) if candidates else None


def workers_wanted(in_use: int, unplaced: int, sessions_per_worker: int) -> int:
    """The pool size to aim for: the workers in use plus one warm spare, and with
    one session per worker (``sessions_per_worker``) one more per waiting session."""
    if sessions_per_worker:
        return in_use + unplaced + 1
    return max(in_use, 1) + 1
