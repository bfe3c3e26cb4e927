"""The ``status`` answer (SPEC §4 shape), shared by every transport.

Runs on the asyncio loop thread and waits on nothing: the session entries are
the loop's own view of the live sessions (each route's entry, updated as its turns
are admitted and settled), so ``status`` never asks the supervisor, a worker or
the writer, and a prompt's answer is never followed by a status that still shows
its turn running. On the daemon socket the session list goes out as JSON kept
encoded between calls (:mod:`supervisor.status_book`): with thousands of idle
sessions, a call re-encodes only what changed. Worker figures come from the pool
plus psutil, sampled at most once a second per worker (Process objects are kept, since the
first ``cpu_percent()`` of a new one is always 0.0). Each worker lists its hosted
agent processes as its last heartbeat named them (restarts are the worker's count),
with psutil figures sampled the same way, as are the host process's own
(``rssBytes``, ``cpuPercent``). ``usage`` is the host's running totals
(:mod:`supervisor.usage`); each session entry has its own. ``turnsCommitted``
counts the turns committed since the host started (a rate is its difference
between two answers).
"""

from __future__ import annotations

import os
import time
import weakref
from collections import Counter
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import orjson
import psutil

from supervisor import __version__
from supervisor.status_book import SessionStatusBook

if TYPE_CHECKING:
    from ipc.worker_wire import AgentProcessEntry
    from supervisor.live import LiveTable
    from supervisor.ownership import Owners
    from supervisor.routes import Route
    from supervisor.sessions import Sessions

__all__ = ["host_status", "process_figures"]

_processes: dict[int, psutil.Process] = {}


_SILENT_BEATS = 2.0  # a worker silent this many heartbeats is reported unresponsive
_SAMPLE_SECS = 1.0
_samples: dict[int, tuple[float, int, float]] = {}  # pid -> (taken at, rss, cpu%)
_books: weakref.WeakKeyDictionary[LiveTable, SessionStatusBook] = weakref.WeakKeyDictionary()


def _session_entries(routes: list[Route],
                     owners: Owners) -> tuple[list[dict[str, Any]], Counter[str]]:
    """The wire entries of the live sessions (each route keeps its own up to date;
    see :class:`supervisor.routes.Route`), and how many sessions each worker hosts.
    ``status`` is polled every second, with thousands of sessions: no copies."""
    entries = [route.status for route in routes]
    count = owners.count
    for entry in entries:
        entry["clients"] = count(entry["sessionId"])
    return entries, Counter(route.worker_id for route in routes)


def process_figures(pid: int) -> tuple[int, float]:
    """RSS and CPU% of ``pid``, sampled at most once a second (cheap to poll)."""
    now = time.monotonic()
    sample = _samples.get(pid)
    if sample is not None and now - sample[0] < _SAMPLE_SECS:
        return sample[1], sample[2]
    process = _processes.get(pid)
    try:
        if process is None:
            process = _processes[pid] = psutil.Process(pid)
        with process.oneshot():
            rss, cpu = process.memory_info().rss, process.cpu_percent(None)
    except psutil.Error:
        _processes.pop(pid, None)
        _samples.pop(pid, None)
        return 0, 0.0
    _samples[pid] = (now, rss, cpu)
    return rss, cpu


def _forget_gone(shown: set[int]) -> None:
    """Drop the kept Process objects of processes no longer shown (replaced workers,
    restarted agents), so they do not pile up in a long-running host."""
    if len(_processes) > len(shown):
        for pid in [pid for pid in _processes if pid not in shown]:
            _processes.pop(pid, None)
            _samples.pop(pid, None)


def _agent_entry(agent: AgentProcessEntry) -> dict[str, Any]:
    """A worker's agent process (from its last heartbeat) with the host's psutil figures."""
    rss, cpu = process_figures(agent["pid"])
    return {"agentAlias": agent["alias"], "pid": agent["pid"], "rssBytes": rss,
            "cpuPercent": cpu, "sessions": agent["sessions"], "restarts": agent["restarts"],
            "sandbox": agent.get("confinement", "none")}


def _encoded_entries(live: LiveTable, owners: Owners) -> tuple[orjson.Fragment, int,
                                                                dict[str, int]]:
    """The wire entries as one JSON fragment (encoded once per change), how many,
    and how many sessions each worker hosts."""
    book = _books.get(live)
    if book is None:
        book = _books[live] = SessionStatusBook()
    entries = orjson.Fragment(book.sessions_json(live, owners))
    return entries, len(book), {w: len(sids) for w, sids in live.by_worker.items()}


def host_status(sessions: Sessions, owners: Owners, *,
                encoded_sessions: bool = False) -> dict[str, Any]:
    """The ``status`` result; ``clients`` of a session = connections holding it.
    ``encoded_sessions``: ``sessions`` is an ``orjson.Fragment`` (for a caller that
    only sends the answer), kept encoded between calls as long as nothing changed."""
    host = sessions.host
    entries: list[dict[str, Any]] | orjson.Fragment
    per_worker: Mapping[str, int]
    if encoded_sessions:
        entries, active, per_worker = _encoded_entries(host.live, owners)
    else:
        entries, per_worker = _session_entries(host.live.routes(), owners)
        active = len(entries)
    pool = host.pool
    now = time.monotonic()
    silent_after = _SILENT_BEATS * pool.heartbeat_secs
    workers, infos = [], pool.info()
    for w in infos:
        rss, cpu = process_figures(w.pid)
        responsive = w.alive and (not w.ready or now - w.last_beat <= silent_after)
        workers.append({"pid": w.pid, "rssBytes": rss, "cpuPercent": cpu,
                        "sessions": per_worker.get(w.worker_id, 0), "responsive": responsive,
                        "agents": [_agent_entry(a) for a in w.agents]})
    pid = os.getpid()
    _forget_gone({pid} | {w.pid for w in infos} | {a["pid"] for w in infos for a in w.agents})
    rss, cpu = process_figures(pid)
    settings = host.settings
    return {
        "serverVersion": __version__,
        "protocolVersion": 1,
        "pid": pid,
        "rssBytes": rss,
        "cpuPercent": cpu,
        "uptimeSecs": round(time.time() - host.started_at, 3),
        "turnsCommitted": host.turn_stats.committed,
        "activeSessions": active,
        "sessions": entries,
        "workers": workers,
        "usage": host.usage.to_wire(),
        "limits": {"maxSessions": settings.max_sessions,
                   "sessionTimeoutSecs": settings.session_timeout_secs},
        "store": {"path": host.store.where, "backend": host.store.backend,
                  "persistent": host.store.persistent, "lastCommit": host.store.last_commit},
        "hostId": settings.host_id,
        **({"hosts": host.shared.hosts_wire()} if host.shared is not None else {}),
        "sandbox": {**host.sandbox.to_wire(),
                    "allowUnsandboxedShell": settings.allow_unsandboxed_shell},
    }
