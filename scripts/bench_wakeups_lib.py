"""Wake-ups per turn, measured: voluntary context switches of a server's threads.

Every time a thread blocks (on a socket, a queue, a lock, a futex) and is woken
again, Linux counts one voluntary context switch for it
(``/proc/PID/task/TID/status``, ``voluntary_ctxt_switches``). Summed over every
thread of the server process and its children (the workers), the change across
N sequential turns, minus what the same processes do when idle for as long,
divided by N, is the number of thread wake-ups one turn costs.

Runs on the bench process's asyncio loop thread (the reads are a few small
files; the client itself is not counted).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import psutil

__all__ = ["process_tree", "voluntary_switches", "wakeups_per_step"]


def process_tree(pid: int) -> list[int]:
    """``pid`` and all its descendants, as they are now."""
    try:
        root = psutil.Process(pid)
        return [pid, *(child.pid for child in root.children(recursive=True))]
    except psutil.NoSuchProcess:
        return []


def voluntary_switches(pids: list[int]) -> int:
    """The sum of ``voluntary_ctxt_switches`` over every thread of ``pids``."""
    total = 0
    for pid in pids:
        for status in Path(f"/proc/{pid}/task").glob("*/status"):
            with contextlib.suppress(OSError):
                for line in status.read_text().splitlines():
                    if line.startswith("voluntary_ctxt_switches:"):
                        total += int(line.split()[1])
                        break
    return total


async def wakeups_per_step(root_pid: int, step: Callable[[], Awaitable[object]], steps: int,
                           idle_seconds: float) -> tuple[float, dict[str, float]]:
    """Wake-ups per ``step`` of the process tree of ``root_pid`` (warm it up first).

    Returns the count and details: the same split into the root process (the host)
    and its children (the workers), the idle rate (wake-ups/s) that was
    subtracted, and the raw count per step."""
    pids = process_tree(root_pid)
    groups = {"host": pids[:1], "workers": pids[1:]}
    before_idle = {name: voluntary_switches(group) for name, group in groups.items()}
    await asyncio.sleep(idle_seconds)
    idle = {name: (voluntary_switches(group) - before_idle[name]) / idle_seconds
            for name, group in groups.items()}
    started = time.perf_counter()
    before = {name: voluntary_switches(group) for name, group in groups.items()}
    for _ in range(steps):
        await step()
    raw = {name: voluntary_switches(group) - before[name] for name, group in groups.items()}
    elapsed = time.perf_counter() - started
    per_step = {name: (raw[name] - idle[name] * elapsed) / steps for name in groups}
    return sum(per_step.values()), {
        "host_wakeups_per_turn": round(per_step["host"], 2),
        "workers_wakeups_per_turn": round(per_step["workers"], 2),
        "idle_wakeups_per_s": round(sum(idle.values()), 1),
        "raw_wakeups_per_turn": round(sum(raw.values()) / steps, 2)}
