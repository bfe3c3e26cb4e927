#!/usr/bin/env python3
"""The speed floor of a WebSocket server: :mod:`echo_floor`'s answers, one JSON-RPC
message per text frame instead of one per line.

Usage: ``ws_floor.py PORT`` (127.0.0.1:PORT) or ``ws_floor.py --library PORT``.

By default only the unavoidable work of the transport is done: the ``websockets``
library's sans-I/O :class:`~websockets.server.ServerProtocol` (handshake, framing,
masking, ping/pong, close) fed from a plain :class:`asyncio.Protocol` with
TCP_NODELAY, as :mod:`echo_floor` serves lines; any path, any headers (no auth), no
compression. ``--library`` serves the same answers from the library's own asyncio
server (``websockets.asyncio.server.serve``), so the two
servers side by side show what that layer costs per message.

Every request frame is answered at once from the asyncio loop thread (see
:func:`echo_floor.answer_line`: ``initialize`` -> ``{}``, a prompt -> its echo as
``session/update`` chunks, then the result). Clients send each message in one
frame; fragmented messages are not reassembled. Runs until SIGINT/SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import sys
from typing import cast

from echo_floor import FRAME_LIMIT, answer_line, serve_until_stopped
from websockets.asyncio.server import ServerConnection, serve
from websockets.frames import Frame, Opcode
from websockets.http11 import Request
from websockets.server import ServerProtocol

__all__ = ["main", "serve_library", "serve_sans_io"]


def _replies(message: bytes) -> list[bytes]:
    """The reply frames for one request frame (none for notifications)."""
    reply = answer_line(message)
    return reply.splitlines() if reply is not None else []


class SansIoEcho(asyncio.Protocol):
    """One connection: bytes in -> the sans-I/O protocol -> replies -> bytes out.
    Loop thread."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        sock = self.transport.get_extra_info("socket")
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.protocol = ServerProtocol(max_size=FRAME_LIMIT)

    def data_received(self, data: bytes) -> None:
        self.protocol.receive_data(data)
        for event in self.protocol.events_received():
            if isinstance(event, Request):
                self.protocol.send_response(self.protocol.accept(event))
            elif isinstance(event, Frame) and event.opcode is Opcode.TEXT:
                for reply in _replies(bytes(event.data)):
                    self.protocol.send_text(reply)
        self._flush()

    def eof_received(self) -> bool:
        self.protocol.receive_eof()
        self._flush()
        return False

    def _flush(self) -> None:
        for data in self.protocol.data_to_send():
            if data:
                self.transport.write(data)
            else:  # the protocol's end of stream
                self.transport.close()
                return
        if self.protocol.close_expected():
            self.transport.close()


async def serve_sans_io(port: int) -> None:
    """Serve :class:`SansIoEcho` on 127.0.0.1:``port`` until SIGINT/SIGTERM."""
    loop = asyncio.get_running_loop()
    await serve_until_stopped(await loop.create_server(SansIoEcho, "127.0.0.1", port))


async def _library_echo(connection: ServerConnection) -> None:
    async for message in connection:
        data = message.encode() if isinstance(message, str) else message
        for reply in _replies(data):
            await connection.send(reply.decode())


async def serve_library(port: int) -> None:
    """Serve the same answers from the library's asyncio server until SIGINT/SIGTERM."""
    await serve_until_stopped(await serve(
        _library_echo, "127.0.0.1", port, max_size=FRAME_LIMIT, compression=None))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--library", action="store_true",
                        help="serve from websockets' asyncio server instead")
    parser.add_argument("port", type=int, help="listen on 127.0.0.1:PORT")
    args = parser.parse_args(argv)
    asyncio.run((serve_library if args.library else serve_sans_io)(args.port))
    return 0


if __name__ == "__main__":
    sys.exit(main())
