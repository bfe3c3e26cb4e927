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
    "PartialFrameStalled",
    "encode_frame",
    "new_stream_reader",
]

DEFAULT_FRAME_LIMIT: Final = 32 * 1024 * 1024
"""Longest accepted line in bytes: room for a 10 MiB blob in base64 plus the envelope."""

_NEWLINE: Final = b"\n"
_CR: Final = 0x0D
_CHUNK: Final = 256 * 1024
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


class PartialFrameStalled(Exception):
    """A frame was begun and no byte of it arrived for the stall timeout."""

    def __init__(self, timeout: float, buffered: int) -> None:
        super().__init__(f"a partial frame ({buffered} bytes) made no progress for {timeout:g} s")
        self.timeout = timeout
        self.buffered = buffered


class FrameReader:
    """Splits a byte stream into frames. Loop thread only; one reader per stream.

    The partial line is held here (never more than the limit plus one chunk), so
    :meth:`release` frees it as soon as the connection ends, and a frame that
    stops growing for ``stall_timeout`` seconds raises :class:`PartialFrameStalled`.
    """

    __slots__ = ("_discarding", "_eof", "_limit", "_peak", "_pending", "_reader", "_scanned",
                 "_stall_timeout")

    def __init__(self, reader: asyncio.StreamReader, limit: int = DEFAULT_FRAME_LIMIT, *,
                 stall_timeout: float | None = None) -> None:
        self._reader = reader
        self._limit = limit
        self._stall_timeout = stall_timeout
        self._pending = bytearray()
        self._scanned = 0  # bytes of _pending known to hold no newline
        self._discarding = False  # dropping the rest of an over-long line
        self._eof = False
        self._peak = 0

    @property
    def peak_buffered(self) -> int:
        """The most bytes held at once (a line with what followed it in its chunk)."""
        return self._peak

    async def read(self) -> bytes | Literal[Oversized.OVERSIZED] | None:
        """The next non-blank line without its line ending, ``None`` at EOF,
        or :data:`OVERSIZED` for a line longer than the limit (already discarded).

        Connection errors from the underlying reader propagate, and so does
        :class:`PartialFrameStalled`.
        """
        while True:
            line = self._take_line()
            if line is None:
                if self._eof:
                    return None
                await self._fill()
                continue
            if line is OVERSIZED or len(line) > self._limit:  # blank or not
                return OVERSIZED
            if not _is_blank(line):
                return line

    def release(self) -> None:
        """Drop the buffered partial line (the connection is over)."""
        self._pending = bytearray()
        self._scanned = 0

    def _take_line(self) -> bytes | Literal[Oversized.OVERSIZED] | None:
        """The next complete line from the buffer (``\\r\\n`` or ``\\n`` removed), the
        partial last line at EOF, or ``None`` when more bytes are needed."""
        pending = self._pending
        end = pending.find(_NEWLINE, self._scanned)
        if end < 0:
            self._scanned = len(pending)
            if self._eof and (pending or self._discarding):
                return self._cut(len(pending), len(pending))
            if len(pending) > self._limit + 1:  # over the limit even without a "\r"
                self._discarding = True
                self.release()
            return None
        return self._cut(end, end + 1)

    def _cut(self, end: int, consumed: int) -> bytes | Literal[Oversized.OVERSIZED]:
        """Take ``consumed`` bytes off the buffer; the line is the first ``end``
        of them less a trailing ``\r`` (OVERSIZED for the tail of an over-long line)."""
        pending = self._pending
        line: bytes | Literal[Oversized.OVERSIZED] = OVERSIZED
        if not self._discarding:
            line = bytes(pending[: end - 1 if end and pending[end - 1] == _CR else end])
        del pending[:consumed]
        self._scanned = 0
        self._discarding = False
        return line

    async def _fill(self) -> None:
        """Read the next chunk; a begun frame waits at most ``stall_timeout``."""
        begun = bool(self._pending) or self._discarding
        if begun and self._stall_timeout is not None:
            try:
                async with asyncio.timeout(self._stall_timeout):
                    chunk = await self._reader.read(_CHUNK)
            except TimeoutError:
                raise PartialFrameStalled(self._stall_timeout, len(self._pending)) from None
        else:
            chunk = await self._reader.read(_CHUNK)
        if not chunk:
            self._eof = True
        elif not self._discarding or _NEWLINE in chunk:
            self._pending += chunk
            self._peak = max(self._peak, len(self._pending))
        # else: still inside an over-long line; nothing of it is kept


def _is_blank(line: bytes) -> bool:
    return not line or (line[0] in _BLANK_START and not line.strip())
