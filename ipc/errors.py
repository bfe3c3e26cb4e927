"""The error table: one exception class per JSON-RPC error code.

ZeroClaw's numbering is kept on purpose: in the ACP specification -32000 means
"authentication required" and -32002 "resource not found", but ZeroClaw clients
already key on the numbers below, so we keep them and document the difference.

Any thread may raise these; the endpoint turns them into error responses with
:meth:`RpcError.to_error`. Messages never carry stack traces, and never more of
the client's input than :data:`QUOTE_LIMIT` characters at a time: every message
passes :func:`bounded_message` here, so a 1 MB ``sessionId`` is not echoed whole.
"""

from __future__ import annotations

import re
from typing import Any, ClassVar, Final

__all__ = [
    "FirstRequestNotInitialize",
    "InternalError",
    "InvalidParams",
    "InvalidRequest",
    "MethodNotFound",
    "ParseError",
    "ProtocolVersionMismatch",
    "RpcError",
    "SessionBusy",
    "SessionLimitReached",
    "SessionNotFound",
    "SessionNotOwned",
    "SessionOwnedByAnotherHost",
    "bounded_data",
    "bounded_message",
    "clip",
    "error_for_code",
    "relayed_error",
]

QUOTE_LIMIT: Final = 128
"""Longest run of client input (a run of non-blank characters) an error message quotes."""
MESSAGE_LIMIT: Final = 1024
"""Longest error message (client input with blanks in it is bounded by this)."""
_LONG_RUN: Final = re.compile(rf"\S{{{QUOTE_LIMIT + 1},}}")


def clip(text: str, limit: int = QUOTE_LIMIT) -> str:
    """``text`` cut to ``limit`` characters, with an ellipsis when it was longer."""
    return text if len(text) <= limit else text[:limit] + "…"


DATA_LIMIT: Final = 8192
"""Most bytes of a relayed error's ``data`` (an agent's error detail) kept whole."""


def bounded_data(data: Any) -> Any:
    """An error's ``data`` from a peer fit for the wire: kept as it came when it encodes
    to at most :data:`DATA_LIMIT` bytes, else its strings clipped, else its JSON text cut
    (with an ellipsis). Lists and objects keep their shape while they fit."""
    import orjson  # only on the way of a relayed error

    try:
        if len(orjson.dumps(data)) <= DATA_LIMIT:
            return data
        clipped = _clip_strings(data, DATA_LIMIT // 8)
        text = orjson.dumps(clipped)
    except TypeError:  # orjson: not JSON (it came as JSON, so only from a bug here)
        return None
    return clipped if len(text) <= DATA_LIMIT else clip(text.decode(), DATA_LIMIT // 2)


def _clip_strings(value: Any, limit: int) -> Any:
    if isinstance(value, str):
        return clip(value, limit)
    if isinstance(value, list):
        return [_clip_strings(item, limit) for item in value]
    if isinstance(value, dict):
        return {key: _clip_strings(item, limit) for key, item in value.items()}
    return value


def bounded_message(text: str) -> str:
    """An error message fit for the wire: each run of more than :data:`QUOTE_LIMIT`
    non-blank characters (an id, a path, a name the client sent: the words of the
    messages themselves are short) is clipped, then the whole to :data:`MESSAGE_LIMIT`."""
    if len(text) > QUOTE_LIMIT:
        text = clip(_LONG_RUN.sub(lambda run: clip(run.group()), text), MESSAGE_LIMIT)
    return text


class RpcError(Exception):
    """Base of every error that is answered on the wire."""

    code: ClassVar[int] = -32603
    default_message: ClassVar[str] = "Internal error"

    def __init__(self, message: str | None = None, data: Any = None) -> None:
        self.message = bounded_message(message) if message else self.default_message
        self.data = data
        super().__init__(self.message)

    def to_error(self) -> dict[str, Any]:
        """The JSON-RPC ``error`` object for this exception."""
        error: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.data is not None:
            error["data"] = self.data
        return error


class ParseError(RpcError):
    code = -32700
    default_message = "Parse error"


class InvalidRequest(RpcError):
    code = -32600
    default_message = "Invalid Request"


class MethodNotFound(RpcError):
    code = -32601
    default_message = "Method not found"


class InvalidParams(RpcError):
    code = -32602
    default_message = "Invalid params"


class InternalError(RpcError):
    code = -32603
    default_message = "Internal error"


class SessionNotFound(RpcError):
    code = -32000
    default_message = "Session not found"


class SessionLimitReached(RpcError):
    code = -32001
    default_message = "Maximum session limit reached"


class SessionBusy(RpcError):
    code = -32002
    default_message = "Session busy: a turn is already running"


class SessionNotOwned(RpcError):
    code = -32003
    default_message = "Session not owned by this connection"


class SessionOwnedByAnotherHost(RpcError):
    """Several hosts on one PostgreSQL store: another live host holds the session's
    lease; ``data`` is ``{ownerHost, leaseExpiresInSecs}``."""

    code = -32004
    default_message = "Session owned by another host"


class FirstRequestNotInitialize(RpcError):
    code = -32010
    default_message = "First request must be initialize"


class ProtocolVersionMismatch(RpcError):
    code = -32011
    default_message = "Protocol version mismatch"


_BY_CODE: dict[int, type[RpcError]] = {
    cls.code: cls
    for cls in (
        ParseError,
        InvalidRequest,
        MethodNotFound,
        InvalidParams,
        InternalError,
        SessionNotFound,
        SessionLimitReached,
        SessionBusy,
        SessionNotOwned,
        FirstRequestNotInitialize,
        ProtocolVersionMismatch,
    )
}


def error_for_code(code: int, message: str, data: Any = None) -> RpcError:
    """Rebuild an error received from elsewhere (a worker, a peer) by its code."""
    cls = _BY_CODE.get(code, RpcError)
    err = cls(message, data)
    if cls is RpcError:
        err.code = code  # type: ignore[misc]
    return err


def relayed_error(error: Any, fallback: str) -> RpcError:
    """The error a peer answered with (a JSON-RPC error object relayed as it came:
    ``{code, message, data?}``), or -32603 with ``fallback`` when ``error`` is not one."""
    if not isinstance(error, dict):
        return InternalError(fallback)
    code, message = error.get("code"), error.get("message")
    if isinstance(code, bool) or not isinstance(code, int) or not isinstance(message, str):
        return InternalError(fallback)
    return error_for_code(code, message, bounded_data(error.get("data")))
