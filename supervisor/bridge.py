"""How the asyncio loop calls actors without blocking, and gets answers back.

The loop ``tell``s an actor a :class:`Call`; the actor runs the named method on its
own thread and hands the outcome back with ``loop.call_soon_threadsafe`` (about 3x
cheaper than ``run_in_executor(ask)``). Nothing here ever blocks the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pykka

__all__ = ["Call", "CallableActor", "Reply", "call", "loop_reply"]

log = logging.getLogger("zeroclaw.bridge")

Reply = Callable[[BaseException | None, Any], None]


def loop_reply(loop: asyncio.AbstractEventLoop, future: asyncio.Future[Any]) -> Reply:
    """A reply callable for any thread that settles ``future`` on ``loop``."""

    def settle(error: BaseException | None, result: Any) -> None:
        if future.done():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)

    def reply(error: BaseException | None, result: Any) -> None:
        with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits any more
            loop.call_soon_threadsafe(settle, error, result)

    return reply


@dataclass(frozen=True, slots=True)
class Call:
    """Run ``method(*args)`` on the actor; ``reply`` gets (error, result) on its thread."""

    method: str
    args: tuple[Any, ...]
    reply: Reply | None = None


class CallableActor(pykka.ThreadingActor):
    """An actor whose public methods the loop runs with :func:`call`.

    A method that raises answers the caller with the exception; the actor lives on
    (a raising ``tell`` handler would otherwise kill it).
    """

    use_daemon_thread = True

    def on_receive(self, message: Any) -> Any:
        if not isinstance(message, Call):
            return None
        try:
            result = getattr(self, message.method)(*message.args)
        except Exception as exc:
            if message.reply is None:
                log.exception("%s.%s failed", type(self).__name__, message.method)
            else:
                message.reply(exc, None)
            return None
        if message.reply is not None:
            message.reply(None, result)
        return None


def call(ref: pykka.ActorRef[Any], method: str, *args: Any) -> asyncio.Future[Any]:
    """From the loop thread: run ``method`` on the actor; await the returned future."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()
    ref.tell(Call(method, args, loop_reply(loop, future)))
    return future
