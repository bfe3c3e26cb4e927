"""Close confirmations from workers, matched to the closes that asked for them.

Runs on the asyncio loop thread. Every ``CloseSession`` the host sends carries a
number of its own, and the worker's ``SessionClosed`` answer carries it back (an
unknown session is answered at once, a live one when its actor has stopped).
Closes of one session can overlap — an eviction, then a restore and a
``session/close``; a close, a prompt that restores the session, a second close —
and each close is released by its own confirmation only, never another's.
"""

from __future__ import annotations

import asyncio
import itertools

__all__ = ["Closings"]


class Closings:
    """The closes sent and not yet confirmed, by their number."""

    def __init__(self) -> None:
        self._numbers = itertools.count(1)
        self._waiting: dict[int, tuple[str, asyncio.Future[None] | None]] = {}

    def number(self) -> int:
        """A fresh ``close_id`` for the next ``CloseSession``."""
        return next(self._numbers)

    def sent(self, close_id: int, worker_id: str, *, wait: bool) -> asyncio.Future[None] | None:
        """Record a ``CloseSession`` just sent; a future for its confirmation if ``wait``."""
        waiter = asyncio.get_running_loop().create_future() if wait else None
        self._waiting[close_id] = (worker_id, waiter)
        return waiter

    def confirmed(self, close_id: int) -> None:
        """A ``SessionClosed`` came back with this number."""
        _, waiter = self._waiting.pop(close_id, ("", None))
        _resolve(waiter)

    def forget(self, close_id: int) -> None:
        """The close stopped waiting (timed out): a late confirmation is ignored."""
        self._waiting.pop(close_id, None)

    def worker_gone(self, worker_id: str) -> None:
        """A worker that died confirms nothing more: its closes are done."""
        for close_id in [n for n, (w, _) in self._waiting.items() if w == worker_id]:
            _resolve(self._waiting.pop(close_id)[1])


def _resolve(waiter: asyncio.Future[None] | None) -> None:
    if waiter is not None and not waiter.done():
        waiter.set_result(None)
