"""SupervisorActor: the host's slow process work, off the asyncio loop.

Runs on its own pykka thread. The loop keeps the live-session table itself
(:mod:`supervisor.core.live`: admission, LRU, placement and the idle sweep are
decided there, with no thread hop on a request's path); this actor gets the work
that blocks or scans the system, as typed messages (:mod:`actors.bridge`), each
answered with its own type:

- :class:`StartWorker` → ``subprocess.Popen``: start a worker process (the fork
  and exec block; the pool asks for one as it grows, see
  :class:`supervisor.workers.workers.WorkerPool`).
- :class:`EndOrphans` → ``tuple[int, ...]``: kill and reap what dead workers'
  tool commands left behind (:func:`supervisor.workers.orphans.end_orphans`: it reads
  ``/proc`` and signals process groups), told when a worker exits and every few
  seconds.
"""

from __future__ import annotations

import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from actors.bridge import MessageActor, Request
from supervisor.workers.orphans import end_orphans
from supervisor.workers.workers import start_worker_process

__all__ = ["EndOrphans", "StartWorker", "SupervisorActor"]


@dataclass(frozen=True, slots=True)
class StartWorker(Request[subprocess.Popen[bytes]]):
    """Start a worker process with ``argv`` and exactly ``env``; answered with it."""

    argv: tuple[str, ...]
    env: Mapping[str, str]


@dataclass(frozen=True, slots=True)
class EndOrphans(Request[tuple[int, ...]]):
    """End the host's adopted orphans; answered with the pids ended."""


class SupervisorActor(MessageActor):
    """Every method runs on the actor's thread."""

    def handle(self, message: Request[Any]) -> Any:
        match message:
            case StartWorker(argv=argv, env=env):
                return start_worker_process(list(argv), dict(env))
            case EndOrphans():
                return tuple(end_orphans())
        raise TypeError(f"SupervisorActor does not take {type(message).__name__}")
