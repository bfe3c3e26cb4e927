"""The daemon section of ``scripts/bench``: ``zeroclaw daemon`` on ``daemon.sock`` against
``echo_floor.py --unix``.

Runs on the bench process's asyncio loop thread; the blocking measurements
(initialize and ``status``) use :class:`NdjsonClient` and hold the loop while
they run; the live sessions are opened over several connections at once. The
daemons are :class:`load_lib.Daemon`s (fresh short temp config dirs, no
ZEROCLAW_* variables); the floor lives in its own short temp dir (a Unix socket
path must stay under 107 bytes).

Two daemons: the first serves the rates (initialize, turns, persisted turns);
the second, fresh one holds the live idle sessions, so their RSS is not mixed
with what the turns left behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import orjson
import psutil
from bench_lib import (
    FLOOR_SCRIPT,
    MEASUREMENT_ERRORS,
    BenchSizes,
    Goal,
    MetricSpec,
    Sample,
    measure_pair,
    new_session,
    progress,
    prompt,
    run_turns,
    timed,
    turns_title,
)
from bench_rpc_lib import NdjsonClient, RpcPeer, percentile, wait_listening
from load_lib import Daemon, started_daemon, stored_user_messages

__all__ = ["run_daemon"]

MIB = 1024 * 1024
SETTLE_SECS = 1.0


class FloorSocket:
    """``echo_floor.py --unix`` as a child process, in a short temp dir."""

    def __init__(self) -> None:
        self.workdir = Path(tempfile.mkdtemp(prefix="zcf", dir="/tmp"))
        self.socket_path = self.workdir / "floor.sock"
        self.proc = subprocess.Popen(
            [sys.executable, str(FLOOR_SCRIPT), "--unix", str(self.socket_path)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.process = psutil.Process(self.proc.pid)

    def wait_listening(self, timeout: float = 30.0) -> None:
        wait_listening(self.proc, self.socket_path, "the floor", timeout=timeout)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        shutil.rmtree(self.workdir, ignore_errors=True)


@contextlib.contextmanager
def floor_socket() -> Iterator[FloorSocket]:
    floor = FloorSocket()
    try:
        floor.wait_listening()
        yield floor
    finally:
        floor.stop()


def total_rss(root: psutil.Process) -> int:
    """RSS of ``root`` and all its descendants, in bytes."""
    total = 0
    for proc in [root, *root.children(recursive=True)]:
        with contextlib.suppress(psutil.Error):
            total += proc.memory_info().rss
    return total


def settle(daemon: Daemon) -> None:
    """Let a fresh daemon finish starting (host, store, worker imports) before timing it.

    The host starts in the background after the socket is up; its workers import
    for ~100 ms each, which on two cores would be measured as the daemon's cost.
    """
    client = NdjsonClient(daemon.socket_path)
    try:
        client.request("initialize", {"protocolVersion": 1})
        sid = client.request("session/new", {})["sessionId"]  # waits for a ready worker
        client.request("session/close", {"sessionId": sid})
    finally:
        client.close()
    time.sleep(SETTLE_SECS)  # the spare worker's start; a benchmark, not a test


# -- rates, in alternated rounds -----------------------------------------------------

async def initialize_rate(sizes: BenchSizes, path: Path) -> Sample:
    """Sequential ``initialize`` round trips per second, blocking client, one connection."""
    client = NdjsonClient(path)
    try:
        async def step() -> object:
            return client.request("initialize", {"protocolVersion": 1})

        await timed(200, step)
        return await timed(sizes.socket_initializes, step, sizes.min_seconds)
    finally:
        client.close()


@contextlib.asynccontextmanager
async def socket_sessions(path: Path,
                          count: int) -> AsyncIterator[list[tuple[RpcPeer, str]]]:
    """``count`` connections with one session each (closed, with the session, on exit)."""
    peers = [await RpcPeer.connect(path) for _ in range(count)]
    try:
        for peer in peers:
            await peer.request("initialize", {"protocolVersion": 1})
        ids = [await new_session(peer, {"keep_siblings": True}) for peer in peers]
        yield list(zip(peers, ids, strict=True))
        await asyncio.gather(*(peer.request("session/close", {"sessionId": sid})
                               for peer, sid in zip(peers, ids, strict=True)))
    finally:
        await asyncio.gather(*(peer.close() for peer in peers))


async def turn_rate(sessions: int, sizes: BenchSizes, path: Path) -> Sample:
    """Prompt turns per second, ``sessions`` connections prompting their session at once."""
    async with socket_sessions(path, sessions) as pairs:
        await asyncio.gather(*(prompt(peer, sid) for peer, sid in pairs))  # warm every session
        return await run_turns(pairs, sizes.turns_each, sizes.min_seconds)


async def persisted_rate(sizes: BenchSizes, path: Path, db_path: Path | None) -> Sample:
    """Turns found in the store per second of wall time, on fresh sessions at once.

    ``db_path`` None (the floor): nothing is stored, the rate is the answered turns.
    """
    async with socket_sessions(path, sizes.persist_sessions) as pairs:
        run = await run_turns(pairs, sizes.turns_each, sizes.min_seconds)
        if db_path is None:
            return run
        stored_rows = stored_user_messages(db_path, [sid for _peer, sid in pairs])
    stored = sum(len(texts) for texts in stored_rows.values())
    seconds = run.details["seconds"]
    return Sample(stored / seconds, run.count, run.p50_ms, run.p99_ms,
                  {"answered": run.count, "stored": stored, "seconds": seconds})


SocketMeasure = Callable[[Path], Awaitable[Sample]]


def _rate_plan(sizes: BenchSizes) -> list[tuple[MetricSpec, SocketMeasure]]:
    plan: list[tuple[MetricSpec, SocketMeasure]] = [
        (MetricSpec("daemon_initialize", "daemon", "initialize round trips", "req/s",
                    goal=Goal(">=", 0.8)), partial(initialize_rate, sizes)),
    ]
    for count in sizes.concurrency:
        plan.append((MetricSpec(f"daemon_turns_{count}", "daemon", turns_title(count),
                                "turns/s"), partial(turn_rate, count, sizes)))
    return plan


async def _rates(sizes: BenchSizes, floor: FloorSocket, daemon: Daemon) -> dict[str, Any]:
    metrics = {}
    for spec, measure in _rate_plan(sizes):
        metrics[spec.name] = await measure_pair(
            spec, partial(measure, floor.socket_path), partial(measure, daemon.socket_path),
            sizes.rounds)
    spec = MetricSpec(
        "daemon_persisted_turns", "daemon",
        f"persisted turns, {sizes.persist_sessions} sessions: store rows / wall s", "turns/s")
    metrics[spec.name] = await measure_pair(
        spec, partial(persisted_rate, sizes, floor.socket_path, None),
        partial(persisted_rate, sizes, daemon.socket_path, daemon.db_path), sizes.rounds)
    return metrics


# -- live idle sessions: one run each -------------------------------------------------

def _live_specs(sizes: BenchSizes) -> dict[str, MetricSpec]:
    sessions, connections = sizes.live_sessions, sizes.live_connections
    specs = [
        MetricSpec("daemon_session_new", "daemon",
                   f"session/new, {connections} connections at once, up to {sessions:,} live",
                   "sessions/s"),
        MetricSpec("daemon_status", "daemon",
                   f"status p50 to the whole answer, {sessions:,} live sessions", "ms",
                   "lower", Goal("<=", 5.0, of_ratio=False, unit="ms")),
        MetricSpec("daemon_rss_total", "daemon",
                   f"RSS host + workers, {sessions:,} idle sessions", "MiB", "lower",
                   Goal("<=", 400.0, of_ratio=False, unit="MiB"), has_ratio=False),
        MetricSpec("daemon_rss_per_session", "daemon",
                   f"RSS per idle session: growth / {sessions:,}", "KiB",
                   "lower", has_ratio=False),
    ]
    return {spec.name: spec for spec in specs}


def status_latencies(client: NdjsonClient,
                     calls: int) -> tuple[list[float], list[float], int | None]:
    """Per ``status`` call, the milliseconds until its whole answer is in and those
    the client then takes to decode it (with 10,000 sessions listed, a 2 MB line);
    the sessions the last one listed. ``client`` gets nothing else."""
    for _ in range(min(20, calls)):  # warm up
        client.request("status")
    answered, decoded, listed = [], [], None
    for _ in range(calls):
        started = time.perf_counter()
        line = client.call_unparsed("status")
        arrived = time.perf_counter()
        result = orjson.loads(line)["result"]
        answered.append((arrived - started) * 1000)
        decoded.append((time.perf_counter() - arrived) * 1000)
        listed = result.get("activeSessions")
    return answered, decoded, listed


@contextlib.asynccontextmanager
async def idle_sessions(path: Path, count: int, connections: int) -> AsyncIterator[float]:
    """Open ``count`` idle sessions over ``connections`` connections at once, each
    asking for its share one after another; yields the seconds it took. The
    connections (and their sessions) stay open until the block ends."""
    peers = [await RpcPeer.connect(path) for _ in range(connections)]
    shares = [count // connections + (n < count % connections) for n in range(connections)]

    async def open_share(peer: RpcPeer, share: int) -> None:
        for _ in range(share):
            await new_session(peer, {"keep_siblings": True})

    try:
        for peer in peers:
            await peer.request("initialize", {"protocolVersion": 1})
        started = time.perf_counter()
        await asyncio.gather(*(open_share(peer, share)
                               for peer, share in zip(peers, shares, strict=True)))
        yield time.perf_counter() - started
    finally:
        await asyncio.gather(*(peer.close() for peer in peers))


async def live_sessions(sizes: BenchSizes, path: Path,
                        root: psutil.Process) -> dict[str, Sample]:
    """Open ``live_sessions`` idle sessions (``live_connections`` at once), time
    ``status`` with all of them live, and weigh ``root`` and its children."""
    count = sizes.live_sessions
    rss_before = total_rss(root)
    client = NdjsonClient(path)
    try:
        client.request("initialize", {"protocolVersion": 1})
        async with idle_sessions(path, count, sizes.live_connections) as seconds:
            samples, decoded, listed = status_latencies(client, sizes.status_calls)
            rss_after = total_rss(root)
    finally:
        client.close()
    p50, p99 = percentile(samples, 0.5), percentile(samples, 0.99)
    return {
        "daemon_session_new": Sample(count / seconds, count, details={
            "seconds": round(seconds, 2), "connections": sizes.live_connections}),
        "daemon_status": Sample(p50, len(samples), p50, p99, {
            "listed": listed, "decode_p50_ms": round(percentile(decoded, 0.5), 2)}),
        "daemon_rss_total": Sample(rss_after / MIB, count, details={
            "processes": 1 + len(root.children(recursive=True))}),
        "daemon_rss_per_session": Sample((rss_after - rss_before) / count / 1024, count),
    }


async def _live_side(name: str, sizes: BenchSizes, path: Path,
                     root: psutil.Process) -> dict[str, Sample] | str:
    progress(f"{sizes.live_sessions:,} live sessions and status: {name} ...")
    try:
        samples = await live_sessions(sizes, path, root)
    except MEASUREMENT_ERRORS as error:
        progress(f"{sizes.live_sessions:,} live sessions and status: {name} failed: {error}")
        return f"{type(error).__name__}: {error}"
    status, opened = samples["daemon_status"], samples["daemon_session_new"]
    progress(f"{name}: {sizes.live_sessions:,} sessions opened in"
             f" {opened.details['seconds']:.1f} s ({opened.value:,.0f}/s), status p50"
             f" {status.p50_ms:.2f} ms p99 {status.p99_ms:.2f} ms (+ decoding it"
             f" {status.details['decode_p50_ms']:.2f} ms), RSS"
             f" {samples['daemon_rss_total'].value:.1f} MiB")
    return samples


async def _live_metrics(sizes: BenchSizes, floor: FloorSocket,
                        daemon: Daemon) -> dict[str, Any]:
    floor_run = await _live_side("floor", sizes, floor.socket_path, floor.process)
    zeroclaw_run = await _live_side("zeroclaw", sizes, daemon.socket_path, daemon.process)

    def side(run: dict[str, Sample] | str, name: str) -> Sample | str:
        return run if isinstance(run, str) else run[name]

    return {name: spec.entry(side(zeroclaw_run, name), side(floor_run, name))
            for name, spec in _live_specs(sizes).items()}


async def run_daemon(sizes: BenchSizes) -> dict[str, dict[str, Any]]:
    """Every daemon metric against the floor on a Unix socket: the result entries."""
    metrics: dict[str, dict[str, Any]] = {}
    with floor_socket() as floor:
        progress("starting zeroclaw daemon for the rates")
        rate_sessions = max(sizes.concurrency) + sizes.persist_sessions + 16
        with started_daemon(rate_sessions, lambda: False) as daemon:
            settle(daemon)
            metrics.update(await _rates(sizes, floor, daemon))
        progress(f"starting a fresh zeroclaw daemon for {sizes.live_sessions:,} live sessions")
        with started_daemon(sizes.live_sessions + 8, lambda: False) as daemon:
            settle(daemon)
            metrics.update(await _live_metrics(sizes, floor, daemon))
    return metrics
