"""Benchmark plumbing for ``scripts/bench_daemon``: servers, a blocking client, measurements.

Runs on the bench process's main thread (blocking sockets, no event loop). The
daemon and the floor (``scripts/echo_floor.py --unix``) are child processes
with their own short temp dirs (a Unix socket path must stay under 107 bytes).

Result format (the JSON line)::

    {"bench": "zeroclaw-daemon", "format": 1, "quick": bool, "python": "3.11.7",
     "cpus": 2, "started": "<ISO time>", "sessions": 1000,
     "metrics": {NAME: {"title", "unit", "value", "target", "ok", ...}}}
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
import psutil

__all__ = ["BenchSizes", "NdjsonClient", "Server", "format_table", "run_benchmarks"]

REPO = Path(__file__).resolve().parent.parent
ENTRY_POINT = "import sys; from supervisor.cli import main; sys.exit(main())"
TIMEOUT = 60.0
MIB = 1024 * 1024
ROUNDS = 3


def progress(message: str) -> None:
    print(f"bench_daemon: {message}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class BenchSizes:
    """How much work each measurement does."""

    initialize_round_trips: int = 5000
    live_sessions: int = 1000
    status_calls: int = 1000

    @classmethod
    def quick(cls) -> BenchSizes:
        return cls(initialize_round_trips=1000, live_sessions=1000, status_calls=200)


class NdjsonClient:
    """A blocking JSON-RPC client on a Unix socket; notifications go to
    :meth:`on_notification` (skipped here; subclasses may record them)."""

    def __init__(self, path: Path, timeout: float = TIMEOUT) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        self.sock.connect(str(path))
        self._buffer = b""
        self._next_id = 0

    def close(self) -> None:
        self.sock.close()

    def request(self, method: str, params: Any = None) -> Any:
        """The result; an error answer raises ``RuntimeError``."""
        reply = self.call(method, params)
        if "error" in reply:
            raise RuntimeError(f"{method}: {reply['error']}")
        return reply.get("result")

    def call(self, method: str, params: Any = None) -> dict[str, Any]:
        """The whole response frame (``result`` or ``error``)."""
        self._next_id += 1
        frame: dict[str, Any] = {"jsonrpc": "2.0", "id": self._next_id, "method": method}
        if params is not None:
            frame["params"] = params
        self.sock.sendall(orjson.dumps(frame) + b"\n")
        while True:
            reply = orjson.loads(self._read_line())
            if "method" in reply:
                self.on_notification(reply)
            elif reply.get("id") == self._next_id:
                return dict(reply)

    def on_notification(self, frame: dict[str, Any]) -> None:
        """A frame with a method that came while waiting for an answer."""

    def _read_line(self) -> bytes:
        while True:
            newline = self._buffer.find(b"\n")
            if newline >= 0:
                line, self._buffer = self._buffer[:newline], self._buffer[newline + 1:]
                return line
            chunk = self.sock.recv(1 << 16)
            if not chunk:
                raise ConnectionError("server closed the connection")
            self._buffer += chunk


class Server:
    """A server child process listening on ``socket_path``."""

    def __init__(self, name: str, argv: list[str], socket_path: Path, env: dict[str, str]):
        self.name = name
        self.socket_path = socket_path
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, env=env)

    def wait_listening(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited {self.proc.returncode}")
            with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX) as probe:
                probe.connect(str(self.socket_path))
                return
            time.sleep(0.02)
        raise RuntimeError(f"{self.name} not listening after {timeout} s")

    def total_rss(self) -> int:
        """RSS of the server and all its descendants, in bytes."""
        root = psutil.Process(self.proc.pid)
        total = 0
        for proc in [root, *root.children(recursive=True)]:
            with contextlib.suppress(psutil.Error):
                total += proc.memory_info().rss
        return total

    def process_count(self) -> int:
        return 1 + len(psutil.Process(self.proc.pid).children(recursive=True))

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        if self.proc.stderr is not None:
            self.proc.stderr.close()


def _clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ZEROCLAW_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    return env


@contextlib.contextmanager
def daemon_server(max_sessions: int) -> Iterator[Server]:
    config_dir = Path(tempfile.mkdtemp(prefix="zcb", dir="/tmp"))
    (config_dir / "config.toml").write_text(f"[acp]\nmax_sessions = {max_sessions}\n")
    argv = [sys.executable, "-c", ENTRY_POINT, "daemon", "--config-dir", str(config_dir),
            "--log-level", "warning"]
    server = Server("daemon", argv, config_dir / "data" / "daemon.sock", _clean_env())
    try:
        server.wait_listening()
        yield server
    finally:
        server.stop()
        shutil.rmtree(config_dir, ignore_errors=True)


@contextlib.contextmanager
def floor_server() -> Iterator[Server]:
    work = Path(tempfile.mkdtemp(prefix="zcf", dir="/tmp"))
    path = work / "floor.sock"
    argv = [sys.executable, str(REPO / "scripts" / "echo_floor.py"), "--unix", str(path)]
    server = Server("floor", argv, path, _clean_env())
    try:
        server.wait_listening()
        yield server
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)


def initialize_rate(server: Server, round_trips: int) -> float:
    """Sequential ``initialize`` round trips per second on one connection."""
    client = NdjsonClient(server.socket_path)
    try:
        params = {"protocolVersion": 1}
        for _ in range(min(200, round_trips)):  # warm up
            client.request("initialize", params)
        started = time.perf_counter()
        for _ in range(round_trips):
            client.request("initialize", params)
        return round_trips / (time.perf_counter() - started)
    finally:
        client.close()


def settle(server: Server, quiet_secs: float = 1.0) -> None:
    """Let a fresh daemon finish starting (host, store, worker imports) before timing it.

    The host starts in the background after the socket is up; its workers import
    for ~100 ms each, which on two cores would be measured as the daemon's cost.
    """
    client = NdjsonClient(server.socket_path)
    try:
        client.request("initialize", {"protocolVersion": 1})
        sid = client.request("session/new", {})["sessionId"]  # waits for a ready worker
        client.request("session/close", {"sessionId": sid})
    finally:
        client.close()
    time.sleep(quiet_secs)  # the spare worker's start; a benchmark, not a test


def open_sessions(server: Server, count: int) -> list[NdjsonClient]:
    """``count`` live idle sessions, spread over a few connections that stay open."""
    clients = [NdjsonClient(server.socket_path) for _ in range(8)]
    for client in clients:
        client.request("initialize", {"protocolVersion": 1})
    for index in range(count):
        clients[index % len(clients)].request("session/new", {"keep_siblings": True})
    return clients


def status_latencies(client: NdjsonClient, calls: int) -> tuple[list[float], int]:
    """Milliseconds per ``status`` call; the number of sessions the last one listed."""
    listed = 0
    for _ in range(min(20, calls)):  # warm up
        client.request("status")
    samples = []
    for _ in range(calls):
        started = time.perf_counter()
        result = client.request("status")
        samples.append((time.perf_counter() - started) * 1000)
        listed = result["activeSessions"]
    return samples, listed


def percentile(samples: list[float], fraction: float) -> float:
    if not samples:
        return float("nan")
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def _metric(title: str, unit: str, value: float, target: str, ok: bool,
            **extra: Any) -> dict[str, Any]:
    return {"title": title, "unit": unit, "value": round(value, 3), "target": target,
            "ok": ok, **extra}


def run_benchmarks(sizes: BenchSizes) -> dict[str, Any]:
    metrics: dict[str, dict[str, Any]] = {}
    with floor_server() as floor, daemon_server(sizes.live_sessions) as daemon:
        settle(daemon)
        floor_rates, daemon_rates = [], []
        for round_no in range(ROUNDS):  # alternated, best of each: less noise from the box
            progress(f"initialize round trips, round {round_no + 1}/{ROUNDS}")
            floor_rates.append(initialize_rate(floor, sizes.initialize_round_trips))
            daemon_rates.append(initialize_rate(daemon, sizes.initialize_round_trips))
        floor.stop()
        floor_rate, daemon_rate = max(floor_rates), max(daemon_rates)
        ratio = daemon_rate / floor_rate
        metrics["initialize_rate"] = _metric(
            "initialize round trips", "req/s", daemon_rate, ">= 0.8x floor", ratio >= 0.8,
            floor=round(floor_rate, 1), ratio=round(ratio, 3))
        progress(f"daemon: opening {sizes.live_sessions} idle sessions")
        started = time.perf_counter()
        clients = open_sessions(daemon, sizes.live_sessions)
        open_secs = time.perf_counter() - started
        try:
            progress(f"daemon: {sizes.status_calls} status calls")
            samples, listed = status_latencies(clients[0], sizes.status_calls)
            p50, p99 = percentile(samples, 0.5), percentile(samples, 0.99)
            metrics["status_p50"] = _metric(
                f"status p50, {listed} live sessions", "ms", p50, "<= 2 ms", p50 <= 2.0,
                p99=round(p99, 3), mean=round(statistics.fmean(samples), 3),
                sessions=listed)
            rss = daemon.total_rss() / MIB
            metrics["total_rss"] = _metric(
                f"RSS daemon + workers, {listed} idle sessions", "MiB", rss, "<= 300 MiB",
                rss <= 300, processes=daemon.process_count(), open_secs=round(open_secs, 2))
        finally:
            for client in clients:
                client.close()
    return {"bench": "zeroclaw-daemon", "format": 1,
            "python": ".".join(map(str, sys.version_info[:3])), "cpus": os.cpu_count(),
            "started": datetime.now(UTC).isoformat(timespec="seconds"),
            "sessions": sizes.live_sessions, "metrics": metrics}


def format_table(result: dict[str, Any]) -> str:
    rows = [("metric", "value", "target", "ok", "details")]
    for entry in result["metrics"].values():
        details = ", ".join(f"{k}={v}" for k, v in entry.items()
                            if k not in {"title", "unit", "value", "target", "ok"})
        rows.append((entry["title"], f"{entry['value']:.3f} {entry['unit']}", entry["target"],
                     "yes" if entry["ok"] else "NO", details))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
                     for row in rows)
