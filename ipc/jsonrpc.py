"""Transport-agnostic JSON-RPC 2.0 endpoint, both directions on one connection.

An :class:`Endpoint` is fed whole frames (:meth:`Endpoint.receive`) by a
transport and writes whole frames through the ``send`` callable it was given.
It validates envelopes (SPEC §2), gates everything behind ``initialize``,
dispatches inbound requests and notifications to a method table, and correlates
the responses to its own outbound requests (ids ``zc-out-<n>``). Inbound and
outbound ids live in separate namespaces: the same id text may be in flight in
both directions at once.

Handlers are ``handler(params, endpoint)``. A notification is looked up in the
``notifications`` table first, when one is given (a method that is to be handled
otherwise when no answer is wanted, e.g. an extension passed on as a
notification), then in the method table. A plain return value is answered
inline (no task: the fast path for ``initialize`` and ``status``); an awaitable
runs as a task, so requests on one connection run concurrently. Handlers raise
:class:`ipc.errors.RpcError` subclasses for error answers; anything else is
logged and answered -32603 ``"Internal error: <ExceptionClass>"``, never with a
traceback.

Threading: every method runs on the asyncio loop thread only.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final, TypeAlias

import orjson

from ipc.errors import (
    FirstRequestNotInitialize,
    InternalError,
    InvalidRequest,
    MethodNotFound,
    ParseError,
    RpcError,
    clip,
)
from ipc.later import LaterAnswer

__all__ = [
    "ConnectionLost",
    "Endpoint",
    "Handler",
    "RemoteError",
    "is_valid_request_id",
    "notification_frame",
]

log = logging.getLogger("zeroclaw.ipc.jsonrpc")

Handler: TypeAlias = Callable[[Any, "Endpoint"], Any]
"""``handler(params, endpoint)`` returning a JSON value or an awaitable of one."""

_ID_TYPES: Final = frozenset({str, int, float, orjson.Fragment, type(None)})
_NL: Final = orjson.OPT_APPEND_NEWLINE
_dumps: Final = orjson.dumps
_loads: Final = orjson.loads
_DecodeError: Final = orjson.JSONDecodeError
_ABSENT: Final[Any] = object()
_CONTAINERS: Final = (dict, list)
_PLAIN: Final = frozenset({dict, list, str, int, float, bool, type(None)})

_PARSE_ERROR_FRAME: Final = _dumps(
    {"jsonrpc": "2.0", "id": None, "error": ParseError().to_error()}, option=_NL
)
_TOO_LARGE_FRAME: Final = _dumps(
    {"jsonrpc": "2.0", "id": None, "error": InvalidRequest("frame too large").to_error()},
    option=_NL,
)


class ConnectionLost(ConnectionError):
    """The endpoint closed (or its peer stopped sending) before the answer came."""


class RemoteError(RpcError):
    """The peer answered one of our requests with an error object."""

    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(message, data)
        self.message = message  # the peer's words, even when empty (no default message)
        self.code = code  # type: ignore[misc]

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"


def notification_frame(method: str, params: Any = None) -> bytes:
    """The line :meth:`Endpoint.notify` sends. Raises ``TypeError`` (orjson) when
    ``params`` cannot be encoded."""
    message: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
    if params is not None:
        message["params"] = params
    return _dumps(message, option=_NL)


def is_valid_request_id(value: Any) -> bool:
    """A request id we can echo: a string, a number, or null (bools are not ids).

    A number orjson could only read as a float is an ``orjson.Fragment`` of its
    exact text by then (see :func:`_id_as_written`), so every id echoes as sent.
    """
    return type(value) in _ID_TYPES


def _id_as_written(frame: bytes, parsed: float) -> Any:
    """The exact text of a number id that orjson read as a float (a fraction, or an
    integer past 64 bits: 2**64 would come back as 1.8446744073709552e+19), as an
    ``orjson.Fragment`` that serialises verbatim. Rare, so the stdlib parser reads
    the frame again for it; ``parsed`` stays if that fails (nesting too deep)."""
    try:
        document = json.loads(frame, parse_int=orjson.Fragment, parse_float=orjson.Fragment)
    except (ValueError, RecursionError):
        return parsed
    written = document.get("id") if type(document) is dict else None
    return written if type(written) is orjson.Fragment else parsed


class Endpoint:
    """One JSON-RPC connection's state: dispatch table in, ``send`` callable out.

    Attributes a dialect may use: ``state`` (per-connection data), ``initialized``,
    ``name`` (for logs), ``on_eof`` (callbacks run once when the peer's input ends),
    ``on_close`` (callbacks run once by :meth:`close`).
    """

    def __init__(
        self,
        send: Callable[[bytes], None],
        methods: Mapping[str, Handler],
        *,
        require_initialize: bool = True,
        name: str = "",
        outbound_prefix: str = "zc-out-",
        notifications: Mapping[str, Handler] | None = None,
    ) -> None:
        self.state: dict[str, Any] = {}
        self.initialized = False
        self.name = name
        self.on_eof: list[Callable[[], None]] = []
        self.on_close: list[Callable[[], None]] = []
        self._send = send
        self._methods = methods
        self._notifications: Mapping[str, Handler] = {} if notifications is None else notifications
        self._gated = require_initialize
        self._prefix = outbound_prefix
        self._next_id = 0
        self._pending: dict[str, asyncio.Future[Any]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._answers: set[LaterAnswer] = set()  # handlers' answers still to come
        self._unstarted = 0  # handler tasks whose first step has not run yet
        self._closed = False
        self._input_closed = False

    # --- state -----------------------------------------------------------------

    @property
    def closed(self) -> bool:
        """True once :meth:`close` ran: nothing more is sent or dispatched."""
        return self._closed

    @property
    def running_handlers(self) -> int:
        """How many awaitable handlers are still running (or answers still to come)."""
        return len(self._tasks) + len(self._answers)

    @property
    def in_order_now(self) -> bool:
        """Whether work done now by a handler keeps the arrival order of this connection's
        requests: no earlier request's handler task still waits for its first step."""
        return self._unstarted == 0

    @property
    def pending_requests(self) -> int:
        """How many of our outbound requests await an answer."""
        return len(self._pending)

    # --- inbound ---------------------------------------------------------------

    def receive(self, frame: bytes) -> None:
        """Parse one frame (no newline needed) and act on it. Never raises."""
        if self._closed:
            return
        try:
            message = _loads(frame)
        except _DecodeError:
            log.debug("%s: unparsable frame (%d bytes)", self.name, len(frame))
            self._send(_PARSE_ERROR_FRAME)
            return
        if type(message) is dict and type(message.get("id")) is float:
            message["id"] = _id_as_written(frame, message["id"])
        try:
            self._dispatch(message)
        except Exception:
            log.exception("%s: unexpected failure while dispatching a frame", self.name)

    def receive_oversized(self) -> None:
        """Answer a frame that was discarded for exceeding the frame limit."""
        if not self._closed:
            log.warning("%s: discarded a frame longer than the frame limit", self.name)
            self._send(_TOO_LARGE_FRAME)

    def receive_eof(self) -> None:
        """The peer will send nothing more: fail our pending requests, refuse new ones.

        Sending stays possible, so in-flight handlers can still answer.
        """
        self._input_closed = True
        self._fail_pending()
        callbacks, self.on_eof = self.on_eof, []
        self._run_callbacks("on_eof", callbacks)

    def _dispatch(self, message: Any) -> None:
        if type(message) is not dict:
            self._reply_error(None, InvalidRequest("Invalid Request: not an object"))
            return
        method = message.get("method")
        if type(method) is not str:
            if _is_response_shaped(message):
                self._receive_response(message)  # never answered, even when malformed
                return
            request_id = message.get("id")
            if not is_valid_request_id(request_id):
                request_id = None
            self._reply_error(
                request_id, InvalidRequest('Invalid Request: "method" must be a string')
            )
            return
        if "id" not in message:
            self._receive_notification(message, method)
            return
        request_id = message["id"]
        if not is_valid_request_id(request_id):
            self._reply_error(None, InvalidRequest("Invalid Request: bad id"))
            return
        params = message.get("params", _ABSENT)
        if message.get("jsonrpc") != "2.0" or (
            params is not _ABSENT and type(params) not in _CONTAINERS
        ):
            self._reply_error(request_id, InvalidRequest(_envelope_problem(message)))
            return
        self._receive_request(request_id, method, {} if params is _ABSENT else params)

    def _receive_request(self, request_id: Any, method: str, params: Any) -> None:
        if self._gated and not self.initialized and method != "initialize":
            self._reply_error(request_id, FirstRequestNotInitialize())
            return
        handler = self._methods.get(method)
        if handler is None:
            self._reply_error(request_id, MethodNotFound(f"Method not found: {method}"))
            return
        try:
            result = handler(params, self)
        except RpcError as error:
            self._reply_error(request_id, error)
            return
        except Exception as error:
            self._reply_internal(request_id, method, error)
            return
        if type(result) is LaterAnswer:
            self._answer_later(request_id, method, result)
            return
        if type(result) not in _PLAIN and hasattr(result, "__await__"):
            self._start_task(self._finish_request(request_id, method, result))
            return
        if method == "initialize":
            self.initialized = True
        self._reply_result(request_id, result)

    def _receive_notification(self, message: dict[str, Any], method: str) -> None:
        params = message.get("params", _ABSENT)
        if message.get("jsonrpc") != "2.0" or (
            params is not _ABSENT and type(params) not in _CONTAINERS
        ):
            log.debug("%s: dropped invalid notification: %s", self.name, _envelope_problem(message))
            return
        if self._gated and not self.initialized:
            log.debug("%s: notification %s before initialize ignored", self.name, clip(method))
            return
        handler = self._notifications.get(method) or self._methods.get(method)
        if handler is None:
            log.debug("%s: notification for unknown method %s", self.name, clip(method))
            return
        try:
            result = handler({} if params is _ABSENT else params, self)
        except RpcError as error:
            log.debug("%s: notification %s failed: %s", self.name, clip(method), error.message)
            return
        except Exception:
            log.exception("%s: notification %s handler crashed", self.name, clip(method))
            return
        if type(result) not in _PLAIN and hasattr(result, "__await__"):
            self._start_task(self._finish_notification(method, result))

    def _receive_response(self, message: dict[str, Any]) -> None:
        problem = _response_problem(message)
        if problem is not None:
            log.warning("%s: dropped malformed response (%s)", self.name, problem)
            return
        response_id = message["id"]
        future = self._pending.pop(response_id, None) if type(response_id) is str else None
        if future is None or future.done():
            log.warning("%s: ignored response for unknown id %.64r", self.name, response_id)
            return
        error = message.get("error")
        if error is None:
            future.set_result(message["result"])
        else:
            future.set_exception(RemoteError(error["code"], error["message"], error.get("data")))

    # --- handler tasks ---------------------------------------------------------

    def _start_task(self, coroutine: Any) -> None:
        """Run a handler's ``coroutine`` as a task, one of ``_tasks`` until it ends: it
        takes itself out as its last step (see :meth:`_finish_request`), rather than by
        a done callback, which would cost the loop one more turn per request. A task
        cancelled before it started never runs that step: :meth:`close`, the one
        place that cancels them, has those taken out by a done callback."""
        self._tasks.add(asyncio.get_running_loop().create_task(coroutine))
        self._unstarted += 1

    def _answer_later(self, request_id: Any, method: str, answer: LaterAnswer) -> None:
        """A handler answers by a plain call (see :mod:`ipc.later`), maybe at once."""
        self._answers.add(answer)

        def deliver(error: Exception | None, result: Any) -> None:
            self._answers.discard(answer)
            if error is None:
                self._reply_result(request_id, result)
            elif isinstance(error, RpcError):
                self._reply_error(request_id, error)
            else:
                self._reply_internal(request_id, method, error)

        answer.bind(deliver)

    def _task_ended(self) -> None:
        """The last step of a handler task (loop thread)."""
        self._tasks.discard(asyncio.current_task())

    async def _finish_request(
        self, request_id: Any, method: str, awaitable: Awaitable[Any]
    ) -> None:
        self._unstarted -= 1
        try:
            result = await awaitable
        except RpcError as error:
            self._reply_error(request_id, error)
        except asyncio.CancelledError:
            if _being_cancelled():
                raise
            self._reply_error(request_id, InternalError("Internal error: request cancelled"))
        except Exception as error:
            self._reply_internal(request_id, method, error)
        else:
            if method == "initialize":
                self.initialized = True
            self._reply_result(request_id, result)
        finally:
            self._task_ended()

    async def _finish_notification(self, method: str, awaitable: Awaitable[Any]) -> None:
        self._unstarted -= 1
        try:
            await awaitable
        except RpcError as error:
            log.debug("%s: notification %s failed: %s", self.name, clip(method), error.message)
        except asyncio.CancelledError:
            if _being_cancelled():
                raise
        except Exception:
            log.exception("%s: notification %s handler crashed", self.name, clip(method))
        finally:
            self._task_ended()

    async def drain(self) -> None:
        """Wait until every running handler task has finished."""
        while self._tasks or self._answers:
            await asyncio.wait([*self._tasks, *(answer.wait() for answer in self._answers)])
            self._answers = {answer for answer in self._answers if not answer.done}

    # --- outbound --------------------------------------------------------------

    async def request(
        self, method: str, params: Any = None, *, timeout: float | None = None
    ) -> Any:
        """Send a request to the peer and wait for its result.

        Raises :class:`RemoteError` on an error answer, :class:`TimeoutError`
        after ``timeout`` seconds (the id is then forgotten), and
        :class:`ConnectionLost` if the endpoint closes or the peer's input ends.
        """
        if self._closed or self._input_closed:
            raise ConnectionLost(f"{self.name}: connection closed")
        request_id = f"{self._prefix}{self._next_id}"
        self._next_id += 1
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": method}
        if params is not None:
            message["params"] = params
        frame = _dumps(message, option=_NL)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = future
        try:
            self._send(frame)
            if timeout is None:
                return await future
            async with asyncio.timeout(timeout):
                return await future
        finally:
            self._pending.pop(request_id, None)

    def send_frame(self, frame: bytes) -> None:
        """Send what the caller encoded: whole lines, one message each, sent together
        (see :func:`notification_frame`; a no-op once closed)."""
        if not self._closed:
            self._send(frame)

    def notify(self, method: str, params: Any = None) -> None:
        """Send a notification to the peer (a no-op once closed)."""
        if not self._closed:
            self._send(notification_frame(method, params))

    # --- replies ---------------------------------------------------------------

    def _reply_result(self, request_id: Any, result: Any) -> None:
        if self._closed:
            return
        try:
            frame = _dumps({"jsonrpc": "2.0", "id": request_id, "result": result}, option=_NL)
        except TypeError as error:
            log.error(
                "%s: result of request %.64r not serialisable: %s", self.name, request_id, error
            )
            self._reply_error(request_id, InternalError("Internal error: result not serialisable"))
            return
        self._send(frame)

    def _reply_error(self, request_id: Any, error: RpcError) -> None:
        if self._closed:
            return
        body = error.to_error()
        try:
            frame = _dumps({"jsonrpc": "2.0", "id": request_id, "error": body}, option=_NL)
        except TypeError:
            body.pop("data", None)
            frame = _dumps({"jsonrpc": "2.0", "id": request_id, "error": body}, option=_NL)
        self._send(frame)

    def _reply_internal(self, request_id: Any, method: str, error: Exception) -> None:
        log.error("%s: handler for %s raised", self.name, clip(method), exc_info=error)
        message = f"Internal error: {type(error).__name__}"
        self._reply_error(request_id, InternalError(message))

    # --- closing ---------------------------------------------------------------

    def close(self) -> None:
        """Fail pending requests, cancel handler tasks, silence sends. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._input_closed = True
        self._send = _send_nothing  # let go of the transport: no cycle through its send
        self._fail_pending()
        callbacks, self.on_eof = self.on_eof, []
        self._run_callbacks("on_eof", callbacks)
        for task in list(self._tasks):
            task.cancel()
            task.add_done_callback(self._tasks.discard)  # also one that never started
        self._unstarted = 0
        answers, self._answers = self._answers, set()
        for answer in answers:
            answer.abandon()
        callbacks, self.on_close = self.on_close, []
        self._run_callbacks("on_close", callbacks)

    def _run_callbacks(self, kind: str, callbacks: list[Callable[[], None]]) -> None:
        for callback in callbacks:
            try:
                callback()
            except Exception:
                log.exception("%s: %s callback failed", self.name, kind)

    def _fail_pending(self) -> None:
        pending, self._pending = self._pending, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(ConnectionLost(f"{self.name}: connection closed"))


def _send_nothing(frame: bytes) -> None:
    """The ``send`` of a closed endpoint (never called: sends check ``_closed``)."""


def _being_cancelled() -> bool:
    """True when the current task itself was cancelled (not an inner await)."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


def _is_response_shaped(message: dict[str, Any]) -> bool:
    """Has result/error, or an id with no method at all (given a non-string method)."""
    return (
        "result" in message or "error" in message or ("id" in message and "method" not in message)
    )


def _envelope_problem(message: dict[str, Any]) -> str:
    """Why a request/notification envelope with a string method is invalid."""
    if message.get("jsonrpc") != "2.0":
        return 'Invalid Request: "jsonrpc" must be "2.0"'
    return 'Invalid Request: "params" must be an object or an array'


def _response_problem(message: dict[str, Any]) -> str | None:
    """Why a response-shaped frame is malformed (never quoting its content)."""
    if message.get("jsonrpc") != "2.0":
        return "jsonrpc is not 2.0"
    if "method" in message:
        return "has a method member"
    if ("result" in message) == ("error" in message):
        return "needs exactly one of result and error"
    if "id" not in message or not is_valid_request_id(message["id"]):
        return "bad id"
    if "error" in message:
        error = message["error"]
        if type(error) is not dict:
            return "error is not an object"
        if type(error.get("code")) is not int or type(error.get("message")) is not str:
            return "error lacks an integer code or a string message"
    return None
