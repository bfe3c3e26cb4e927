"""The heartbeat of a host on a shared store, and what it does when it cannot beat.

Runs on the asyncio loop thread. Every third of the lease TTL the keeper has the
leases of the sessions live here renewed (:class:`actors.persistence.RenewLeases`).
A lease the database renewed lasts at least until the moment the renewal was *sent*
plus the TTL (the database starts the TTL when it runs the statement, later): that is
this host's own bound, in its monotonic clock, for every lease it holds.

When renewals fail (the database is down or cut off) or hang (a partition that drops
packets, a frozen server), the keeper stops every session here a :data:`margin
<LeaseKeeper.margin>` before that bound: a running turn fails (-32603, its record not
kept) and idle sessions are evicted. No turn of this host's can then be running when
another host takes a session over (``[store] takeover = "expired"``). A later prompt
restores the session, which takes its lease in the database first: while the
database is unreachable that fails with -32603, once it is back it succeeds. A live
session the database did not renew (another host took it over after this one
stalled) is stopped the same way.

Nothing here blocks: the renewal is a write of the persistence actor, awaited with
a deadline.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Collection

__all__ = ["LeaseKeeper"]

log = logging.getLogger("zeroclaw.leases")

RETRY_SECS = 1.0  # between renewals that failed, at most


class LeaseKeeper:
    """Renews this host's leases; ``stop(sids, reason)`` ends the sessions that may lose
    theirs. ``live()`` lists the sessions live or opening here; ``renew(live)`` renews
    their leases and returns the ids the database renewed."""

    def __init__(self, ttl_secs: float, live: Callable[[], list[str]],
                 renew: Callable[[tuple[str, ...]], Awaitable[list[str]]],
                 stop: Callable[[Collection[str], str], None], *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl = ttl_secs
        self.period = ttl_secs / 3
        #: Sessions stop this long before their leases may run out: time for a running
        #: turn to be cancelled on its worker.
        self.margin = ttl_secs / 4
        self.retry = min(self.period, RETRY_SECS)
        self._live = live
        self._renew = renew
        self._stop = stop
        self._clock = clock
        self.valid_until = clock() + ttl_secs  # the host just took or freed its leases
        self.lapsed = False  # sessions were stopped: no renewal came in time

    async def run(self) -> None:
        failed = False
        while True:
            if self.lapsed:
                await asyncio.sleep(self.retry)
            elif failed:  # never past the point where the sessions must stop
                await asyncio.sleep(max(0.0, min(self.retry, self._left())))
            else:  # and early enough before it for the renewal to be answered
                await asyncio.sleep(max(0.0, min(self.period, self._left() - self.margin / 2)))
            failed = not await self.beat()

    def _left(self) -> float:
        """Seconds until the sessions must stop unless a renewal succeeds."""
        return self.valid_until - self.margin - self._clock()

    async def beat(self) -> bool:
        """One renewal; whether it succeeded."""
        live = tuple(self._live())
        sent = self._clock()
        renewed = await self._renewed(asyncio.ensure_future(self._renew(live)))
        if renewed is None:
            return False
        self.valid_until = sent + self.ttl
        if self.lapsed and self._left() > 0:  # one answered too late is no recovery
            self.lapsed = False
            log.warning("lease heartbeat: the store answers again; sessions restore on "
                        "their next prompt")
        lost = set(live) - set(renewed)
        if lost:
            self._stop(lost, "this host no longer owns the session: another host took "
                             "it over")
        return True

    async def _renewed(self, attempt: asyncio.Future[list[str]]) -> list[str] | None:
        """``attempt``'s ids, or None when it failed; the sessions are stopped as soon
        as their leases may run out, whether it is still pending or failed."""
        while not attempt.done():
            left = self._left()
            if left <= 0:
                self._lapse("the lease heartbeat gets no answer from the store")
                await asyncio.wait([attempt])
                break
            await asyncio.wait([attempt], timeout=left)
        try:
            return attempt.result()
        except Exception as exc:
            log.warning("lease heartbeat failed: %s", exc)
            if self._left() <= 0:
                self._lapse("the store is unreachable: this host cannot renew its leases")
            return None

    def _lapse(self, why: str) -> None:
        if self.lapsed:
            return
        self.lapsed = True
        live = self._live()
        log.error("%s; %d session(s) stopped before their leases could run out", why,
                  len(live))
        self._stop(live, f"{why}, so the session stopped here before another host could "
                         "take it over")
