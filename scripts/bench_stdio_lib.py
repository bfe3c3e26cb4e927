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
    DESIGN_FLOOR_SCRIPT,
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
from bench_wakeups_lib import wakeups_per_step

__all__ = ["run_stdio"]

STREAM_CHUNKS = 2000  # words of the streaming prompt: one agent_message_chunk each


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


def design_floor_stdio() -> StdioServer:
    return StdioServer("design", lambda workdir: [
        sys.executable, str(DESIGN_FLOOR_SCRIPT), "--db", str(workdir / "design-floor.db")])


def card_floor_stdio(max_sessions: int) -> StdioServer:
    """The design floor with the card's session and persistence actors (``--card``),
    holding as many live sessions as zeroclaw does."""
    return StdioServer("card", lambda workdir: [
        sys.executable, str(DESIGN_FLOOR_SCRIPT), "--card", "--max-sessions", str(max_sessions),
        "--db", str(workdir / "card-floor.db")])


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


async def stream_rate(sizes: BenchSizes, server: StdioServer) -> Sample:
    """Chunks per second at the client for turns that stream :data:`STREAM_CHUNKS`
    ``agent_message_chunk`` updates each (the echo agent echoes word by word). A
    server may merge chunks into fewer updates for a client that lags; the text is
    what counts (checked in the answer), and ``updates_per_turn`` says how many came."""
    text = " ".join(["w"] * STREAM_CHUNKS)
    async with _started(server) as (peer, workdir):
        sid = await new_session(peer, {"cwd": str(workdir)})

        async def step() -> None:
            result = await peer.request("session/prompt", {"sessionId": sid, "prompt": text})
            if not isinstance(result, dict) or result.get("content") != text:
                raise RpcFailure(f"streaming turn did not echo its prompt: {result!r:.200}")

        await step()  # warm
        seen = peer.notifications
        sample = await timed(2, step, sizes.min_seconds)
        updates = (peer.notifications - seen) / sample.count
        return Sample(sample.value * STREAM_CHUNKS, sample.count,
                      details={"updates_per_turn": round(updates, 1)})


async def turn_wakeups(sizes: BenchSizes, server: StdioServer) -> Sample:
    """Thread wake-ups per sequential turn in the server and its child processes
    (voluntary context switches, idle rate subtracted: see :mod:`bench_wakeups_lib`)."""
    async with _started(server) as (peer, workdir):
        sid = await new_session(peer, {"cwd": str(workdir)})
        for _ in range(20):
            await prompt(peer, sid)
        assert peer.process is not None
        count, details = await wakeups_per_step(
            peer.process.pid, partial(prompt, peer, sid), sizes.wakeup_turns,
            sizes.wakeup_idle_seconds)
        return Sample(round(count, 2), sizes.wakeup_turns, details=details)


StdioMeasure = Callable[[StdioServer], Awaitable[Sample]]


def _plan(sizes: BenchSizes) -> list[tuple[MetricSpec, StdioMeasure, bool]]:
    """(metric, measurement, whether the design floor is measured too). Targets: issue 11
    (turns and session/new against the design floor, streaming against the echo floor)."""
    turn_goals = {1: Goal(">=", 0.25)}
    plan: list[tuple[MetricSpec, StdioMeasure, bool]] = [
        (MetricSpec("stdio_cold_start", "stdio", "cold start to initialize answer", "ms",
                    "lower", Goal("<=", 1.6)), partial(cold_start, sizes), False),
        (MetricSpec("stdio_initialize", "stdio", "initialize round trips", "req/s",
                    goal=Goal(">=", 0.9)), partial(initialize_rate, sizes), False),
        (MetricSpec("stdio_session_new", "stdio", "session/new, sequential", "sessions/s",
                    design_goal=Goal(">=", 0.7)), partial(session_new_rate, sizes), True),
    ]
    for count in sizes.concurrency:
        spec = MetricSpec(f"stdio_turns_{count}", "stdio", turns_title(count), "turns/s",
                          goal=turn_goals.get(count), design_goal=Goal(">=", 0.7))
        plan.append((spec, partial(turn_rate, count, sizes), True))
    plan.append((MetricSpec("stdio_stream_chunks", "stdio",
                            f"one turn streaming {STREAM_CHUNKS:,} chunks", "chunks/s",
                            goal=Goal(">=", 0.5)), partial(stream_rate, sizes), True))
    plan.append((MetricSpec("stdio_turn_wakeups", "stdio", "wake-ups per sequential turn",
                            "wake-ups", "lower", has_ratio=False),
                 partial(turn_wakeups, sizes), True))
    return plan


async def run_stdio(sizes: BenchSizes) -> dict[str, dict[str, Any]]:
    """Every stdio metric, floor(s) and zeroclaw in alternated rounds: the result entries."""
    max_sessions = 2 * max(sizes.concurrency)
    zeroclaw = zeroclaw_acp(max_sessions)
    floor, design, card = floor_stdio(), design_floor_stdio(), card_floor_stdio(max_sessions)
    metrics = {}
    for spec, measure, on_design in _plan(sizes):
        metrics[spec.name] = await measure_pair(
            spec, partial(measure, floor), partial(measure, zeroclaw), sizes.rounds,
            partial(measure, design) if on_design else None,
            partial(measure, card) if on_design else None)
    return metrics
