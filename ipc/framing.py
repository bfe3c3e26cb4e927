"""NDJSON framing: one JSON-RPC message per line, UTF-8, ``\\n`` separated.

Reading rules (SPEC §2): blank lines and a trailing ``\\r`` are ignored, a
partial last line at EOF still counts as a frame, and a line longer than the
frame limit is discarded up to its newline without ever being held whole in
memory — the reader reports it as :data:`OVERSIZED` so the endpoint can answer
-32600 and the connection stays usable.

The :class:`asyncio.StreamReader` given to :class:`FrameReader` must be created
with ``limit=frame_limit + 1`` (room for a ``\r``; see :func:`new_stream_reader`):
asyncio's default of 64 KiB rejects real ACP messages.

Everything here runs on the asyncio loop thread, except :func:`encode_frame`,
which is pure and safe from any thread.
"""

from __future__ import annotations

import asyncio
import enum
from typing import Any, Final, Literal

import orjson

__all__ = [
    "DEFAULT_FRAME_LIMIT",
    "OVERSIZED",
    "FrameReader",
    "Oversized",
    "encode_frame",
    "new_stream_reader",
]

DEFAULT_FRAME_LIMIT: Final = 32 * 1024 * 1024
"""Longest accepted line in bytes: room for a 10 MiB blob in base64 plus the envelope."""

_NEWLINE: Final = b"\n"
_BLANK_START: Final = frozenset(b" \t\r\n\f\v")


class Oversized(enum.Enum):
    """Type of the :data:`OVERSIZED` sentinel (an enum so ``is`` checks type-narrow)."""

    OVERSIZED = "oversized"


OVERSIZED: Final = Oversized.OVERSIZED
"""Returned by :meth:`FrameReader.read` for a line longer than the frame limit."""


def encode_frame(obj: Any) -> bytes:
    """Serialise one message as a single NDJSON line (newline included).

    Raises ``orjson.JSONEncodeError`` (a ``TypeError``) for values JSON cannot
    hold, e.g. integers past 64 bits or non-string dict keys.
    """
    return orjson.dumps(obj, option=orjson.OPT_APPEND_NEWLINE)


def new_stream_reader(frame_limit: int = DEFAULT_FRAME_LIMIT) -> asyncio.StreamReader:
    """A StreamReader whose buffer limit fits ``frame_limit`` plus a ``\r`` (loop thread)."""
    return asyncio.StreamReader(limit=frame_limit + 1)


class FrameReader:
    """Splits a byte stream into frames. Loop thread only; one reader per stream."""

    __slots__ = ("_limit", "_reader")

    def __init__(self, reader: asyncio.StreamReader, limit: int = DEFAULT_FRAME_LIMIT) -> None:
        self._reader = reader
        self._limit = limit

    async def read(self) -> bytes | Literal[Oversized.OVERSIZED] | None:
        """The next non-blank line without its line ending, ``None`` at EOF,
        or :data:`OVERSIZED` for a line longer than the limit (already discarded).

        Connection errors from the underlying reader propagate.
        """
        while True:
            try:
                line = await self._reader.readuntil(_NEWLINE)
            except asyncio.IncompleteReadError as eof:
                line = eof.partial
                if not line:
                    return None
            except asyncio.LimitOverrunError as overrun:
                await self._discard_line(overrun.consumed)
                return OVERSIZED
            if line[-1:] == _NEWLINE:
                line = line[:-2] if line[-2:-1] == b"\r" else line[:-1]
            elif line[-1:] == b"\r":
                line = line[:-1]
            if len(line) > self._limit:  # blank or not, as when the line overran the buffer
                return OVERSIZED
            if not line or (line[0] in _BLANK_START and not line.strip()):
                continue
            return line

    async def _discard_line(self, consumed: int) -> None:
        """Drop the rest of an over-long line, one buffer-sized chunk at a time."""
        reader = self._reader
        while True:
            await reader.read(consumed)
            try:
                await reader.readuntil(_NEWLINE)
                return
            except asyncio.IncompleteReadError:
                return
            except asyncio.LimitOverrunError as overrun:
                consumed = overrun.consumed
