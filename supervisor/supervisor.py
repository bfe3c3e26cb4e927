"""SupervisorActor: the session table, limits, eviction and placement.

Runs on its own pykka thread; the asyncio loop reaches it only through
:func:`actors.bridge.call` and never waits on it for a worker or the store.
It decides; the loop acts (sends envelopes to workers, writes through the
persistence actor). Decisions come back as frozen dataclasses.

Rules (SPEC §5): at most ``max_sessions`` live sessions; at the cap the least
recently used idle session is evicted (it stays in the store, restorable); only
when every live session is busy does admission fail with -32001. Idle sessions
older than ``session_timeout_secs`` are evicted by :meth:`SupervisorActor.sweep`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from actors.bridge import CallableActor
from ipc.errors import InvalidParams, SessionBusy, SessionLimitReached, SessionNotFound

__all__ = ["Admission", "Eviction", "Limits", "SupervisorActor", "workers_wanted"]


def workers_wanted(in_use: int, unplaced: int, sessions_per_worker: int) -> int:
    """The pool size to aim for: the workers in use plus one warm spare, and with
    one session per worker (``sessions_per_worker``) one more per waiting session."""
    if sessions_per_worker:
        return in_use + unplaced + 1
    return max(in_use, 1) + 1


@dataclass(frozen=True, slots=True)
class Limits:
    max_sessions: int
    session_timeout_secs: float
    sessions_per_worker: int = 0  # 0 = no limit per worker


@dataclass(frozen=True, slots=True)
class Eviction:
    """A live session dropped from memory; its worker must close its actor."""

    sid: str
    worker_id: str | None


@dataclass(frozen=True, slots=True)
class Admission:
    """``worker_id`` None: no worker has room yet; call ``place`` once one is ready."""

    evicted: tuple[Eviction, ...]
    worker_id: str | None


@dataclass(slots=True)
class _Live:
    sid: str
    agent_alias: str
    worker_id: str | None = None
    busy: bool = False
    last_used: float = field(default_factory=time.monotonic)

    def touch(self) -> None:
        self.last_used = time.monotonic()


class SupervisorActor(CallableActor):
    """Owns the table of live sessions. Every method runs on the actor's thread."""

    def __init__(self, limits: Limits) -> None:
        super().__init__()
        self.limits = limits
        self.sessions: dict[str, _Live] = {}
        self.by_worker: dict[str, set[str]] = {}

    # --- admission and placement ---------------------------------------------

    def admit(self, sid: str, agent_alias: str, ready_workers: Sequence[str]) -> Admission:
        """Make room for ``sid`` (evicting LRU idle sessions) and place it on a worker."""
        if sid in self.sessions:
            raise InvalidParams(f"session {sid} is already active; call session/close first")
        evicted = []
        while len(self.sessions) >= self.limits.max_sessions:
            victim = self._least_recently_used_idle()
            if victim is None:
                raise SessionLimitReached(
                    f"Maximum session limit reached ({self.limits.max_sessions})"
                )
            evicted.append(Eviction(victim.sid, self._drop(victim.sid)))
        self.sessions[sid] = _Live(sid, agent_alias)
        return Admission(tuple(evicted), self.place(sid, ready_workers))

    def place(self, sid: str, ready_workers: Sequence[str]) -> str | None:
        """Put ``sid`` on the least-loaded ready worker with room, if any."""
        live = self._get(sid)
        cap = self.limits.sessions_per_worker
        candidates = [w for w in ready_workers if not cap or len(self.by_worker.get(w, ())) < cap]
        if not candidates:
            return None
        worker_id = min(candidates, key=lambda w: len(self.by_worker.get(w, ())))
        live.worker_id = worker_id
        self.by_worker.setdefault(worker_id, set()).add(sid)
        return worker_id

    def workers_wanted(self) -> int:
        """Workers in use plus one warm spare (or one per session when isolated)."""
        in_use = sum(1 for sids in self.by_worker.values() if sids)
        unplaced = sum(1 for s in self.sessions.values() if s.worker_id is None)
        return workers_wanted(in_use, unplaced, self.limits.sessions_per_worker)

    def _least_recently_used_idle(self) -> _Live | None:
        idle = [s for s in self.sessions.values() if not s.busy]
        return min(idle, key=lambda s: s.last_used) if idle else None

    # --- turns ------------------------------------------------------------------

    def begin_turn(self, sid: str) -> str | None:
        """Mark ``sid`` busy; returns its worker. -32000 if not live, -32002 if busy."""
        live = self._get(sid)
        if live.busy:
            raise SessionBusy(f"Session busy: a turn is already running in {sid}")
        live.busy = True
        live.touch()
        return live.worker_id

    def end_turn(self, sid: str) -> bool:
        """Mark ``sid`` idle again (its turn ended); False if it is no longer live."""
        live = self.sessions.get(sid)
        if live is None:
            return False
        live.busy = False
        live.touch()
        return True

    def touch(self, sid: str) -> bool:
        live = self.sessions.get(sid)
        if live is not None:
            live.touch()
        return live is not None

    # --- removal ----------------------------------------------------------------

    def release(self, sid: str) -> str | None:
        """Forget a live session (closed or evicted); returns the worker it was on."""
        if sid not in self.sessions:
            raise SessionNotFound(f"Session not found: {sid}")
        return self._drop(sid)

    def worker_exited(self, worker_id: str) -> list[str]:
        """Forget every session on a dead worker; returns their ids."""
        sids = sorted(self.by_worker.pop(worker_id, set()))
        for sid in sids:
            self.sessions.pop(sid, None)
        return sids

    def sweep(self) -> list[Eviction]:
        """Evict idle sessions unused for longer than the session timeout."""
        horizon = time.monotonic() - self.limits.session_timeout_secs
        stale = [s.sid for s in self.sessions.values() if not s.busy and s.last_used < horizon]
        return [Eviction(sid, self._drop(sid)) for sid in stale]

    def _get(self, sid: str) -> _Live:
        live = self.sessions.get(sid)
        if live is None:
            raise SessionNotFound(f"Session not found: {sid}")
        return live

    def _drop(self, sid: str) -> str | None:
        live = self.sessions.pop(sid)
        if live.worker_id is not None:
            self.by_worker.get(live.worker_id, set()).discard(sid)
        return live.worker_id
