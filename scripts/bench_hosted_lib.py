"""The measurements of ``scripts/bench_hosted``: an echo ACP agent on the ACP
TypeScript SDK (``bench_echo_agent.mjs``), hosted by ``zeroclaw acp``
(``provider = "acp"``), against the same agent driven directly by the same client.

Runs on the bench process's asyncio loop thread. The "floor" side of every metric
is the agent itself over its stdio; the "zeroclaw" side is ``zeroclaw acp`` with
that agent as its one agent, in a fresh temp ``--config-dir`` per measurement.
Both get the same ACP requests (prompts as text blocks), so the difference is
what hosting costs: zeroclaw's stdio, its worker hop, the agent's pipes in the
worker, and the turn's store commit.

Metrics: sequential turns (turns/s, target >= 0.5x direct); one turn streaming
:data:`STREAM_CHUNKS` chunks (chunks/s, target >= 0.7x direct); the latency from
sending a prompt to its first chunk (p50 ms, target: within 1 ms of direct).
The sequential turns and the first chunk are also measured on the design floor
(``design_floor.py``, with no agent process at all): what the plainest host pays
for a turn before hosting an agent adds its own hop. The "card" side of every metric
is the hosting floor (``hosted_floor.py``): the same agent behind a host that does
only what the design card makes unavoidable (a worker process over zmq that runs the
agent's pipes and a session actor, a persistence actor committing each turn).
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, cast

from bench_lib import DESIGN_FLOOR_SCRIPT, BenchSizes, Goal, MetricSpec, Sample, measure_pair
from bench_rpc_lib import RpcFailure, RpcPeer, percentile
from bench_wakeups_lib import cpu_seconds, process_tree

__all__ = ["STREAM_CHUNKS", "AgentTools", "find_agent_tools", "run_hosted", "stream_notes"]

STREAM_CHUNKS = 2000
FIRST_CHUNK_SLACK_MS = 1.0
_SCRIPTS = Path(__file__).resolve().parent
_TOOLS = _SCRIPTS.parent / ".tools" / "node_modules"


@dataclass(frozen=True)
class AgentTools:
    """How to run the echo agent: a node binary and the SDK's ``dist/acp.js``."""

    node: str
    sdk: Path

    def argv(self) -> list[str]:
        return [self.node, str(_SCRIPTS / "bench_echo_agent.mjs"), str(self.sdk)]


def find_agent_tools() -> AgentTools:
    """The node and ACP TypeScript SDK that ``scripts/test`` installs under .tools/."""
    sdk = _TOOLS / "@agentclientprotocol" / "sdk" / "dist" / "acp.js"
    node = _TOOLS / "node" / "bin" / "node"
    if not sdk.is_file() or not node.is_file():
        raise RuntimeError(f"{sdk} or {node} is missing: run scripts/test once to install them")
    return AgentTools(str(node), sdk)


class TimedPeer(RpcPeer):
    """An :class:`RpcPeer` that notes when the first notification after :meth:`arm`
    arrived, and how much message text came since (the loop thread)."""

    first_note_at: float | None = None
    text_chars = 0

    def arm(self) -> None:
        self.first_note_at = None
        self.notifications = 0
        self.text_chars = 0

    async def _on_frame(self, frame: dict[str, Any]) -> None:
        if "method" in frame and "id" not in frame:
            if self.first_note_at is None:
                self.first_note_at = time.perf_counter()
            update = (frame.get("params") or {}).get("update") or {}
            self.text_chars += len((update.get("content") or {}).get("text") or "")
        await super()._on_frame(frame)


@dataclass(frozen=True)
class Side:
    """One way to reach the agent: ``argv_for(workdir)`` is the process to speak to."""

    name: str
    argv_for: Callable[[Path], list[str]]
    env: dict[str, str] | None = None
    worker_mark: str | None = None  # hosted: in the command line of its worker processes


def direct(tools: AgentTools) -> Side:
    return Side("direct", lambda _workdir: tools.argv())


def hosted(tools: AgentTools) -> Side:
    """``zeroclaw acp`` (this interpreter's environment) with the agent as ``echo``."""
    executable = Path(sys.prefix) / "bin" / "zeroclaw"
    env = {k: v for k, v in os.environ.items() if not k.startswith("ZEROCLAW_")}

    def argv_for(workdir: Path) -> list[str]:
        config = workdir / "config"
        config.mkdir()
        command = ", ".join(f'"{arg}"' for arg in tools.argv())
        (config / "config.toml").write_text(
            f'[acp]\ndefault_agent = "echo"\n[agents.echo]\nprovider = "acp"\n'
            f"command = [{command}]\n", encoding="utf-8")
        return [str(executable), "acp", "--config-dir", str(config)]

    return Side("zeroclaw", argv_for, env, worker_mark="actors.worker")


def hosting_floor(tools: AgentTools) -> Side:
    """``scripts/hosted_floor.py``: the agent behind a host that does only what the card
    makes unavoidable (the "card" side of the hosted metrics)."""
    def argv_for(workdir: Path) -> list[str]:
        return [sys.executable, str(_SCRIPTS / "hosted_floor.py"), "--db",
                str(workdir / "floor.db"), "--", *tools.argv()]

    return Side("card", argv_for, worker_mark="--worker")


@contextlib.asynccontextmanager
async def _session(side: Side) -> AsyncIterator[tuple[TimedPeer, str]]:
    """A fresh process of ``side``, initialized, with one session warmed by a few turns."""
    with tempfile.TemporaryDirectory(prefix=f"zcb-hosted-{side.name}-") as temp:
        workdir = Path(temp)
        peer = cast(TimedPeer, await TimedPeer.spawn(side.argv_for(workdir), workdir, side.env))
        try:
            await peer.request("initialize", {"protocolVersion": 1, "clientCapabilities": {}})
            result = await peer.request("session/new", {"cwd": temp, "mcpServers": []})
            sid = result["sessionId"]
            for _ in range(5):
                await _turn(peer, sid, "warm up")
            yield peer, sid
        except RpcFailure as error:
            raise RpcFailure(f"{side.name}: {error}; stderr: {peer.stderr_tail()}") from None
        finally:
            await peer.close()


async def _turn(peer: TimedPeer, sid: str, text: str) -> tuple[float, float]:
    """One prompt: (seconds to its result, seconds to its first notification)."""
    peer.arm()
    began = time.perf_counter()
    result = await peer.request("session/prompt", {
        "sessionId": sid, "prompt": [{"type": "text", "text": text}]})
    ended = time.perf_counter()
    if not isinstance(result, dict) or result.get("stopReason") != "end_turn":
        raise RpcFailure(f"session/prompt did not end its turn: {result!r}")
    if peer.first_note_at is None:
        raise RpcFailure("a turn streamed nothing")
    return ended - began, peer.first_note_at - began


async def _sequential(sizes: BenchSizes, side: Side) -> tuple[list[float], list[float], float]:
    """Turns one after another on one session: each turn's and its first chunk's
    milliseconds, and the seconds they took."""
    async with _session(side) as (peer, sid):
        turns: list[float] = []
        firsts: list[float] = []
        started = time.perf_counter()
        while len(turns) < sizes.turns_each * 20 or time.perf_counter() - started < (
                sizes.min_seconds):
            turn, first = await _turn(peer, sid, "hello world")
            turns.append(turn * 1000)
            firsts.append(first * 1000)
        return turns, firsts, time.perf_counter() - started


async def sequential_turns(sizes: BenchSizes, side: Side) -> Sample:
    """Sequential turns per second, with their latencies."""
    turns, _firsts, seconds = await _sequential(sizes, side)
    return Sample(len(turns) / seconds, len(turns), percentile(turns, 0.5),
                  percentile(turns, 0.99))


async def first_chunk(sizes: BenchSizes, side: Side) -> Sample:
    """Milliseconds from sending a prompt to its first chunk: the p50 (and p99)."""
    _turns, firsts, _seconds = await _sequential(sizes, side)
    p50 = percentile(firsts, 0.5)
    return Sample(p50, len(firsts), p50, percentile(firsts, 0.99))


def _cpu_by_role(root_pid: int, worker_mark: str | None) -> dict[str, float]:
    """CPU seconds so far of the process tree of ``root_pid``: ``host`` (the root, when
    it hosts the agent), ``workers`` (its processes with ``worker_mark`` in their
    command line) and ``agent`` (the rest: the agent and what it runs), with
    ``client`` this process's."""
    totals = {"client": time.process_time(), "agent": 0.0}
    if worker_mark:
        totals.update(host=0.0, workers=0.0)
    for pid in process_tree(root_pid):
        role = "agent"
        if worker_mark and pid == root_pid:
            role = "host"
        elif worker_mark and worker_mark in _cmdline(pid):
            role = "workers"
        totals[role] += sum(cpu_seconds([pid]).values())
    return totals


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_text(errors="replace")
    except OSError:
        return ""


async def streamed_chunks(sizes: BenchSizes, side: Side) -> Sample:
    """Turns of :data:`STREAM_CHUNKS` chunks each: the agent's chunks relayed per second.

    zeroclaw merges consecutive chunks into one update while its client reads
    behind (see supervisor/core/pacing.py), so the chunks are counted by their text
    (each is ``"x "``), and the updates that carried them are in ``details``, with
    the CPU microseconds per chunk of each process (from /proc: steadier than the
    rate on a machine shared with other jobs)."""
    async with _session(side) as (peer, sid):
        assert peer.process is not None
        seconds, updates = 0.0, 0
        turns: list[float] = []
        cpu_before = _cpu_by_role(peer.process.pid, side.worker_mark)
        while len(turns) < 3 or seconds < sizes.min_seconds:
            turn, _first = await _turn(peer, sid, f"stream {STREAM_CHUNKS}")
            if peer.text_chars != 2 * STREAM_CHUNKS:
                raise RpcFailure(f"{peer.text_chars} of {2 * STREAM_CHUNKS} characters came")
            seconds += turn
            updates += peer.notifications
            turns.append(turn * 1000)
        cpu_after = _cpu_by_role(peer.process.pid, side.worker_mark)
    chunks = STREAM_CHUNKS * len(turns)
    details = {"turn_ms": round(min(turns), 1), "updates_per_turn": round(updates / len(turns))}
    details.update({f"{role}_cpu_us_per_chunk": round((cpu_after[role] - spent) / chunks * 1e6, 2)
                    for role, spent in cpu_before.items()})
    return Sample(chunks / seconds, len(turns), percentile(turns, 0.5), percentile(turns, 0.99),
                  details)


Measure = Callable[[Side], Awaitable[Sample]]


def design_floor() -> Side:
    """``scripts/design_floor.py``: a turn's unavoidable cost with no agent process at
    all, to set the direct agent's turn rate against."""
    def argv_for(workdir: Path) -> list[str]:
        return [sys.executable, str(DESIGN_FLOOR_SCRIPT), "--db", str(workdir / "floor.db")]

    return Side("design", argv_for)


def _plan(sizes: BenchSizes) -> list[tuple[MetricSpec, Measure, bool]]:
    """(metric, measurement, whether the design floor is measured too: it answers a
    turn, but streams only the prompt's words back)."""
    return [
        (MetricSpec("hosted_turns", "hosted", "sequential turns, echo agent", "turns/s",
                    goal=Goal(">=", 0.5)), partial(sequential_turns, sizes), True),
        (MetricSpec("hosted_stream", "hosted", f"one turn of {STREAM_CHUNKS} chunks",
                    "chunks/s", goal=Goal(">=", 0.7)), partial(streamed_chunks, sizes), False),
        (MetricSpec("hosted_first_chunk", "hosted", "prompt to first chunk, p50", "ms",
                    "lower"), partial(first_chunk, sizes), True),
    ]


def _judge_first_chunk(entry: dict[str, Any]) -> dict[str, Any]:
    """The first-chunk target is a difference: zeroclaw's p50 within 1 ms of direct."""
    if entry["zeroclaw"] is None or entry["floor"] is None:
        return entry
    entry["difference_ms"] = round(entry["zeroclaw"] - entry["floor"], 3)
    entry["target"] = f"<= floor + {FIRST_CHUNK_SLACK_MS:g} ms"
    entry["ok"] = entry["difference_ms"] <= FIRST_CHUNK_SLACK_MS
    return entry


async def run_hosted(sizes: BenchSizes) -> dict[str, dict[str, Any]]:
    """Every metric, direct ("floor") and hosted in alternated rounds: the result entries."""
    tools = find_agent_tools()
    floor, zeroclaw = direct(tools), hosted(tools)
    design, card = design_floor(), hosting_floor(tools)
    metrics = {}
    for spec, measure, on_design in _plan(sizes):
        metrics[spec.name] = await measure_pair(
            spec, partial(measure, floor), partial(measure, zeroclaw), sizes.rounds,
            partial(measure, design) if on_design else None, partial(measure, card))
    _judge_first_chunk(metrics["hosted_first_chunk"])
    return metrics


def stream_notes(entry: dict[str, Any] | None) -> list[str]:
    """The report's lines on the streamed turn: how far the hosting floor itself gets
    against the direct agent, and the CPU per streamed chunk of each side's processes."""
    entry = entry or {}
    lines = []
    if entry.get("card") and entry.get("floor") and entry.get("zeroclaw"):
        lines.append(f"  {STREAM_CHUNKS} chunks: the hosting floor (card) reaches "
                     f"{entry['card'] / entry['floor']:.2f}x of the direct agent; zeroclaw "
                     f"{entry['zeroclaw'] / entry['card']:.2f}x of the hosting floor")
    sides = []
    for side, roles in (("zeroclaw", ("host", "workers", "agent", "client")),
                        ("card", ("host", "workers", "agent", "client")),
                        ("floor", ("agent", "client"))):
        figures = [(role, entry.get(f"{side}_{role}_cpu_us_per_chunk")) for role in roles]
        if all(value is not None for _role, value in figures):
            sides.append(f"{side} " + ", ".join(f"{role} {value:.2f}"
                                                for role, value in figures))
    if sides:
        lines.append("  CPU µs per streamed chunk: " + "; ".join(sides))
    return lines
