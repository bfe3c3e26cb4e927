"""The human side of ``scripts/bench``: the result table, ``--compare``, the exit status.

Pure functions of result objects (see :mod:`bench_lib` for the format); run on
the bench process's main thread.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["compare_results", "exit_status", "format_table"]


def _number(value: float | None) -> str:
    if value is None or math.isnan(value):
        return "-"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.1f}" if abs(value) >= 10 else f"{value:.2f}"


def _ratio(ratio: float | None) -> str:
    if ratio is None:
        return "-"
    return f"{ratio:.0f}x" if ratio >= 100 else f"{ratio:.2f}x"


def _latencies(entry: dict[str, Any]) -> str:
    sides = [f"{_number(entry.get(f'{side}_p50_ms'))}/{_number(entry.get(f'{side}_p99_ms'))}"
             for side in ("zeroclaw", "floor") if f"{side}_p50_ms" in entry]
    return " | ".join(sides)


def _ok(entry: dict[str, Any]) -> str:
    if "zeroclaw_error" in entry:
        return "failed"
    return {True: "yes", False: "NO", None: ""}[entry.get("ok")]


def _columns(rows: Sequence[Sequence[str]], left: int) -> list[str]:
    """Rows as aligned text: the first ``left`` columns left-aligned, the others right."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) if i < left else cell.rjust(w)
                       for i, (cell, w) in enumerate(zip(row, widths, strict=True))).rstrip()
             for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return lines


def _cpu_split(entry: dict[str, Any]) -> str:
    """CPU µs per operation, server (host alone, where it has children) + client."""
    sides = []
    for side in ("zeroclaw", "card", "design", "floor"):
        server, host = entry.get(f"{side}_server_cpu_us"), entry.get(f"{side}_host_cpu_us")
        if server is None:
            continue
        own = f" (host {host:.1f})" if host is not None and host != server else ""
        sides.append(f"{side} {server:.1f}{own} + {entry[f'{side}_client_cpu_us']:.1f}")
    return "CPU µs per operation, server + client: " + "; ".join(sides)


def _turn_cpu_split(entry: dict[str, Any]) -> str:
    """Where a sequential turn's CPU goes, per side: the host's loop thread, its other
    threads, the workers and the client (the wake-up measurement's details)."""
    sides = []
    for side in ("zeroclaw", "card", "design", "floor"):
        if entry.get(f"{side}_loop_cpu_us_per_turn") is None:
            continue
        parts = [entry[f"{side}_{key}_cpu_us_per_turn"]
                 for key in ("loop", "host_threads", "workers", "client")]
        sides.append(f"{side} {parts[0]:.0f} loop + {parts[1]:.0f} host threads +"
                     f" {parts[2]:.0f} workers + {parts[3]:.0f} client = {sum(parts):.0f}")
    return "; ".join(sides)


def _notes(metrics: dict[str, Any]) -> list[str]:
    notes = []
    for entry in metrics.values():
        if entry.get("zeroclaw_stored") is not None:
            notes.append(f"  {entry['title']}: {entry['zeroclaw_stored']:,} of"
                         f" {entry['zeroclaw_answered']:,} answered turns found in the store"
                         " (the floor's rate: answered turns, it stores nothing)")
        if entry.get("zeroclaw_listed") is not None:
            notes.append(f"  {entry['title']}: status listed {entry['zeroclaw_listed']:,}"
                         " live sessions")
        if entry.get("zeroclaw_host_wakeups_per_turn") is not None:
            sides = [f"{side} {entry[f'{side}_host_wakeups_per_turn']:.1f} host +"
                     f" {entry[f'{side}_workers_wakeups_per_turn']:.1f} worker"
                     for side in ("zeroclaw", "card", "design", "floor")
                     if entry.get(f"{side}_host_wakeups_per_turn") is not None]
            notes.append(f"  {entry['title']}: " + "; ".join(sides))
            notes.append(f"  CPU µs per sequential turn: {_turn_cpu_split(entry)}")
        if entry.get("zeroclaw_updates_per_turn") is not None:
            notes.append(f"  {entry['title']}: zeroclaw sent {entry['zeroclaw_updates_per_turn']:,}"
                         " updates per turn (chunks merge while the client lags)")
        if entry.get("zeroclaw_workers_cpu_us") is not None:
            notes.append(f"  {entry['title']}: CPU µs per delta: zeroclaw's worker"
                         f" {entry['zeroclaw_workers_cpu_us']:.2f}, host"
                         f" {entry['zeroclaw_host_cpu_us']:.2f}, model server"
                         f" {entry['zeroclaw_model_server_cpu_us']:.2f}; the floor"
                         f" {entry['floor_host_cpu_us']:.2f}")
        if entry.get("zeroclaw_server_cpu_us") is not None:
            notes.append(f"  {entry['title']}: {_cpu_split(entry)}")
        if entry.get("zeroclaw_processes") is not None:
            notes.append(f"  {entry['title']}: {entry['zeroclaw_processes']} processes"
                         " (host + workers)")
    return notes


def format_table(result: dict[str, Any]) -> str:
    """One row per metric: zeroclaw, the echo floor, zeroclaw / floor, the design floor and
    zeroclaw / design (where measured), targets, latencies; then notes and errors."""
    rows = [("section", "metric", "unit", "zeroclaw", "floor", "zc/floor", "design",
             "zc/design", "card", "zc/card", "target", "ok", "p50/p99 ms zeroclaw | floor")]
    for entry in result["metrics"].values():
        targets = ", ".join(t for t in (entry["target"], entry.get("design_target")) if t)
        rows.append((entry["section"], entry["title"], entry["unit"], _number(entry["zeroclaw"]),
                     _number(entry["floor"]), _ratio(entry["ratio"]),
                     _number(entry.get("design")), _ratio(entry.get("design_ratio")),
                     _number(entry.get("card")), _ratio(entry.get("card_ratio")),
                     targets, _ok(entry), _latencies(entry)))
    lines = _columns(rows, left=3)
    notes = _notes(result["metrics"])
    errors = [f"  {entry['title']}: {side} failed: {entry[f'{side}_error']}"
              for entry in result["metrics"].values()
              for side in ("zeroclaw", "floor", "design", "card") if f"{side}_error" in entry]
    errors += [f"  {section}: {error}" for section, error in result.get("errors", {}).items()]
    scope = f"{'quick' if result.get('quick') else 'full'} run, {result.get('cpus')} CPUs,"
    lines.append(f"({scope} {result.get('elapsed_secs', 0):.0f} s; best of"
                 f" {result.get('rounds')} alternated rounds per rate)")
    return "\n".join(lines + (["", "notes:", *notes] if notes else [])
                     + (["", "errors:", *errors] if errors else []))


def _change(a: float | None, b: float | None) -> float | None:
    return b / a - 1 if a and b is not None else None


def _percent(change: float | None) -> str:
    return f"{change:+.1%}" if change is not None else "-"


def _verdict(entry: dict[str, Any], change: float) -> str:
    if change == 0:
        return "same"
    higher_is_better = entry.get("better", "higher") == "higher"
    return "better" if (change > 0) == higher_is_better else "worse"


def compare_results(before: dict[str, Any], after: dict[str, Any],
                    names: tuple[Path, Path]) -> str:
    """Per metric of either result: A, B, the change of zeroclaw's value, better or worse
    (rates: higher is better; latencies and RSS: lower), zeroclaw / floor A -> B, and the
    floor's own change (how much of the change is the machine rather than zeroclaw)."""
    rows = [("metric", "unit", "A", "B", "change", "verdict", "zc/floor A -> B",
             "zc/design A -> B", "zc/card A -> B", "floor change")]
    names_in_order = list(before["metrics"]) + [
        name for name in after["metrics"] if name not in before["metrics"]]
    for name in names_in_order:
        old, new = before["metrics"].get(name, {}), after["metrics"].get(name, {})
        entry = new or old
        title = f"{entry.get('section', '')} {entry.get('title', name)}".strip()
        a, b = old.get("zeroclaw"), new.get("zeroclaw")
        change = _change(a, b)
        rows.append((title, entry.get("unit", ""), _number(a), _number(b),
                     _percent(change),
                     _verdict(entry, change) if change is not None else "-",
                     f"{_ratio(old.get('ratio'))} -> {_ratio(new.get('ratio'))}",
                     f"{_ratio(old.get('design_ratio'))} -> {_ratio(new.get('design_ratio'))}",
                     f"{_ratio(old.get('card_ratio'))} -> {_ratio(new.get('card_ratio'))}",
                     _percent(_change(old.get("floor"), new.get("floor")))))
    header = [f"{label}: {path} (started {result.get('started')},"
              f" {'quick' if result.get('quick') else 'full'} run)"
              for label, path, result in (("A", names[0], before), ("B", names[1], after))]
    return "\n".join([*header, "", *_columns(rows, left=2)])


def exit_status(result: dict[str, Any]) -> int:
    """0: every metric measured and every target met; 1: a measurement failed;
    2: all measured, but a target was missed."""
    metrics = result["metrics"].values()
    if result.get("errors") or any(f"{side}_error" in e for e in metrics
                                   for side in ("zeroclaw", "floor", "design", "card")):
        return 1
    return 2 if any(entry.get("ok") is False for entry in metrics) else 0
