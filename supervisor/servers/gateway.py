"""The daemon's gateway: ACP over WebSocket for remote editors, and ops over HTTP.

Runs on the daemon's asyncio loop (the main thread). Each connection is a
:class:`~supervisor.servers.ws_transport.WsConnection`: the ``websockets`` library's
sans-I/O protocol (it parses and writes the HTTP and WebSocket wire) on a plain
asyncio ``Protocol``; this module routes its requests and makes its endpoint. The
module is imported only when the gateway is on. Routes, all ``GET``:

- ``/acp``: the ACP v1 dialect of ``acp.sock``, one JSON-RPC message per text frame,
  through the same :meth:`supervisor.servers.acp_server.AcpServer.make_endpoint` (handshake,
  envelope rules, ownership, out-of-band cancel, permission relay); the connection
  carries its tenant's :class:`~supervisor.host.tenants.TenantScope` and ``?agent=`` as its
  default agent. The token is checked before the upgrade (401 without a valid one).
- ``/health``: 200 or 503 with ``{"status", "reasons"}``; no token needed.
- ``/status``: the ``status`` JSON as the token's tenant may see it (an admin: all).
- ``/metrics``: Prometheus text format (:mod:`supervisor.ops.metrics`); admin token only.
- ``/``: the status page (:mod:`supervisor.servers.status_page`): static files, no token; its
  script reads ``/status`` with the token.

A token goes in ``Authorization: Bearer <token>``, as a ``Sec-WebSocket-Protocol``
entry ``zeroclaw.token.<token>`` (browsers cannot set headers; the server never echoes
it and selects ``acp`` when offered), or as ``?token=``. An address that sent
``auth_failures`` wrong tokens within ``auth_window_secs`` gets 429 until the window
passes; an IPv6 address counts as its ``/auth_ipv6_prefix`` network (64 by default:
one machine commonly holds a whole /64), an IPv4-mapped one as its IPv4 address.
Every HTTP answer carries ``X-Content-Type-Options: nosniff`` (a browser must not
take ``/status`` JSON or an error's text for a script or a page). The token never
reaches a log, an answer or ``status``.

Tenants can change while the daemon runs (:meth:`Gateway.reload_tenants`, asked for
by ``zeroclaw tenant add|remove`` through ``daemon.sock``): new tokens work at once,
and every ``/acp`` connection whose tenant was removed or whose token hash changed
is closed with 1008 "token revoked" (its running turns are cancelled and stored, as
for a client that went away); the other connections take their tenant's new limits.

The frame limit is ``acp.sock``'s rule: a message over ``acp.frame_limit`` is
answered -32600 and the connection goes on; it is never held whole in memory (see
:mod:`supervisor.servers.ws_transport`). Messages go without compression.

Connections are accepted by the daemon's own accept loop under its open-file guard
(:class:`ipc.listener.AdoptingListener`, shared with the Unix sockets): out of file
descriptors, accepting pauses with one warning instead of asyncio's storm of
tracebacks, and the process keeps a reserve for its workers and store. Each accepted
socket then gets its connection, with Nagle's algorithm off.

Backpressure, as on the Unix sockets: frames to a client that is behind queue in its
:class:`~supervisor.servers.ws_transport.Outbox`, which is also the connection's write
flow, so a running turn whose client is behind holds its updates and slows its own
agent (:mod:`supervisor.core.pacing`). A client that takes nothing for
``acp.client_stall_timeout_secs`` while behind, or whose queue passes the write
high-water mark (``ZEROCLAW_WRITE_HIGH_WATER``), is disconnected, so a stuck client
cannot grow the host's memory.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import ipaddress
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
from supervisor.config.gateway_config import GatewayConfig, tenant_caps
from supervisor.host.tenants import Tenancy, TenantScope, tenant_of_token
from supervisor.servers.status_page import PAGE_PATHS, page_response
from supervisor.servers.ws_transport import CLOSE_TIMEOUT, OPEN_TIMEOUT, Outbox, WsConnection

if TYPE_CHECKING:
    from websockets.http11 import Request, Response
    from websockets.server import ServerProtocol

    from ipc.jsonrpc import Endpoint
    from ipc.listener import OpenFileGuard
    from supervisor.config.config import Settings
    from supervisor.config.gateway_config import TenantConfig
    from supervisor.servers.acp_server import AcpServer

__all__ = ["TOKEN_SUBPROTOCOL_PREFIX", "AuthLimiter", "Gateway", "GatewayStats", "limiter_key"]

log = logging.getLogger("zeroclaw.gateway")

TOKEN_SUBPROTOCOL_PREFIX = "zeroclaw.token."
ACP_SUBPROTOCOL = "acp"
REVOKED_CLOSE = (1008, "token revoked")  # policy violation: the tenant or its token went
GOING_AWAY = 1001


@dataclass(slots=True)
class GatewayStats:
    """Figures for ``/metrics`` (loop thread): open ``/acp`` connections, and refused
    requests by reason (``missing``, ``invalid``, ``rate_limited``)."""

    connections: int = 0
    auth_failures: collections.Counter[str] = field(default_factory=collections.Counter)


def limiter_key(address: str, ipv6_prefix: int = 64) -> str:
    """What failed logins from ``address`` count under: an IPv4 address itself (an
    IPv4-mapped IPv6 one as its IPv4 address), an IPv6 address's ``/ipv6_prefix``
    network (one host commonly holds a whole /64, so counting single addresses
    would never slow it down); anything that is not an IP address as it is."""
    try:
        ip = ipaddress.ip_address(address.partition("%")[0])  # without a zone ("fe80::1%lo")
    except ValueError:
        return address
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((ip, ipv6_prefix), strict=False))
    return str(ip)


class AuthLimiter:
    """Failed logins per client in a sliding window; blocked at ``limit`` failures.

    A client is what :func:`limiter_key` makes of its address (an IPv6 one: its
    ``/ipv6_prefix`` network). Memory stays bounded by the clients that failed
    within one window: past ``_SWEEP_AT`` of them, every expired one is dropped."""

    _SWEEP_AT = 10_000

    def __init__(self, limit: int, window: float, clock: Callable[[], float] = time.monotonic,
                 *, ipv6_prefix: int = 64) -> None:
        self._limit = limit
        self._window = window
        self._clock = clock
        self._ipv6_prefix = ipv6_prefix
        self._failures: dict[str, collections.deque[float]] = {}

    def key(self, address: str) -> str:
        """The client ``address`` counts as (see :func:`limiter_key`)."""
        return limiter_key(address, self._ipv6_prefix)

    def _recent(self, key: str) -> collections.deque[float] | None:
        failures = self._failures.get(key)
        if failures is None:
            return None
        horizon = self._clock() - self._window
        while failures and failures[0] <= horizon:
            failures.popleft()
        if not failures:
            del self._failures[key]
            return None
        return failures

    def blocked(self, address: str) -> float:
        """Seconds until ``address`` (its client) may try again (0: it may now)."""
        failures = self._recent(self.key(address))
        if failures is None or len(failures) < self._limit:
            return 0.0
        return max(0.0, failures[0] + self._window - self._clock())

    def failed(self, address: str) -> None:
        if len(self._failures) >= self._SWEEP_AT:
            for known in list(self._failures):
                self._recent(known)
        key = self.key(address)
        self._recent(key)
        self._failures.setdefault(key, collections.deque()).append(self._clock())


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


def _select_subprotocol(protocol: ServerProtocol, offered: Any) -> Any:
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
        self.limiter = AuthLimiter(self.config.auth_failures, self.config.auth_window_secs,
                                   ipv6_prefix=self.config.auth_ipv6_prefix)
        self.url = ""
        self._on_connection = on_connection
        self._high_water = write_high_water
        self._listener: AdoptingListener | None = None
        self._tls: ssl.SSLContext | None = None
        self._connections: set[WsConnection] = set()
        self._stopping = False
        self._scopes: weakref.WeakKeyDictionary[WsConnection, TenantScope] = (
            weakref.WeakKeyDictionary())
        self._numbers: weakref.WeakKeyDictionary[WsConnection, int] = (
            weakref.WeakKeyDictionary())
        self._endpoints: dict[Endpoint, WsConnection] = {}
        self._counter = itertools.count(1)
        from supervisor.ops.metrics import MetricsPage

        self.metrics = MetricsPage(acp.host, self.stats)

    # --- lifecycle (loop thread) ----------------------------------------------------

    async def start(self, guard: OpenFileGuard) -> str:
        """Listen, accepting under ``guard``; the base URL (``http://host:port``, the
        real port when 0 was asked)."""
        config = self.config
        if config.tls_cert is not None and config.tls_key is not None:
            self._tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            self._tls.load_cert_chain(config.tls_cert, config.tls_key)
        listening = _listening_socket(config.host, config.port)
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
        """An accepted connection, served by a :class:`WsConnection` (TLS handshake
        first, when configured); ``on_closed`` once it has closed. Loop thread."""

        def connection() -> WsConnection:
            made = WsConnection(self, self.settings.frame_limit, lambda: closed(made),
                                select_subprotocol=_select_subprotocol,
                                logger=_library_logger())
            return made

        def closed(made: WsConnection) -> None:
            self._connections.discard(made)
            on_closed()

        await _connect_accepted(connection, conn, self._tls)

    def connected(self, connection: WsConnection) -> None:
        self._connections.add(connection)  # until its ``on_closed``

    def stop_accepting(self) -> None:
        """No new connection from now on, and no new ``/acp`` session on the open ones
        (503); those already upgraded go on until :meth:`close`."""
        self._stopping = True
        if self._listener is not None:
            self._listener.close()

    def endpoints(self) -> list[Endpoint]:
        return list(self._endpoints)

    def reload_tenants(self, tenants: Mapping[str, TenantConfig]) -> int:
        """Use ``tenants`` from now on; close the ``/acp`` connections whose tenant is
        gone or has another token (how many were closed). Loop thread."""
        self.tenants = tenants
        self._share_caps()
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
            connection.close(*REVOKED_CLOSE)
            revoked += 1
        if not tenants:
            log.warning("gateway: no tenants are configured any more, so no token is valid")
        return revoked

    def _share_caps(self) -> None:
        """Hand the tenants' ``max_sessions`` to the host's admission, which evicts within
        a tenant at its cap (the host started with those of its settings)."""
        caps = tenant_caps(self.tenants)

        def share(_: object = None) -> None:
            started = self.acp.host.started()
            if started is not None:
                started.host.live.tenant_caps = caps

        starting = self.acp.host.starting
        if starting is not None and not starting.done():
            starting.add_done_callback(share)  # in order: the last reload's caps win
        else:
            share()

    def _revoked(self, scope: TenantScope) -> bool:
        """The scope's tenant was removed, or its token or id replaced, since it was checked."""
        now = self.tenants.get(scope.name)
        return (now is None or now.token_sha256 != scope.tenant.token_sha256
                or now.id != scope.tenant.id)

    async def close(self, flush_timeout: float = 5.0) -> None:
        """Let every client take the frames queued for it (bounded), then close every
        connection (1001 going away) and the listener."""
        self.stop_accepting()
        flushing = [c.outbox.flushed() for c in self._connections if c.outbox is not None]
        if flushing:
            await asyncio.wait([asyncio.ensure_future(f) for f in flushing],
                               timeout=flush_timeout)
        connections = list(self._connections)
        for connection in connections:
            connection.close(GOING_AWAY)
        if connections:
            await asyncio.wait([asyncio.ensure_future(c.wait_closed()) for c in connections],
                               timeout=CLOSE_TIMEOUT)
        for connection in connections:
            connection.transport.abort()  # those that did not close in time

    # --- HTTP, before any upgrade -----------------------------------------------------

    async def route(self, connection: WsConnection, request: Request) -> Response | None:
        """The answer to an HTTP request; ``None`` to upgrade it (``/acp`` with a
        valid token)."""
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
        if self._stopping:  # accepted before the daemon began to stop; asked after
            return connection.respond(503, "Server is shutting down.\n")
        self._scopes[connection] = TenantScope(tenant, self.tenancy, agent)
        return None  # go on with the WebSocket handshake

    def _authenticate(self, connection: WsConnection,
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
                            self.config.auth_failures, self.limiter.key(address), blocked)
            else:
                log.info("gateway: invalid token from %s", address)
            return _unauthorized(connection, "invalid token"), None
        return None, tenant

    async def _health(self, connection: WsConnection) -> Response:
        from supervisor.ops.metrics import health

        ok, body = await health(self.acp.host)
        return _json(connection, 200 if ok else 503, body)

    async def _status(self, connection: WsConnection, tenant: TenantConfig) -> Response:
        from supervisor.ops.status import host_status

        try:
            sessions = await asyncio.wait_for(self.acp.host.sessions(), 10)
        except Exception:
            return _json(connection, 503, {"error": "the host is not running"})
        status = host_status(sessions, self.acp.host.owners)
        return _json(connection, 200,
                     TenantScope(tenant, self.tenancy).status_view(status, sessions))

    # --- /acp ---------------------------------------------------------------------

    def opened(self, connection: WsConnection) -> Endpoint | None:
        """The endpoint of an upgraded ``/acp`` connection (``None``: closed at once)."""
        scope = self._scopes.pop(connection, None)
        if scope is None:  # cannot happen: /acp is only upgraded after its check
            connection.close(1011)
            return None
        if self._revoked(scope):  # tenants were reloaded during the handshake
            connection.close(*REVOKED_CLOSE)
            return None
        number = self._numbers[connection] = next(self._counter)
        log.info("gateway connection #%d from %s: tenant %s", number, _address(connection),
                 scope.name)
        outbox = connection.outbox = Outbox(connection, self._high_water,
                                            self.settings.client_stall_timeout_secs)
        endpoint = self.acp.make_endpoint(outbox.put, f"gw#{number}({scope.name})")
        endpoint.state["scope"] = scope
        endpoint.state["flow"] = outbox  # paced turns wait for a slow client
        outbox.endpoint = endpoint
        self._endpoints[endpoint] = connection
        self.stats.connections += 1
        self._on_connection(1)
        return endpoint

    def closed(self, connection: WsConnection) -> None:
        """An ``/acp`` connection is gone: its prompts' turns are cancelled (and kept)."""
        endpoint = connection.endpoint
        assert endpoint is not None
        endpoint.close()
        self._endpoints.pop(endpoint, None)
        self.stats.connections -= 1
        self._on_connection(-1)
        log.info("gateway connection #%d closed", self._numbers.get(connection, 0))


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
        factory, conn, ssl=tls, ssl_handshake_timeout=OPEN_TIMEOUT if tls else None)


def _address(connection: WsConnection) -> str:
    remote = connection.remote_address
    return str(remote[0]) if isinstance(remote, tuple) and remote else "unknown"


def _json(connection: WsConnection, status: int, body: Any) -> Response:
    response = connection.respond(status, orjson.dumps(body).decode() + "\n")
    _set_type(response, "application/json")
    return response


def _set_type(response: Response, content_type: str) -> None:
    """The answer's type; and since every such answer is made for its request (a
    tenant's status, maybe asked with ``?token=``), no cache may keep it."""
    del response.headers["Content-Type"]
    response.headers["Content-Type"] = content_type
    response.headers["Cache-Control"] = "no-store"


def _unauthorized(connection: WsConnection, reason: str) -> Response:
    response = _json(connection, 401, {"error": reason})
    response.headers["WWW-Authenticate"] = 'Bearer realm="zeroclaw"'
    return response
