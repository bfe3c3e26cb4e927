"""A reference model of SPEC §2, written from the spec and not from ``ipc/``.

Fuzz tests compare the real framing, endpoint and hosts against it: which lines a
byte stream holds (:func:`split_lines`), what each line is (:func:`classify`), and
whether a frame the host sent is a well-formed JSON-RPC response (:func:`parse_reply`).
Pure functions: safe from any thread.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Final

import orjson

from ipc.framing import OVERSIZED, Oversized

__all__ = [
    "NULL_KEY",
    "Line",
    "Verdict",
    "classify",
    "id_key",
    "parse_reply",
    "split_lines",
    "valid_id",
    "valid_response",
]

Line = bytes | Oversized
NULL_KEY: Final = "null"


def split_lines(stream: bytes, limit: int) -> list[Line]:
    """The frames a reader must produce from ``stream`` (whole, then EOF).

    Lines end at ``\\n``; one trailing ``\\r`` is dropped; a partial last line
    counts; a line longer than ``limit`` is :data:`OVERSIZED`; other whitespace-only
    lines are skipped.
    """
    pieces = stream.split(b"\n")
    if not pieces[-1]:
        pieces.pop()
    lines: list[Line] = []
    for piece in pieces:
        line = piece[:-1] if piece.endswith(b"\r") else piece
        if len(line) > limit:
            lines.append(OVERSIZED)
        elif line.strip():
            lines.append(line)
    return lines


def valid_id(value: Any) -> bool:
    """A request id the host accepts: a string, null, or any number (echoed exactly
    as written; read with orjson on both sides, so past 64 bits both are floats)."""
    return value is None or type(value) in (str, int, float)


def id_key(value: Any) -> str:
    """A hashable, comparable stand-in for an id (``"null"`` for null)."""
    return json.dumps(value)


def valid_response(message: dict[str, Any]) -> bool:
    """A response-shaped object that is well formed (it may still answer nothing)."""
    if message.get("jsonrpc") != "2.0" or "method" in message:
        return False
    if ("result" in message) == ("error" in message) or not valid_id(message.get("id", 1.5)):
        return False
    if "error" not in message:
        return True
    error = message["error"]
    return (
        type(error) is dict and type(error.get("code")) is int and type(error.get("message")) is str
    )


@dataclass(frozen=True, slots=True)
class Verdict:
    """What one line is. ``kind``:

    - ``"reply"``: the envelope is broken; answer ``code`` to ``key`` (``"null"``
      when no id can be recovered).
    - ``"request"``: a valid request ``method``/``params`` with id ``request_id``.
    - ``"notification"``: a notification (valid or not): never answered.
    - ``"response"``: response-shaped: never answered; ``message`` is the object.
    """

    kind: str
    key: str = NULL_KEY
    code: int = 0
    request_id: Any = None
    method: str = ""
    params: Any = None
    message: Any = None
    valid: bool = True


def _reply(code: int, request_id: Any = None) -> Verdict:
    return Verdict("reply", id_key(request_id if valid_id(request_id) else None), code)


def _response_shaped(message: dict[str, Any]) -> bool:
    """A result or an error, or an id without any method: meant as a response."""
    if "result" in message or "error" in message:
        return True
    return "id" in message and "method" not in message


def classify(line: Line) -> Verdict:
    """SPEC §2's reading of one line, before any method-specific handling."""
    if line is OVERSIZED:
        return _reply(-32600)
    try:
        message = orjson.loads(line)
    except orjson.JSONDecodeError:
        return _reply(-32700)
    if type(message) is not dict:
        return _reply(-32600)
    method = message.get("method")
    if type(method) is not str:
        if _response_shaped(message):
            return Verdict("response", message=message, valid=valid_response(message))
        return _reply(-32600, message.get("id"))
    params = message.get("params", {})
    well_formed = message.get("jsonrpc") == "2.0" and type(params) in (dict, list)
    if "id" not in message:
        return Verdict("notification", method=method, params=params, valid=well_formed)
    request_id = message["id"]
    if not valid_id(request_id):
        return _reply(-32600)
    if not well_formed:
        return _reply(-32600, request_id)
    return Verdict("request", id_key(request_id), 0, request_id, method, params)


def parse_reply(data: bytes) -> dict[str, Any]:
    """The response object in ``data``, one ``\\n``-terminated line; assert it is well formed."""
    assert data.endswith(b"\n") and data.count(b"\n") == 1, data[:200]
    reply = orjson.loads(data)
    assert type(reply) is dict and reply.get("jsonrpc") == "2.0", reply
    assert "method" not in reply and "id" in reply and valid_id(reply["id"]), reply
    assert ("result" in reply) != ("error" in reply), reply
    if "error" in reply:
        error = reply["error"]
        assert type(error) is dict and set(error) <= {"code", "message", "data"}, reply
        assert type(error.get("code")) is int and type(error.get("message")) is str, reply
        assert "Traceback" not in data.decode(errors="replace"), reply
    return dict(reply)
