"""The measurements of ``scripts/bench_capacity``: how many editors one host serves while
each streams a long answer from a model paced like a real one.

Runs on the bench process's asyncio loop thread: every client is a task of that loop.
The model API is ``bench_model_server.py`` in ``paced`` mode (its own process): time to
first token, then a delta every ``gap``; each delta's text is the server's monotonic
clock at the write that carries it, so a client's delay for a delta is its own clock
minus that stamp, and the server's own lateness is never counted. Three sides, measured
at each session count N in turn (floor, then zeroclaw over ``acp.sock``, then over the
gateway), each stopping once it misses:

- **floor**: ``relay_floor.py``, one asyncio program that only reads each session's SSE
  stream (aiohttp, as zeroclaw's agent does) and writes each delta as an ACP
  ``session/update`` line to its client;
- **acp_sock** and **gateway**: one ``zeroclaw daemon --gateway`` with the model agent,
  clients over ``acp.sock`` and over ``ws://…/acp`` (an admin tenant).

A side serves N when the p99 of its added delay is within :data:`SLACK_MS` and no turn
was lost (an error, a stop reason other than ``end_turn``, or a delta missing); its
capacity is the largest N it served. Afterwards the daemon gets :data:`IDLE_SESSIONS`
idle sessions and streams at its capacity again: the RSS of host and workers then.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import re
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import psutil
from bench_gateway_lib import GatewayDaemon, WsPeer, _free_port
from bench_lib import progress
from bench_rpc_lib import RpcFailure, RpcPeer, percentile
from load_lib import Daemon, started_daemon

__all__ = ["IDLE_SESSIONS", "SLACK_MS", "Pace", "run_capacity"]

SCRIPTS = Path(__file__).resolve().parent
SLACK_MS = 25.0
"""The added delay (p99, per delta) a client tolerates before it notices."""
IDLE_SESSIONS = 1000
_STAMP = re.compile(r"@(\d+\.\d+) ")


@dataclass(frozen=True)
class Pace:
    """How the model streams: ``tokens`` deltas, the first after ``first_ms``, then
    one every ``gap_ms``."""

    tokens: int
    first_ms: float
    gap_ms: float

    def prompt(self) -> list[dict[str, str]]:
        return [{"type": "text", "text": f"paced {self.tokens} {self.first_ms} {self.gap_ms}"}]

    @property
    def turn_secs(self) -> float:
        return (self.first_ms + self.tokens * self.gap_ms) / 1000


@dataclass
class ClientTally:
    """What one client saw (loop thread): its delays in ms, turns done and lost."""

    delays: list[float] = field(default_factory=list)
    turn_stamps: int = 0
    turns: int = 0
    lost: int = 0
    errors: list[str] = field(default_factory=list)

    def on_update(self, params: dict[str, Any]) -> None:
        update = params.get("update", {})
        if update.get("sessionUpdate") != "agent_message_chunk":
            return
        now = time.monotonic()
        for stamp in _STAMP.finditer(update.get("content", {}).get("text", "")):
            self.delays.append((now - float(stamp[1])) * 1000)
            self.turn_stamps += 1


def _tallied(tally: ClientTally, frame: dict[str, Any]) -> bool:
    """Whether ``frame`` was a session update, now counted in ``tally``."""
    if frame.get("method") != "session/update":
        return False
    tally.on_update(frame.get("params", {}))
    return True


class TalliedSocketPeer(RpcPeer):
    """An ``acp.sock`` (or floor) connection whose updates go to a :class:`ClientTally`."""

    tally: ClientTally

    async def _on_frame(self, frame: dict[str, Any]) -> None:
        if not _tallied(self.tally, frame):
            await super()._on_frame(frame)


class TalliedWsPeer(WsPeer):
    """A gateway ``/acp`` connection whose updates go to a :class:`ClientTally`."""

    tally: ClientTally

    async def _on_frame(self, frame: dict[str, Any]) -> None:
        if not _tallied(self.tally, frame):
            await super()._on_frame(frame)


Connect = Callable[[], Awaitable[RpcPeer]]


@dataclass
class Side:
    """One thing measured: how to connect, the cwd its sessions use, and the processes
    whose CPU and RSS are its cost (``root``, and its children as "workers")."""

    name: str
    connect: Connect
    cwd: str
    root: psutil.Process


async def _stream_turns(side: Side, pace: Pace, deadline: float, start_in: float,
                        tally: ClientTally) -> None:
    """One editor: a session, then prompts back to back until ``deadline``."""
    await asyncio.sleep(start_in)
    peer = await side.connect()
    peer.tally = tally  # type: ignore[attr-defined]
    try:
        await peer.request("initialize", {"protocolVersion": 1, "clientCapabilities": {}})
        sid = (await peer.request("session/new", {"cwd": side.cwd, "mcpServers": []}))["sessionId"]
        while time.monotonic() < deadline:
            tally.turn_stamps = 0
            try:
                result = await peer.request("session/prompt",
                                            {"sessionId": sid, "prompt": pace.prompt()})
            except RpcFailure as exc:
                tally.lost += 1
                tally.errors.append(str(exc)[:200])
                continue
            whole = result.get("stopReason") == "end_turn" and tally.turn_stamps == pace.tokens
            tally.turns += whole
            tally.lost += not whole
    finally:
        await peer.close()


def _cpu(process: psutil.Process) -> float:
    with contextlib.suppress(psutil.Error):
        times = process.cpu_times()
        return float(times.user + times.system)
    return 0.0


def _costs(root: psutil.Process) -> dict[str, float]:
    """CPU seconds and RSS (MiB) of ``root`` ("host") and its children ("workers")."""
    children = root.children()
    rss = 0
    with contextlib.suppress(psutil.Error):
        rss = sum(p.memory_info().rss for p in children)
    return {"host_cpu": _cpu(root), "workers_cpu": sum(_cpu(p) for p in children),
            "host_rss_mib": root.memory_info().rss / 2**20, "workers_rss_mib": rss / 2**20}


async def measure_step(side: Side, sessions: int, secs: float, pace: Pace) -> dict[str, Any]:
    """``sessions`` editors streaming for ``secs``: the delays, turns and costs."""
    before = _costs(side.root)
    started = time.monotonic()
    seeded = random.Random(sessions)
    tallies = [ClientTally() for _ in range(sessions)]
    await asyncio.gather(*(
        _stream_turns(side, pace, started + secs, seeded.uniform(0, pace.turn_secs), tally)
        for tally in tallies))
    elapsed = time.monotonic() - started
    after = _costs(side.root)
    delays = sorted(d for tally in tallies for d in tally.delays)
    turns = sum(t.turns for t in tallies)
    step = {
        "side": side.name, "sessions": sessions, "seconds": round(elapsed, 2),
        "deltas": len(delays), "turns": turns, "lost_turns": sum(t.lost for t in tallies),
        "p50_ms": percentile(delays, 0.5) if delays else None,
        "p99_ms": percentile(delays, 0.99) if delays else None,
        "max_ms": delays[-1] if delays else None,
        "host_cpu_ms_per_turn": _per_turn(after["host_cpu"] - before["host_cpu"], turns),
        "workers_cpu_ms_per_turn": _per_turn(after["workers_cpu"] - before["workers_cpu"], turns),
        "host_rss_mib": round(after["host_rss_mib"], 1),
        "workers_rss_mib": round(after["workers_rss_mib"], 1),
        "errors": sorted({e for t in tallies for e in t.errors})[:3],
    }
    step["served"] = (bool(delays) and step["lost_turns"] == 0
                      and percentile(delays, 0.99) <= SLACK_MS)
    return step


def _per_turn(seconds: float, turns: int) -> float | None:
    return round(seconds * 1000 / turns, 2) if turns else None


def _report(step: dict[str, Any]) -> None:
    p99 = "-" if step["p99_ms"] is None else f"{step['p99_ms']:.1f}"
    progress(f"{step['side']:9} N={step['sessions']:4}: p99 +{p99} ms, max "
             f"{step['max_ms'] or 0:.1f} ms, {step['turns']} turns, {step['lost_turns']} lost"
             f"{'' if step['served'] else '  (missed)'}")


@contextlib.contextmanager
def model_server() -> Iterator[str]:
    """``bench_model_server.py`` in its own process; yields its ``/v1`` base URL."""
    proc = subprocess.Popen([sys.executable, str(SCRIPTS / "bench_model_server.py")],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline().split()[1])
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(timeout=30)


@contextlib.contextmanager
def relay_floor(base_url: str, workdir: Path) -> Iterator[Side]:
    """``relay_floor.py`` on a Unix socket in ``workdir``."""
    path = workdir / "floor.sock"
    proc = subprocess.Popen([sys.executable, str(SCRIPTS / "relay_floor.py"), str(path),
                             base_url], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        proc.stdout.readline()  # "listening"
        yield Side("floor", partial(TalliedSocketPeer.connect, path), str(workdir),
                   psutil.Process(proc.pid))
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(timeout=30)


@contextlib.contextmanager
def zeroclaw_daemon(base_url: str, workdir: Path) -> Iterator[tuple[Side, Side, Daemon]]:
    """A daemon with the model agent and its gateway; the acp.sock and gateway sides."""
    import hashlib
    import secrets

    token = secrets.token_urlsafe(24)
    port = _free_port()
    extra = (f'[agents.main]\nprovider = "openai"\nbase_url = "{base_url}"\n'
             f'model = "gpt-bench"\nworkspace = "{workdir}"\n'
             '[autonomy]\nlevel = "read_only"\n'
             f'[gateway]\nlisten = "127.0.0.1:{port}"\n[tenants.bench]\n'
             f'token_sha256 = "{hashlib.sha256(token.encode()).hexdigest()}"\n'
             f'admin = true\nworkspace_root = "{workdir}"\n')
    with started_daemon(4 * IDLE_SESSIONS, lambda: False, extra) as daemon:
        gateway = GatewayDaemon(daemon, port, token)
        gateway.wait_http()
        root = daemon.process
        yield (Side("acp_sock", partial(TalliedSocketPeer.connect, gateway.acp_socket),
                    str(workdir), root),
               Side("gateway", partial(TalliedWsPeer.open, gateway.ws_url, token),
                    str(workdir), root),
               daemon)


async def search_capacity(sides: list[Side], counts: list[int], secs: float, pace: Pace,
                          rounds: int = 1) -> dict[str, list[dict[str, Any]]]:
    """Each side at each of ``counts`` in turn until it misses: ``rounds`` alternated
    rounds of the sides at every N, each side keeping its best (served first, then the
    lowest p99), so that a burst of load from elsewhere hurts one round, not the result."""
    steps: dict[str, list[dict[str, Any]]] = {side.name: [] for side in sides}
    running = list(sides)
    for sessions in counts:
        tries: dict[str, list[dict[str, Any]]] = {side.name: [] for side in running}
        for _ in range(rounds):
            for side in running:
                tries[side.name].append(await measure_step(side, sessions, secs, pace))
                _report(tries[side.name][-1])
        for side in list(running):
            best = min(tries[side.name], key=lambda s: (not s["served"], s["p99_ms"] or 1e9))
            steps[side.name].append(best)
            if not best["served"]:
                running.remove(side)
        if not running:
            break
    return steps


def capacity_of(steps: list[dict[str, Any]]) -> int:
    return max((s["sessions"] for s in steps if s["served"]), default=0)


async def idle_plus_streaming(side: Side, sessions: int, secs: float,
                              pace: Pace) -> dict[str, Any]:
    """:data:`IDLE_SESSIONS` idle sessions held open while ``sessions`` stream."""
    peers = [await side.connect() for _ in range(10)]
    try:
        for peer in peers:
            peer.tally = ClientTally()  # type: ignore[attr-defined]  # (idle: nothing comes)
            await peer.request("initialize", {"protocolVersion": 1})
        await asyncio.gather(*(_open_idle(peer, side.cwd, IDLE_SESSIONS // len(peers))
                               for peer in peers))
        step = await measure_step(side, max(sessions, 1), secs, pace)
        step["idle_sessions"] = IDLE_SESSIONS
        step["total_rss_mib"] = round(step["host_rss_mib"] + step["workers_rss_mib"], 1)
        return step
    finally:
        await asyncio.gather(*(peer.close() for peer in peers))


async def _open_idle(peer: RpcPeer, cwd: str, count: int) -> None:
    for _ in range(count):
        await peer.request("session/new", {"cwd": cwd, "mcpServers": []})


async def run_capacity(counts: list[int], secs: float, pace: Pace, workdir: Path,
                       rounds: int = 1) -> dict[str, Any]:
    """The whole bench: capacity of each side, then the idle-plus-streaming RSS."""
    for sub in ("floor", "zc"):
        (workdir / sub).mkdir(parents=True, exist_ok=True)
    with model_server() as base_url, relay_floor(base_url, workdir / "floor") as floor, \
            zeroclaw_daemon(base_url, workdir / "zc") as (acp_sock, gateway, _daemon):
        steps = await search_capacity([floor, acp_sock, gateway], counts, secs, pace, rounds)
        capacities = {name: capacity_of(side_steps) for name, side_steps in steps.items()}
        progress(f"capacities: {capacities}; now {IDLE_SESSIONS} idle sessions + "
                 f"{capacities['acp_sock']} streaming")
        loaded = await idle_plus_streaming(acp_sock, capacities["acp_sock"], secs, pace)
        _report(loaded)
    return {"pace": asdict(pace), "seconds_per_step": secs, "rounds": rounds,
            "slack_ms": SLACK_MS,
            "steps": steps, "capacities": capacities, "idle_plus_streaming": loaded}
