"""The stdio section of ``scripts/bench``: ``zeroclaw acp`` against ``echo_floor.py``.

Runs on the bench process's asyncio loop thread. Each measurement starts its
server fresh in its own temp dir (zeroclaw's ``--config-dir`` is in there, so
its store too), so that one measurement never warms or pollutes another.
ZEROCLAW_* variables are not passed to zeroclaw.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from bench_lib import (
    FLOOR_SCRIPT,
    BenchSizes,
    Goal,
    MetricSpec,
    Sample,
    measure_pair,
    new_session,
    prompt,
    run_turns,
    timed,
    turns_title,
)
from bench_rpc_lib import RpcFailure, RpcPeer

__all__ = ["run_stdio"]



@dataclass(frozen=True)
class StdioServer:
    """A server to measure: ``argv_for(workdir)`` gives its command line."""

    name: str
    argv_for: Callable[[Path], list[str]]
    env: dict[str, str] | None = None


def zeroclaw_acp(max_sessions: int) -> StdioServer:
    """``zeroclaw acp`` from this interpreter's environment (the checkout's .venv)."""
    executable = Path(sys.prefix) / "bin" / "zeroclaw"
    env = {k: v for k, v in os.environ.items() if not k.startswith("ZEROCLAW_")}

    def argv_for(workdir: Path) -> list[str]:
        return [str(executable), "acp", "--config-dir", str(workdir / "config"),
                "--max-sessions", str(max_sessions)]

    return StdioServer("zeroclaw", argv_for, env)


def floor_stdio() -> StdioServer:
    return StdioServer("floor", lambda _workdir: [sys.executable, str(FLOOR_SCRIPT)])


async def _initialized(server: StdioServer, workdir: Path) -> RpcPeer:
    peer = await RpcPeer.spawn(server.argv_for(workdir), workdir, server.env)
    try:
        await peer.request("initialize", {"protocolVersion": 1})
    except RpcFailure as error:
        await peer.close()
        raise RpcFailure(f"{error}; stderr: {peer.stderr_tail()}") from None
    return peer


@contextlib.asynccontextmanager
async def _started(server: StdioServer) -> AsyncIterator[tuple[RpcPeer, Path]]:
    """A fresh, initialized server in a fresh temp dir; closed on the way out."""
    with tempfile.TemporaryDirectory(prefix=f"zcb-{server.name}-") as temp:
        peer = await _initialized(server, Path(temp))
        try:
            yield peer, Path(temp)
        finally:
            await peer.close()


async def cold_start(sizes: BenchSizes, server: StdioServer) -> Sample:
    """Median milliseconds from spawning the server to its ``initialize`` answer."""
    durations = []
    with tempfile.TemporaryDirectory(prefix=f"zcb-{server.name}-") as temp:
        for _ in range(sizes.cold_starts):
            started = time.perf_counter()
            peer = await _initialized(server, Path(temp))
            durations.append((time.perf_counter() - started) * 1000)
            await peer.close()
    return Sample(statistics.median(durations), sizes.cold_starts)


async def initialize_rate(sizes: BenchSizes, server: StdioServer) -> Sample:
    """Sequential ``initialize`` round trips per second."""
    async with _started(server) as (peer, _workdir):
        def step() -> Awaitable[object]:
            return peer.request("initialize", {"protocolVersion": 1})

        await timed(20, step)
        return await timed(sizes.initializes, step, sizes.min_seconds)


async def session_new_rate(sizes: BenchSizes, server: StdioServer) -> Sample:
    """Sequential ``session/new`` per second (zeroclaw commits each row before answering)."""
    async with _started(server) as (peer, workdir):
        def step() -> Awaitable[object]:
            return new_session(peer, {"cwd": str(workdir)})

        await timed(5, step)
        return await timed(sizes.session_news, step, sizes.min_seconds)


async def turn_rate(sessions: int, sizes: BenchSizes, server: StdioServer) -> Sample:
    """Prompt turns per second with ``sessions`` sessions prompting at once on one pipe."""
    async with _started(server) as (peer, workdir):
        ids = [await new_session(peer, {"cwd": str(workdir)}) for _ in range(sessions)]
        pairs = [(peer, sid) for sid in ids]
        await asyncio.gather(*(prompt(peer, sid) for sid in ids))  # warm every session
        return await run_turns(pairs, sizes.turns_each, sizes.min_seconds)


StdioMeasure = Callable[[StdioServer], Awaitable[Sample]]


def _plan(sizes: BenchSizes) -> list[tuple[MetricSpec, StdioMeasure]]:
    turn_goals = {1: Goal(">=", 0.45), 8: Goal(">=", 0.45)}
    plan: list[tuple[MetricSpec, StdioMeasure]] = [
        (MetricSpec("stdio_cold_start", "stdio", "cold start to initialize answer", "ms",
                    "lower", Goal("<=", 1.6)), partial(cold_start, sizes)),
        (MetricSpec("stdio_initialize", "stdio", "initialize round trips", "req/s",
                    goal=Goal(">=", 0.9)), partial(initialize_rate, sizes)),
        (MetricSpec("stdio_session_new", "stdio", "session/new, sequential", "sessions/s",
                    goal=Goal(">=", 0.65)), partial(session_new_rate, sizes)),
    ]
    for count in sizes.concurrency:
        spec = MetricSpec(f"stdio_turns_{count}", "stdio", turns_title(count), "turns/s",
                          goal=turn_goals.get(count))
        plan.append((spec, partial(turn_rate, count, sizes)))
    return plan


async def run_stdio(sizes: BenchSizes) -> dict[str, dict[str, Any]]:
    """Every stdio metric, floor and zeroclaw in alternated rounds: the result entries."""
    zeroclaw = zeroclaw_acp(max_sessions=2 * max(sizes.concurrency))
    floor = floor_stdio()
    metrics = {}
    for spec, measure in _plan(sizes):
        metrics[spec.name] = await measure_pair(
            spec, partial(measure, floor), partial(measure, zeroclaw), sizes.rounds)
    return metrics
