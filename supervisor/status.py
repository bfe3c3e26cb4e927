"""The ``status`` answer (SPEC §4 shape), shared by every transport.

Runs on the asyncio loop thread. Session data comes from the SupervisorActor's
snapshot, worker data from the pool plus psutil (Process objects are kept, since
the first ``cpu_percent()`` of a new one is always 0.0).
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any

import psutil

from supervisor import __version__

if TYPE_CHECKING:
    from supervisor.sessions import Sessions

__all__ = ["host_status"]

_processes: dict[int, psutil.Process] = {}


def _process_figures(pid: int) -> tuple[int, float]:
    process = _processes.get(pid)
    try:
        if process is None:
            process = _processes[pid] = psutil.Process(pid)
        with process.oneshot():
            return process.memory_info().rss, process.cpu_percent(None)
    except psutil.Error:
        _processes.pop(pid, None)
        return 0, 0.0


async def host_status(sessions: Sessions) -> dict[str, Any]:
    host = sessions.host
    snapshot = await host.supervise("snapshot")
    per_worker: dict[str, int] = {}
    for s in snapshot:
        if s.worker_id:
            per_worker[s.worker_id] = per_worker.get(s.worker_id, 0) + 1
    workers = []
    for w in host.pool.info():
        rss, cpu = _process_figures(w.pid)
        workers.append({"pid": w.pid, "rssBytes": rss, "cpuPercent": cpu,
                        "sessions": per_worker.get(w.worker_id, 0)})
    settings = host.settings
    return {
        "serverVersion": __version__,
        "protocolVersion": 1,
        "pid": os.getpid(),
        "uptimeSecs": round(time.time() - host.started_at, 3),
        "activeSessions": len(snapshot),
        "sessions": [
            {"sessionId": s.sid, "agentAlias": s.agent_alias, "state": s.state,
             "clients": s.clients, "lastActivity": s.last_activity, "turns": s.turns}
            for s in snapshot
        ],
        "workers": workers,
        "limits": {"maxSessions": settings.max_sessions,
                   "sessionTimeoutSecs": settings.session_timeout_secs},
        "store": {"path": str(host.store.path), "persistent": host.store.persistent},
    }
