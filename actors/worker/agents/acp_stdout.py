"""A hosted agent's stdout as lines, a whole read at a time (the agent process's loop
thread, :mod:`actors.worker.agents.acp_process`).

The pipe's protocol: each read is split into its complete lines with bytes
operations and they are handed on together, so a streaming agent's thousands of
lines cost one call per read, not a task wake-up and a buffer copy per line. The
lines follow the repo's NDJSON reading rules (:mod:`ipc.framing`): a trailing
``\\r`` is dropped, a partial last line at the end still counts, and a line
longer than the limit is dropped up to its newline without ever being held
whole: it is handed on as :data:`ipc.framing.OVERSIZED`. Blank lines are handed
on as they are (the caller skips them).
"""

from __future__ import annotations

import asyncio
import fcntl
import time
from collections.abc import Callable, Sequence
from typing import Any, Final, Literal, cast

from ipc.framing import OVERSIZED, Oversized

__all__ = ["PIPE_SIZE", "Line", "LinesProtocol", "enlarge_pipe"]

Line = bytes | Literal[Oversized.OVERSIZED]
#: What the agent's stdout pipe is made to hold (Linux's default is 64 KiB, ~400 of a
#: streaming agent's lines): room for what it writes while its reader pauses or works
#: through a long read, so it never waits on a full pipe.
PIPE_SIZE: Final = 256 * 1024
_DEFAULT_PIPE_SIZE: Final = 64 * 1024
_NEWLINE: Final = b"\n"
_CR: Final = b"\r"


class LinesProtocol(asyncio.Protocol):
    """Hands ``deliver`` the lines of each read, in order (the loop thread, as all of
    it); :attr:`ended` is done once the stream ended (its exception: a read failed)."""

    def __init__(self, limit: int, deliver: Callable[[list[Line]], None],
                 read_size: int = _DEFAULT_PIPE_SIZE) -> None:
        """``read_size``: the most a read takes: what the pipe holds, no more (a read
        allocates that much whatever it gets)."""
        self.ended: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._limit = limit
        self._deliver = deliver
        self._read_size = read_size
        self._held: list[bytes] = []  # the partial line's pieces (the limit at most)
        self._held_size = 0
        self._discarding = False  # inside a line over the limit
        self._transport: asyncio.ReadTransport | None = None
        self._holders: set[object] = set()  # who keeps it from reading (:meth:`hold`)
        self._read_at = 0.0  # when the last read came (time.monotonic)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.ReadTransport)
        self._transport = transport
        if hasattr(transport, "max_size"):  # a pipe's
            cast(Any, transport).max_size = self._read_size

    def pause_for(self, seconds: float) -> None:
        """Read nothing more until ``seconds`` after the last read came (what comes
        meanwhile waits in the pipe): the loop thread sleeps what the read's work left
        of that. It sleeps: an asyncio timer wakes no sooner than a millisecond, which
        would hold a streaming turn's answer back that long, and nothing else this loop
        serves minds a wait this short."""
        transport = self._transport
        if transport is not None and transport.is_reading():
            left = self._read_at + seconds - time.monotonic()
            if left > 0:
                time.sleep(left)

    def hold(self, holder: object) -> None:
        """Read nothing more until ``holder`` lets go (:meth:`release`); the agent then
        waits on its full pipe."""
        self._holders.add(holder)
        if self._transport is not None:
            self._transport.pause_reading()

    def release(self, holder: object) -> None:
        """``holder`` no longer keeps it from reading."""
        self._holders.discard(holder)
        self._resume()

    @property
    def held(self) -> bool:
        """Whether someone keeps it from reading."""
        return bool(self._holders)

    def _resume(self) -> None:
        if self._transport is not None and not self._holders:
            self._transport.resume_reading()

    def data_received(self, data: bytes) -> None:
        self._read_at = time.monotonic()
        lines: list[Line] = []
        start = 0
        if self._held or self._discarding:
            cut = data.find(_NEWLINE)
            if cut < 0:
                self._hold(data)
                return
            lines.append(self._held_line(data[:cut]))
            start = cut + 1
        end = data.rfind(_NEWLINE)
        if end >= start:
            lines.extend(self._lines_of(data[start:end]))
            start = end + 1
        if start < len(data):
            self._hold(data[start:])
        if lines:
            self._deliver(lines)

    def eof_received(self) -> None:
        if self._held or self._discarding:
            self._deliver([self._held_line(b"")])

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.ended.done():
            if exc is None:
                self.ended.set_result(None)
            else:
                self.ended.set_exception(exc)

    def _hold(self, piece: bytes) -> None:
        """Keep ``piece`` of a partial line, unless the line is already over the limit
        (a ``\\r`` to come may end it, so one byte more is allowed)."""
        if self._discarding:
            return
        self._held.append(piece)
        self._held_size += len(piece)
        if self._held_size > self._limit + 1:
            self._held, self._held_size, self._discarding = [], 0, True

    def _held_line(self, tail: bytes) -> Line:
        """The held partial line ended by ``tail``; OVERSIZED for one that was dropped."""
        held, discarding = self._held, self._discarding
        self._held, self._held_size, self._discarding = [], 0, False
        if discarding:
            return OVERSIZED
        return self._lines_of(b"".join((*held, tail)))[0]

    def _lines_of(self, text: bytes) -> Sequence[Line]:
        """The lines of ``text`` (no newline at its end), less a trailing ``\\r`` each,
        OVERSIZED for one over the limit; checked only where ``text`` holds a ``\\r``
        or is longer than the limit (a streaming agent's reads are neither)."""
        lines = text.split(_NEWLINE)
        if _CR in text:
            lines = [line[:-1] if line.endswith(_CR) else line for line in lines]
        if len(text) > self._limit:
            return [OVERSIZED if len(line) > self._limit else line for line in lines]
        return lines


def enlarge_pipe(fd: int, size: int = PIPE_SIZE) -> int:
    """Make the pipe at ``fd`` hold ``size`` bytes where the system allows; what it
    holds now."""
    try:
        return fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, size)
    except OSError:  # over the system's or the user's limit: it keeps what it has
        try:
            return fcntl.fcntl(fd, fcntl.F_GETPIPE_SZ)
        except OSError:
            return _DEFAULT_PIPE_SIZE
