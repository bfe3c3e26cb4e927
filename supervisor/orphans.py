"""Leftovers of dead workers: the host adopts and ends them.

A tool's process (``shell`` runs commands in their own process group so it can
kill them as a whole) would outlive a worker that is killed mid-turn, re-parented
to PID 1. The host marks itself a *child subreaper*, so such processes become its
children instead; :func:`end_orphans` then kills their process groups and reaps
them (when a worker exits, and every few seconds for stragglers). Runs on the
SupervisorActor's thread (:class:`supervisor.supervisor.EndOrphans`), off the
loop, and never blocks (``WNOHANG`` reaping).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal

__all__ = ["become_subreaper", "end_orphans"]

log = logging.getLogger("zeroclaw.orphans")

_PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> bool:
    """Adopt orphaned descendants (Linux); False where the kernel refuses."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


def _children() -> set[int]:
    """Direct children of this process, whichever of its threads they belong to."""
    children: set[int] = set()
    with contextlib.suppress(OSError):
        for task in os.listdir("/proc/self/task"):
            with contextlib.suppress(OSError), open(
                f"/proc/self/task/{task}/children", encoding="ascii"
            ) as fh:
                children.update(int(p) for p in fh.read().split())
    return children


def end_orphans() -> list[int]:
    """Kill (by process group) and reap adopted children that run in a session of their own.

    Workers share the host's session; a tool command starts a new one (so its whole
    group can be killed). A child of the host in another session is therefore a
    command whose worker is gone. Starting or exiting workers are never touched.
    """
    own_session = os.getsid(0)
    ended = []
    for pid in sorted(_children()):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if os.getsid(pid) == own_session:
                continue
            with contextlib.suppress(ProcessLookupError):
                os.killpg(os.getpgid(pid), signal.SIGKILL)
            ended.append(pid)
    _reap(ended)
    if ended:
        log.warning("ended %d process(es) left behind by a dead worker", len(ended))
    return ended


def _reap(pids: list[int]) -> None:
    """Collect the exit statuses; one still dying is left for the next sweep."""
    for pid in pids:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
