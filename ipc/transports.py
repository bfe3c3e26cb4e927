"""Byte-stream transports feeding :class:`ipc.jsonrpc.Endpoint`: stdio and Unix sockets.

:func:`serve_stream` runs one connection: it reads NDJSON frames, feeds the
endpoint, and at EOF lets in-flight handlers finish (``drain``) before closing.

Writes are paced (:class:`WriteFlow`, in ``endpoint.state["flow"]``): once more
than :data:`PACE_MARK` bytes wait unsent, senders that can wait (a turn's
session updates) hold back until the peer drains, so a slow client slows only
its own streams. The connection closes early when the peer is gone (our writes
fail), or when it takes no byte for ``stall_timeout`` seconds while it is behind
(it stopped reading): that is the only rule that gives up on a peer, so one that
reads, however slowly, is never dropped. While the write buffer is past the
high-water mark anyway (answers, which are not paced), the peer's requests are
not read until it is below again, so a slow or stuck client cannot grow our
memory by asking for more.

:func:`open_stdio` moves the protocol onto private duplicates of fds 0 and 1,
then points fd 1 at stderr and fd 0 at ``/dev/null``: a stray ``print`` or a
child process can no longer corrupt the frame stream or steal its input.
Regular files work as stdin/stdout too (``zeroclaw acp < requests.ndjson``).

Threading: everything here runs on the asyncio loop thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import socket
import stat
import sys
import threading
from collections.abc import Callable
from typing import Any, Final, TypeAlias

from ipc.framing import (
    DEFAULT_FRAME_LIMIT,
    OVERSIZED,
    FrameReader,
    PartialFrameStalled,
    new_stream_reader,
)
from ipc.jsonrpc import Endpoint
from ipc.stall_watch import StallWatch

__all__ = [
    "BYTE_STREAM",
    "DEFAULT_STALL_TIMEOUT",
    "DEFAULT_WRITE_HIGH_WATER",
    "PACE_MARK",
    "EndpointFactory",
    "WriteFlow",
    "held_writes",
    "holding_writes",
    "open_stdio",
    "serve_stream",
    "serve_unix",
]

log = logging.getLogger("zeroclaw.ipc.transports")

DEFAULT_WRITE_HIGH_WATER: Final = 64 * 1024 * 1024
"""Unsent bytes past which a peer's requests are not read until it has taken some."""

PACE_MARK: Final = 256 * 1024
"""Unsent bytes past which a connection is behind: paced senders wait for it to drain."""

BYTE_STREAM: Final = "byte_stream"
"""The key of an endpoint's ``state`` that is true when what it sends is written to a
byte stream as it is (NDJSON): one send may then carry several lines. On a
WebSocket, each send is one message and must be one line."""

DEFAULT_STALL_TIMEOUT: Final = 30.0
"""Seconds a connection may stay behind without taking a byte before it is closed."""

_FLUSH_TIMEOUT: Final = 5.0
_FRAMES_PER_YIELD: Final = 64
_FILE_CHUNK: Final = 256 * 1024
_TRIM_AFTER: Final = 1024 * 1024
"""A connection that held a frame this large returns free heap memory when it ends."""

EndpointFactory: TypeAlias = Callable[[Callable[[bytes], None]], Endpoint]


# --- one connection ----------------------------------------------------------


async def serve_stream(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    make_endpoint: EndpointFactory,
    *,
    frame_limit: int = DEFAULT_FRAME_LIMIT,
    write_high_water: int = DEFAULT_WRITE_HIGH_WATER,
    stall_timeout: float = DEFAULT_STALL_TIMEOUT,
    partial_frame_timeout: float | None = None,
    hangup: asyncio.Event | None = None,
) -> None:
    """Serve one connection until EOF (after draining handlers) or until it breaks.

    ``reader`` must have been created with ``limit=frame_limit + 1`` (see
    :func:`ipc.framing.new_stream_reader`). A frame begun and left unfinished for
    ``partial_frame_timeout`` seconds closes the connection (``None``: never);
    ``hangup``, once set, ends the input as EOF would (nothing more is read). The
    endpoint is always closed and the writer flushed (bounded) and closed on return;
    then everything the connection buffered is let go at once (:func:`_let_go`).
    """
    connection = _Connection(writer, write_high_water, stall_timeout)
    endpoint = make_endpoint(connection.send)
    endpoint.state["flow"] = connection.flow
    endpoint.state[BYTE_STREAM] = True  # several lines may go in one send
    connection.endpoint = endpoint
    frames = FrameReader(reader, frame_limit, stall_timeout=partial_frame_timeout)
    try:
        await connection.run(frames, hangup)
    finally:
        connection.flow.close()
        endpoint.close()
        await connection.close_writer()
        _let_go(frames, reader)


class WriteFlow:
    """The pace of one connection's writes (loop thread).

    ``behind`` is true while more than :data:`PACE_MARK` bytes wait unsent (in the
    transport, or ``queued()`` of them held by :func:`held_writes`);
    :meth:`when_drained` calls back once the buffer is down to a quarter of that.
    While the connection is behind, a timer looks (every quarter of
    ``stall_timeout``, at most every second) whether the peer took any byte;
    when it took none for ``stall_timeout`` seconds, ``on_stall`` is called
    with the reason (the connection then closes).
    """

    def __init__(self, writer: asyncio.StreamWriter, stall_timeout: float,
                 on_stall: Callable[[str], None],
                 queued: Callable[[], int] = lambda: 0) -> None:
        self._writer = writer
        self._transport = writer.transport
        self._queued = queued
        self._written = 0
        self._stall = StallWatch(stall_timeout, self._taken, self._still_behind, on_stall)
        self._drained: list[Callable[[], None]] = []
        self._waiter: asyncio.Task[None] | None = None
        with contextlib.suppress(NotImplementedError, AttributeError):
            self._transport.set_write_buffer_limits(high=PACE_MARK, low=PACE_MARK // 4)

    @property
    def behind(self) -> bool:
        return self._unsent() > PACE_MARK

    @property
    def room(self) -> int:
        """Bytes that may still be sent before the connection is :attr:`behind` (it is
        once this is negative)."""
        return PACE_MARK - self._unsent()

    def _unsent(self) -> int:
        return self._transport.get_write_buffer_size() + self._queued()

    def wrote(self, nbytes: int) -> None:
        """Count a write; start watching for a stall when it left us behind."""
        self._written += nbytes
        if self.behind:
            self._stall.start()

    def when_drained(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` (once) when the connection is no longer behind; never
        if it closes first."""
        self._drained.append(callback)
        if self._waiter is None:
            self._waiter = asyncio.ensure_future(self._wait_drained())

    def close(self) -> None:
        self._drained.clear()
        self._stall.stop()
        if self._waiter is not None:
            self._waiter.cancel()

    def _taken(self) -> int:
        return self._written - self._unsent()

    def _still_behind(self) -> bool:
        return self.behind and not self._transport.is_closing()

    async def _wait_drained(self) -> None:
        try:
            while self.behind and not self._transport.is_closing():
                await self._writer.drain()  # returns once the buffer is at the low mark
                if self.behind:
                    await asyncio.sleep(0.005)  # a transport without flow control
        except Exception:  # the peer went away: nothing to call back
            self._drained.clear()
            return
        finally:
            self._waiter = None
        if self._transport.is_closing():
            self._drained.clear()
            return
        callbacks, self._drained = self._drained, []
        for callback in callbacks:
            callback()


class _Holding(threading.local):
    """Per thread (each loop's own): the connections with frames held by
    :func:`held_writes`, None while not holding."""

    connections: list[_Connection] | None = None


_holding = _Holding()


def holding_writes() -> bool:
    """Whether this thread is inside :func:`held_writes` (what is sent now is held)."""
    return _holding.connections is not None


class held_writes:  # lower case: it is used as a function, ``with held_writes():``
    """Within the block, what is sent to each connection is held, then written in one
    write per connection at its end (loop thread): a burst of session updates from a
    worker costs the client one wake-up, not one per update. Outside it, a frame is
    written at once. A plain class, not a generator: it is entered on the way of
    every read of worker messages."""

    __slots__ = ("_held",)

    def __enter__(self) -> None:
        if _holding.connections is not None:  # already holding: the outer block writes
            self._held: list[_Connection] | None = None
            return
        self._held = _holding.connections = []

    def __exit__(self, *exc_info: object) -> None:
        held = self._held
        if held is None:
            return
        _holding.connections = None
        for connection in held:
            connection.write_held()


class _Connection:
    """Glue between one stream pair and its endpoint (loop thread)."""

    def __init__(self, writer: asyncio.StreamWriter, high_water: int,
                 stall_timeout: float) -> None:
        self.endpoint: Endpoint | None = None
        self._writer = writer
        self._transport = writer.transport
        self._high_water = high_water
        self._broken: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._held: list[bytes] = []  # frames held by held_writes()
        self._held_bytes = 0
        self.flow = WriteFlow(writer, stall_timeout, self._break, lambda: self._held_bytes)

    def send(self, frame: bytes) -> None:
        """The endpoint's ``send``: write now (or at the end of :func:`held_writes`),
        give up on a peer that does not read."""
        if self._transport.is_closing():
            self._break("peer went away")
            return
        holding = _holding.connections
        if holding is not None:
            if not self._held:
                holding.append(self)
            self._held.append(frame)
            self._held_bytes += len(frame)
        else:
            self._write(frame)
        self.flow.wrote(len(frame))

    def write_held(self) -> None:
        """Write the frames :func:`held_writes` held, as one write."""
        held, self._held, self._held_bytes = self._held, [], 0
        if held and not self._transport.is_closing():
            self._write(held[0] if len(held) == 1 else b"".join(held))

    def _write(self, data: bytes) -> None:
        try:
            self._writer.write(data)
        except Exception as error:  # a broken pipe surfaces here on some transports
            self._break(f"write failed: {type(error).__name__}")

    def _break(self, reason: str) -> None:
        if not self._broken.done():
            log.warning("closing connection: %s", reason)
            self._broken.set_result(reason)
            self._transport.abort()
        if self.endpoint is not None:
            self.endpoint.close()

    async def run(self, frames: FrameReader, hangup: asyncio.Event | None = None) -> None:
        """Read until EOF (or ``hangup``), then drain handlers; stop early if the
        connection breaks."""
        endpoint = self.endpoint
        assert endpoint is not None
        reading = asyncio.ensure_future(self._read_all(frames, endpoint))
        # shielded: cancelling our watcher must not cancel the protocol's own future
        closed = asyncio.ensure_future(asyncio.shield(self._writer.wait_closed()))
        hung_up = asyncio.ensure_future(hangup.wait()) if hangup is not None else None
        draining: asyncio.Future[None] | None = None
        try:
            watched = [f for f in (reading, closed, self._broken, hung_up) if f is not None]
            await asyncio.wait(watched, return_when=asyncio.FIRST_COMPLETED)
            if hung_up is not None and hung_up.done() and not reading.done():
                log.info("input hung up: ending it as at EOF")
                reading.cancel()  # nothing more is read
            elif not reading.done() or _read_failed(reading):
                return
            endpoint.receive_eof()
            draining = asyncio.ensure_future(endpoint.drain())
            await asyncio.wait(
                (draining, closed, self._broken), return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            for future in (reading, closed, hung_up, draining):
                if future is not None:
                    future.cancel()
            if closed.done() and not closed.cancelled():
                closed.exception()  # the peer's reset is expected: mark it retrieved

    def _over_high_water(self) -> bool:
        return self._transport.get_write_buffer_size() + self._held_bytes > self._high_water

    async def _until_below_high_water(self) -> None:
        """Hold the peer's input while our unsent answers to it pass the high-water mark;
        the stall rule (:class:`WriteFlow`) gives up on it if it takes nothing."""
        log.info("peer is %d bytes behind: its requests wait until it reads",
                 self._transport.get_write_buffer_size())
        while self._over_high_water() and not self._transport.is_closing():
            await self._writer.drain()  # returns at the transport's low mark
            if self._over_high_water():
                await asyncio.sleep(0.005)  # a mark below that low mark

    async def _read_all(self, frames: FrameReader, endpoint: Endpoint) -> None:
        count = 0
        while not endpoint.closed:
            if self._over_high_water():
                await self._until_below_high_water()
            frame = await frames.read()
            if frame is None:
                return
            if frame is OVERSIZED:
                endpoint.receive_oversized()
            else:
                endpoint.receive(frame)
            count += 1
            if count % _FRAMES_PER_YIELD == 0:
                await asyncio.sleep(0)  # let handler tasks and other connections run

    async def close_writer(self) -> None:
        """Flush what is buffered (bounded by a timeout), then close."""
        writer = self._writer
        if not self._transport.is_closing():
            writer.close()
        try:
            async with asyncio.timeout(_FLUSH_TIMEOUT):
                await writer.wait_closed()
        except TimeoutError:
            log.warning(
                "peer did not take the last %d bytes", self._transport.get_write_buffer_size()
            )
            self._transport.abort()
        except Exception:
            pass  # a reset peer: nothing left to flush


def _let_go(frames: FrameReader, reader: asyncio.StreamReader) -> None:
    """Free a finished connection's buffers now rather than at the next cyclic GC.

    The partial frame goes; and asyncio keeps the error that ended the connection
    in ``reader``, whose traceback holds our frames (and so the last frame read,
    and the reader itself): a cycle that only the collector would free. Dropping
    the traceback and the error it was raised during breaks it. After a large
    frame, the C heap's free pages go back to the system too: glibc would keep
    them (its mmap threshold rises after the first large free).
    """
    frames.release()
    error: BaseException | None = reader.exception()
    while error is not None:
        earlier = error.__context__
        error.__traceback__ = error.__context__ = error.__cause__ = None
        error = earlier
    if frames.peak_buffered >= _TRIM_AFTER and (trim := _malloc_trim()) is not None:
        trim(0)


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim`` (None elsewhere); ctypes is loaded on first use only."""
    import ctypes

    try:
        trim: Callable[[int], int] = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
    return trim




def _read_failed(reading: asyncio.Future[None]) -> bool:
    """Whether the read loop ended with an error (logged) rather than at EOF."""
    error = reading.exception()
    if error is None:
        return False
    if isinstance(error, PartialFrameStalled):
        log.warning("closing connection: %s", error)
        return True
    if isinstance(error, OSError):
        log.info("connection read failed: %s", type(error).__name__)
    else:
        log.error("connection read loop crashed", exc_info=error)
    return True


# --- Unix socket listener ----------------------------------------------------


async def serve_unix(
    path: str,
    make_endpoint: EndpointFactory,
    *,
    frame_limit: int = DEFAULT_FRAME_LIMIT,
    write_high_water: int = DEFAULT_WRITE_HIGH_WATER,
) -> asyncio.Server:
    """Listen on a Unix socket (mode 0600); each connection gets its own endpoint."""

    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await serve_stream(
                reader,
                writer,
                make_endpoint,
                frame_limit=frame_limit,
                write_high_water=write_high_water,
            )
        except asyncio.CancelledError:
            # Not re-raised: on 3.11 the stream protocol's done-callback calls
            # task.exception() on a cancelled connection task and logs a bogus error.
            log.debug("connection on %s cancelled", path)
        except Exception:
            log.exception("connection on %s failed", path)

    server = await asyncio.start_unix_server(on_connect, path, limit=frame_limit + 1)
    os.chmod(path, 0o600)
    return server


# --- stdio ---------------------------------------------------------------------


async def open_stdio(
    frame_limit: int = DEFAULT_FRAME_LIMIT,
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """Take over stdin/stdout for the protocol and connect them to the loop.

    Call once per process, before anything else may write to stdout.
    """
    in_fd, out_fd = _claim_stdio()
    reader = await _connect_input(in_fd, frame_limit)
    writer = await _connect_output(out_fd)
    return reader, writer


def _claim_stdio() -> tuple[int, int]:
    """Private copies of fds 0/1 for the protocol; fd 1 → stderr, fd 0 → /dev/null."""
    sys.stdout.flush()
    in_fd = os.dup(0)
    out_fd = os.dup(1)
    os.dup2(2, 1)
    null_fd = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null_fd, 0)
    os.close(null_fd)
    sys.stdout = sys.stderr
    return in_fd, out_fd


def _is_regular_file(fd: int) -> bool:
    """True for anything epoll cannot watch: regular files and devices such as /dev/null."""
    mode = os.fstat(fd).st_mode
    pollable = stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode) or os.isatty(fd)
    return not pollable


async def _connect_input(fd: int, frame_limit: int) -> asyncio.StreamReader:
    reader = new_stream_reader(frame_limit)
    if _is_regular_file(fd):
        _FileReadPump(fd, reader).start()
        return reader
    loop = asyncio.get_running_loop()
    pipe = os.fdopen(fd, "rb", buffering=0)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), pipe)
    return reader


async def _connect_output(fd: int) -> asyncio.StreamWriter:
    loop = asyncio.get_running_loop()
    protocol = _OutputProtocol(loop)
    transport: asyncio.WriteTransport
    if _is_regular_file(fd):
        transport = _FileWriteTransport(fd, protocol, loop)
    elif _is_stream_socket(fd):
        transport = await _socket_output(loop, fd, protocol)
    else:
        pipe = os.fdopen(fd, "wb", buffering=0)
        transport, _ = await loop.connect_write_pipe(lambda: protocol, pipe)
    return asyncio.StreamWriter(transport, protocol, None, loop)


def _is_stream_socket(fd: int) -> bool:
    if not stat.S_ISSOCK(os.fstat(fd).st_mode):
        return False
    probe = socket.socket(fileno=fd)
    try:
        return probe.type == socket.SOCK_STREAM
    finally:
        probe.detach()  # the fd stays open


async def _socket_output(loop: asyncio.AbstractEventLoop, fd: int,
                         protocol: asyncio.Protocol) -> asyncio.WriteTransport:
    """A write transport on a stdout that is a socket (``socat EXEC:``, inetd, systemd
    socket units: often the same socket as stdin). asyncio's pipe transport takes a
    readable write end for a closed one, so the client's next request would end the
    connection; a socket transport that never reads (the input side reads, and sees
    the end) is used instead."""
    sock = socket.socket(fileno=fd)
    transport, _ = await loop.connect_accepted_socket(lambda: protocol, sock)
    transport.pause_reading()
    return transport


class _OutputProtocol(asyncio.Protocol):
    """Write side of stdout: records when the pipe is gone, and when its buffer is
    back under the low mark (``drain``), as StreamWriter expects."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._closed = loop.create_future()
        self._resumed: asyncio.Future[None] | None = None

    def pause_writing(self) -> None:
        if self._resumed is None:
            self._resumed = self._loop.create_future()

    def resume_writing(self) -> None:
        resumed, self._resumed = self._resumed, None
        if resumed is not None and not resumed.done():
            resumed.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        if exc is not None:
            log.info("stdout closed: %s", type(exc).__name__)
        if not self._closed.done():
            self._closed.set_result(None)
        self.resume_writing()

    def _get_close_waiter(self, stream: Any) -> asyncio.Future[None]:
        return self._closed

    async def _drain_helper(self) -> None:
        if self._resumed is not None:
            await asyncio.shield(self._resumed)


class _FileWriteTransport(asyncio.WriteTransport):
    """stdout redirected to a regular file: writes are synchronous and never buffer."""

    def __init__(self, fd: int, protocol: asyncio.BaseProtocol, loop: asyncio.AbstractEventLoop):
        super().__init__()
        self._fd = fd
        self._protocol = protocol
        self._loop = loop
        self._closing = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._closing:
            return
        view = memoryview(data)
        while view:
            view = view[os.write(self._fd, view) :]

    def get_write_buffer_size(self) -> int:
        return 0

    def is_closing(self) -> bool:
        return self._closing

    def close(self) -> None:
        if not self._closing:
            self._closing = True
            os.close(self._fd)
            self._loop.call_soon(self._protocol.connection_lost, None)

    def abort(self) -> None:
        self.close()


class _FileReadPump(asyncio.ReadTransport):
    """stdin redirected from a regular file: fed to the reader with its flow control."""

    def __init__(self, fd: int, reader: asyncio.StreamReader) -> None:
        super().__init__()
        self._fd = fd
        self._reader = reader
        self._may_read = asyncio.Event()
        self._may_read.set()
        self._task: asyncio.Task[None] | None = None
        reader.set_transport(self)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._pump())

    async def _pump(self) -> None:
        try:
            while True:
                await self._may_read.wait()
                chunk = os.read(self._fd, _FILE_CHUNK)
                if not chunk:
                    self._reader.feed_eof()
                    return
                self._reader.feed_data(chunk)
                await asyncio.sleep(0)
        except OSError as error:
            self._reader.set_exception(error)
        finally:
            os.close(self._fd)

    def pause_reading(self) -> None:
        self._may_read.clear()

    def resume_reading(self) -> None:
        self._may_read.set()

    def is_reading(self) -> bool:
        return self._may_read.is_set()

    def is_closing(self) -> bool:
        return self._task is not None and self._task.done()

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
