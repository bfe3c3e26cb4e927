"""``/metrics`` (Prometheus text format) and ``/health`` of the gateway.

Runs on the asyncio loop thread when scraped. Nothing is instrumented on the turn's
path: a custom collector reads the host's own state at scrape time (the live routes,
the turn counts of :mod:`supervisor.turn_stats`, the worker pool with the RSS that
``status`` samples at most once a second, the gateway's connection and refusal
counts). ``prometheus_client`` is imported only here, when the gateway is on.

Metrics:

| name | type | labels |
|---|---|---|
| ``zeroclaw_sessions_live`` | gauge | ``state`` (idle, busy) |
| ``zeroclaw_turns_total`` | counter | ``stop_reason`` (turns committed since start) |
| ``zeroclaw_turn_duration_seconds`` | histogram | |
| ``zeroclaw_workers`` | gauge | |
| ``zeroclaw_worker_rss_bytes`` | gauge | ``pid`` |
| ``zeroclaw_gateway_connections`` | gauge | |
| ``zeroclaw_gateway_auth_failures_total`` | counter | ``reason`` (missing, invalid, rate_limited) |
| ``zeroclaw_uptime_seconds`` | gauge | |
| ``zeroclaw_store_hosts`` | gauge | ``state`` (alive, dead): hosts of a shared store |
| ``zeroclaw_store_host_live_sessions`` | gauge | ``host_id`` (each host's live leases) |
| ``zeroclaw_store_host_heartbeat_age_seconds`` | gauge | ``host_id`` |

The ``zeroclaw_store_host*`` figures are only there on a PostgreSQL store, as of the
host's last pass over ``zeroclaw_hosts`` (:mod:`supervisor.shared_store`, every second).
"""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client.core import (
    CollectorRegistry,
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from supervisor.turn_stats import LATENCY_BUCKETS

if TYPE_CHECKING:
    from supervisor.host_handle import HostHandle
    from supervisor.servers.gateway import GatewayStats
    from supervisor.sessions import Sessions

__all__ = ["HostCollector", "MetricsPage", "health"]


class HostCollector:
    """Reads the host's state when the registry is collected (loop thread)."""

    def __init__(self, host: HostHandle, gateway: GatewayStats) -> None:
        self._host = host
        self._gateway = gateway

    def collect(self) -> Iterator[Metric]:
        yield from self._gateway_metrics()
        sessions = self._host.started()
        if sessions is not None:
            yield from _session_metrics(sessions)
            yield from _turn_metrics(sessions)
            yield from _worker_metrics(sessions)
            yield from _store_host_metrics(sessions)

    def _gateway_metrics(self) -> Iterator[Metric]:
        stats = self._gateway
        yield GaugeMetricFamily("zeroclaw_gateway_connections",
                                "Open ACP connections on the gateway", value=stats.connections)
        failures = CounterMetricFamily("zeroclaw_gateway_auth_failures",
                                       "Gateway requests refused for their token",
                                       labels=["reason"])
        for reason in ("missing", "invalid", "rate_limited"):
            failures.add_metric([reason], stats.auth_failures.get(reason, 0))
        yield failures


def _session_metrics(sessions: Sessions) -> Iterator[Metric]:
    host = sessions.host
    states = Counter(route.status["state"] for route in host.live.routes())
    live = GaugeMetricFamily("zeroclaw_sessions_live", "Live sessions by state",
                             labels=["state"])
    for state in ("idle", "busy"):
        live.add_metric([state], states.get(state, 0))
    yield live
    yield GaugeMetricFamily("zeroclaw_uptime_seconds", "Seconds since the host started",
                            value=time.time() - host.started_at)


def _turn_metrics(sessions: Sessions) -> Iterator[Metric]:
    stats = sessions.host.turn_stats
    turns = CounterMetricFamily("zeroclaw_turns", "Turns committed, by stop reason",
                                labels=["stop_reason"])
    for reason, count in sorted(stats.by_stop_reason.items()):
        turns.add_metric([reason], count)
    yield turns
    cumulative, buckets = 0, []
    for bound, count in zip(LATENCY_BUCKETS, stats.bucket_counts, strict=False):
        cumulative += count
        buckets.append((repr(float(bound)), cumulative))
    buckets.append(("+Inf", sum(stats.bucket_counts)))
    yield HistogramMetricFamily("zeroclaw_turn_duration_seconds",
                                "Duration of committed turns, from start to end",
                                buckets=buckets, sum_value=stats.seconds_total)


def _worker_metrics(sessions: Sessions) -> Iterator[Metric]:
    from supervisor.status import process_figures

    workers = [w for w in sessions.host.pool.info() if w.alive]
    yield GaugeMetricFamily("zeroclaw_workers", "Worker processes alive", value=len(workers))
    rss = GaugeMetricFamily("zeroclaw_worker_rss_bytes", "Resident memory of each worker",
                            labels=["pid"])
    for worker in workers:
        rss.add_metric([str(worker.pid)], process_figures(worker.pid)[0])
    yield rss


def _store_host_metrics(sessions: Sessions) -> Iterator[Metric]:
    watch = sessions.host.shared
    if watch is None:
        return
    rows = watch.hosts
    alive = sum(1 for row in rows if row.alive(watch.ttl_secs))
    count = GaugeMetricFamily("zeroclaw_store_hosts", "Hosts of the shared store, by state",
                              labels=["state"])
    count.add_metric(["alive"], alive)
    count.add_metric(["dead"], len(rows) - alive)
    yield count
    live = GaugeMetricFamily("zeroclaw_store_host_live_sessions",
                             "Live sessions (unexpired leases) of each host", labels=["host_id"])
    age = GaugeMetricFamily("zeroclaw_store_host_heartbeat_age_seconds",
                            "Seconds since each host's last heartbeat", labels=["host_id"])
    for row in rows:
        live.add_metric([row.host_id], row.live_sessions)
        age.add_metric([row.host_id], max(0.0, row.heartbeat_age_secs))
    yield live
    yield age


class MetricsPage:
    """The ``/metrics`` body: one private registry holding the host collector."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self, host: HostHandle, gateway: GatewayStats) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(HostCollector(host, gateway))

    def render(self) -> str:
        return generate_latest(self.registry).decode()


async def health(host: HostHandle) -> tuple[bool, dict[str, Any]]:
    """``(healthy, body)``: the host is up, its store writable, every worker responsive."""
    sessions = host.started()
    if sessions is None:
        starting = host.starting is not None and not host.starting.done()
        return False, {"status": "unhealthy",
                       "reasons": ["the host is starting" if starting else "the host is down"]}
    from supervisor.status import host_status

    reasons = _store_problems(sessions)
    workers = host_status(sessions, host.owners)["workers"]
    if not workers:
        reasons.append("no worker process is running")
    silent = [w["pid"] for w in workers if not w["responsive"]]
    if silent:
        reasons.append(f"worker(s) not responsive: {', '.join(map(str, silent))}")
    body: dict[str, Any] = {"status": "ok" if not reasons else "unhealthy", "reasons": reasons,
                            "workers": len(workers), "sessions": len(sessions.host.live.routes())}
    return not reasons, body


def _store_problems(sessions: Sessions) -> list[str]:
    store = sessions.host.store
    if not store.persistent:
        return ["the session store is not persistent (sessions are kept in memory only)"]
    try:
        store.check_file()
    except Exception as exc:
        return [str(exc)]
    if store.url is not None:  # a PostgreSQL store: its writes report their own errors
        return []
    if not os.access(store.path, os.W_OK) or not os.access(store.path.parent, os.W_OK):
        return ["the session store is not writable"]
    return []
