"""The measurements of ``scripts/bench_model``: zeroclaw's own agent (``provider =
"openai"``) on a local streaming model API (``bench_model_server.py``, its own process).

Runs on the bench process's asyncio loop thread.

- **First chunk, 64 sessions streaming at once.** The server stamps the write that
  carries a response's first byte with ``time.monotonic()`` and puts the stamp in the
  first delta's text (see the server's docstring). The "zeroclaw" side is ``zeroclaw
  acp`` with 64 sessions prompting turn after turn, the bench reading its stdout: a
  turn's latency is the bench's ``time.monotonic()`` when the turn's first
  ``agent_message_chunk`` arrives minus the stamp. The "floor" is a bare
  ``httpx.AsyncClient`` in the bench process making the same 64 streams of requests to
  the same server, timed the same way when it has parsed the first delta. Targets:
  zeroclaw's p50 within :data:`P50_SLACK_MS`, its p99 within :data:`P99_SLACK_MS`.
  Both sides follow the same schedule: each session starts at a random point within
  one turn's length (seeded), then prompts back to back.
- **Chunks relayed per second.** One session, turns of :data:`RELAY_CHUNKS` deltas the
  server writes as fast as the connection takes them, through zeroclaw; the floor is
  ``echo_floor.py`` (stdio) writing the same number of ``agent_message_chunk``
  notifications for a prompt of that many words. Chunks are counted by their text
  (zeroclaw merges the deltas of a reader that is behind), target >= 0.5x.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, cast

import orjson
import psutil
from bench_gateway_lib import server_cpu_seconds
from bench_lib import FLOOR_SCRIPT, BenchSizes, Goal, MetricSpec, Sample, measure_pair, progress
from bench_rpc_lib import RpcFailure, RpcPeer, percentile

__all__ = ["ModelServerProcess", "run_model"]

SESSIONS = 64
FIRST_DELTAS, FIRST_GAP_MS = 40, 25.0  # a turn: 40 deltas 25 ms apart (about 1 s)
FIRST_TURNS_EACH = 5  # measured turns per session and round, after one warm-up turn
RELAY_CHUNKS = 20000
P50_SLACK_MS, P99_SLACK_MS = 2.0, 5.0
SEED = 20261203
_SCRIPTS = Path(__file__).resolve().parent
SERVER_SCRIPT = _SCRIPTS / "bench_model_server.py"


class ModelServerProcess:
    """``bench_model_server.py`` as a child process; ``url`` is its ``/v1`` base."""

    def __init__(self, process: asyncio.subprocess.Process, port: int) -> None:
        self.process = process
        self.url = f"http://127.0.0.1:{port}/v1"

    @classmethod
    @contextlib.asynccontextmanager
    async def running(cls) -> AsyncIterator[ModelServerProcess]:
        process = await asyncio.create_subprocess_exec(
            sys.executable, str(SERVER_SCRIPT), stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE)
        assert process.stdout is not None and process.stdin is not None
        try:
            line = await asyncio.wait_for(process.stdout.readline(), 30)
            if not line.startswith(b"port "):
                raise RuntimeError(f"the model server did not start: {line!r}")
            yield cls(process, int(line.split()[1]))
        finally:
            process.stdin.close()
            try:
                await asyncio.wait_for(process.wait(), 10)
            except TimeoutError:
                process.kill()
                await process.wait()


def stamp_latency_ms(text: str, now: float) -> float | None:
    """Milliseconds since the server's stamp at the start of ``text`` (``@<t> ...``)."""
    if not text.startswith("@"):
        return None
    return (now - float(text[1:].split(" ", 1)[0])) * 1000


# -- the floor: a bare httpx client ---------------------------------------------------

def _httpx_turn(client: Any, url: str, body: bytes) -> float:
    """One streamed request (blocking, on a pool thread); milliseconds from the server's
    stamp to the client having the first delta parsed."""
    latency = None
    with client.stream("POST", f"{url}/chat/completions", content=body, headers={
            "content-type": "application/json", "accept": "text/event-stream"}) as response:
        for line in response.iter_lines():
            if latency is not None or not line.startswith("data: ") or line == "data: [DONE]":
                continue
            for choice in orjson.loads(line[6:]).get("choices") or ():
                text = (choice.get("delta") or {}).get("content") or ""
                latency = stamp_latency_ms(text, time.monotonic())
    if latency is None:
        raise RuntimeError("a stream carried no stamped delta")
    return latency


async def _staggered(sessions: int, turn: Callable[[int], Awaitable[float]]) -> list[float]:
    """Every session: a warm-up turn, a seeded random wait within one turn's length, then
    :data:`FIRST_TURNS_EACH` turns back to back; every measured turn's latency."""
    schedule = random.Random(SEED)
    waits = [schedule.uniform(0, FIRST_DELTAS * FIRST_GAP_MS / 1000) for _ in range(sessions)]
    await asyncio.gather(*(turn(n) for n in range(sessions)))
    latencies: list[float] = []

    async def loop(n: int) -> None:
        await asyncio.sleep(waits[n])
        for _ in range(FIRST_TURNS_EACH):
            latencies.append(await turn(n))

    await asyncio.gather(*(loop(n) for n in range(sessions)))
    return latencies


def _latency_sample(latencies: list[float]) -> Sample:
    p50 = percentile(latencies, 0.5)
    return Sample(p50, len(latencies), p50, percentile(latencies, 0.99),
                  {"max_ms": round(max(latencies), 2)})


async def httpx_first_chunk(server: ModelServerProcess) -> Sample:
    """The floor: each session is a thread with its own ``httpx.Client`` reading the
    stream line by line, as zeroclaw's agents read theirs (without the hops after)."""
    import httpx

    body = orjson.dumps({"model": "gpt-bench", "stream": True, "messages": [
        {"role": "user", "content": f"first {FIRST_DELTAS} {FIRST_GAP_MS}"}]})
    loop = asyncio.get_running_loop()
    clients = [httpx.Client(timeout=60) for _ in range(SESSIONS)]
    try:
        with ThreadPoolExecutor(SESSIONS, thread_name_prefix="httpx-floor") as pool:
            latencies = await _staggered(SESSIONS, lambda n: loop.run_in_executor(
                pool, _httpx_turn, clients[n], server.url, body))
    finally:
        for client in clients:
            client.close()
    return _latency_sample(latencies)


# -- zeroclaw: zeroclaw acp with the openai agent -------------------------------------

class ChunkPeer(RpcPeer):
    """An :class:`RpcPeer` that keeps, per session, the latency of each turn's first
    stamped chunk and the message text received (the loop thread)."""

    first_ms: dict[str, float]
    text_chars: int

    def watch(self) -> None:
        self.first_ms, self.text_chars, self.notifications = {}, 0, 0

    async def _on_frame(self, frame: dict[str, Any]) -> None:
        if frame.get("method") == "session/update" and "id" not in frame:
            params = frame.get("params") or {}
            update = params.get("update") or {}
            if update.get("sessionUpdate") == "agent_message_chunk":
                text = (update.get("content") or {}).get("text") or ""
                self.text_chars += len(text)
                latency = stamp_latency_ms(text, time.monotonic())
                if latency is not None:
                    self.first_ms[str(params.get("sessionId"))] = latency
        await super()._on_frame(frame)


@dataclass(frozen=True)
class ZeroclawSide:
    """``zeroclaw acp`` (this interpreter's environment) whose one agent is ``openai`` on
    the bench's model server."""

    server: ModelServerProcess
    env: dict[str, str] = field(default_factory=lambda: {
        k: v for k, v in os.environ.items() if not k.startswith("ZEROCLAW_")})

    def argv_for(self, workdir: Path) -> list[str]:
        config = workdir / "config"
        config.mkdir()
        (config / "config.toml").write_text(
            f'[acp]\nmax_sessions = {2 * SESSIONS}\n[agents.main]\nprovider = "openai"\n'
            f'base_url = "{self.server.url}"\nmodel = "gpt-bench"\n'
            f'workspace = "{workdir / "agent-ws"}"\ncontext_window = 4000000\n'
            '[autonomy]\nlevel = "read_only"\n', encoding="utf-8")
        return [str(Path(sys.prefix) / "bin" / "zeroclaw"), "acp", "--config-dir", str(config)]


@contextlib.asynccontextmanager
async def _zeroclaw(side: ZeroclawSide,
                    sessions: int) -> AsyncIterator[tuple[ChunkPeer, list[str]]]:
    """A fresh ``zeroclaw acp`` in a temp dir, initialized, with ``sessions`` sessions."""
    with tempfile.TemporaryDirectory(prefix="zcb-model-") as temp:
        workdir = Path(temp)
        peer = cast(ChunkPeer, await ChunkPeer.spawn(side.argv_for(workdir), workdir, side.env))
        peer.watch()
        try:
            await peer.request("initialize", {"protocolVersion": 1, "clientCapabilities": {}})
            ids = [(await peer.request("session/new", {"cwd": temp, "mcpServers": []}))[
                "sessionId"] for _ in range(sessions)]
            yield peer, ids
        except RpcFailure as error:
            raise RpcFailure(f"zeroclaw: {error}; stderr: {peer.stderr_tail()}") from None
        finally:
            await peer.close()


async def _prompt(peer: RpcPeer, sid: str, text: str) -> float:
    """One turn (the prompt as a string, which the floor reads too); its seconds."""
    began = time.perf_counter()
    result = await peer.request("session/prompt", {"sessionId": sid, "prompt": text})
    if not isinstance(result, dict) or result.get("stopReason") != "end_turn":
        raise RpcFailure(f"session/prompt did not end its turn: {result!r}")
    return time.perf_counter() - began


async def zeroclaw_first_chunk(side: ZeroclawSide) -> Sample:
    async with _zeroclaw(side, SESSIONS) as (peer, ids):
        async def turn(n: int) -> float:
            peer.first_ms.pop(ids[n], None)
            await _prompt(peer, ids[n], f"first {FIRST_DELTAS} {FIRST_GAP_MS}")
            latency = peer.first_ms.pop(ids[n], None)
            if latency is None:
                raise RpcFailure("a turn streamed no stamped chunk")
            return latency

        return _latency_sample(await _staggered(SESSIONS, turn))


# -- chunks relayed per second ----------------------------------------------------------

async def _relay_turns(peer: ChunkPeer, sid: str, text: str, chars: int,
                       sizes: BenchSizes, server: psutil.Process | None = None) -> Sample:
    """Turns of ``text`` until three and ``min_seconds``: chunks (by text) per second,
    and the CPU µs per delta of the peer (``host``), its children (``workers``) and
    the model ``server``, from the kernel's per-process counters."""
    await _prompt(peer, sid, text)  # warm up
    assert peer.process is not None
    cpu_before = _relay_cpu(psutil.Process(peer.process.pid), server)
    seconds, updates, turns = 0.0, 0, 0
    while turns < 3 or seconds < sizes.min_seconds:
        peer.watch()
        seconds += await _prompt(peer, sid, text)
        if peer.text_chars < chars:
            raise RpcFailure(f"{peer.text_chars} of {chars} characters came")
        updates += peer.notifications
        turns += 1
    cpu_after = _relay_cpu(psutil.Process(peer.process.pid), server)
    cpu_us = {f"{name}_cpu_us": round((cpu_after[name] - cpu_before[name]) * 1e6
                                      / (RELAY_CHUNKS * turns), 2) for name in cpu_after}
    return Sample(RELAY_CHUNKS * turns / seconds, turns, details={
        "turn_ms": round(1000 * seconds / turns, 1), "updates_per_turn": round(updates / turns),
        **cpu_us})


def _relay_cpu(host: psutil.Process, server: psutil.Process | None) -> dict[str, float]:
    """CPU seconds so far: the host (or the floor), its children, the model server."""
    total, own = server_cpu_seconds(host)
    seconds = {"host": own, "workers": total - own}
    if server is not None:
        seconds["model_server"] = server_cpu_seconds(server)[0]
    return seconds


async def floor_relay(sizes: BenchSizes) -> Sample:
    with tempfile.TemporaryDirectory(prefix="zcb-model-floor-") as temp:
        peer = cast(ChunkPeer, await ChunkPeer.spawn(
            [sys.executable, str(FLOOR_SCRIPT)], Path(temp), None))
        peer.watch()
        try:
            words = " ".join(["x"] * RELAY_CHUNKS)
            return await _relay_turns(peer, "floor", words, len(words), sizes)
        finally:
            await peer.close()


async def zeroclaw_relay(sizes: BenchSizes, side: ZeroclawSide) -> Sample:
    async with _zeroclaw(side, 1) as (peer, [sid]):
        return await _relay_turns(peer, sid, f"stream {RELAY_CHUNKS}", 2 * RELAY_CHUNKS, sizes,
                                  psutil.Process(side.server.process.pid))


def _judge_first_chunk(entry: dict[str, Any]) -> dict[str, Any]:
    """Targets on differences: zeroclaw's p50 and p99 within the slack of the floor's."""
    if entry["zeroclaw"] is None or entry["floor"] is None:
        return entry
    p50 = entry["zeroclaw_p50_ms"] - entry["floor_p50_ms"]
    p99 = entry["zeroclaw_p99_ms"] - entry["floor_p99_ms"]
    entry["difference_p50_ms"], entry["difference_p99_ms"] = round(p50, 3), round(p99, 3)
    entry["ratio"] = None
    entry["target"] = f"p50 <= floor + {P50_SLACK_MS:g} ms, p99 <= floor + {P99_SLACK_MS:g} ms"
    entry["ok"] = p50 <= P50_SLACK_MS and p99 <= P99_SLACK_MS
    return entry


async def run_model(sizes: BenchSizes) -> dict[str, dict[str, Any]]:
    """Both metrics, floor and zeroclaw in alternated rounds: the result entries."""
    async with ModelServerProcess.running() as server:
        progress(f"model server at {server.url}")
        side = ZeroclawSide(server)
        first = MetricSpec(
            "model_first_chunk", "model", f"server first byte to first chunk, {SESSIONS} "
            "sessions streaming", "ms", "lower")
        relay = MetricSpec("model_relay", "model", f"one answer of {RELAY_CHUNKS} chunks",
                           "chunks/s", goal=Goal(">=", 0.5))
        metrics = {
            first.name: _judge_first_chunk(await measure_pair(
                first, partial(httpx_first_chunk, server), partial(zeroclaw_first_chunk, side),
                sizes.rounds)),
            relay.name: await measure_pair(relay, partial(floor_relay, sizes),
                                           partial(zeroclaw_relay, sizes, side), sizes.rounds),
        }
    return metrics
