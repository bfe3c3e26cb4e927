"""A turn's cancel flag that also calls back: a thread blocked on a queue is woken
by the cancel itself (a sentinel put in its queue), instead of waking every few
milliseconds to look at the flag."""

from __future__ import annotations

import threading
from collections.abc import Callable

__all__ = ["TurnCancel", "call_on_cancel"]


class TurnCancel(threading.Event):
    """A :class:`threading.Event` whose :meth:`set` also runs the callbacks registered
    with :meth:`on_set` (on the thread that sets it: the worker's IO thread; they must
    not block). Created by :meth:`actors.worker.session.SessionState.begin_turn`."""

    def __init__(self) -> None:
        super().__init__()
        self._hooks_lock = threading.Lock()
        self._hooks: list[Callable[[], None]] = []

    def set(self) -> None:
        with self._hooks_lock:
            super().set()
            hooks, self._hooks = self._hooks, []
        for hook in hooks:
            hook()

    def on_set(self, hook: Callable[[], None]) -> Callable[[], None]:
        """Run ``hook`` once when the flag is set (at once if it is); returns what
        unregisters it (any thread)."""
        with self._hooks_lock:
            if not self.is_set():
                self._hooks.append(hook)
                return lambda: self._forget(hook)
        hook()
        return _nothing

    def _forget(self, hook: Callable[[], None]) -> None:
        with self._hooks_lock:
            if hook in self._hooks:
                self._hooks.remove(hook)


def call_on_cancel(cancelled: threading.Event,
                   hook: Callable[[], None]) -> Callable[[], None] | None:
    """:meth:`TurnCancel.on_set` when ``cancelled`` is one; None for a plain Event
    (the caller then has to look at the flag itself from time to time)."""
    return cancelled.on_set(hook) if isinstance(cancelled, TurnCancel) else None


def _nothing() -> None:
    """Unregisters a hook that already ran."""
