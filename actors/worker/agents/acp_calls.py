"""Requests to a hosted agent from other threads (a turn's ``session/prompt``, a
client's forwarded request), each answered in a ``concurrent.futures.Future``.

The agent process's loop thread (:mod:`actors.worker.agents.acp_process`) writes
the request as soon as the caller's hand-off reaches it, and settles its future
in the same step that reads the response: no task runs the request, and the
waiting thread hears of the answer without the loop steps a task's end takes.
Only well-formed responses to these requests are taken here; anything else goes
to the endpoint as before (which drops a malformed response, as it would its own).
A caller may cancel its future at any time: the answer is then dropped.
"""

from __future__ import annotations

import concurrent.futures
import itertools
from collections.abc import Callable
from typing import Any

import orjson

from ipc.jsonrpc import ConnectionLost, RemoteError

__all__ = ["AgentCalls"]

_ID_PREFIX = "zc-call-"


class AgentCalls:
    """The requests sent and not answered yet. Loop thread only."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._ids = itertools.count()
        self._pending: dict[str, concurrent.futures.Future[Any]] = {}

    def send(self, write: Callable[[bytes], None], method: str, params: Any,
             future: concurrent.futures.Future[Any]) -> None:
        """Write the request through ``write``; ``future`` gets its answer."""
        if future.cancelled():
            return
        request_id = f"{_ID_PREFIX}{next(self._ids)}"
        try:
            frame = orjson.dumps({"jsonrpc": "2.0", "id": request_id, "method": method,
                                  "params": params}, option=orjson.OPT_APPEND_NEWLINE)
        except TypeError as exc:
            _settle(future, exc)
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
        _settle(self._pending.pop(request_id), outcome)
        return True

    def fail_all(self) -> None:
        """The agent's output ended: every request still waiting fails."""
        pending, self._pending = self._pending, {}
        for future in pending.values():
            _settle(future, ConnectionLost(f"{self._name}: connection closed"))

    def cancel_all(self) -> None:
        """The loop ends: every request still waiting is cancelled (as its task would be)."""
        pending, self._pending = self._pending, {}
        for future in pending.values():
            future.cancel()


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
