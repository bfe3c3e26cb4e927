"""Close confirmations from workers, matched to the closes that asked for them.

Runs on the asyncio loop thread. A worker answers every ``CloseSession`` with
exactly one ``SessionClosed`` (an unknown session at once, a live one when its
actor has stopped). Closes of one session can overlap — an eviction, then a
restore and a ``session/close``; a close, a prompt that restores the session, a
second close — so each confirmation goes to the oldest close still waiting on
that worker for that session, never to whichever close registered last. The
confirmations carry no close id, so two overlapping closes may each be released
by the other's confirmation; both still end. (A worker that never confirms a
close delays the next close of that session there by one confirmation.)
"""

from __future__ import annotations

import asyncio
from collections import deque

__all__ = ["Closings"]


class Closings:
    """Per (worker, session): the closes sent and not yet confirmed, oldest first."""

    def __init__(self) -> None:
        self._waiting: dict[tuple[str, str], deque[asyncio.Future[None] | None]] = {}

    def sent(self, worker_id: str, sid: str, *, wait: bool) -> asyncio.Future[None] | None:
        """Record a ``CloseSession`` just sent; a future for its confirmation if ``wait``."""
        waiter = asyncio.get_running_loop().create_future() if wait else None
        self._waiting.setdefault((worker_id, sid), deque()).append(waiter)
        return waiter

    def confirmed(self, worker_id: str, sid: str) -> None:
        """A ``SessionClosed`` came: it answers the oldest close of that session there."""
        queue = self._waiting.get((worker_id, sid))
        if not queue:
            return
        _resolve(queue.popleft())
        if not queue:
            del self._waiting[(worker_id, sid)]

    def worker_gone(self, worker_id: str) -> None:
        """A worker that died confirms nothing more: its closes are done."""
        for key in [k for k in self._waiting if k[0] == worker_id]:
            for waiter in self._waiting.pop(key):
                _resolve(waiter)


def _resolve(waiter: asyncio.Future[None] | None) -> None:
    if waiter is not None and not waiter.done():
        waiter.set_result(None)
