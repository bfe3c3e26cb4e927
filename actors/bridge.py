"""Getting an actor's answer back to the asyncio loop without blocking it.

Two shapes: :class:`MessageActor` subclasses (the supervisor) take typed
messages, frozen dataclasses deriving from :class:`Request` (``Request[R]``:
answered with an ``R``), which the loop sends with :func:`ask` (await the
answer) or :func:`tell` (no answer wanted); the persistence actor takes typed
writes (:class:`actors.persistence.PersistRequest` carrying a
:class:`actors.persistence.StoreWrite`) with a ``reply`` callback.

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
from typing import Any, Generic, TypeAlias, TypeVar

import pykka

__all__ = [
    "MessageActor",
    "ReplyCallback",
    "Request",
    "SimpleInboxActor",
    "ask",
    "loop_callback",
    "loop_reply",
    "reply_all",
    "tell",
]

logger = logging.getLogger("zeroclaw.actors.bridge")

#: ``reply(error, value)``: ``error`` is ``None`` on success, else the failure.
ReplyCallback: TypeAlias = Callable[[BaseException | None, Any], None]
R = TypeVar("R")


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

    return loop_callback(loop, settle)


def loop_callback(loop: asyncio.AbstractEventLoop,
                  then: Callable[[BaseException | None, Any], None]) -> ReplyCallback:
    """A reply callback, callable from any thread, that calls ``then(error, value)``
    on ``loop`` (once; nothing when the loop has closed meanwhile)."""
    return _LoopCallback(loop, then)


class _LoopCallback:
    """A reply that runs ``then`` on ``loop``; :func:`reply_all` sends several
    of them for one loop there together."""

    __slots__ = ("loop", "then")

    def __init__(self, loop: asyncio.AbstractEventLoop,
                 then: Callable[[BaseException | None, Any], None]) -> None:
        self.loop = loop
        self.then = then

    def __call__(self, error: BaseException | None, value: Any) -> None:
        # Runs on the actor's thread.
        _post(self.loop, [(self.then, error, value)])


Reply: TypeAlias = tuple[ReplyCallback, BaseException | None, Any]
"""A reply callback and what to call it with: ``(reply, error, value)``."""


def reply_all(replies: list[Reply]) -> None:
    """Call each reply (the actor's thread), in order; the replies bound for one
    loop (:func:`loop_callback`, :func:`loop_reply`) go there as one callback, so
    a group of writes wakes the loop once (each wake-up would also have this
    thread wait for the GIL behind the loop it just woke)."""
    by_loop: dict[asyncio.AbstractEventLoop, list[tuple[Any, BaseException | None, Any]]] = {}
    for reply, error, value in replies:
        if isinstance(reply, _LoopCallback):
            by_loop.setdefault(reply.loop, []).append((reply.then, error, value))
        else:
            _call(reply, error, value)
    for loop, calls in by_loop.items():
        _post(loop, calls)


def _post(loop: asyncio.AbstractEventLoop,
          calls: list[tuple[Any, BaseException | None, Any]]) -> None:
    try:
        if len(calls) == 1:
            then, error, value = calls[0]
            loop.call_soon_threadsafe(then, error, value)
        else:
            loop.call_soon_threadsafe(_run_calls, calls)
    except RuntimeError:
        logger.debug("event loop closed; %d repl(ies) dropped", len(calls))


def _run_calls(calls: list[tuple[Any, BaseException | None, Any]]) -> None:
    """Run replies on their loop, each on its own (one that raises is logged)."""
    for then, error, value in calls:
        _call(then, error, value)


def _call(then: Any, error: BaseException | None, value: Any) -> None:
    try:
        then(error, value)
    except Exception as exc:  # its message may quote what was written: the type only
        logger.error("a reply callback raised %s", type(exc).__name__)


class Request(Generic[R]):
    """The base of a typed actor message answered with an ``R``; each message is a
    frozen dataclass deriving from ``Request[its answer type]``."""

    __slots__ = ()


@dataclass(frozen=True, slots=True)
class _Envelope:
    """A message on its way to a :class:`MessageActor`; ``reply`` gets (error, answer)
    on the actor's thread (None: nobody waits)."""

    message: Request[Any]
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


class MessageActor(SimpleInboxActor):
    """An actor that answers typed :class:`Request` messages in :meth:`handle`.

    A message whose handling raises answers the caller with the exception (or is
    logged, when told); the actor lives on (a raising handler would otherwise
    kill it).
    """

    use_daemon_thread = True

    def handle(self, message: Request[Any]) -> Any:
        """Answer one message (a ``match`` over the actor's message types); runs on
        the actor's thread."""
        raise NotImplementedError

    def on_receive(self, message: Any) -> Any:
        if not isinstance(message, _Envelope):
            return None
        try:
            answer = self.handle(message.message)
        except Exception as exc:
            if message.reply is None:
                logger.exception("%s failed on %r", type(self).__name__, message.message)
            else:
                message.reply(exc, None)
            return None
        if message.reply is not None:
            message.reply(None, answer)
        return None


def tell(ref: pykka.ActorRef[Any], message: Request[Any]) -> None:
    """From any thread: send ``message`` to a :class:`MessageActor`, no answer wanted.

    A failure is logged by the actor.
    """
    ref.tell(_Envelope(message))


def ask(ref: pykka.ActorRef[Any], message: Request[R]) -> asyncio.Future[R]:
    """From the loop thread: send ``message``; await the returned future for its answer."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[R] = loop.create_future()
    ref.tell(_Envelope(message, loop_reply(loop, future)))
    return future
