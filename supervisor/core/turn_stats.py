"""Counts of the turns this host committed, by stop reason, and their durations.

Runs on the asyncio loop thread. Recording a turn is a dict update and a bisect into
fixed buckets (no metrics library on the turn's path); ``/metrics`` reads these
figures when it is scraped (:mod:`supervisor.ops.metrics`).
"""

from __future__ import annotations

import bisect
from collections import Counter
from dataclasses import dataclass, field
from typing import Final

__all__ = ["LATENCY_BUCKETS", "TurnStats"]

LATENCY_BUCKETS: Final = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
                          60.0, 120.0, 300.0)
"""Upper bounds (seconds) of the turn-duration histogram; a last bucket takes the rest."""


@dataclass(slots=True)
class TurnStats:
    """``committed``: every turn; ``by_tenant``: each gateway tenant's ("" the owner's)."""

    by_stop_reason: Counter[str] = field(default_factory=Counter)
    bucket_counts: list[int] = field(default_factory=lambda: [0] * (len(LATENCY_BUCKETS) + 1))
    seconds_total: float = 0.0
    committed: int = 0
    by_tenant: Counter[str] = field(default_factory=Counter)

    def record(self, stop_reason: str, seconds: float, tenant: str | None = None) -> None:
        """A turn of ``tenant``'s session was committed; ``seconds`` from its start to its
        end."""
        seconds = max(0.0, seconds)
        self.committed += 1
        self.by_tenant[tenant or ""] += 1
        self.by_stop_reason[stop_reason] += 1
        self.bucket_counts[bisect.bisect_left(LATENCY_BUCKETS, seconds)] += 1
        self.seconds_total += seconds
