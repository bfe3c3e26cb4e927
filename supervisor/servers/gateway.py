"""The daemon's gateway: ACP over WebSocket for remote editors, and ops over HTTP.

Runs on the daemon's asyncio loop (the main thread), served by the ``websockets``
library (imported only when the gateway is on). Routes, all ``GET``:

- ``/acp``: the ACP v1 dialect of ``acp.sock``, one JSON-RPC message per text frame,
  through the same :meth:`supervisor.servers.acp_server.AcpServer.make_endpoint` (handshake,
  envelope rules, ownership, out-of-band cancel, permission relay); the connection
  carries its tenant's :class:`~supervisor.tenants.TenantScope` and ``?agent=`` as its
  default agent. The token is checked before the upgrade (401 without a valid one).
- ``/health``: 200 or 503 with ``{"status", "reasons"}``; no token needed.
- ``/status``: the ``status`` JSON as the token's tenant may see it (an admin: all).
- ``/metrics``: Prometheus text format (:mod:`supervisor.metrics`); admin token only.
- ``/``: the status page (:mod:`supervisor.servers.status_page`): static files, no token; its
  script reads ``/status`` with the token.

A token goes in ``Authorization: Bearer <token>``, as a ``Sec-WebSocket-Protocol``
entry ``zeroclaw.token.<token>`` (browsers cannot set headers; the server never echoes
it and selects ``acp`` when offered), or as ``?token=``. An address that sent
``auth_failures`` wrong tokens within ``auth_window_secs`` gets 429 until the window
passes. The token never reaches a log, an answer or ``status``.

Tenants can change while the daemon runs (:meth:`Gateway.reload_tenants`, asked for
by ``zeroclaw tenant add|remove`` through ``daemon.sock``): new tokens work at once,
and every ``/acp`` connection whose tenant was removed or whose token hash changed
is closed with 1008 "token revoked" (its running turns are cancelled and stored, as
for a client that went away); the other connections take their tenant's new limits.

The frame limit differs from ``acp.sock``'s rule on one point: a message over
``acp.frame_limit`` closes its connection with 1009 ("frame exceeds limit of N
bytes") instead of being answered -32600 with the connection going on. The library
checks the length in each frame's header before it reads the payload (so memory
stays bounded), and then fails the connection inside its parser: it has no way to
skip one frame's payload and carry on, and once its Close frame is out no answer
may follow (RFC 6455 §5.5.1). Without ``max_size`` it would read any frame whole
into memory; a per-fragment limit fails the same way. Other connections go on.

Connections are accepted by the daemon's own accept loop under its open-file guard
(:class:`ipc.listener.AdoptingListener`, shared with the Unix sockets): out of file
descriptors, accepting pauses with one warning instead of asyncio's storm of
tracebacks, and the process keeps a reserve for its workers and store. Each accepted
socket is then handed to the library's server, with Nagle's algorithm off.

Backpressure, as on the Unix sockets: frames to a client queue in :class:`_Outbox`,
which is also the connection's write flow, so a running turn whose client is behind
holds its updates and slows its own agent (:mod:`supervisor.pacing`); the library holds
at most ``write_limit`` bytes in the socket buffer. A client that takes nothing for
``acp.client_stall_timeout_secs`` while behind, or whose queue passes the write
high-water mark (``ZEROCLAW_WRITE_HIGH_WATER``), is disconnected, so a stuck client
cannot grow the host's memory.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import itertools
import logging
import socket
import ssl
import time
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit

import orjson

from ipc.listener import AdoptingListener
from ipc.transports import PACE_MARK
from supervisor.gateway_config import GatewayConfig
from supervisor.servers.status_page import PAGE_PATHS, page_response
from supervisor.tenants import Tenancy, TenantScope, tenant_of_token

if TYPE_CHECKING:
    from websockets.asyncio.server import Server, ServerConnection
    from websockets.http11 import Request, Response

    from ipc.jsonrpc import Endpoint
    from ipc.listener import OpenFileGuard
    from supervisor.config import Settings
    from supervisor.gateway_config import TenantConfig
    from supervisor.servers.acp_server import AcpServer

__all__ = ["TOKEN_SUBPROTOCOL_PREFIX", "AuthLimiter", "Gateway", "GatewayStats"]

log = logging.getLogger("zeroclaw.gateway")

TOKEN_SUBPROTOCOL_PREFIX = "zeroclaw.token."
ACP_SUBPROTOCOL = "acp"
REVOKED_CLOSE = (1008, "token revoked")  # policy violation: the tenant or its token went
_WRITE_LIMIT = (PACE_MARK, PACE_MARK // 4)  # the socket buffer's high and low marks
_OPEN_TIMEOUT = 10.0  # the TLS handshake, then the WebSocket one (the library's default)


@dataclass(slots=True)
class GatewayStats:
    """Figures for ``/metrics`` (loop thread): open ``/acp`` connections, and refused
    requests by reason (``missing``, ``invalid``, ``rate_limited``)."""

    connections: int = 0
    auth_failures: collections.Counter[str] = field(default_factory=collections.Counter)


class AuthLimiter:
    """Failed logins per address in a sliding window; blocked at ``limit`` failures.

    Memory stays bounded by the addresses that failed within one window: past
    ``_SWEEP_AT`` addresses, every expired one is dropped."""

    _SWEEP_AT = 10_000

    def __init__(self, limit: int, window: float, clock: Callable[[], float] = time.monotonic):
        self._limit = limit
        self._window = window
        self._clock = clock
        self._failures: dict[str, collections.deque[float]] = {}

    def _recent(self, address: str) -> collections.deque[float] | None:
        failures = self._failures.get(address)
        if failures is None:
            return None
        horizon = self._clock() - self._window
        while failures and failures[0] <= horizon:
            failures.popleft()
        if not failures:
            del self._failures[address]
            return None
        return failures

    def blocked(self, address: str) -> float:
        """Seconds until ``address`` may try again (0: it may now)."""
        failures = self._recent(address)
        if failures is None or len(failures) < self._limit:
            return 0.0
        return max(0.0, failures[0] + self._window - self._clock())

    def failed(self, address: str) -> None:
        if len(self._failures) >= self._SWEEP_AT:
            for known in list(self._failures):
                self._recent(known)
        self._recent(address)
        self._failures.setdefault(address, collections.deque()).append(self._clock())


def _credentials(request: Request) -> tuple[str | None, str | None]:
    """The request's token (the ``Authorization`` header, else a ``zeroclaw.token.``
    subprotocol entry, else ``?token=``: one guess per request) and its ``?agent=``."""
    query = parse_qs(urlsplit(request.path).query)
    agents = [a.strip() for a in query.get("agent", []) if a.strip()]
    agent = agents[0] if agents else None
    scheme, _, credentials = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() == "bearer" and credentials.strip():
        return credentials.strip(), agent
    for header in request.headers.get_all("Sec-WebSocket-Protocol"):
        for entry in header.split(","):
            token = entry.strip().removeprefix(TOKEN_SUBPROTOCOL_PREFIX)
            if token and token != entry.strip():
                return token, agent
    tokens = [t for t in query.get("token", []) if t]
    return (tokens[0] if tokens else None), agent


def _select_subprotocol(connection: ServerConnection, offered: Any) -> Any:
    """``acp`` when the client offers it; never a token entry (it would be echoed)."""
    return ACP_SUBPROTOCOL if ACP_SUBPROTOCOL in offered else None


class Gateway:
    """The HTTP/WebSocket listener of one daemon and its connections."""

    def __init__(self, settings: Settings, acp: AcpServer, *, write_high_water: int,
                 on_connection: Callable[[int], None]) -> None:
        """``on_connection(+1 / -1)``: the daemon's client count (ephemeral lifetime);
        ``write_high_water``: unsent bytes after which a client counts as not reading."""
        assert settings.gateway is not None
        self.config: GatewayConfig = settings.gateway
        self.settings = settings
        self.acp = acp
        self.tenancy = Tenancy()
        self.tenants: Mapping[str, TenantConfig] = settings.tenants
        self.stats = GatewayStats()
        self.limiter = AuthLimiter(self.config.auth_failures, self.config.auth_window_secs)
        self.url = ""
        self._on_connection = on_connection
        self._high_water = write_high_water
        self._server: Server | None = None
        self._listener: AdoptingListener | None = None
        self._tls: ssl.SSLContext | None = None
        self._watching: set[asyncio.Future[None]] = set()
        self._scopes: weakref.WeakKeyDictionary[Any, TenantScope] = weakref.WeakKeyDictionary()
        self._endpoints: dict[Endpoint, ServerConnection] = {}
        self._closing: set[asyncio.Task[None]] = set()
        self._outboxes: set[_Outbox] = set()
        self._numbers = itertools.count(1)
        from supervisor.metrics import MetricsPage

        self.metrics = MetricsPage(acp.host, self.stats)

    # --- lifecycle (loop thread) ----------------------------------------------------

    async def start(self, guard: OpenFileGuard) -> str:
        """Listen, accepting under ``guard``; the base URL (``http://host:port``, the
        real port when 0 was asked)."""
        from websockets.asyncio.server import serve

        config = self.config
        if config.tls_cert is not None and config.tls_key is not None:
            self._tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            self._tls.load_cert_chain(config.tls_cert, config.tls_key)
        listening = _listening_socket(config.host, config.port)
        try:
            self._server = await serve(
                self._serve_acp, sock=listening, process_request=self._route,
                select_subprotocol=_select_subprotocol, max_size=self.settings.frame_limit,
                write_limit=_WRITE_LIMIT, open_timeout=_OPEN_TIMEOUT, server_header=None,
                logger=_library_logger(),
            )
        except BaseException:
            listening.close()
            raise
        # The library's asyncio server owns the socket (it answers 503 unless serving,
        # and closes it), but our guarded accept loop does the accepting in its place.
        asyncio.get_running_loop().remove_reader(listening.fileno())
        self._listener = AdoptingListener(listening, self._adopt, guard=guard)
        self._listener.start()
        host, port = listening.getsockname()[:2]
        shown = f"[{host}]" if ":" in host else host
        self.url = f"{'https' if self._tls else 'http'}://{shown}:{port}"
        if not self.tenants:
            log.warning("gateway: no tenants are configured, so no token is valid; "
                        "add one with `zeroclaw tenant add NAME`")
        return self.url

    async def _adopt(self, conn: socket.socket, on_closed: Callable[[], None]) -> None:
        """An accepted connection, handed to the library's server (TLS handshake
        first, when configured); ``on_closed`` once it has closed. Loop thread."""
        assert self._server is not None
        # The library's connection factory, kept by the asyncio server it made for us
        # (it has no public one: its servers accept by themselves).
        factory = self._server.server._protocol_factory  # type: ignore[attr-defined]
        _, connection = await _connect_accepted(factory, conn, self._tls)
        closed = asyncio.ensure_future(connection.wait_closed())
        self._watching.add(closed)
        closed.add_done_callback(self._watching.discard)
        closed.add_done_callback(lambda _: on_closed())

    def stop_accepting(self) -> None:
        """No new connection from now on; the open ones go on until :meth:`close`."""
        if self._listener is not None:
            self._listener.stop()  # the library's server closes the socket, just below
        if self._server is not None:
            self._server.server.close()  # the listening socket only (``close`` runs once)

    def endpoints(self) -> list[Endpoint]:
        return list(self._endpoints)

    def reload_tenants(self, tenants: Mapping[str, TenantConfig]) -> int:
        """Use ``tenants`` from now on; close the ``/acp`` connections whose tenant is
        gone or has another token (how many were closed). Loop thread."""
        self.tenants = tenants
        revoked = 0
        for endpoint, connection in list(self._endpoints.items()):
            scope: TenantScope = endpoint.state["scope"]
            if not self._revoked(scope):
                if self.tenants[scope.name] != scope.tenant:  # new limits apply at once
                    endpoint.state["scope"] = dataclasses.replace(
                        scope, tenant=self.tenants[scope.name])
                continue
            log.info("gateway: %s: the tenant's token was revoked: closing", endpoint.name)
            endpoint.close()  # its prompts' turns are cancelled (and kept), as on a hang-up
            closing = asyncio.ensure_future(connection.close(*REVOKED_CLOSE))
            self._closing.add(closing)
            closing.add_done_callback(self._closing.discard)
            revoked += 1
        if not tenants:
            log.warning("gateway: no tenants are configured any more, so no token is valid")
        return revoked

    def _revoked(self, scope: TenantScope) -> bool:
        """The scope's tenant was removed, or its token replaced, since it was checked."""
        now = self.tenants.get(scope.name)
        return now is None or now.token_sha256 != scope.tenant.token_sha256

    async def close(self, flush_timeout: float = 5.0) -> None:
        """Let every client take the frames queued for it (bounded), then close every
        connection (1001 going away) and the listener."""
        flushing = [outbox.flushed() for outbox in self._outboxes]
        if flushing:
            await asyncio.wait([asyncio.ensure_future(f) for f in flushing],
                               timeout=flush_timeout)
        if self._server is not None:
            self._server.close(close_connections=True)
            await self._server.wait_closed()

    # --- HTTP, before any upgrade -----------------------------------------------------

    async def _route(self, connection: ServerConnection, request: Request) -> Response | None:
        path = urlsplit(request.path).path
        if path == "/health":
            return await self._health(connection)
        if path in PAGE_PATHS:  # static files that hold no data: no token
            return page_response(connection, path)
        if path not in ("/acp", "/status", "/metrics"):
            return connection.respond(404, "not found\n")
        token, agent = _credentials(request)
        refusal, tenant = self._authenticate(connection, token)
        if refusal is not None:
            return refusal
        assert tenant is not None
        if path == "/status":
            return await self._status(connection, tenant)
        if path == "/metrics":
            if not tenant.admin:
                return _json(connection, 403, {"error": "an admin tenant's token is needed"})
            response = connection.respond(200, self.metrics.render())
            _set_type(response, self.metrics.content_type)
            return response
        self._scopes[connection] = TenantScope(tenant, self.tenancy, agent)
        return None  # go on with the WebSocket handshake

    def _authenticate(self, connection: ServerConnection,
                      token: str | None) -> tuple[Response | None, TenantConfig | None]:
        """The token's tenant, or the refusal to send (429, 401)."""
        address = _address(connection)
        wait = self.limiter.blocked(address)
        if wait > 0:
            self.stats.auth_failures["rate_limited"] += 1
            response = _json(connection, 429, {"error": "too many failed attempts"})
            response.headers["Retry-After"] = str(max(1, round(wait)))
            return response, None
        if token is None:
            self.stats.auth_failures["missing"] += 1
            log.info("gateway: request from %s without a token refused", address)
            return _unauthorized(connection, "a token is required"), None
        tenant = tenant_of_token(token, self.tenants)
        if tenant is None:
            self.limiter.failed(address)
            self.stats.auth_failures["invalid"] += 1
            blocked = self.limiter.blocked(address)
            if blocked:  # once per block, not once per guess
                log.warning("gateway: %d wrong tokens from %s: refused for %.0f s",
                            self.config.auth_failures, address, blocked)
            else:
                log.info("gateway: invalid token from %s", address)
            return _unauthorized(connection, "invalid token"), None
        return None, tenant

    async def _health(self, connection: ServerConnection) -> Response:
        from supervisor.metrics import health

        ok, body = await health(self.acp.host)
        return _json(connection, 200 if ok else 503, body)

    async def _status(self, connection: ServerConnection, tenant: TenantConfig) -> Response:
        from supervisor.status import host_status

        try:
            sessions = await asyncio.wait_for(self.acp.host.sessions(), 10)
        except Exception:
            return _json(connection, 503, {"error": "the host is not running"})
        status = host_status(sessions, self.acp.host.owners)
        return _json(connection, 200,
                     TenantScope(tenant, self.tenancy).status_view(status, sessions))

    # --- /acp ---------------------------------------------------------------------

    async def _serve_acp(self, connection: ServerConnection) -> None:
        """One ACP connection, from its upgrade until either side closes it."""
        scope = self._scopes.pop(connection, None)
        if scope is None:  # cannot happen: /acp is only upgraded after its check
            await connection.close(1011)
            return
        if self._revoked(scope):  # tenants were reloaded during the handshake
            await connection.close(*REVOKED_CLOSE)
            return
        number = next(self._numbers)
        log.info("gateway connection #%d from %s: tenant %s", number, _address(connection),
                 scope.name)
        outbox = _Outbox(connection, self._high_water,
                         self.settings.client_stall_timeout_secs)
        endpoint = self.acp.make_endpoint(outbox.put, f"gw#{number}({scope.name})")
        endpoint.state["scope"] = scope
        endpoint.state["flow"] = outbox  # paced turns wait for a slow client
        outbox.endpoint = endpoint
        self._endpoints[endpoint] = connection
        self._outboxes.add(outbox)
        self.stats.connections += 1
        self._on_connection(1)
        writer = asyncio.ensure_future(outbox.run())
        try:
            await self._read(connection, endpoint)
        finally:
            endpoint.close()  # its prompts' turns are cancelled (and kept) by the host
            writer.cancel()
            outbox.close()
            self._endpoints.pop(endpoint, None)
            self._outboxes.discard(outbox)
            self.stats.connections -= 1
            self._on_connection(-1)
            log.info("gateway connection #%d closed", number)

    @staticmethod
    async def _read(connection: ServerConnection, endpoint: Endpoint) -> None:
        from websockets.exceptions import ConnectionClosed

        try:
            while not endpoint.closed:
                frame = await connection.recv(decode=False)
                endpoint.receive(frame)
        except ConnectionClosed:
            pass


class _Outbox:
    """Frames waiting for one WebSocket client, written in order by :meth:`run`, and the
    connection's write flow for paced senders (:mod:`supervisor.pacing`, the duck type
    of :class:`ipc.transports.WriteFlow`).

    ``behind`` while more than :data:`~ipc.transports.PACE_MARK` bytes wait (queued here
    or in the socket buffer): a running turn then holds its updates and slows its agent
    instead of filling this queue. While behind, a client that takes no frame for
    ``stall_timeout`` seconds is disconnected; and whatever happens, one whose queue
    passes ``high_water`` bytes is (loop thread).
    """

    def __init__(self, connection: ServerConnection, high_water: int,
                 stall_timeout: float) -> None:
        self.endpoint: Endpoint | None = None
        self._connection = connection
        self._high_water = high_water
        self._stall_timeout = stall_timeout
        self._frames: collections.deque[bytes] = collections.deque()
        self._queued = 0
        self._ready = asyncio.Event()
        self._empty = asyncio.Event()
        self._empty.set()
        self._drained: list[Callable[[], None]] = []
        self._last_sent = time.monotonic()
        self._stall_timer: asyncio.TimerHandle | None = None
        self._gave_up = False

    @property
    def behind(self) -> bool:
        return self._waiting() > PACE_MARK

    def _waiting(self) -> int:
        return self._queued + self._connection.transport.get_write_buffer_size()

    def when_drained(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` (once) when the client caught up; never if it goes first."""
        self._drained.append(callback)
        self._ready.set()

    def put(self, frame: bytes) -> None:
        """The endpoint's ``send`` (never blocks): queue, or give up on a stuck client."""
        if self._gave_up:
            return
        self._frames.append(frame.rstrip(b"\n"))
        self._queued += len(frame)
        self._ready.set()
        self._empty.clear()
        if self._queued > self._high_water:
            self._give_up(f"client is not reading ({self._queued} bytes queued)")
        elif self._stall_timer is None and self.behind:
            self._last_sent = time.monotonic()
            self._watch_stall()

    def _watch_stall(self) -> None:
        period = min(1.0, self._stall_timeout / 4)
        self._stall_timer = asyncio.get_running_loop().call_later(period, self._check_stall)

    def _check_stall(self) -> None:
        self._stall_timer = None
        if self._gave_up or not self.behind:
            return
        if time.monotonic() - self._last_sent >= self._stall_timeout:
            self._give_up(f"client stalled: took no frame for {self._stall_timeout:g} s")
            return
        self._watch_stall()

    def _give_up(self, reason: str) -> None:
        self._gave_up = True
        log.warning("closing gateway connection: %s", reason)
        self._frames.clear()
        self._drained.clear()
        if self.endpoint is not None:
            self.endpoint.close()
        self._connection.transport.abort()  # its buffers go at once

    async def run(self) -> None:
        from websockets.exceptions import ConnectionClosed

        try:
            while not self._gave_up:
                await self._ready.wait()
                self._ready.clear()
                while self._frames:
                    frame = self._frames.popleft()
                    self._queued -= len(frame) + 1
                    await self._connection.send(frame, text=True)  # waits past write_limit
                    self._last_sent = time.monotonic()
                    self._call_back_if_below(PACE_MARK // 4)
                self._empty.set()
                # a send returns with at most PACE_MARK in the socket buffer (write_limit)
                self._call_back_if_below(PACE_MARK)
        except ConnectionClosed:
            pass
        finally:
            self.close()

    def _call_back_if_below(self, mark: int) -> None:
        if self._drained and self._waiting() <= mark:
            callbacks, self._drained = self._drained, []
            for callback in callbacks:
                callback()

    def close(self) -> None:
        """Nothing more will be sent: nobody waits for a drain or a flush."""
        self._drained.clear()
        self._empty.set()
        if self._stall_timer is not None:
            self._stall_timer.cancel()
            self._stall_timer = None

    async def flushed(self) -> None:
        """Until every queued frame went to the socket (or the writer stopped)."""
        await self._empty.wait()


class _Redacted(logging.Filter):
    """The library's own log lines without anything taken from a request: its debug
    lines show headers (a token), and an exception's text may quote a header value."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.INFO:
            return False
        error = record.exc_info[1] if record.exc_info else None
        if error is not None:
            record.msg = f"{record.msg} ({type(error).__name__})"
            record.exc_info = record.exc_text = None
        if isinstance(record.args, tuple):
            record.args = tuple(a if isinstance(a, int) else "-" for a in record.args)
        else:
            record.args = None
        return True


def _library_logger() -> logging.Logger:
    logger = logging.getLogger("zeroclaw.gateway.ws")
    if not any(isinstance(f, _Redacted) for f in logger.filters):
        logger.addFilter(_Redacted())
    return logger


def _listening_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port`` (the first address ``host`` resolves to)."""
    family, _, _, _, address = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    return socket.create_server(address[:2], family=family, backlog=100)


async def _connect_accepted(factory: Callable[[], asyncio.BaseProtocol], conn: socket.socket,
                            tls: ssl.SSLContext | None) -> tuple[Any, Any]:
    """An accepted TCP socket on an asyncio transport of ``factory``'s protocol, with
    Nagle's algorithm off (loop thread).

    asyncio turns it off by itself only for sockets made with protocol ``IPPROTO_TCP``,
    and ``socket.create_server`` makes them with 0: left on, a frame written while the
    previous one is unacknowledged waits for the client's delayed ACK (about 40 ms on
    Linux), which stalled every streamed turn between its first update and the rest."""
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return await asyncio.get_running_loop().connect_accepted_socket(
        factory, conn, ssl=tls, ssl_handshake_timeout=_OPEN_TIMEOUT if tls else None)


def _address(connection: ServerConnection) -> str:
    remote = connection.remote_address
    return str(remote[0]) if isinstance(remote, tuple) and remote else "unknown"


def _json(connection: ServerConnection, status: int, body: Any) -> Response:
    response = connection.respond(status, orjson.dumps(body).decode() + "\n")
    _set_type(response, "application/json")
    return response


def _set_type(response: Response, content_type: str) -> None:
    """The answer's type; and since every such answer is made for its request (a
    tenant's status, maybe asked with ``?token=``), no cache may keep it."""
    del response.headers["Content-Type"]
    response.headers["Content-Type"] = content_type
    response.headers["Cache-Control"] = "no-store"


def _unauthorized(connection: ServerConnection, reason: str) -> Response:
    response = _json(connection, 401, {"error": reason})
    response.headers["WWW-Authenticate"] = 'Bearer realm="zeroclaw"'
    return response
