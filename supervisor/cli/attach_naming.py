"""``zeroclaw acp --attach … --session KEY``: the session flags on a bridged connection
(and ``--provenance``).

The attach bridge (:mod:`supervisor.cli.attach`) copies the editor's bytes to the
host as they are, with one exception made here: when the command line names a
session (``--session``, ``--session-label``, ``--require-existing``,
``--reset-session``), each ``session/new`` request the editor sends gains the
``_meta`` that an editor able to send it would have sent (``sessionKey``,
``sessionLabel``, ``resetSession``, ``zeroclaw.requireExisting``), by the rules the
stdio host applies to its flags (:meth:`ipc.session_names.SessionNaming.over`): a
request that names a key or label of its own is left alone, and ``--reset-session``
resets only at the first ``session/new``. The host (a daemon's ``acp.sock`` or a
gateway, for the tenant of the token) then resolves the names itself.

With ``--provenance meta`` or ``meta+receipt``, the editor's ``initialize`` gains
``_meta.zeroclaw.provenance`` (the mode) and ``_meta.zeroclaw.originHost`` (this
machine's name, where the editor runs), so the host gives this connection the mode
(:mod:`supervisor.servers.provenance`); an ``initialize`` that asks for a mode of its
own is left alone.

:class:`RequestRewriter` runs on the bridge's stdin thread only. Every other line,
any line it cannot parse, and a line longer than the frame limit pass byte for byte
(the host answers those as it would have).
"""

from __future__ import annotations

import socket
from typing import Any

import orjson

from ipc.session_names import SessionNaming

__all__ = ["RequestRewriter", "ask_provenance", "name_session_new"]

_MARKS = (b'"session/new"', b'"initialize"')


def name_session_new(frame: dict[str, Any], defaults: SessionNaming) -> bool:
    """Give the ``session/new`` request ``frame`` the ``_meta`` of ``defaults`` (in
    place); False when it is not one, or names its own session, or its ``params`` or
    ``_meta`` are not objects (the host refuses those itself)."""
    if frame.get("method") != "session/new" or "id" not in frame:
        return False
    params = frame.setdefault("params", {})
    if not isinstance(params, dict):
        return False
    meta = params.setdefault("_meta", {})
    if not isinstance(meta, dict) or "sessionKey" in meta or "sessionLabel" in meta:
        return False
    ours = meta.get("zeroclaw")
    if ours is not None and not isinstance(ours, dict):
        return False
    if defaults.key is not None:
        meta["sessionKey"] = defaults.key
    if defaults.label is not None:
        meta["sessionLabel"] = defaults.label
    if defaults.reset:
        meta["resetSession"] = True
    if defaults.require_existing:
        meta["zeroclaw"] = {**(ours or {}), "requireExisting": True}
    return True


def ask_provenance(frame: dict[str, Any], mode: str) -> bool:
    """Give the ``initialize`` request ``frame`` the ``_meta`` asking for ``mode`` (in
    place); False when it is not one, asks for a mode itself, or is malformed."""
    if frame.get("method") != "initialize" or "id" not in frame:
        return False
    params = frame.setdefault("params", {})
    meta = params.setdefault("_meta", {}) if isinstance(params, dict) else None
    ours = meta.setdefault("zeroclaw", {}) if isinstance(meta, dict) else None
    if not isinstance(ours, dict) or "provenance" in ours:
        return False
    ours["provenance"] = mode
    ours["originHost"] = socket.gethostname()
    return True


class RequestRewriter:
    """The editor's byte stream, with its ``session/new`` requests named and its
    ``initialize`` asking for the provenance mode (stdin thread).

    :meth:`feed` returns what may be sent now: whole lines, and the start of a line
    too long to be a frame (sent as it comes, never held); the tail of a shorter
    partial line waits for its newline. :meth:`flush` gives what is left at EOF.
    """

    def __init__(self, naming: SessionNaming, limit: int, provenance: str = "off") -> None:
        self.naming = naming
        self.provenance = provenance
        self._limit = limit
        self._tail = bytearray()
        self._passing = False  # inside an over-long line: bytes go as they come

    def feed(self, data: bytes) -> bytes:
        out = bytearray()
        start = 0
        while (end := data.find(b"\n", start)) >= 0:
            if self._passing:
                out += data[start:end + 1]
                self._passing = False
            else:
                self._tail += data[start:end]
                out += self._line(bytes(self._tail))
                out += b"\n"
                self._tail.clear()
            start = end + 1
        rest = data[start:]
        if self._passing:
            out += rest
        else:
            self._tail += rest
            if len(self._tail) > self._limit:
                out += self._tail
                self._tail.clear()
                self._passing = True
        return bytes(out)

    def flush(self) -> bytes:
        """The partial line left at EOF, as it is."""
        tail = bytes(self._tail)
        self._tail.clear()
        return tail

    def _line(self, line: bytes) -> bytes:
        if not any(mark in line for mark in _MARKS):
            return line
        try:
            frame = orjson.loads(line)
        except orjson.JSONDecodeError:
            return line
        if not isinstance(frame, dict):
            return line
        if self.provenance != "off" and ask_provenance(frame, self.provenance):
            return orjson.dumps(frame)
        if not self.naming.named or not name_session_new(frame, self.naming):
            return line
        if self.naming.reset:  # a reset is for the first session/new only
            self.naming = SessionNaming(self.naming.key, self.naming.label, False,
                                        self.naming.require_existing)
        return orjson.dumps(frame)
