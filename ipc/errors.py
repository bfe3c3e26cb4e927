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
    "bounded_message",
    "clip",
    "error_for_code",
]

QUOTE_LIMIT: Final = 128
"""Longest run of client input (a run of non-blank characters) an error message quotes."""
MESSAGE_LIMIT: Final = 1024
"""Longest error message (client input with blanks in it is bounded by this)."""
_LONG_RUN: Final = re.compile(rf"\S{{{QUOTE_LIMIT + 1},}}")


def clip(text: str, limit: int = QUOTE_LIMIT) -> str:
    """``text`` cut to ``limit`` characters, with an ellipsis when it was longer."""
    return text if len(text) <= limit else text[:limit] + "…"


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
