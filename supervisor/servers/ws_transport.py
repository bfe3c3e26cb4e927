"""The gateway's connections: the ``websockets`` library's sans-I/O
:class:`~websockets.server.ServerProtocol` driven from a plain :class:`asyncio.Protocol`.

Everything here runs on the daemon's asyncio loop thread. The library parses and
writes everything on the wire (the HTTP request and answer, frames, masking,
ping/pong, the close handshake); :class:`WsConnection` moves bytes between it and
the socket, asks its :class:`ConnectionHandler` (the gateway) how to answer each
request, and feeds every whole message to the connection's endpoint at once, in
the callback that read it: no task, queue or lock per message.

Frame limit (``acp.sock``'s rule): a message over ``frame_limit`` bytes is answered
-32600 (:meth:`ipc.jsonrpc.Endpoint.receive_oversized`) and the connection goes on;
it is never held whole in memory. One frame over the limit is dropped as its
payload arrives (:class:`_SkippingReader`: the library reads the frame's header and
asks for its payload, which is consumed from the buffer and let go); the fragments
of a message whose running size passes the limit are dropped (each one is at most
the limit). A control frame over the limit is a protocol error (1002), as any over
125 bytes is.

Other rules kept from the library's asyncio server: the opening handshake (TLS
excepted, which asyncio times itself) must finish within ``OPEN_TIMEOUT``; a ping
goes out every ``PING_INTERVAL`` and a connection whose pong does not come back
before the next one is closed (1011); after a Close frame, the TCP connection is
closed by the peer or, ``CLOSE_TIMEOUT`` later, by us.

Writes (:class:`Outbox`): a frame goes to the socket at once unless the transport
holds more than :data:`~ipc.transports.PACE_MARK` bytes (its high mark); then it
queues here until the transport drains, and the queue is the connection's write flow
for paced senders (:mod:`supervisor.core.pacing`, the duck type of
:class:`ipc.transports.WriteFlow`). A client that takes no byte for
``stall_timeout`` seconds while behind, or whose queue passes ``high_water`` bytes,
is disconnected.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
from collections.abc import Callable, Generator
from typing import TYPE_CHECKING, Any, Final, Protocol, cast

from websockets.exceptions import ProtocolError
from websockets.frames import CTRL_OPCODES, Frame, Opcode
from websockets.http11 import Request, Response
from websockets.protocol import OPEN, State
from websockets.server import ServerProtocol
from websockets.streams import StreamReader

from ipc.framing import OVERSIZED, Oversized
from ipc.stall_watch import StallWatch
from ipc.transports import PACE_MARK

if TYPE_CHECKING:
    from ipc.jsonrpc import Endpoint

__all__ = ["ANSWER_HEADERS", "CLOSE_TIMEOUT", "OPEN_TIMEOUT", "ConnectionHandler", "Outbox",
           "WsConnection"]

log = logging.getLogger("zeroclaw.gateway")

OPEN_TIMEOUT: Final = 10.0
"""Seconds for the opening handshake (the library's default)."""
CLOSE_TIMEOUT: Final = 10.0
"""Seconds the peer has to close the TCP connection after the Close frames."""
PING_INTERVAL: Final = 20.0
"""Seconds between keepalive pings; a pong must come back within as long."""
ANSWER_HEADERS: Final = {"X-Content-Type-Options": "nosniff"}
"""Headers of every HTTP answer: no browser may take a JSON body or an error's text
for a script, a style sheet or a page."""


class ConnectionHandler(Protocol):
    """What a :class:`WsConnection` asks of the server it belongs to (loop thread)."""

    def connected(self, connection: WsConnection) -> None:
        """The connection is up (after the TLS handshake, when there is one)."""

    async def route(self, connection: WsConnection, request: Request) -> Response | None:
        """The answer to ``request``, or ``None`` to go on with the upgrade."""

    def opened(self, connection: WsConnection) -> Endpoint | None:
        """The upgraded connection's endpoint (``None``: the handler closed it)."""

    def closed(self, connection: WsConnection) -> None:
        """The connection of an :meth:`opened` endpoint is gone."""


class _SkippingReader(StreamReader):
    """The library's byte buffer, which never holds more than ``limit`` bytes of one
    read: a larger read (only a frame's payload asks for one) is consumed and let go
    as it arrives, then given as empty, with :attr:`skipped` set."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit = limit
        self.skipped = False

    def read_exact(self, n: int) -> Generator[None, None, bytearray]:
        if n <= self.limit:
            buffer = self.buffer
            if n <= len(buffer):  # there already (the usual case): no generator to wait in
                data = buffer[:n]
                del buffer[:n]
                return data
            return (yield from super().read_exact(n))
        left = n
        while left:
            while not self.buffer:
                if self.eof:
                    raise EOFError(f"stream ends {left} bytes before the end of a frame")
                yield
            taken = min(left, len(self.buffer))
            del self.buffer[:taken]
            left -= taken
        self.skipped = True
        return bytearray()


class LimitedServerProtocol(ServerProtocol):
    """The library's server protocol with ``acp.sock``'s frame limit: data frames
    become whole messages in :attr:`messages` (``bytes``, or :data:`OVERSIZED` for a
    message over ``frame_limit``, already dropped); control frames go on as events.
    Every HTTP answer, the library's own refusals included, carries
    :data:`ANSWER_HEADERS`."""

    def __init__(self, frame_limit: int, **options: Any) -> None:
        super().__init__(max_size=None, **options)
        self.frame_limit = frame_limit
        self.reader = _SkippingReader(frame_limit)
        self.parser = self.parse()  # again, on the new reader
        next(self.parser)
        self.messages: list[bytes | Oversized] = []
        self._parts: list[bytes] = []
        self._dropping = False

    def send_response(self, response: Response) -> None:
        """Send the answer to the opening request (this class's or the library's)."""
        for name, value in ANSWER_HEADERS.items():
            if name not in response.headers:
                response.headers[name] = value
        super().send_response(response)

    def recv_frame(self, frame: Frame) -> None:
        """Run by the library's parser for each frame (its errors fail the connection)."""
        reader = cast(_SkippingReader, self.reader)
        skipped, reader.skipped = reader.skipped, False
        if frame.opcode in CTRL_OPCODES:
            if skipped:
                raise ProtocolError("control frame too long")
            super().recv_frame(frame)
            return
        if frame.opcode is Opcode.CONT:
            if self.current_size is None:
                raise ProtocolError("unexpected continuation frame")
        elif self.current_size is not None:
            raise ProtocolError("expected a continuation frame")
        elif frame.fin and not skipped:  # the usual case: a whole message in one frame
            self.messages.append(cast(bytes, frame.data))  # unmasked: always bytes
            return
        else:
            self.current_size, self._dropping = 0, False
        self._take_fragment(frame, skipped)

    def _take_fragment(self, frame: Frame, skipped: bool) -> None:
        assert self.current_size is not None
        self.current_size += self.frame_limit + 1 if skipped else len(frame.data)
        if skipped or self.current_size > self.frame_limit:
            self._dropping = True
            self._parts.clear()
        elif not self._dropping:
            self._parts.append(cast(bytes, frame.data))
        if frame.fin:
            self.messages.append(OVERSIZED if self._dropping else b"".join(self._parts))
            self.current_size, self._parts = None, []


class WsConnection(asyncio.Protocol):
    """One accepted connection, from its HTTP request to its close (loop thread)."""

    def __init__(self, handler: ConnectionHandler, frame_limit: int,
                 on_closed: Callable[[], None], **options: Any) -> None:
        """``options``: the library protocol's (``select_subprotocol``, ``logger``)."""
        self.protocol = LimitedServerProtocol(frame_limit, **options)
        self.endpoint: Endpoint | None = None
        self.outbox: Outbox | None = None
        self.transport: asyncio.Transport = cast(asyncio.Transport, None)
        self.paused = False
        self.written = 0
        self._handler = handler
        self._on_closed = on_closed
        self._closed = asyncio.get_running_loop().create_future()
        self._answering: asyncio.Task[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._close_timer: asyncio.TimerHandle | None = None
        self._ping: bytes | None = None
        self._ended = False

    @property
    def remote_address(self) -> Any:
        return self.transport.get_extra_info("peername")

    def respond(self, status: int, text: str) -> Response:
        """A plain-text answer to send instead of the upgrade."""
        return self.protocol.reject(status, text)

    # --- asyncio callbacks ---------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self.transport.set_write_buffer_limits(high=PACE_MARK, low=PACE_MARK // 4)
        self._timer = asyncio.get_running_loop().call_later(OPEN_TIMEOUT, self._open_timed_out)
        self._handler.connected(self)

    def data_received(self, data: bytes) -> None:
        protocol = self.protocol
        protocol.receive_data(data)
        if protocol.events:
            self._handle(protocol.events_received())
        if protocol.messages and self.endpoint is not None:
            self._deliver()
        if protocol.writes or protocol.state is not OPEN:  # pongs, a close, an EOF
            self.flush()

    def eof_received(self) -> bool:
        self.protocol.receive_eof()
        self._handle(self.protocol.events_received())
        self.flush()
        return False  # asyncio closes the transport once what is buffered is written

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        if self.outbox is not None:
            self.outbox.resume()

    def connection_lost(self, exc: Exception | None) -> None:
        for timer in (self._timer, self._close_timer):
            if timer is not None:
                timer.cancel()
        if self._answering is not None:
            self._answering.cancel()
        self._end()
        self._closed.set_result(None)
        self._on_closed()

    # --- the connection's life -----------------------------------------------------

    def send(self, message: bytes) -> bool:
        """Write one text frame now (False: the connection is closing, nothing sent)."""
        if self.protocol.state is not OPEN:
            return False
        self.protocol.send_text(message)
        self.flush()
        return True

    def close(self, code: int, reason: str = "") -> None:
        """Start the closing handshake (an unopened connection is dropped)."""
        state = self.protocol.state
        if state is OPEN:
            self.protocol.send_close(code, reason)
            self.flush()
        elif state is State.CONNECTING:
            self.transport.abort()

    async def wait_closed(self) -> None:
        await asyncio.shield(self._closed)

    def flush(self) -> None:
        """Write what the library has to send; end the stream when it says so."""
        transport = self.transport
        for data in self.protocol.data_to_send():
            if data:
                self.written += len(data)
                transport.write(data)
            elif transport.can_write_eof():
                transport.write_eof()
            else:
                transport.close()
        if self.paused and self.outbox is not None:
            self.outbox.check_backlog()  # a pong or a close went around the queue
        if self.protocol.state is OPEN:
            return
        if self._close_timer is None and self.protocol.close_expected():
            self._close_timer = asyncio.get_running_loop().call_later(
                CLOSE_TIMEOUT, transport.abort)
        if self.endpoint is not None:
            self._end()  # a Close frame went or came: nothing more is read

    def _end(self) -> None:
        """Once: the endpoint's input is over (its handler is told)."""
        if self.outbox is not None:
            self.outbox.close()
        if self.endpoint is not None and not self._ended:
            self._ended = True
            self._handler.closed(self)

    def _handle(self, events: list[Any]) -> None:
        for event in events:
            if isinstance(event, Request):
                self._answering = asyncio.ensure_future(self._answer(event))
            elif event.opcode is Opcode.PONG and event.data == self._ping:
                self._ping = None

    def _deliver(self) -> None:
        endpoint = self.endpoint
        assert endpoint is not None
        messages, self.protocol.messages = self.protocol.messages, []
        for message in messages:
            if message is OVERSIZED:
                endpoint.receive_oversized()
            else:
                endpoint.receive(message)

    async def _answer(self, request: Request) -> None:
        """Route ``request``: an HTTP answer, or the upgrade and the endpoint."""
        try:
            response = await self._handler.route(self, request)
        except Exception as error:
            log.error("gateway: answering a request failed (%s)", type(error).__name__)
            response = self.respond(500, "Failed to open a WebSocket connection.\n")
        self._answering = None
        if self.transport.is_closing() or self.protocol.eof_sent:  # failed meanwhile
            return
        if response is None:
            response = self.protocol.accept(request)
        self.protocol.send_response(response)
        if self.protocol.state is OPEN:
            self._opened()
        self.flush()

    def _opened(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self.endpoint = self._handler.opened(self)
        if self.endpoint is None:
            return
        self._timer = asyncio.get_running_loop().call_later(PING_INTERVAL, self._keepalive)
        if self.protocol.messages:
            self._deliver()

    def _open_timed_out(self) -> None:
        self._timer = None
        if self.protocol.state is State.CONNECTING:
            log.info("gateway: the opening handshake timed out")
            self.transport.abort()

    def _keepalive(self) -> None:
        """Every :data:`PING_INTERVAL`: fail a connection whose last ping got no pong,
        else ping it again."""
        if self.protocol.state is not OPEN:
            self._timer = None
            return
        if self._ping is not None:
            self.protocol.fail(1011, "keepalive ping timeout")
        else:
            self._ping = os.urandom(4)
            self.protocol.send_ping(self._ping)
        self.flush()
        self._timer = asyncio.get_running_loop().call_later(PING_INTERVAL, self._keepalive)


class Outbox:
    """Frames waiting for one WebSocket client, and the connection's write flow for
    paced senders (loop thread).

    ``behind`` while more than :data:`~ipc.transports.PACE_MARK` bytes wait (queued here
    or in the socket buffer): a running turn then holds its updates and slows its agent
    instead of filling this queue. While behind, a client that takes no byte for
    ``stall_timeout`` seconds is disconnected; and whatever happens, one whose queue
    passes ``high_water`` bytes is.
    """

    def __init__(self, connection: WsConnection, high_water: int,
                 stall_timeout: float) -> None:
        self.endpoint: Endpoint | None = None
        self._connection = connection
        self._transport = connection.transport
        self._high_water = high_water
        self._frames: collections.deque[bytes] = collections.deque()
        self._queued = 0
        self._empty = asyncio.Event()
        self._empty.set()
        self._drained: list[Callable[[], None]] = []
        self._done = False  # closed, or given up on
        self._stall = StallWatch(stall_timeout, self._taken, self._still_behind,
                                 self._give_up)

    @property
    def behind(self) -> bool:
        return self._queued + self._transport.get_write_buffer_size() > PACE_MARK

    def put(self, frame: bytes) -> None:
        """The endpoint's ``send`` (never blocks): write, queue, or give up on a
        stuck client."""
        if self._done:
            return
        if not self._frames and not self._connection.paused:
            self._connection.send(frame.rstrip(b"\n"))
        else:
            self._frames.append(frame)
            self._queued += len(frame)
            self._empty.clear()
            if self._queued > self._high_water:
                self._give_up(f"client is not reading ({self._queued} bytes queued)")
                return
        if self._still_behind():
            self._stall.start()

    def check_backlog(self) -> None:
        """Give up on a client whose unsent bytes passed the high-water mark, counting
        those written around the queue (pongs, a close) beyond the transport's high mark:
        a client that pings and never reads must not grow the host's memory either."""
        over_mark = max(0, self._transport.get_write_buffer_size() - PACE_MARK)
        if not self._done and self._queued + over_mark > self._high_water:
            self._give_up(f"client is not reading ({self._queued + over_mark} bytes behind)")

    def when_drained(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` (once) when the client caught up; never if it goes first."""
        self._drained.append(callback)
        if not self._connection.paused:
            asyncio.get_running_loop().call_soon(self._call_back_if_below, PACE_MARK)

    def resume(self) -> None:
        """The transport drained to its low mark: write what waits, up to its high one."""
        while self._frames and not self._connection.paused:
            frame = self._frames.popleft()
            self._queued -= len(frame)
            if not self._connection.send(frame.rstrip(b"\n")):
                self._frames.clear()
                self._queued = 0
            self._call_back_if_below(PACE_MARK // 4)
        if not self._frames:
            self._empty.set()
            self._call_back_if_below(PACE_MARK)

    def _taken(self) -> int:
        return self._connection.written - self._transport.get_write_buffer_size()

    def _still_behind(self) -> bool:
        """Worth watching for a stall: not given up on, and the socket takes no more."""
        return not self._done and self._connection.paused

    def _give_up(self, reason: str) -> None:
        log.warning("closing gateway connection: %s", reason)
        self.close()
        if self.endpoint is not None:
            self.endpoint.close()
        self._transport.abort()  # its buffers go at once

    def _call_back_if_below(self, mark: int) -> None:
        if self._drained and self._queued + self._transport.get_write_buffer_size() <= mark:
            callbacks, self._drained = self._drained, []
            for callback in callbacks:
                callback()

    def close(self) -> None:
        """Nothing more will be sent: nobody waits for a drain or a flush."""
        self._done = True
        self._frames.clear()
        self._queued = 0
        self._drained.clear()
        self._empty.set()
        self._stall.stop()

    async def flushed(self) -> None:
        """Until every queued frame went to the socket (or the connection closed)."""
        await self._empty.wait()
