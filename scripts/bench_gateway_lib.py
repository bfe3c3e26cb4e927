"""The measurements of ``scripts/bench_gateway``: the daemon's gateway (``/acp`` over
WebSocket, ``/metrics`` over HTTP) against the same daemon's ``acp.sock``.

Runs on the bench process's asyncio loop thread; the blocking measurements (the HTTP
requests) hold the loop while they run. Each daemon is a :class:`load_lib.Daemon`
(fresh short temp config dir, no ZEROCLAW_* variables) with ``[gateway] listen`` on a
free loopback port and one admin tenant whose token only this process knows.

The "floor" of a rate is the same request over ``acp.sock`` of the same daemon, so
the ratio is what the WebSocket hop costs: ``initialize`` round trips (blocking
clients of the same weight on both sides; target >= 0.8x) and prompt turns with the
echo agent at 1 and 8 sessions (asyncio clients; target >= 0.8x). The ``initialize``
rounds also time, with the same clients and in the same alternated rounds, servers
that do only the transport's unavoidable work, so the report shows where the gap
lies: the line echo floor (``echo_floor.py``) over a Unix socket and over TCP
loopback (what TCP costs), the WebSocket floor (``ws_floor.py``: the library's
sans-I/O protocol on a plain asyncio Protocol; what the framing costs) and the same
answers from the library's asyncio server (what that layer costs); ``/acp`` is
shown against the WebSocket floor as well as acp.sock. Every rate carries the CPU
time per operation of the server (process tree) and of the client (this process).
On a second, fresh daemon: the host's RSS added by 256 idle ``/acp`` connections (target
<= 64 MiB; the floor: as many idle ``acp.sock`` connections), then ``/metrics`` p50/p99
with 1,000 live sessions (target p99 <= 20 ms; the floor: a 404 from the same
listener, i.e. the HTTP exchange without the metrics).
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import secrets
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any, cast

import orjson
import psutil
from bench_daemon_lib import MIB, floor_socket, settle
from bench_lib import (
    FLOOR_SCRIPT,
    BenchSizes,
    Goal,
    Measure,
    MetricSpec,
    Sample,
    best_of_rounds,
    measure_pair,
    new_session,
    progress,
    prompt,
    run_turns,
    timed,
    turns_title,
)
from bench_rpc_lib import NdjsonClient, RpcFailure, RpcPeer, percentile
from load_lib import Daemon, started_daemon
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

__all__ = ["run_gateway", "server_cpu_seconds"]

IDLE_CONNECTIONS = 256
METRICS_SESSIONS = 1000
HTTP_TIMEOUT = 30.0
WS_FLOOR_SCRIPT = Path(__file__).resolve().parent / "ws_floor.py"


class WsPeer(RpcPeer):
    """An :class:`RpcPeer` on the gateway's ``/acp``: one JSON-RPC message per text
    frame instead of one per line (the stream fields are unused)."""

    connection: ClientConnection

    @classmethod
    async def open(cls, url: str, token: str) -> WsPeer:
        peer = cls(cast(asyncio.StreamReader, None), cast(asyncio.StreamWriter, None))
        peer.connection = await connect(
            url, additional_headers={"Authorization": f"Bearer {token}"},
            max_size=None, open_timeout=HTTP_TIMEOUT)
        peer._started()
        return peer

    async def _send(self, frame: dict[str, Any]) -> None:
        try:
            await self.connection.send(orjson.dumps(frame).decode())
        except ConnectionClosed as error:
            raise RpcFailure(f"the gateway closed the connection: {error}") from None

    async def _read_frames(self) -> None:
        with contextlib.suppress(ConnectionClosed):
            async for message in self.connection:
                frame = orjson.loads(message)
                if isinstance(frame, dict):
                    await self._on_frame(frame)
        self._fail_pending("the gateway closed the connection")

    async def close(self, timeout: float = 10.0) -> None:
        await self.connection.close()
        if self._reader_task is not None:
            self._reader_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader_task


class GatewayDaemon:
    """A started daemon with its gateway: ``acp.sock``, ``ws://.../acp`` and the token."""

    def __init__(self, daemon: Daemon, port: int, token: str) -> None:
        self.daemon = daemon
        self.acp_socket = daemon.socket_path.parent / "acp.sock"
        self.port = port
        self.ws_url = f"ws://127.0.0.1:{port}/acp"
        self.token = token

    def wait_http(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.daemon.proc.poll() is not None:
                raise RuntimeError(f"the daemon exited\n{self.daemon.stderr()}")
            with contextlib.suppress(OSError), socket.create_connection(
                    ("127.0.0.1", self.port), timeout=1):
                return
            time.sleep(0.02)
        raise RuntimeError(f"the gateway is not listening\n{self.daemon.stderr()}")

    def get(self, path: str, token: bool = True) -> tuple[int, bytes]:
        """One ``GET`` on a new connection (the gateway answers HTTP, then closes)."""
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=HTTP_TIMEOUT)
        try:
            headers = {"Authorization": f"Bearer {self.token}"} if token else {}
            connection.request("GET", path, headers=headers)
            response = connection.getresponse()
            return response.status, response.read()
        finally:
            connection.close()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@contextlib.contextmanager
def gateway_daemon(max_sessions: int) -> Iterator[GatewayDaemon]:
    """A fresh daemon with the gateway on a free loopback port and one admin tenant."""
    import hashlib

    token = secrets.token_urlsafe(24)
    digest = hashlib.sha256(token.encode()).hexdigest()
    port = _free_port()
    extra = (f'[gateway]\nlisten = "127.0.0.1:{port}"\n'
             f'[tenants.bench]\ntoken_sha256 = "{digest}"\nadmin = true\n')
    with started_daemon(max_sessions, lambda: False, extra) as daemon:
        gateway = GatewayDaemon(daemon, port, token)
        gateway.wait_http()
        settle(daemon)
        yield gateway


# -- rates, in alternated rounds: acp.sock ("floor") and /acp ------------------------

Connect = Callable[[], Awaitable[RpcPeer]]


def _sides(gateway: GatewayDaemon) -> tuple[Connect, Connect]:
    return (partial(RpcPeer.connect, gateway.acp_socket),
            partial(WsPeer.open, gateway.ws_url, gateway.token))


class TcpNdjsonClient(NdjsonClient):
    """:class:`NdjsonClient` over TCP to 127.0.0.1 (the echo floor's ``--tcp``)."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=HTTP_TIMEOUT)
        self._buffer = bytearray()
        self._next_id = 0


class WsClient:
    """A blocking client on ``/acp`` with no thread and no loop: the library's sans-I/O
    protocol over a plain socket, as light as :class:`NdjsonClient` is on a socket.
    Requests one at a time; notifications are skipped."""

    def __init__(self, url: str, token: str) -> None:
        from websockets.client import ClientProtocol
        from websockets.uri import parse_uri

        uri = parse_uri(url)
        self.protocol = ClientProtocol(uri, max_size=None)
        self.sock = socket.create_connection((uri.host, uri.port), timeout=HTTP_TIMEOUT)
        request = self.protocol.connect()
        request.headers["Authorization"] = f"Bearer {token}"
        self.protocol.send_request(request)
        self._flush()
        while self.protocol.handshake_exc is None and not self.protocol.events_received():
            self._receive()
        if self.protocol.handshake_exc is not None:
            raise RpcFailure(f"handshake failed: {self.protocol.handshake_exc}")
        self._next_id = 0

    def _flush(self) -> None:
        for data in self.protocol.data_to_send():
            self.sock.sendall(data)

    def _receive(self) -> None:
        data = self.sock.recv(1 << 16)
        if not data:
            raise RpcFailure("the gateway closed the connection")
        self.protocol.receive_data(data)

    def request(self, method: str, params: Any = None) -> Any:
        from websockets.frames import Frame

        self._next_id += 1
        self.protocol.send_text(orjson.dumps(
            {"jsonrpc": "2.0", "id": self._next_id, "method": method, "params": params}))
        self._flush()
        while True:
            for event in self.protocol.events_received():
                if isinstance(event, Frame):
                    reply = orjson.loads(event.data)
                    if reply.get("id") == self._next_id and "method" not in reply:
                        if "error" in reply:
                            raise RpcFailure(f"{method}: {reply['error']}")
                        return reply.get("result")
            self._flush()  # pongs
            self._receive()

    def close(self) -> None:
        self.sock.close()


Blocking = NdjsonClient | WsClient


def _cpu_seconds(process: psutil.Process) -> float:
    times = process.cpu_times()
    return float(times.user + times.system)


def server_cpu_seconds(root: psutil.Process) -> tuple[float, float]:
    """CPU seconds used so far by ``root`` and its descendants, and by ``root`` alone."""
    own = _cpu_seconds(root)
    total = own
    for child in root.children(recursive=True):
        with contextlib.suppress(psutil.Error):
            total += _cpu_seconds(child)
    return total, own


async def with_cpu_split(server: psutil.Process, measure: Measure) -> Sample:
    """``measure``'s sample with the CPU time per operation, in µs, of the server
    (``server`` and its descendants; ``host``: ``server`` alone) and of the client
    (this process), from the kernel's per-process counters."""
    server_before, host_before = server_cpu_seconds(server)
    client_before = time.process_time()
    sample = await measure()
    client = time.process_time() - client_before
    server_after, host_after = server_cpu_seconds(server)
    per_operation = 1e6 / sample.count
    return replace(sample, details={
        **sample.details,
        "server_cpu_us": round((server_after - server_before) * per_operation, 1),
        "host_cpu_us": round((host_after - host_before) * per_operation, 1),
        "client_cpu_us": round(client * per_operation, 1)})


async def initialize_rate(sizes: BenchSizes, open_client: Callable[[], Blocking],
                          server: psutil.Process) -> Sample:
    """Sequential ``initialize`` round trips per second, blocking client, one connection,
    with the CPU split per round trip (see :func:`with_cpu_split`)."""
    client = open_client()
    try:
        async def step() -> object:
            return client.request("initialize", {"protocolVersion": 1})

        await timed(200, step)
        return await with_cpu_split(server, partial(
            timed, sizes.socket_initializes, step, sizes.min_seconds))
    finally:
        client.close()


@dataclass(frozen=True)
class ChildServer:
    """A floor server run as a child process on 127.0.0.1: its port and process."""

    port: int
    process: psutil.Process


@contextlib.contextmanager
def child_server(script: Path, *args: str) -> Iterator[ChildServer]:
    """``script *args PORT`` on a free port, as a child process, until the block ends."""
    port = _free_port()
    proc = subprocess.Popen([sys.executable, str(script), *args, str(port)],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
                break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{script.name} {' '.join(args)} did not start")
            time.sleep(0.02)
        yield ChildServer(port, psutil.Process(proc.pid))
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


@contextlib.asynccontextmanager
async def acp_sessions(open_peer: Connect, cwd: str,
                       count: int) -> AsyncIterator[list[tuple[RpcPeer, str]]]:
    """``count`` connections with one session each (closed, with the session, on exit)."""
    peers = [await open_peer() for _ in range(count)]
    try:
        for peer in peers:
            await peer.request("initialize", {"protocolVersion": 1})
        ids = [await new_session(peer, {"cwd": cwd, "mcpServers": []}) for peer in peers]
        yield list(zip(peers, ids, strict=True))
        await asyncio.gather(*(peer.request("session/close", {"sessionId": sid})
                               for peer, sid in zip(peers, ids, strict=True)))
    finally:
        await asyncio.gather(*(peer.close() for peer in peers))


async def turn_rate(sessions: int, sizes: BenchSizes, cwd: str, open_peer: Connect,
                    server: psutil.Process) -> Sample:
    """Prompt turns per second, ``sessions`` connections prompting their session at once,
    with the CPU split per turn (server: the host, its workers and their agents)."""
    async with acp_sessions(open_peer, cwd, sessions) as pairs:
        await asyncio.gather(*(prompt(peer, sid) for peer, sid in pairs))  # warm every session
        return await with_cpu_split(server, partial(
            run_turns, pairs, sizes.turns_each, sizes.min_seconds))


INITIALIZE_ROWS = (
    # name, title, zeroclaw side, floor side, design side
    ("gateway_transport_bound", "bound: line floor initialize, TCP vs Unix",
     "line floor, TCP", "line floor, Unix", None),
    ("gateway_ws_floor", "bound: WebSocket floor initialize vs line floor, TCP",
     "WebSocket floor", "line floor, TCP", None),
    ("gateway_ws_library", "bound: websockets asyncio server vs WebSocket floor",
     "websockets asyncio server", "WebSocket floor", None),
    ("gateway_initialize", "initialize round trips", "/acp", "acp.sock", "WebSocket floor"),
)
"""The rows built from one alternated run of every ``initialize`` side: the bounds of
the transport, then ``/acp`` against acp.sock (the target) and the WebSocket floor."""


async def _initialize_rates(sizes: BenchSizes, gateway: GatewayDaemon) -> dict[str, Any]:
    """``initialize`` round trips with the same blocking clients on every side, in the
    same alternated rounds: the line echo floor over a Unix socket and over TCP, the
    WebSocket floor (sans-I/O) and the same answers from the library's asyncio server,
    then the daemon's acp.sock and ``/acp``."""
    with contextlib.ExitStack() as stack:
        unix = stack.enter_context(floor_socket())
        tcp = stack.enter_context(child_server(FLOOR_SCRIPT, "--tcp"))
        ws = stack.enter_context(child_server(WS_FLOOR_SCRIPT))
        library = stack.enter_context(child_server(WS_FLOOR_SCRIPT, "--library"))
        host = gateway.daemon.process

        def ws_side(port: int) -> Callable[[], Blocking]:
            return partial(WsClient, f"ws://127.0.0.1:{port}/acp", gateway.token)

        clients: dict[str, tuple[Callable[[], Blocking], psutil.Process]] = {
            "line floor, Unix": (partial(NdjsonClient, unix.socket_path), unix.process),
            "line floor, TCP": (partial(TcpNdjsonClient, tcp.port), tcp.process),
            "WebSocket floor": (ws_side(ws.port), ws.process),
            "websockets asyncio server": (ws_side(library.port), library.process),
            "acp.sock": (partial(NdjsonClient, gateway.acp_socket), host),
            "/acp": (partial(WsClient, gateway.ws_url, gateway.token), host)}
        spec = MetricSpec("gateway_initialize", "gateway", "initialize round trips", "req/s")
        best = await best_of_rounds(spec, {
            side: partial(initialize_rate, sizes, open_client, server)
            for side, (open_client, server) in clients.items()}, sizes.rounds)
    metrics = {}
    for name, title, zeroclaw, floor, design in INITIALIZE_ROWS:
        goal = Goal(">=", 0.8) if name == "gateway_initialize" else None
        row = MetricSpec(name, "gateway", title, "req/s", goal=goal)
        metrics[name] = row.entry(best[zeroclaw], best[floor],
                                  best[design] if design else None)
    return metrics


async def _rates(sizes: BenchSizes, gateway: GatewayDaemon) -> dict[str, Any]:
    metrics = await _initialize_rates(sizes, gateway)
    floor, zeroclaw = _sides(gateway)
    cwd = str(gateway.daemon.config_dir)
    host = gateway.daemon.process
    for count in (1, 8):
        spec = MetricSpec(f"gateway_turns_{count}", "gateway", turns_title(count), "turns/s",
                          goal=Goal(">=", 0.8))
        metrics[spec.name] = await measure_pair(
            spec, partial(turn_rate, count, sizes, cwd, floor, host),
            partial(turn_rate, count, sizes, cwd, zeroclaw, host), sizes.rounds)
    return metrics


# -- idle connections and /metrics: a fresh daemon -------------------------------------

async def idle_rss(open_peer: Connect, gateway: GatewayDaemon) -> Sample:
    """MiB the host process grew by with :data:`IDLE_CONNECTIONS` initialized, idle
    connections open (closed again afterwards)."""
    process = gateway.daemon.process
    before = process.memory_info().rss
    peers: list[RpcPeer] = []
    try:
        for _ in range(IDLE_CONNECTIONS):  # one at a time: never past the listen backlog
            peers.append(await open_peer())
            await peers[-1].request("initialize", {"protocolVersion": 1})
        grown = process.memory_info().rss - before
    finally:
        await asyncio.gather(*(peer.close() for peer in peers))
    return Sample(grown / MIB, IDLE_CONNECTIONS,
                  details={"per_connection_kib": round(grown / IDLE_CONNECTIONS / 1024, 1)})


def open_live_sessions(gateway: GatewayDaemon, count: int) -> None:
    """``count`` idle sessions, opened one after another on daemon.sock (kept open)."""
    client = NdjsonClient(gateway.daemon.socket_path)
    try:
        client.request("initialize", {"protocolVersion": 1})
        for _ in range(count):
            client.request("session/new", {"keep_siblings": True})
        listed = client.request("status")["activeSessions"]
    finally:
        client.close()
    if listed != count:
        raise RuntimeError(f"status lists {listed} live sessions, not {count}")


async def http_latency(gateway: GatewayDaemon, path: str, expected: int, calls: int) -> Sample:
    """``GET path`` ``calls`` times, one after another: the p99 (and p50) in ms."""
    for _ in range(min(20, calls)):  # warm up
        gateway.get(path)
    samples = []
    for _ in range(calls):
        began = time.perf_counter()
        status, body = gateway.get(path)
        samples.append((time.perf_counter() - began) * 1000)
        if status != expected:
            raise RuntimeError(f"GET {path} answered {status}: {body[:200]!r}")
    p50, p99 = percentile(samples, 0.5), percentile(samples, 0.99)
    return Sample(p99, calls, p50, p99, {"bytes": len(body)})


async def _live(sizes: BenchSizes, gateway: GatewayDaemon) -> dict[str, Any]:
    floor, zeroclaw = _sides(gateway)
    idle = MetricSpec("gateway_idle_rss", "gateway",
                      f"host RSS added by {IDLE_CONNECTIONS} idle connections", "MiB", "lower",
                      Goal("<=", 64.0, of_ratio=False, unit="MiB"), has_ratio=False)
    # the WebSocket side first, on the fresh host: memory the other side freed would
    # otherwise be reused and hide part of its cost
    progress(f"{IDLE_CONNECTIONS} idle connections: /acp, then acp.sock")
    over_ws = await idle_rss(zeroclaw, gateway)
    over_socket = await idle_rss(floor, gateway)
    progress(f"{idle.title}: zeroclaw {over_ws.value:.1f} MiB, floor {over_socket.value:.1f} MiB")
    metrics = {idle.name: idle.entry(over_ws, over_socket)}
    progress(f"opening {METRICS_SESSIONS:,} live sessions")
    open_live_sessions(gateway, METRICS_SESSIONS)
    calls = sizes.status_calls // 2
    spec = MetricSpec("gateway_metrics", "gateway",
                      f"/metrics p99, {METRICS_SESSIONS:,} live sessions", "ms", "lower",
                      Goal("<=", 20.0, of_ratio=False, unit="ms"))
    metrics[spec.name] = await measure_pair(
        spec, partial(http_latency, gateway, "/no-such-page", 404, calls),
        partial(http_latency, gateway, "/metrics", 200, calls), sizes.rounds)
    return metrics


async def run_gateway(sizes: BenchSizes) -> dict[str, dict[str, Any]]:
    """Every gateway metric against acp.sock of the same daemon: the result entries."""
    progress("starting zeroclaw daemon with the gateway, for the rates")
    with gateway_daemon(64) as gateway:
        metrics = await _rates(sizes, gateway)
    progress("starting a fresh daemon for idle connections and /metrics")
    with gateway_daemon(METRICS_SESSIONS + 8) as gateway:
        metrics.update(await _live(sizes, gateway))
    return metrics
