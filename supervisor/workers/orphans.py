"""Leftovers of dead workers: the host adopts and ends them.

A worker ends every process it started or adopted before it exits
(:mod:`actors.worker.process_tree`), but one that is killed cannot: its agents' and
commands' process trees (each in a session of its own) are re-parented to PID 1.
The host marks itself a *child subreaper*, so they become its children instead;
:func:`end_orphans` then kills each as a whole tree and reaps it (when a worker
exits, and every few seconds for stragglers). Runs on the SupervisorActor's thread
(:class:`supervisor.workers.supervisor.EndOrphans`), off the loop, and never blocks.
"""

from __future__ import annotations

import logging

from actors.worker.process_tree import become_subreaper, end_adopted

__all__ = ["become_subreaper", "end_orphans"]

log = logging.getLogger("zeroclaw.orphans")


def end_orphans() -> list[int]:
    """Kill (as trees) and reap adopted children that run in a session of their own;
    the pids of those that were still running.

    Workers share the host's session; every tree a worker starts has one of its own.
    A child of the host in another session is therefore what a dead worker left.
    Starting or exiting workers are never touched, and zombies (a tree that ended by
    itself as its worker exited) are reaped without a word: the warning names only
    processes that were still running.
    """
    ended = end_adopted()
    if ended:
        log.warning("ended %d process(es) left behind by a dead worker", len(ended))
    return ended
