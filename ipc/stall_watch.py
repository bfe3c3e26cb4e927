"""The stall rule of a paced connection: a peer that takes nothing while its writer is
behind is given up on (loop thread)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

__all__ = ["StallWatch"]


class StallWatch:
    """Watches one connection while it is behind (loop thread).

    ``taken()`` counts the bytes the peer has taken so far and ``behind()`` says
    whether the connection is still behind (and worth watching). Once started, a
    timer looks every quarter of ``timeout`` (at most every second) whether any byte
    was taken; when none was for ``timeout`` seconds, ``on_stall`` gets the reason.
    The watch ends by itself when the connection is no longer behind.
    """

    __slots__ = ("_behind", "_last_progress", "_last_taken", "_on_stall", "_taken",
                 "_timeout", "_timer")

    def __init__(self, timeout: float, taken: Callable[[], int], behind: Callable[[], bool],
                 on_stall: Callable[[str], None]) -> None:
        self._timeout = timeout
        self._taken = taken
        self._behind = behind
        self._on_stall = on_stall
        self._last_taken = 0
        self._last_progress = 0.0
        self._timer: asyncio.TimerHandle | None = None

    def start(self) -> None:
        """Start watching from now, unless already watching."""
        if self._timer is None:
            self._last_taken = self._taken()
            self._last_progress = time.monotonic()
            self._schedule()

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _schedule(self) -> None:
        period = min(1.0, self._timeout / 4)
        self._timer = asyncio.get_running_loop().call_later(period, self._check)

    def _check(self) -> None:
        """While behind: any byte taken is progress; none for ``timeout`` is a stall."""
        self._timer = None
        if not self._behind():
            return
        now, taken = time.monotonic(), self._taken()
        if taken != self._last_taken:
            self._last_taken, self._last_progress = taken, now
        elif now - self._last_progress >= self._timeout:
            self._on_stall(f"client stalled: took no bytes for {self._timeout:g} s")
            return
        self._schedule()
