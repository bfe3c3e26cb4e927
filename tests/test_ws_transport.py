"""The gateway's connection transport on one loopback socket, with a stand-in for the
gateway: keepalive pings, and bytes that break the protocol while a request is being
answered. (Everything else it does is tested through the daemon.)"""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import pytest
from websockets.client import ClientProtocol
from websockets.uri import parse_uri

from supervisor.servers import ws_transport
from supervisor.servers.ws_transport import Outbox, WsConnection


class _Upgrading:
    """A handler that upgrades every request (after ``delay`` seconds) and echoes
    nothing."""

    def __init__(self, delay: float = 0.0) -> None:
        self.delay = delay
        self.routed = asyncio.Event()

    def connected(self, connection: WsConnection) -> None:
        pass

    async def route(self, connection: WsConnection, request: Any) -> None:
        await asyncio.sleep(self.delay)
        self.routed.set()
        return None

    def opened(self, connection: WsConnection) -> Any:
        return object()

    def closed(self, connection: WsConnection) -> None:
        pass


async def _close_code_of_a_client_that_never_pongs() -> int | None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(
        lambda: WsConnection(_Upgrading(), 4096, lambda: None), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client = ClientProtocol(parse_uri(f"ws://127.0.0.1:{port}/acp"))
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    client.send_request(client.connect())
    writer.writelines(client.data_to_send())
    try:
        async with asyncio.timeout(10):
            while data := await reader.read(65536):
                client.receive_data(data)  # the pings it gets are never answered
    finally:
        writer.close()
        server.close()
    return client.close_rcvd.code if client.close_rcvd else None


def test_a_client_that_answers_no_ping_is_closed_1011(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ws_transport, "PING_INTERVAL", 0.05)
    assert asyncio.run(_close_code_of_a_client_that_never_pongs()) == 1011


async def _errors_after_garbage_behind_a_request() -> list[str]:
    loop = asyncio.get_running_loop()
    errors: list[str] = []
    loop.set_exception_handler(lambda _, context: errors.append(str(context)))
    handler = _Upgrading(delay=0.05)
    server = await loop.create_server(
        lambda: WsConnection(handler, 4096, lambda: None), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    client = ClientProtocol(parse_uri(f"ws://127.0.0.1:{port}/acp"))
    client.send_request(client.connect())
    writer.writelines([*client.data_to_send(), b"not a frame"])
    try:
        async with asyncio.timeout(10):
            assert await reader.read() == b""  # failed: closed without an answer
            await handler.routed.wait()  # the route's answer comes after the close
            await asyncio.sleep(0)  # and is handled
    finally:
        writer.close()
        server.close()
    return errors


def test_a_request_followed_by_garbage_is_closed_without_an_answer() -> None:
    assert asyncio.run(_errors_after_garbage_behind_a_request()) == []


class _WithOutbox(_Upgrading):
    """Upgrades every request and gives the connection an outbox, as the gateway does;
    ``lost`` is set when the connection has closed."""

    def __init__(self, high_water: int) -> None:
        super().__init__()
        self.high_water = high_water
        self.lost = asyncio.Event()

    def opened(self, connection: WsConnection) -> Any:
        connection.outbox = Outbox(connection, self.high_water, stall_timeout=30.0)
        return object()


async def _flood_pings_without_reading(high_water: int, most: int) -> bool:
    """Ping the server (up to ``most`` bytes) and read nothing back; whether it closed."""
    loop = asyncio.get_running_loop()
    handler = _WithOutbox(high_water)
    server = await loop.create_server(
        lambda: WsConnection(handler, 4096, handler.lost.set), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client = ClientProtocol(parse_uri(f"ws://127.0.0.1:{port}/acp"))
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # no room to read ahead
    sock.connect(("127.0.0.1", port))
    reader, writer = await asyncio.open_connection(sock=sock, limit=1024)
    client.send_request(client.connect())
    writer.writelines(client.data_to_send())
    client.receive_data(await reader.read(4096))  # the 101 answer; nothing is read after it
    assert client.handshake_exc is None
    for _ in range(1024):
        client.send_ping(b"p" * 125)
    pings = b"".join(client.data_to_send())
    sent = 0
    try:
        async with asyncio.timeout(30):
            while sent < most and not handler.lost.is_set():
                writer.write(pings)
                await writer.drain()
                sent += len(pings)
    except ConnectionError:
        pass
    finally:
        writer.close()
        server.close()
    return handler.lost.is_set()


def test_a_client_that_pings_and_never_reads_is_closed_at_the_high_water_mark() -> None:
    """Each ping gets a pong, written around the outbox: they count toward the mark too,
    or a client that never reads could grow the host's memory without end."""
    assert asyncio.run(_flood_pings_without_reading(64 * 1024, 48 * 1024 * 1024))
