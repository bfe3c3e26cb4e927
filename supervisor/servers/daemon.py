"""``zeroclaw daemon [--ephemeral]``: one shared host serving many clients on ``daemon.sock``.

Everything runs on the asyncio loop (main thread) except the host's actors and
workers. Start: raise the soft open-file limit to the hard one, claim the
socket (:mod:`supervisor.servers.daemon_socket`), listen (:mod:`ipc.listener`: out of
file descriptors, accepting pauses instead of spinning), start the host in the
background (``initialize`` is answered before it is up; other methods wait for
it). Stop, on SIGTERM/SIGINT/SIGHUP or when an ephemeral daemon is left alone:
stop accepting, cancel the running turns (persisted as cancelled) and let their
prompts answer, close the connections, stop workers and actors (queued writes
finish), remove the socket if it is still ours, exit 0.

``tenants/reload`` (on ``daemon.sock`` only, so only its owner can ask; ``zeroclaw
tenant add|remove`` does after editing ``config.toml``) re-reads the configuration's
``[tenants.*]`` and hands them to the gateway (:meth:`Gateway.reload_tenants`):
``{}`` → ``{tenants: N, revokedConnections: N}``; a configuration that cannot be
read is refused with -32602 and changes nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import signal
import ssl
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from ipc.errors import InvalidParams
from ipc.jsonrpc import Endpoint
from ipc.listener import ConnectionHandler, Listener, OpenFileGuard, raise_open_file_limit
from ipc.transports import DEFAULT_WRITE_HIGH_WATER, serve_stream
from ipc.version import __version__
from supervisor.config.config import Settings
from supervisor.config.protected import acp_socket_path
from supervisor.host.host_handle import HostHandle
from supervisor.ops.heap import keep_freed_buffers
from supervisor.servers.acp_server import AcpServer
from supervisor.servers.daemon_socket import (
    DaemonAlreadyRunning,
    SocketClaim,
    SocketUnusable,
    claim_socket,
    peer_credentials,
)
from supervisor.servers.rpc_server import RpcServer

if TYPE_CHECKING:
    from supervisor.servers.gateway import Gateway

__all__ = [
    "EPHEMERAL_GRACE_SECS",
    "STOP_SIGNALS",
    "WRITE_HIGH_WATER_ENV",
    "Lifetime",
    "acp_socket_path",
    "run_daemon",
    "write_high_water",
]

EndpointMaker = Callable[[Callable[[bytes], None], str], Endpoint]

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
"""Each stops the daemon cleanly (a hang-up of its terminal too)."""

log = logging.getLogger("zeroclaw.daemon")

EPHEMERAL_GRACE_SECS = 1.0
_DRAIN_SECS = 5.0
_CLOSE_SECS = 6.0
WRITE_HIGH_WATER_ENV = "ZEROCLAW_WRITE_HIGH_WATER"
"""Env var: unsent bytes per connection before a non-reading client is dropped."""


class Lifetime:
    """Counts connected clients; an ephemeral daemon stops ``grace`` s after the last leaves.

    It never stops before a first client has connected, and a client connecting
    within the grace period cancels the pending stop. ``stop`` is called (on the
    loop thread) when the daemon should stop.
    """

    def __init__(self, stop: Callable[[], None], *, ephemeral: bool,
                 grace: float = EPHEMERAL_GRACE_SECS) -> None:
        self.clients = 0
        self._stop = stop
        self._ephemeral = ephemeral
        self._grace = grace
        self._timer: asyncio.TimerHandle | None = None

    def connected(self) -> None:
        self.clients += 1
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
            log.info("client reconnected within the grace period: staying up")

    def disconnected(self) -> None:
        self.clients -= 1
        if self._ephemeral and self.clients == 0 and self._timer is None:
            loop = asyncio.get_running_loop()
            self._timer = loop.call_later(self._grace, self._expire)

    def _expire(self) -> None:
        self._timer = None
        if self.clients == 0:
            log.info("ephemeral daemon: last client left %.1f s ago, stopping", self._grace)
            self._stop()


def write_high_water(env: Mapping[str, str] | None = None) -> int:
    """The per-connection write high-water mark: ``ZEROCLAW_WRITE_HIGH_WATER`` or 64 MiB."""
    text = (os.environ if env is None else env).get(WRITE_HIGH_WATER_ENV, "").strip()
    if not text:
        return DEFAULT_WRITE_HIGH_WATER
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1024:
        log.warning("ignoring %s=%r (want an integer >= 1024)", WRITE_HIGH_WATER_ENV, text)
        return DEFAULT_WRITE_HIGH_WATER
    return value


class Daemon:
    """One daemon process: the listener, its connections and the host."""

    def __init__(self, settings: Settings, *, ephemeral: bool) -> None:
        self.settings = settings
        self.ephemeral = ephemeral
        self.stop = asyncio.Event()
        self.lifetime = Lifetime(self.begin_stop, ephemeral=ephemeral)
        self.host = HostHandle(settings)
        self.rpc = RpcServer(__version__, self.host.sessions, self.host.owners)
        self.acp = AcpServer(settings, __version__, self.host)
        self.write_high_water = write_high_water()
        self._connection_ids = itertools.count(1)
        self._connections: dict[asyncio.Task[None], tuple[asyncio.StreamWriter, list[Endpoint]]]
        self._connections = {}
        self._listeners: list[Listener] = []
        self.gateway = self._gateway() if settings.gateway and settings.gateway.listen else None
        self.rpc.methods["tenants/reload"] = self.reload_tenants
        self.config_tenants = settings.tenants  # as configured; minus the revoked ones

    def _gateway(self) -> Gateway:
        from supervisor.servers.gateway import Gateway

        def count(change: int) -> None:
            (self.lifetime.connected if change > 0 else self.lifetime.disconnected)()

        return Gateway(self.settings, self.acp, write_high_water=self.write_high_water,
                       on_connection=count)

    async def serve(self, claim: SocketClaim, acp_claim: SocketClaim) -> int:
        loop = asyncio.get_running_loop()
        guard = OpenFileGuard()  # shared by every accept loop, the gateway's too
        if self.gateway is not None:
            try:
                log.info("gateway listening on %s", await self.gateway.start(guard))
            except (OSError, ssl.SSLError) as exc:
                guard.close()
                log.error("zeroclaw daemon: the gateway cannot listen on %s: %s",
                          self.settings.gateway and self.settings.gateway.listen, exc)
                return 1
        for signum in STOP_SIGNALS:
            loop.add_signal_handler(signum, self._on_signal, signum)
        limit = self.settings.frame_limit + 1
        self._listeners = [
            Listener(claim.sock, self._handler("rpc", self.rpc.make_endpoint), limit=limit,
                     guard=guard),
            Listener(acp_claim.sock, self._handler("acp", self.acp.make_endpoint), limit=limit,
                     guard=guard),
        ]
        for listener in self._listeners:
            listener.start()
        log.info("zeroclaw daemon %s listening on %s and %s (pid %d%s)", __version__,
                 claim.path, acp_claim.path, os.getpid(), ", ephemeral" if self.ephemeral else "")
        starting = self.host.start()
        starting.add_done_callback(self._watch_revocations)
        stopping = asyncio.ensure_future(self.stop.wait())
        await asyncio.wait((starting, stopping), return_when=asyncio.FIRST_COMPLETED)
        code = 0
        if starting.done() and (starting.cancelled() or starting.exception() is not None):
            log.error("host failed to start: %r", None if starting.cancelled()
                      else starting.exception())
            code = 1
        else:
            await stopping
        stopping.cancel()
        await self._shutdown()
        guard.close()
        for signum in STOP_SIGNALS:
            loop.remove_signal_handler(signum)
        return code

    def reload_tenants(self, params: Any, endpoint: Endpoint) -> dict[str, Any]:
        """``tenants/reload`` (loop thread): see the module doc."""
        from supervisor.config.config import ConfigError, load_settings

        try:
            tenants = load_settings(str(self.settings.config_dir)).tenants
        except ConfigError as error:
            raise InvalidParams(f"configuration error: {error}") from None
        self.config_tenants = tenants
        count, revoked = self.apply_tenants()
        log.info("%s: tenants reloaded: %d tenant(s), %d connection(s) revoked",
                 endpoint.name, count, revoked)
        return {"tenants": count, "revokedConnections": revoked}

    def apply_tenants(self) -> tuple[int, int]:
        """Serve the configured tenants and, on a shared store, its shared tenants, but
        those revoked on any host (:mod:`supervisor.host.shared_store`); how many, and
        the connections closed."""
        sessions = self.host.started()
        watch = sessions.host.shared if sessions is not None else None
        tenants = watch.serving(self.config_tenants) if watch is not None \
            else self.config_tenants
        self.host.reload_tenants(tenants)
        revoked = self.gateway.reload_tenants(tenants) if self.gateway is not None else 0
        return len(tenants), revoked

    def _watch_revocations(self, starting: asyncio.Future[Any]) -> None:
        """Once the host is up: a tenant revoked on another host stops here too, and the
        shared tenants added, changed or removed on any host are served as such."""
        sessions = self.host.started()
        watch = sessions.host.shared if sessions is not None else None
        if watch is None:
            return

        def on_revoked() -> None:
            count, closed = self.apply_tenants()
            log.info("tenants revoked in the shared store: %d tenant(s) left, %d "
                     "connection(s) closed", count, closed)

        def on_tenants_changed() -> None:
            count, closed = self.apply_tenants()
            log.info("shared tenants changed in the store: %d tenant(s) served, %d "
                     "connection(s) closed", count, closed)

        watch.on_revoked = on_revoked
        watch.on_tenants_changed = on_tenants_changed
        if watch.revoked_ids or watch.revoked_hashes:
            on_revoked()
        if watch.shared_tenants:
            on_tenants_changed()

    def _on_signal(self, signum: int) -> None:
        log.info("received %s: stopping", signal.Signals(signum).name)
        self.begin_stop()

    def begin_stop(self) -> None:
        """Stop accepting at once (no connection is accepted only to be dropped),
        then let :meth:`serve` shut down."""
        for listener in self._listeners:
            listener.close()
        if self.gateway is not None:
            self.gateway.stop_accepting()
        self.stop.set()

    def _handler(self, kind: str, make: EndpointMaker) -> ConnectionHandler:
        """The connection callback of one listener (``rpc``: daemon.sock, ``acp``: acp.sock)."""

        async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await self._on_connect(kind, make, reader, writer)

        return on_connect

    async def _on_connect(self, kind: str, make: EndpointMaker, reader: asyncio.StreamReader,
                          writer: asyncio.StreamWriter) -> None:
        creds = peer_credentials(writer.get_extra_info("socket"))
        number = next(self._connection_ids)
        name = f"{kind}#{number}" + (f"(pid {creds[0]})" if creds else "")
        if creds:
            log.info("connection #%d from pid %d uid %d", number, creds[0], creds[1])
        else:
            log.info("connection #%d from an unknown peer", number)
        task = asyncio.current_task()
        assert task is not None
        endpoints: list[Endpoint] = []
        self._connections[task] = (writer, endpoints)
        self.lifetime.connected()

        def make_endpoint(send: Callable[[bytes], None]) -> Endpoint:
            endpoint = make(send, name)
            endpoints.append(endpoint)
            return endpoint

        try:
            await serve_stream(reader, writer, make_endpoint, frame_limit=self.settings.frame_limit,
                               write_high_water=self.write_high_water,
                               stall_timeout=self.settings.client_stall_timeout_secs,
                               partial_frame_timeout=self.settings.partial_frame_timeout_secs)
        except asyncio.CancelledError:
            log.debug("connection #%d cancelled", number)  # not re-raised: see serve_unix
        except Exception:
            log.exception("connection #%d failed", number)
        finally:
            self._connections.pop(task, None)
            self.lifetime.disconnected()
            log.info("connection #%d closed", number)

    async def _shutdown(self) -> None:
        self.begin_stop()  # also when the host failed to start; open connections go on
        sessions = await self.host.settled()
        self.rpc.drop_queued("the daemon is stopping")  # queued prompts start no turn
        if sessions is not None:
            sessions.host.turns.cancel_all()
            await sessions.host.turns.wait_all(timeout=10)
        endpoints = [e for _, eps in self._connections.values() for e in eps]
        endpoints += self.gateway.endpoints() if self.gateway is not None else []
        if endpoints:  # let in-flight requests (the cancelled prompts) answer
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(_DRAIN_SECS):
                    await asyncio.gather(*(e.drain() for e in endpoints))
        for writer, _ in list(self._connections.values()):
            writer.close()
        if self._connections:
            await asyncio.wait(list(self._connections), timeout=_CLOSE_SECS)
        if self.gateway is not None:
            await self.gateway.close()
        if sessions is not None:
            await sessions.host.stop()


async def _run(settings: Settings, ephemeral: bool) -> int:
    problem = _gateway_problem(settings)
    if problem is not None:
        log.error("zeroclaw daemon: %s", problem)
        return 2
    raise_open_file_limit()
    try:
        claim = claim_socket(settings.socket_path, private_dir=settings.data_dir)
    except (DaemonAlreadyRunning, SocketUnusable) as exc:
        log.error("zeroclaw daemon: %s", exc)
        return 1
    try:
        acp_claim = claim_socket(acp_socket_path(settings), private_dir=settings.data_dir)
    except (DaemonAlreadyRunning, SocketUnusable) as exc:
        claim.release()
        log.error("zeroclaw daemon: %s", exc)
        return 1
    try:
        return await Daemon(settings, ephemeral=ephemeral).serve(claim, acp_claim)
    finally:
        acp_claim.release()
        claim.release()


def _gateway_problem(settings: Settings) -> str | None:
    """Why the configured gateway must not start (plain HTTP off loopback), if it must not."""
    if settings.gateway is None or not settings.gateway.listen:
        return None
    from supervisor.config.gateway_config import exposure_problem

    return exposure_problem(settings.gateway)


def run_daemon(settings: Settings, *, ephemeral: bool = False) -> int:
    """Run the daemon until it is told to stop; the process exit code."""
    keep_freed_buffers()
    return asyncio.run(_run(settings, ephemeral))
