"""Getting an actor's answer back to the asyncio loop without blocking it.

Two shapes: :class:`CallableActor` subclasses (the supervisor) are driven with
:func:`call`, which ``tell``s a :class:`Call` and awaits the outcome; the
persistence actor takes typed messages (:class:`actors.persistence.PersistRequest`
carrying a :class:`actors.persistence.StoreWrite`) with a ``reply`` callback.

Actors that do slow work (the persistence actor's writes) take a ``reply``
callback, ``reply(error, value)``, which they call on their own thread when the
work is done. :func:`loop_reply` makes such a callback that resolves an
``asyncio.Future`` on its loop, through ``loop.call_soon_threadsafe`` (much
cheaper than ``run_in_executor(ask)``).
"""

from __future__ import annotations

import asyncio
import logging
import queue
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeAlias

import pykka

__all__ = [
    "Call",
    "CallableActor",
    "ReplyCallback",
    "SimpleInboxActor",
    "call",
    "loop_reply",
    "tell",
]

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


@dataclass(frozen=True, slots=True)
class Call:
    """Run ``method(*args)`` on the actor; ``reply`` gets (error, result) on its thread."""

    method: str
    args: tuple[Any, ...]
    reply: ReplyCallback | None = None


class SimpleInboxActor(pykka.ThreadingActor):
    """A threading actor whose inbox is a ``queue.SimpleQueue``.

    pykka's default inbox is a ``queue.Queue`` (a lock and two conditions per
    put and get); the C ``SimpleQueue`` makes a ``tell`` several times cheaper,
    which matters on the per-turn path. Everything else is pykka's.
    """

    @staticmethod
    def _create_actor_inbox() -> Any:
        return queue.SimpleQueue()


class CallableActor(SimpleInboxActor):
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
                logger.exception("%s.%s failed", type(self).__name__, message.method)
            else:
                message.reply(exc, None)
            return None
        if message.reply is not None:
            message.reply(None, result)
        return None


def tell(ref: pykka.ActorRef[Any], method: str, *args: Any) -> None:
    """From any thread: run ``method`` on a :class:`CallableActor`, no answer wanted.

    A failure is logged by the actor.
    """
    ref.tell(Call(method, args))


def call(ref: pykka.ActorRef[Any], method: str, *args: Any) -> asyncio.Future[Any]:
    """From the loop thread: run ``method`` on the actor; await the returned future."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()
    ref.tell(Call(method, args, loop_reply(loop, future)))
    return future
