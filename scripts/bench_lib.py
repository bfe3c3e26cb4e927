"""Benchmark plumbing for ``scripts/bench``: a JSON-RPC client over a child's stdio,
the measurements, and the report.

Everything runs on the bench process's asyncio loop thread. A measured server is
started fresh (with its own temp dir) for every measurement, so one measurement
never warms or pollutes another. Progress goes to stderr; the caller prints the
report to stdout.

Result format (one JSON object, also written by ``--json-out``)::

    {"bench": "zeroclaw-acp", "format": 1, "quick": bool, "python": "3.11.7",
     "cpus": 2, "started": "<ISO time>",
     "metrics": {NAME: {"title", "unit", "count", "zeroclaw", "floor", "ratio",
                        "zeroclaw_error"?, "floor_error"?}}}

``zeroclaw`` and ``floor`` are rates in ``unit`` (higher is better); ``ratio`` is
zeroclaw / floor. Cold start also keeps the medians in ``*_ms``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

__all__ = [
    "BenchSizes",
    "RpcFailure",
    "RpcPeer",
    "Target",
    "compare_results",
    "format_table",
    "run_benchmarks",
]

FRAME_LIMIT = 32 * 1024 * 1024
REQUEST_TIMEOUT = 60.0
PROMPT_TEXT = "hello world"


class RpcFailure(Exception):
    """A request that failed: an error response, a timeout, or a dead server."""


def progress(message: str) -> None:
    print(f"bench: {message}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Target:
    """A server to measure: ``argv_for(workdir)`` gives its command line."""

    name: str
    argv_for: Callable[[Path], list[str]]
    env: dict[str, str] | None = None


@dataclass(frozen=True)
class BenchSizes:
    cold_starts: int = 10
    initializes: int = 2000
    session_news: int = 1000
    prompts: int = 500
    concurrent_sessions: int = 8
    concurrent_turns_each: int = 100
    min_seconds: float = 2.0  # every rate runs at least this long: fast peers get more steps

    @classmethod
    def quick(cls) -> BenchSizes:
        return cls(cold_starts=3, initializes=200, session_news=100, prompts=50,
                   concurrent_sessions=8, concurrent_turns_each=10, min_seconds=0.3)


@dataclass
class RpcPeer:
    """A server process spoken to with NDJSON JSON-RPC over its stdin/stdout."""

    process: asyncio.subprocess.Process
    stderr_path: Path
    notifications: int = 0
    unparsable: int = 0
    _pending: dict[int, asyncio.Future[Any]] = field(default_factory=dict)
    _ids: itertools.count[int] = field(default_factory=itertools.count)
    _reader: asyncio.Task[None] | None = None

    @classmethod
    async def spawn(cls, argv: list[str], workdir: Path, env: dict[str, str] | None) -> RpcPeer:
        stderr_path = workdir / "server-stderr.log"
        with stderr_path.open("wb") as stderr_file:
            process = await asyncio.create_subprocess_exec(
                *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                stderr=stderr_file, env=env, cwd=workdir, limit=FRAME_LIMIT,
            )
        peer = cls(process, stderr_path)
        peer._reader = asyncio.create_task(peer._read_frames())
        return peer

    async def request(self, method: str, params: dict[str, Any]) -> Any:
        """Send one request and return its result; raise RpcFailure otherwise."""
        request_id = next(self._ids)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = future
        frame = {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}
        try:
            await self._send(frame)
            return await asyncio.wait_for(future, REQUEST_TIMEOUT)
        except TimeoutError:
            raise RpcFailure(f"{method}: no answer in {REQUEST_TIMEOUT:.0f} s") from None
        finally:
            self._pending.pop(request_id, None)

    async def close(self, timeout: float = 10.0) -> None:
        """End the server: EOF on stdin, then SIGKILL if it lingers."""
        stdin = self.process.stdin
        if stdin is not None and not stdin.is_closing():
            stdin.close()
        try:
            await asyncio.wait_for(self.process.wait(), timeout)
        except TimeoutError:
            self.process.kill()
            await self.process.wait()
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader

    def stderr_tail(self, lines: int = 5) -> str:
        text = self.stderr_path.read_text(encoding="utf-8", errors="replace")
        return "\n".join(text.splitlines()[-lines:])

    async def _send(self, frame: dict[str, Any]) -> None:
        stdin = self.process.stdin
        if stdin is None or stdin.is_closing():
            raise RpcFailure("server stdin is closed")
        stdin.write(orjson.dumps(frame, option=orjson.OPT_APPEND_NEWLINE))
        try:
            await stdin.drain()
        except ConnectionError as error:
            raise RpcFailure(f"server went away: {error}") from None

    async def _read_frames(self) -> None:
        stdout = self.process.stdout
        assert stdout is not None
        while line := await stdout.readline():
            if not line.strip():
                continue
            try:
                frame = orjson.loads(line)
            except orjson.JSONDecodeError:
                self.unparsable += 1
                continue
            if isinstance(frame, dict):
                await self._on_frame(frame)
        self._fail_pending(f"server exited (code {await self.process.wait()})")

    async def _on_frame(self, frame: dict[str, Any]) -> None:
        if "method" in frame:
            if "id" in frame:  # the server asks us something: decline politely
                await self._answer_server_request(frame)
            else:
                self.notifications += 1
            return
        future = self._pending.get(frame.get("id", -1))
        if future is None or future.done():
            return
        if "error" in frame:
            future.set_exception(RpcFailure(f"error {frame['error']}"))
        else:
            future.set_result(frame.get("result"))

    async def _answer_server_request(self, frame: dict[str, Any]) -> None:
        reply: dict[str, Any] = {"jsonrpc": "2.0", "id": frame["id"]}
        if frame["method"] == "session/request_permission":
            reply["result"] = {"outcome": {"outcome": "cancelled"}}
        else:
            reply["error"] = {"code": -32601, "message": f"Method not found: {frame['method']}"}
        with contextlib.suppress(RpcFailure):
            await self._send(reply)

    def _fail_pending(self, reason: str) -> None:
        for future in self._pending.values():
            if not future.done():
                future.set_exception(RpcFailure(reason))


# -- measurements ---------------------------------------------------------------

Measure = Callable[[Target, Path, BenchSizes], Awaitable[tuple[float, int]]]


async def _initialized(target: Target, workdir: Path) -> RpcPeer:
    peer = await RpcPeer.spawn(target.argv_for(workdir), workdir, target.env)
    try:
        await peer.request("initialize", {"protocolVersion": 1})
    except RpcFailure as error:
        await peer.close()
        raise RpcFailure(f"{error}; stderr: {peer.stderr_tail()}") from None
    return peer


async def _new_session(peer: RpcPeer, workdir: Path) -> str:
    result = await peer.request("session/new", {"cwd": str(workdir)})
    if not isinstance(result, dict) or not isinstance(result.get("sessionId"), str):
        raise RpcFailure(f"session/new returned no sessionId: {result!r}")
    return result["sessionId"]


async def _prompt(peer: RpcPeer, session_id: str) -> None:
    result = await peer.request("session/prompt", {"sessionId": session_id, "prompt": PROMPT_TEXT})
    if not isinstance(result, dict) or result.get("stopReason") != "end_turn":
        raise RpcFailure(f"session/prompt did not end its turn: {result!r}")


async def measure_cold_start(
    target: Target, workdir: Path, sizes: BenchSizes
) -> tuple[float, int]:
    """Median seconds from spawn to the initialize answer, as starts per second."""
    durations = []
    for _ in range(sizes.cold_starts):
        started = time.perf_counter()
        peer = await _initialized(target, workdir)
        durations.append(time.perf_counter() - started)
        await peer.close()
    return 1.0 / statistics.median(durations), sizes.cold_starts


async def _timed(
    count: int, step: Callable[[], Awaitable[object]], min_seconds: float = 0.0
) -> tuple[float, int]:
    """Run ``step`` at least ``count`` times and for at least ``min_seconds``: (rate, steps)."""
    started = time.perf_counter()
    done = 0
    while done < count or time.perf_counter() - started < min_seconds:
        for _ in range(count):
            await step()
        done += count
    return done / (time.perf_counter() - started), done


async def measure_initialize(
    target: Target, workdir: Path, sizes: BenchSizes
) -> tuple[float, int]:
    peer = await _initialized(target, workdir)
    try:
        def step() -> Awaitable[object]:
            return peer.request("initialize", {"protocolVersion": 1})

        await _timed(20, step)
        return await _timed(sizes.initializes, step, sizes.min_seconds)
    finally:
        await peer.close()


async def measure_session_new(
    target: Target, workdir: Path, sizes: BenchSizes
) -> tuple[float, int]:
    peer = await _initialized(target, workdir)
    try:
        def step() -> Awaitable[object]:
            return _new_session(peer, workdir)

        await _timed(5, step)
        return await _timed(sizes.session_news, step, sizes.min_seconds)
    finally:
        await peer.close()


async def measure_prompts(
    target: Target, workdir: Path, sizes: BenchSizes
) -> tuple[float, int]:
    peer = await _initialized(target, workdir)
    try:
        session_id = await _new_session(peer, workdir)

        def step() -> Awaitable[object]:
            return _prompt(peer, session_id)

        await _timed(5, step)
        return await _timed(sizes.prompts, step, sizes.min_seconds)
    finally:
        await peer.close()


async def measure_concurrent(
    target: Target, workdir: Path, sizes: BenchSizes
) -> tuple[float, int]:
    peer = await _initialized(target, workdir)
    try:
        sessions = [await _new_session(peer, workdir) for _ in range(sizes.concurrent_sessions)]
        await asyncio.gather(*(_prompt(peer, sid) for sid in sessions))  # warm every session

        started = time.perf_counter()

        async def prompt_loop(session_id: str) -> int:
            done = 0
            while (done < sizes.concurrent_turns_each
                   or time.perf_counter() - started < sizes.min_seconds):
                await _prompt(peer, session_id)
                done += 1
            return done

        counts = await asyncio.gather(*(prompt_loop(sid) for sid in sessions))
        return sum(counts) / (time.perf_counter() - started), sum(counts)
    finally:
        await peer.close()


@dataclass(frozen=True)
class MetricSpec:
    name: str
    title: str
    unit: str
    measure: Measure


METRICS = (
    MetricSpec("cold_start", "cold start to initialize answer", "starts/s", measure_cold_start),
    MetricSpec("initialize", "initialize round trips", "req/s", measure_initialize),
    MetricSpec("session_new", "session/new, sequential", "sessions/s", measure_session_new),
    MetricSpec("prompt", "prompt turns, 1 session", "turns/s", measure_prompts),
    MetricSpec("concurrent", "prompt turns, concurrent sessions", "turns/s", measure_concurrent),
)


async def _measure_one(spec: MetricSpec, target: Target, sizes: BenchSizes) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix=f"zc-bench-{target.name}-") as temp:
        workdir = Path(temp)
        progress(f"{spec.name} on {target.name} ...")
        try:
            rate, count = await spec.measure(target, workdir, sizes)
        except (RpcFailure, OSError) as error:
            progress(f"{spec.name} on {target.name} failed: {error}")
            return {"error": str(error)}
        progress(f"{spec.name} on {target.name}: {rate:,.1f} {spec.unit} ({count} ops)")
        return {"rate": rate, "count": count}


async def run_benchmarks(zeroclaw: Target, floor: Target, sizes: BenchSizes) -> dict[str, Any]:
    """Measure every metric on the floor, then on zeroclaw; return the result object."""
    metrics: dict[str, Any] = {}
    for spec in METRICS:
        floor_run = await _measure_one(spec, floor, sizes)
        zeroclaw_run = await _measure_one(spec, zeroclaw, sizes)
        metrics[spec.name] = _metric_entry(spec, zeroclaw_run, floor_run)
    return {
        "bench": "zeroclaw-acp",
        "format": 1,
        "python": sys.version.split()[0],
        "cpus": os.cpu_count(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "metrics": metrics,
    }


def _metric_entry(
    spec: MetricSpec, zeroclaw: dict[str, Any], floor: dict[str, Any]
) -> dict[str, Any]:
    entry: dict[str, Any] = {"title": spec.title, "unit": spec.unit,
                             "count": zeroclaw.get("count", floor.get("count"))}
    for side, run in (("zeroclaw", zeroclaw), ("floor", floor)):
        entry[side] = run.get("rate")
        if "error" in run:
            entry[f"{side}_error"] = run["error"]
        if spec.name == "cold_start" and run.get("rate"):
            entry[f"{side}_ms"] = 1000.0 / run["rate"]
    if entry["zeroclaw"] and entry["floor"]:
        entry["ratio"] = entry["zeroclaw"] / entry["floor"]
    else:
        entry["ratio"] = None
    return entry


# -- reports --------------------------------------------------------------------

def _rate_cell(entry: dict[str, Any], side: str) -> str:
    rate = entry.get(side)
    if rate is None:
        return "failed"
    cell = f"{rate:,.1f}/s"
    if f"{side}_ms" in entry:
        cell += f" ({entry[f'{side}_ms']:.0f} ms)"
    return cell


def format_table(result: dict[str, Any]) -> str:
    """The human table: one row per metric, rates and the ratio to the floor."""
    rows = [("metric", "unit", "zeroclaw", "floor", "vs floor")]
    for entry in result["metrics"].values():
        ratio = entry.get("ratio")
        rows.append((
            f"{entry['title']} (n={entry.get('count')})", entry["unit"],
            _rate_cell(entry, "zeroclaw"), _rate_cell(entry, "floor"),
            f"{ratio:.1%}" if ratio is not None else "-",
        ))
    widths = [max(len(row[i]) for row in rows) for i in range(5)]
    lines = [
        "  ".join(cell.ljust(w) if i < 2 else cell.rjust(w)
                  for i, (cell, w) in enumerate(zip(row, widths, strict=True)))
        for row in rows
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    errors = [f"  {name}: {side} failed: {entry[f'{side}_error']}"
              for name, entry in result["metrics"].items()
              for side in ("zeroclaw", "floor") if f"{side}_error" in entry]
    return "\n".join(lines + (["", "errors:", *errors] if errors else []))


def compare_results(before: dict[str, Any], after: dict[str, Any]) -> str:
    """A table of the zeroclaw rate change (and ratio change) between two results."""
    rows = [("metric", "unit", "before", "after", "change", "vs floor before -> after")]
    for name, new in after["metrics"].items():
        old = before["metrics"].get(name, {})
        old_rate, new_rate = old.get("zeroclaw"), new.get("zeroclaw")
        change = f"{new_rate / old_rate - 1:+.1%}" if old_rate and new_rate else "-"
        ratios = " -> ".join(f"{r:.1%}" if r is not None else "-"
                             for r in (old.get("ratio"), new.get("ratio")))
        rows.append((new.get("title", name), new.get("unit", ""),
                     f"{old_rate:,.1f}" if old_rate else "-",
                     f"{new_rate:,.1f}" if new_rate else "-", change, ratios))
    widths = [max(len(row[i]) for row in rows) for i in range(6)]
    lines = ["  ".join(cell.ljust(w) if i < 2 else cell.rjust(w)
                       for i, (cell, w) in enumerate(zip(row, widths, strict=True)))
             for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
