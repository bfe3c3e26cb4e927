"""What every ``scripts/bench`` section shares: sizes, the metric model, rounds, turn loops.

Everything runs on the bench process's main thread, inside one asyncio loop
(blocking measurements simply hold the loop; nothing else runs then). Each
metric is measured on the floor and on zeroclaw in alternated rounds, and each
side keeps its best round, so that a burst of load from elsewhere on the box
hurts one round rather than the result. Progress goes to stderr.

Result format (one JSON object: the last line of stdout, and ``--json-out``)::

    {"bench": "zeroclaw", "format": 2, "quick": bool, "only": "all"|"stdio"|"daemon",
     "rounds": 3, "python": "3.11.7", "cpus": 2, "started": "<ISO time>",
     "elapsed_secs": ..., "errors"?: {SECTION: "<why the section could not run>"},
     "metrics": {NAME: {"section": "stdio"|"daemon", "title", "unit",
                        "better": "higher"|"lower", "zeroclaw", "floor", "ratio",
                        "design"?, "design_ratio"?, "design_target"?,
                        "card"?, "card_ratio"?,
                        "target", "ok", "count", "zeroclaw_p50_ms"?, "zeroclaw_p99_ms"?,
                        "floor_p50_ms"?, "floor_p99_ms"?, "zeroclaw_error"?, "floor_error"?,
                        ...details}}}

``zeroclaw`` and ``floor`` (the echo floor) are in ``unit``; ``ratio`` is
zeroclaw / floor (None where a ratio means nothing, e.g. RSS); ``target`` is a
text such as ">= 0.9x floor" or "<= 2 ms" and ``ok`` whether every target of
the metric is met (None without a target). Metrics measured on the design floor
too (``scripts/design_floor.py``) add ``design`` and ``design_ratio`` (zeroclaw /
design) and, where the issue sets one, ``design_target``; and ``card`` and
``card_ratio``: the same floor with the parts the card names for every turn
(``design_floor.py --card``: a pykka session actor per session, the persistence
actor writing zeroclaw's own rows through peewee).
"""

from __future__ import annotations

import asyncio
import math
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from bench_rpc_lib import RpcFailure, RpcPeer, percentile

FLOOR_SCRIPT = Path(__file__).resolve().parent / "echo_floor.py"
"""The do-nothing NDJSON server every rate is compared with."""

DESIGN_FLOOR_SCRIPT = Path(__file__).resolve().parent / "design_floor.py"
"""The design floor: loop -> zmq hop to a second process -> one committed row -> answer."""

__all__ = [
    "DESIGN_FLOOR_SCRIPT",
    "FLOOR_SCRIPT",
    "MEASUREMENT_ERRORS",
    "BenchSizes",
    "Goal",
    "MetricSpec",
    "Sample",
    "best_of_rounds",
    "measure_pair",
    "new_session",
    "progress",
    "prompt",
    "run_turns",
    "timed",
    "turns_title",
]

PROMPT_TEXT = "hello world"
MEASUREMENT_ERRORS = (RpcFailure, OSError, RuntimeError, ValueError, KeyError)
_CLOCK_ZERO = time.monotonic()


def progress(message: str) -> None:
    """One progress line on stderr, stamped with the minutes:seconds since start."""
    minutes, seconds = divmod(int(time.monotonic() - _CLOCK_ZERO), 60)
    print(f"bench [{minutes}:{seconds:02d}] {message}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class BenchSizes:
    """How much work each measurement does; a rate runs for at least ``min_seconds``."""

    rounds: int = 3
    min_seconds: float = 1.5
    cold_starts: int = 5  # per round
    initializes: int = 1000
    session_news: int = 300
    turns_each: int = 10  # per session, at least
    concurrency: tuple[int, ...] = (1, 8, 64)
    socket_initializes: int = 5000
    live_sessions: int = 10_000
    live_connections: int = 8  # open the live sessions over this many connections at once
    status_calls: int = 300
    persist_sessions: int = 64
    wakeup_turns: int = 1000
    wakeup_idle_seconds: float = 2.0

    @classmethod
    def quick(cls) -> BenchSizes:
        return cls(rounds=1, min_seconds=0.3, cold_starts=3, initializes=200, session_news=100,
                   turns_each=3, socket_initializes=1000, live_sessions=2000,
                   status_calls=100,
                   wakeup_turns=300, wakeup_idle_seconds=1.0)


@dataclass(frozen=True)
class Sample:
    """One side's measurement: ``value`` in the metric's unit over ``count`` operations."""

    value: float
    count: int
    p50_ms: float | None = None
    p99_ms: float | None = None
    details: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Goal:
    """A target on zeroclaw's value, or (``of_ratio``) on zeroclaw / floor."""

    op: Literal["<=", ">="]
    bound: float
    of_ratio: bool = True
    unit: str = ""

    def describe(self) -> str:
        return f"{self.op} {self.bound:g}x floor" if self.of_ratio else (
            f"{self.op} {self.bound:g} {self.unit}")

    def met(self, value: float | None, ratio: float | None) -> bool | None:
        subject = ratio if self.of_ratio else value
        if subject is None or math.isnan(subject):
            return None
        return subject <= self.bound if self.op == "<=" else subject >= self.bound


@dataclass(frozen=True)
class MetricSpec:
    """What a metric is called and how it is judged; ``better`` says which way is good."""

    name: str
    section: Literal["stdio", "daemon", "hosted", "gateway", "model"]
    title: str
    unit: str
    better: Literal["higher", "lower"] = "higher"
    goal: Goal | None = None
    has_ratio: bool = True
    design_goal: Goal | None = None

    def best(self, samples: list[Sample]) -> Sample:
        pick = max if self.better == "higher" else min
        return pick(samples, key=lambda sample: sample.value)

    def entry(self, zeroclaw: Sample | str, floor: Sample | str,
              design: Sample | str | None = None,
              card: Sample | str | None = None) -> dict[str, Any]:
        """The JSON entry; a side given as a string failed with that error."""
        entry: dict[str, Any] = {"section": self.section, "title": self.title,
                                 "unit": self.unit, "better": self.better}
        sides = [("zeroclaw", zeroclaw), ("floor", floor)]
        sides += [("design", design)] if design is not None else []
        sides += [("card", card)] if card is not None else []
        for side, run in sides:
            if isinstance(run, str):
                entry[side] = None
                entry[f"{side}_error"] = run
                continue
            entry[side] = run.value
            if run.p50_ms is not None:
                entry[f"{side}_p50_ms"], entry[f"{side}_p99_ms"] = run.p50_ms, run.p99_ms
            entry.update({f"{side}_{key}": value for key, value in run.details.items()})
        entry["count"] = next((run.count for run in (zeroclaw, floor)
                               if isinstance(run, Sample)), None)
        both = entry["zeroclaw"] is not None and entry["floor"]
        entry["ratio"] = entry["zeroclaw"] / entry["floor"] if self.has_ratio and both else None
        entry["target"] = self.goal.describe() if self.goal else None
        verdicts = [self.goal.met(entry["zeroclaw"], entry["ratio"])] if self.goal else []
        if design is not None:
            on_design = entry["zeroclaw"] is not None and entry["design"]
            entry["design_ratio"] = (entry["zeroclaw"] / entry["design"]
                                     if self.has_ratio and on_design else None)
            if self.design_goal is not None:
                entry["design_target"] = self.design_goal.describe().replace("floor", "design")
                verdicts.append(self.design_goal.met(entry["zeroclaw"], entry["design_ratio"]))
        if card is not None:
            on_card = entry["zeroclaw"] is not None and entry["card"]
            entry["card_ratio"] = (entry["zeroclaw"] / entry["card"]
                                   if self.has_ratio and on_card else None)
        entry["ok"] = None if not verdicts or None in verdicts else all(verdicts)
        return entry


Measure = Callable[[], Awaitable[Sample]]


async def _attempt(spec: MetricSpec, side: str, measure: Measure, label: str) -> Sample | str:
    try:
        sample = await measure()
    except MEASUREMENT_ERRORS as error:
        progress(f"{spec.title}: {side}{label} failed: {error}")
        return f"{type(error).__name__}: {error}"
    latency = f", p50 {sample.p50_ms:.2f} ms p99 {sample.p99_ms:.2f} ms" if (
        sample.p50_ms is not None and sample.p99_ms is not None) else ""
    progress(f"{spec.title}: {side}{label} {sample.value:,.2f} {spec.unit}{latency}")
    return sample


async def best_of_rounds(spec: MetricSpec, measures: dict[str, Measure],
                         rounds: int) -> dict[str, Sample | str]:
    """``rounds`` alternated rounds of every side, in the order given; each side's best
    (or, when every round of it failed, the last error)."""
    runs: dict[str, list[Sample | str]] = {side: [] for side in measures}
    for round_no in range(1, rounds + 1):
        label = f" (round {round_no}/{rounds})" if rounds > 1 else ""
        for side, measure in measures.items():
            runs[side].append(await _attempt(spec, side, measure, label))

    def best(side: str) -> Sample | str:
        samples = [run for run in runs[side] if isinstance(run, Sample)]
        return spec.best(samples) if samples else str(runs[side][-1])

    return {side: best(side) for side in measures}


async def measure_pair(spec: MetricSpec, floor: Measure, zeroclaw: Measure,
                       rounds: int, design: Measure | None = None,
                       card: Measure | None = None) -> dict[str, Any]:
    """``rounds`` alternated rounds (floor, the design and card floors when given, then
    zeroclaw); each side keeps its best."""
    measures = {"floor": floor, **({"design": design} if design else {}),
                **({"card": card} if card else {}), "zeroclaw": zeroclaw}
    best = await best_of_rounds(spec, measures, rounds)
    return spec.entry(best["zeroclaw"], best["floor"], best.get("design"), best.get("card"))


def turns_title(sessions: int) -> str:
    if sessions == 1:
        return "prompt turns, 1 session"
    return f"prompt turns, {sessions} sessions at once"


# -- the ACP / RPC calls both dialects answer alike ------------------------------

async def new_session(peer: RpcPeer, params: dict[str, Any]) -> str:
    result = await peer.request("session/new", params)
    if not isinstance(result, dict) or not isinstance(result.get("sessionId"), str):
        raise RpcFailure(f"session/new returned no sessionId: {result!r}")
    return result["sessionId"]


async def prompt(peer: RpcPeer, session_id: str) -> None:
    result = await peer.request("session/prompt", {"sessionId": session_id, "prompt": PROMPT_TEXT})
    if not isinstance(result, dict) or result.get("stopReason") != "end_turn":
        raise RpcFailure(f"session/prompt did not end its turn: {result!r}")


async def run_turns(sessions: list[tuple[RpcPeer, str]], turns_each: int,
                    min_seconds: float) -> Sample:
    """Every session prompts turn after turn, all at once, until each did ``turns_each``
    and ``min_seconds`` passed: turns per second over the wall time, and turn latencies."""
    latencies: list[float] = []
    started = time.perf_counter()

    async def prompt_loop(peer: RpcPeer, session_id: str) -> int:
        done = 0
        while done < turns_each or time.perf_counter() - started < min_seconds:
            began = time.perf_counter()
            await prompt(peer, session_id)
            latencies.append((time.perf_counter() - began) * 1000)
            done += 1
        return done

    counts = await asyncio.gather(*(prompt_loop(peer, sid) for peer, sid in sessions))
    seconds = time.perf_counter() - started
    return Sample(sum(counts) / seconds, sum(counts), percentile(latencies, 0.5),
                  percentile(latencies, 0.99), {"seconds": round(seconds, 3)})


async def timed(count: int, step: Callable[[], Awaitable[object]],
                min_seconds: float = 0.0) -> Sample:
    """Run ``step`` at least ``count`` times and for at least ``min_seconds``: steps/s."""
    started = time.perf_counter()
    done = 0
    while done < count or time.perf_counter() - started < min_seconds:
        for _ in range(count):
            await step()
        done += count
    return Sample(done / (time.perf_counter() - started), done)
