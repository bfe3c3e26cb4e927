"""Wake-ups per turn, measured: voluntary context switches of a server's threads.

Every time a thread blocks (on a socket, a queue, a lock, a futex) and is woken
again, Linux counts one voluntary context switch for it
(``/proc/PID/task/TID/status``, ``voluntary_ctxt_switches``). Summed over every
thread of the server process and its children (the workers), the change across
N sequential turns, minus what the same processes do when idle for as long,
divided by N, is the number of thread wake-ups one turn costs.

The same steps also give the CPU time one turn costs, split where it is spent:
the host's main thread (its asyncio loop), the host's other threads (the
persistence writer, zmq's I/O thread, ...), the workers, and the bench client
itself (``time.process_time``). A sequential turn's latency is close to the
sum of these, so the split shows where a turn's time goes.

Runs on the bench process's asyncio loop thread (the reads are a few small
files; the client's CPU includes them).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import psutil

__all__ = ["cpu_seconds", "process_tree", "voluntary_switches", "wakeups_per_step"]

_TICKS = os.sysconf("SC_CLK_TCK")


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


def _thread_cpu(stat_path: Path) -> float:
    """User + system CPU seconds of one thread (``/proc/PID/task/TID/stat``)."""
    with contextlib.suppress(OSError, IndexError, ValueError):
        fields = stat_path.read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _TICKS
    return 0.0


def cpu_seconds(pids: list[int]) -> dict[str, float]:
    """CPU seconds so far: ``loop`` the first pid's main thread, ``host_threads`` its
    other threads, ``workers`` every thread of the other pids."""
    totals = {"loop": 0.0, "host_threads": 0.0, "workers": 0.0}
    for index, pid in enumerate(pids):
        for stat in Path(f"/proc/{pid}/task").glob("*/stat"):
            key = "workers" if index else (
                "loop" if stat.parent.name == str(pid) else "host_threads")
            totals[key] += _thread_cpu(stat)
    return totals


async def wakeups_per_step(root_pid: int, step: Callable[[], Awaitable[object]], steps: int,
                           idle_seconds: float) -> tuple[float, dict[str, float]]:
    """Wake-ups per ``step`` of the process tree of ``root_pid`` (warm it up first).

    Returns the count and details: the same split into the root process (the host)
    and its children (the workers), the idle rate (wake-ups/s) that was
    subtracted, the raw count per step, and the CPU microseconds per step of the
    host's loop thread, its other threads, the workers and the client (idle CPU
    not subtracted: it is a few ticks per second at most)."""
    pids = process_tree(root_pid)
    groups = {"host": pids[:1], "workers": pids[1:]}
    before_idle = {name: voluntary_switches(group) for name, group in groups.items()}
    await asyncio.sleep(idle_seconds)
    idle = {name: (voluntary_switches(group) - before_idle[name]) / idle_seconds
            for name, group in groups.items()}
    started = time.perf_counter()
    before = {name: voluntary_switches(group) for name, group in groups.items()}
    cpu_before, client_before = cpu_seconds(pids), time.process_time()
    for _ in range(steps):
        await step()
    client_cpu = time.process_time() - client_before
    cpu = {key: value - cpu_before[key] for key, value in cpu_seconds(pids).items()}
    raw = {name: voluntary_switches(group) - before[name] for name, group in groups.items()}
    elapsed = time.perf_counter() - started
    per_step = {name: (raw[name] - idle[name] * elapsed) / steps for name in groups}
    return sum(per_step.values()), {
        **{f"{key}_cpu_us_per_turn": round(value * 1e6 / steps, 1) for key, value in cpu.items()},
        "client_cpu_us_per_turn": round(client_cpu * 1e6 / steps, 1),
        "host_wakeups_per_turn": round(per_step["host"], 2),
        "workers_wakeups_per_turn": round(per_step["workers"], 2),
        "idle_wakeups_per_s": round(sum(idle.values()), 1),
        "raw_wakeups_per_turn": round(sum(raw.values()) / steps, 2)}
