"""Process trees: the one place that starts the processes a session runs and ends them.

A hosted agent, a shell command, a terminal of a hosted agent (and, through the agent,
its MCP servers) each run as one *tree*: :func:`start` runs the command under
:mod:`actors.worker.tree_exec`, a small launcher that is a child subreaper (every
orphan of the tree, even one that called ``setsid``, stays in the tree), that ends the
whole tree when its command exits, when asked (SIGTERM), and when the thread that
started it ends (its worker died). :func:`end` ends a tree now: SIGTERM to the launcher,
its grace, then :func:`kill_tree` (every descendant stopped, then killed).

A worker is itself a child subreaper (:func:`become_subreaper`, at start): what escapes
a tree whose launcher was killed is re-parented to it, and :func:`end_adopted` (each
heartbeat, and for all of them at exit) ends it. The host is a subreaper too and ends
what a dead worker left with the same :func:`kill_tree` (:mod:`supervisor.workers.orphans`).

Safe from any thread: :func:`start` and :func:`end_adopted` share a lock, so a tree
just started is never taken for an orphan.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

__all__ = ["become_subreaper", "children", "command_pid", "end", "end_adopted", "end_all",
           "has_exited", "is_zombie", "kill_tree", "start"]

_PR_SET_CHILD_SUBREAPER = 36
_LAUNCHER = Path(__file__).with_name("tree_exec.py")
#: What :func:`end` waits past the tree's own grace for its launcher to finish.
_LAUNCHER_MARGIN_SECS = 0.5
#: How long :func:`end_all` waits for what it killed to die.
_REAP_SECS = 1.0
_lock = threading.Lock()
_trees: dict[int, subprocess.Popen[bytes]] = {}  # launchers of this process, by pid


def become_subreaper() -> bool:
    """Adopt orphaned descendants (Linux); False where the kernel refuses."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


def start(argv: list[str], *, grace: float = 0.0, **popen: Any) -> subprocess.Popen[bytes]:
    """``argv`` as a tree of its own (``popen``: :class:`subprocess.Popen`'s other
    arguments); the Popen is its launcher's, in a session of its own. On SIGTERM
    the tree gets ``grace`` seconds before it is killed."""
    launcher = [sys.executable, "-I", "-S", str(_LAUNCHER), str(os.getpid()), f"{grace:g}",
                *argv]
    with _lock:
        proc = subprocess.Popen(launcher, start_new_session=True, **popen)
        _trees[proc.pid] = proc
    return proc


def has_exited(proc: subprocess.Popen[bytes]) -> bool:
    """True once the launcher has exited, without reaping it (its pid still names it)."""
    if proc.returncode is not None:
        return True
    try:
        info = os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return True
    return info is not None


def end(proc: subprocess.Popen[bytes], grace: float = 0.0) -> int:
    """End the tree of ``proc`` (a :func:`start`) and reap its launcher; its exit status.
    SIGTERM to the launcher, which ends it within ``grace``; what is still there after
    that (and a margin) is killed."""
    if not has_exited(proc):
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace + _LAUNCHER_MARGIN_SECS
        while not has_exited(proc) and time.monotonic() < deadline:
            time.sleep(0.005)
    if not has_exited(proc):
        kill_tree(proc.pid)
    status = proc.wait()
    with _lock:
        _trees.pop(proc.pid, None)
    return status


def children(pid: int | None = None) -> list[int]:
    """The direct children of ``pid`` (this process: of any of its threads)."""
    found: list[int] = []
    pid = os.getpid() if pid is None else pid
    with contextlib.suppress(OSError):
        for task in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError), open(
                    f"/proc/{pid}/task/{task}/children", encoding="ascii") as listing:
                found.extend(int(p) for p in listing.read().split())
    return found


def command_pid(proc: subprocess.Popen[bytes]) -> int | None:
    """The pid of the command a :func:`start` runs (its launcher's first child: the
    one that started first), or None when it is not (or no longer) running."""
    def started(pid: int) -> int:
        try:
            with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as stat:
                return int(stat.read().rpartition(")")[2].split()[19])
        except (OSError, IndexError, ValueError):
            return 1 << 62
    found = children(proc.pid)
    return min(found, key=started) if found else None


def _adopted_children() -> list[int]:
    """The children of this process's main thread: the kernel re-parents an orphan to
    a subreaper's first live thread, the main one (one file to read, not one per thread:
    a worker has a thread per session)."""
    pid = os.getpid()
    try:
        with open(f"/proc/{pid}/task/{pid}/children", encoding="ascii") as listing:
            return sorted(int(p) for p in listing.read().split())
    except OSError:
        return []


def kill_tree(pid: int) -> list[int]:
    """SIGKILL ``pid`` and all its descendants; the pids signalled. Each is stopped
    first (SIGSTOP), walking the tree again until it holds no new one, so none can
    fork, nor be re-parented out of the walk, before the kill."""
    stopped: list[int] = []
    seen: set[int] = set()
    frontier = [pid]
    while frontier:
        fresh = [p for p in frontier if p not in seen]
        for p in fresh:
            seen.add(p)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(p, signal.SIGSTOP)
                stopped.append(p)
        frontier = [c for p in fresh for c in children(p)]
        if not frontier:  # one more look: a fork may have finished during the walk
            frontier = [c for p in stopped for c in children(p) if c not in seen]
    for p in stopped:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(p, signal.SIGKILL)
    return stopped


def is_zombie(pid: int) -> bool:
    """Whether ``pid`` has exited and waits to be reaped (or is gone)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as stat:
            return stat.read().rpartition(")")[2].split()[0] in ("Z", "X")
    except (OSError, IndexError):
        return True


def end_adopted(wait: float = 0.0) -> list[int]:
    """Kill (as trees) and reap the children of this process that it did not start:
    those in another session than its own that are no live :func:`start`; the pids of
    those that were still running (zombies are reaped quietly). Waits up to ``wait``
    seconds for the killed to die; one still dying is reaped the next time."""
    own_session = os.getsid(0)
    ended: list[int] = []
    with _lock:
        for pid in [p for p, proc in _trees.items() if proc.returncode is not None]:
            del _trees[pid]  # reaped elsewhere (Popen.wait): that pid is no longer ours
        adopted = []
        for pid in _adopted_children():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                if pid not in _trees and os.getsid(pid) != own_session:
                    adopted.append(pid)
        for pid in adopted:
            if not is_zombie(pid):
                kill_tree(pid)
                ended.append(pid)
    _reap(adopted, time.monotonic() + (wait if ended else 0.0))
    return ended


def end_all() -> list[int]:
    """Every process this one started or adopted (in another session), killed as trees
    and reaped: the worker's last act. The pids of the adopted that were still running."""
    with _lock:
        trees = list(_trees.values())
        _trees.clear()
    killed = [p for proc in trees if not has_exited(proc) for p in kill_tree(proc.pid)]
    for proc in trees:
        with contextlib.suppress(ChildProcessError):
            proc.wait()
    deadline = time.monotonic() + _REAP_SECS
    while any(not is_zombie(p) for p in killed) and time.monotonic() < deadline:
        time.sleep(0.005)  # what the trees held dies before this process exits
    return end_adopted(_REAP_SECS)


def _reap(pids: list[int], deadline: float) -> None:
    """Collect the exit statuses of ``pids`` (children of this process), waiting for
    them until ``deadline`` at most."""
    waiting = list(pids)
    while waiting:
        for pid in list(waiting):
            try:
                if os.waitpid(pid, os.WNOHANG)[0] != 0:
                    waiting.remove(pid)
            except ChildProcessError:
                waiting.remove(pid)
        if not waiting or time.monotonic() >= deadline:
            return
        time.sleep(0.005)
