"""Requests to a hosted agent from other threads (a turn's ``session/prompt``, a
client's forwarded request), each answered in a ``concurrent.futures.Future``, and
the agent's stdin they are written to.

The caller's thread writes the request itself (:class:`AgentInput`: the pipe is
shared with the agent process's loop thread, :mod:`actors.worker.agents.acp_process`,
frames whole), and the loop thread settles its future in the same step that
reads the response: no hand-off to the loop, no task, and the waiting thread
hears of the answer at once. Only well-formed responses to these requests are
taken here; anything else goes to the endpoint as before (which drops a
malformed response, as it would its own). A caller may cancel its future at any
time: the answer is then dropped.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import itertools
import os
import threading
from collections.abc import Callable
from typing import Any

import orjson

from ipc.jsonrpc import ConnectionLost, RemoteError

__all__ = ["AgentCalls", "AgentInput"]

_ID_PREFIX = "zc-call-"


class AgentInput:
    """The agent's stdin, written from any thread, a frame at a time: what the pipe
    takes at once is written by the caller, the rest waits here and the loop thread
    writes it as the pipe drains. Once the agent is gone, writes are dropped (its
    stdout's end tells the rest). An agent that leaves more than ``limit`` bytes
    waiting (it stopped reading its stdin) is given up on: what waits is dropped and
    ``stuck`` is called (the writer's thread), which ends the agent."""

    def __init__(self, loop: asyncio.AbstractEventLoop, fd: int, limit: int,
                 stuck: Callable[[int], None]) -> None:
        os.set_blocking(fd, False)
        self._loop = loop
        self._fd = fd
        self._limit = limit
        self._stuck = stuck
        self._lock = threading.Lock()
        self._backlog = bytearray()
        self._gone = False

    def write(self, frame: bytes) -> None:
        """Any thread: ``frame`` after everything written before it."""
        with self._lock:
            if self._gone:
                return
            if not self._backlog:
                written = self._write_some(frame)
                if written == len(frame):
                    return
                frame = frame[written:]
                with contextlib.suppress(RuntimeError):  # the loop is closed
                    self._loop.call_soon_threadsafe(self._loop.add_writer, self._fd,
                                                    self._drain)
            self._backlog += frame
            waiting = len(self._backlog)
            if waiting <= self._limit:
                return
            self._gone = True
            self._backlog.clear()
        self._stuck(waiting)

    def close(self) -> None:
        """Write nothing more (any thread)."""
        with self._lock:
            self._gone = True
            self._backlog.clear()

    def _drain(self) -> None:
        """The loop thread, while the backlog waits: as much as the pipe takes."""
        with self._lock:
            if not self._gone:
                del self._backlog[:self._write_some(self._backlog)]
            if self._gone or not self._backlog:
                self._backlog.clear()
                self._loop.remove_writer(self._fd)

    def _write_some(self, data: bytes | bytearray) -> int:
        """How much of ``data`` is done with (all of it once the agent is gone)."""
        try:
            return os.write(self._fd, data)
        except (BlockingIOError, InterruptedError):
            return 0
        except OSError:  # the agent closed its stdin or exited
            self._gone = True
            return len(data)


class AgentCalls:
    """The requests sent and not answered yet. :meth:`send` from any thread, the rest
    on the loop thread."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._ids = itertools.count()
        self._lock = threading.Lock()
        self._pending: dict[str, concurrent.futures.Future[Any]] = {}
        self._ended = False

    def send(self, write: Callable[[bytes], None], method: str, params: Any,
             future: concurrent.futures.Future[Any]) -> None:
        """Write the request through ``write`` (the caller's thread); ``future`` gets
        its answer (ConnectionLost once the agent's output ended)."""
        with self._lock:
            request_id = f"{_ID_PREFIX}{next(self._ids)}"
        try:
            frame = orjson.dumps({"jsonrpc": "2.0", "id": request_id, "method": method,
                                  "params": params}, option=orjson.OPT_APPEND_NEWLINE)
        except TypeError as exc:
            _settle(future, exc)
            return
        with self._lock:
            if self._ended:
                _settle(future, ConnectionLost(f"{self._name}: connection closed"))
                return
            self._pending[request_id] = future
        write(frame)

    def answer(self, message: dict[str, Any]) -> bool:
        """Settle the request ``message`` is a well-formed response to; False when it
        is not one (it is left to the endpoint)."""
        request_id = message.get("id")
        if (type(request_id) is not str or request_id not in self._pending
                or message.get("jsonrpc") != "2.0" or "method" in message
                or ("result" in message) == ("error" in message)):
            return False
        if "error" in message:
            error = message["error"]
            if (type(error) is not dict or type(error.get("code")) is not int
                    or type(error.get("message")) is not str):
                return False
            outcome: Any = RemoteError(error["code"], error["message"], error.get("data"))
        else:
            outcome = _Result(message["result"])
        with self._lock:
            future = self._pending.pop(request_id, None)
        if future is not None:
            _settle(future, outcome)
        return True

    def fail_all(self) -> None:
        """The agent's output ended: every request still waiting fails, and later ones."""
        for future in self._end():
            _settle(future, ConnectionLost(f"{self._name}: connection closed"))

    def cancel_all(self) -> None:
        """The loop ends: every request still waiting is cancelled (as its task would be)."""
        for future in self._end():
            future.cancel()

    def _end(self) -> list[concurrent.futures.Future[Any]]:
        with self._lock:
            self._ended = True
            pending, self._pending = self._pending, {}
        return list(pending.values())


class _Result:
    """A result, told apart from an exception to raise."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value


def _settle(future: concurrent.futures.Future[Any], outcome: Any) -> None:
    """``future``'s result (a :class:`_Result`) or exception, unless it was cancelled."""
    if not future.set_running_or_notify_cancel():
        return
    if isinstance(outcome, _Result):
        future.set_result(outcome.value)
    else:
        future.set_exception(outcome)
