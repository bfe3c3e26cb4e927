"""Harness for gateway tests: a daemon with ``--gateway 127.0.0.1:0`` and known tenants,
a blocking ACP client over WebSocket (the daemon harness's :class:`RpcClient`, with
WebSocket text frames instead of NDJSON lines), plain HTTP requests, and the ACP SDK's
``Transport`` over a WebSocket. Runs on the test's thread (the SDK transport on its loop).
"""

from __future__ import annotations

import hashlib
import json
import re
import socket
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from tests.e2e.procs import write_config

from .helpers import FRAME_TIMEOUT, DaemonProc, RpcClient

__all__ = [
    "TOKENS",
    "GatewayDaemon",
    "ManualClient",
    "WebSocketTransport",
    "WsClient",
    "gateway_config",
    "http_get",
]

TOKENS = {"alice": "alice-token-0123456789", "bob": "bob-token-0123456789",
          "ops": "ops-token-0123456789"}


def gateway_config(config_dir: Path, extra: str = "", **tenant_extra: str) -> None:
    """config.toml with tenants alice, bob and ops (admin), plus ``extra`` TOML."""
    sections = []
    for name, token in TOKENS.items():
        digest = hashlib.sha256(token.encode()).hexdigest()
        lines = [f"[tenants.{name}]", f'token_sha256 = "{digest}"']
        if name == "ops":
            lines.append("admin = true")
        if name in tenant_extra:
            lines.append(tenant_extra[name])
        sections.append("\n".join(lines))
    write_config(config_dir, extra + "\n" + "\n\n".join(sections) + "\n")


class GatewayDaemon:
    """A started daemon's gateway address, read from its log."""

    def __init__(self, daemon: DaemonProc, timeout: float = 20.0) -> None:
        self.daemon = daemon
        deadline = time.monotonic() + timeout
        while True:
            match = re.search(r"gateway listening on (https?://\S+)", daemon.stderr())
            if match:
                break
            assert daemon.proc.poll() is None, f"daemon exited:\n{daemon.stderr()}"
            assert time.monotonic() < deadline, f"no gateway:\n{daemon.stderr()}"
            time.sleep(0.02)
        self.http = match.group(1)
        self.ws = "ws" + self.http.removeprefix("http")

    @property
    def data_dir(self) -> Path:
        return self.daemon.socket_path.parent

    def root(self, tenant: str = "alice") -> Path:
        """The default root of a tenant of :func:`gateway_config` (whose id is its name),
        made as the daemon makes it, for a test that names it as a cwd before its first
        ``session/new``."""
        root = self.data_dir / "tenants" / tenant
        root.mkdir(mode=0o700, parents=True, exist_ok=True)
        return root

    def client(self, tenant: str = "alice", *, query: str = "", **kwargs: Any) -> WsClient:
        return WsClient(f"{self.ws}/acp{query}", token=TOKENS[tenant], **kwargs)

    def get(self, path: str, tenant: str | None = None) -> tuple[int, str, dict[str, str]]:
        headers = {"Authorization": f"Bearer {TOKENS[tenant]}"} if tenant else {}
        return http_get(self.http + path, headers)


def http_get(url: str, headers: dict[str, str] | None = None) -> tuple[int, str, dict[str, str]]:
    """``(status, body, headers)`` of a GET, errors included."""
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=FRAME_TIMEOUT) as response:
            return response.status, response.read().decode(), dict(response.headers)
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode(), dict(error.headers)


class WsClient(RpcClient):
    """:class:`RpcClient` over the gateway's ``/acp``: one JSON-RPC message per text frame.

    ``token`` goes in the ``Authorization`` header unless ``header=False`` (then the
    URL or ``subprotocols`` carry it)."""

    def __init__(self, url: str, *, token: str | None = None, header: bool = True,
                 subprotocols: list[str] | None = None, initialize: bool = True,
                 **options: Any) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token and header else None
        self.ws = connect(url, additional_headers=headers, subprotocols=subprotocols,
                          open_timeout=FRAME_TIMEOUT, legacy=True, **options)
        self.notifications = []
        self.frames = []
        self._next_id = 1
        self._sent_at: dict[int, int] = {}
        if initialize:
            self.request("initialize", {"protocolVersion": 1})

    def close(self) -> None:
        self.ws.close()

    def _write(self, text: str) -> None:
        self.ws.send(text)

    def reply(self, request_id: Any, result: Any) -> None:
        self._write(json.dumps({"jsonrpc": "2.0", "id": request_id, "result": result}))

    def _read_message(self, timeout: float) -> bytes | str:
        try:
            text: bytes | str = self.ws.recv(timeout=timeout)
        except TimeoutError:
            raise TimeoutError("no frame from the gateway") from None
        except ConnectionClosed:
            raise ConnectionError("the gateway closed the connection") from None
        return text

    def wait_request(self, method: str, timeout: float = FRAME_TIMEOUT) -> dict[str, Any]:
        """The next request the gateway sends us (e.g. ``session/request_permission``)."""
        deadline = time.monotonic() + timeout
        while True:
            frame = self.read_frame(max(0.01, deadline - time.monotonic()))
            if frame.get("method") == method and "id" in frame:
                return frame


class ManualClient:
    """A WebSocket client that reads only when asked (:meth:`read_until`), so it can stop
    reading altogether: the library's sans-I/O protocol over a plain socket (every other
    client here reads in a background thread)."""

    def __init__(self, url: str, token: str) -> None:
        from websockets.client import ClientProtocol
        from websockets.uri import parse_uri

        uri = parse_uri(url)
        self.protocol = ClientProtocol(uri)
        self.sock = socket.create_connection((uri.host, uri.port), timeout=FRAME_TIMEOUT)
        request = self.protocol.connect()
        request.headers["Authorization"] = f"Bearer {token}"
        self.protocol.send_request(request)
        self._flush()
        while self.protocol.handshake_exc is None and not self.protocol.events_received():
            self.protocol.receive_data(self.sock.recv(4096))  # the 101 answer, then no more
        assert self.protocol.handshake_exc is None, self.protocol.handshake_exc

    def send(self, message: dict[str, Any]) -> None:
        self.protocol.send_text(json.dumps(message).encode())
        self._flush()

    def _flush(self) -> None:
        for data in self.protocol.data_to_send():
            self.sock.sendall(data)

    def read_until(self, request_id: int, timeout: float = 60.0) -> tuple[Any, list[Any]]:
        """Read until the answer to ``request_id``: it, and every message before it."""
        from websockets.frames import Frame

        deadline = time.monotonic() + timeout
        self.sock.settimeout(timeout)
        seen: list[Any] = []
        while time.monotonic() < deadline:
            for event in self.protocol.events_received():
                if isinstance(event, Frame) and event.data:
                    message = json.loads(event.data)
                    if message.get("id") == request_id and "method" not in message:
                        return message, seen
                    seen.append(message)
            self._flush()  # pongs
            data = self.sock.recv(1 << 20)
            if not data:
                raise ConnectionError("the gateway closed the connection")
            self.protocol.receive_data(data)
        raise TimeoutError(f"no answer to {request_id}")

    def close(self) -> None:
        self.sock.close()


class WebSocketTransport:
    """The ACP SDK's ``Transport`` protocol (decoded messages in and out) over a
    WebSocket: the SDK's ``ClientSideConnection`` takes it instead of two streams."""

    def __init__(self, connection: ClientConnection) -> None:
        self.connection = connection

    async def send(self, message: dict[str, Any]) -> None:
        await self.connection.send(json.dumps(message))

    async def receive(self) -> dict[str, Any] | None:
        try:
            message: dict[str, Any] = json.loads(await self.connection.recv())
        except ConnectionClosed:
            return None
        return message

    async def close(self) -> None:
        await self.connection.close()
