"""Getting an actor's answer back to the asyncio loop without blocking it.

Actors that do slow work (the persistence actor's writes) take a ``reply``
callback, ``reply(error, value)``, which they call on their own thread when the
work is done. :func:`loop_reply` makes such a callback that resolves an
``asyncio.Future`` on its loop, through ``loop.call_soon_threadsafe`` (much
cheaper than ``run_in_executor(ask)``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any, TypeAlias

__all__ = ["ReplyCallback", "loop_reply"]

logger = logging.getLogger("zeroclaw.actors.bridge")

#: ``reply(error, value)``: ``error`` is ``None`` on success, else the failure.
ReplyCallback: TypeAlias = Callable[[BaseException | None, Any], None]


def loop_reply(loop: asyncio.AbstractEventLoop, future: asyncio.Future[Any]) -> ReplyCallback:
    """A reply callback, callable from any thread, that settles ``future`` on ``loop``.

    A future that is already done (e.g. cancelled because its client went
    away) is left alone; so is a loop that has closed meanwhile.
    """

    def settle(error: BaseException | None, value: Any) -> None:
        # Runs on the loop thread.
        if future.done():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(value)

    def reply(error: BaseException | None, value: Any) -> None:
        # Runs on the actor's thread.
        try:
            loop.call_soon_threadsafe(settle, error, value)
        except RuntimeError:
            logger.debug("event loop closed; a reply was dropped")

    return reply
