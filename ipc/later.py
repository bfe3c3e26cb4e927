"""A handler's answer that comes later by a plain call, not from a task.

Runs on the asyncio loop thread. A request handler of :class:`ipc.jsonrpc.Endpoint`
that can start its work at once, and learns its outcome from a callback of its own
(a turn's commit, say), returns a :class:`LaterAnswer` instead of a coroutine: the
endpoint then answers the moment :meth:`LaterAnswer.give` or :meth:`LaterAnswer.fail`
is called, with no task to start and none to wake (two passes of the loop less per
request). If the endpoint closes first (its client is gone), the answer is
abandoned: its ``on_abandon`` runs, as a cancelled handler task's cleanup would.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

__all__ = ["LaterAnswer"]

Deliver = Callable[[Exception | None, Any], None]


class LaterAnswer:
    """One request's answer, given once: a result, an error, or abandoned."""

    __slots__ = ("_deliver", "_done", "_early", "_on_abandon", "_waiter")

    def __init__(self, on_abandon: Callable[[], None]) -> None:
        self._on_abandon = on_abandon
        self._deliver: Deliver | None = None
        self._early: tuple[Exception | None, Any] | None = None  # given before bind
        self._done = False
        self._waiter: asyncio.Future[None] | None = None

    @property
    def done(self) -> bool:
        return self._done

    def bind(self, deliver: Deliver) -> None:
        """The endpoint's side: ``deliver(error, result)`` writes the answer (at once
        when it was given already)."""
        self._deliver = deliver
        early, self._early = self._early, None
        if early is not None:
            deliver(*early)

    def give(self, result: Any) -> None:
        """Answer with ``result`` (a no-op once done)."""
        self._finish(None, result)

    def fail(self, error: Exception) -> None:
        """Answer with ``error``: an RpcError as itself, anything else as -32603."""
        self._finish(error, None)

    def abandon(self) -> None:
        """The endpoint closed first: nothing is answered; ``on_abandon`` runs."""
        if self._end():
            self._on_abandon()

    def wait(self) -> asyncio.Future[None]:
        """A future that is done once the answer is (for a drain of the endpoint)."""
        if self._waiter is None:
            self._waiter = asyncio.get_running_loop().create_future()
            if self._done:
                self._waiter.set_result(None)
        return self._waiter

    def _finish(self, error: Exception | None, result: Any) -> None:
        if not self._end():
            return
        if self._deliver is None:
            self._early = (error, result)
        else:
            self._deliver(error, result)

    def _end(self) -> bool:
        """Mark it done; False when it already was."""
        if self._done:
            return False
        self._done = True
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)
        return True
