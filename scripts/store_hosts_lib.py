"""``store_backends.py --two-hosts``: two ``zeroclaw daemon`` hosts on one PostgreSQL
database against one host on it, and how long a dead host's session takes to move.

Runs on the bench process's asyncio loop (the clients) and one sampling thread (the
database's lock waits). Each case has a fresh database on the server of ``--url``:

- **one host / two hosts**: ``clients`` connections with one session each prompt turn
  after turn (the echo agent), all on one host, or half on each of two hosts at once.
  Reported: total turns per second, the database's commits per second
  (``pg_stat_database``), how often a sample of ``pg_locks`` found a lock waited for
  and the most waiting at once, the connections the hosts hold, and the server's CPU
  per turn (its backends serving the database, when the server runs on this machine).
- **takeover**: a session made and prompted on host 1 (``lease_ttl_secs`` = ``ttl``),
  host 1 killed with SIGKILL, then host 2 is prompted for the session until it answers
  (-32004 until host 1's lease expires): seconds from the kill to that answer, against
  the TTL + 1 s of the issue.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import psycopg
from bench_daemon_lib import settle, turn_rate
from bench_lib import BenchSizes, new_session, prompt
from bench_rpc_lib import RpcFailure, RpcPeer
from load_lib import Daemon, started_daemon

__all__ = ["two_hosts"]

SAMPLE_SECS = 0.05


def store_config(url: str, ttl: float = 30.0) -> str:
    return f'[store]\nurl = "{url}"\nlease_ttl_secs = {ttl}\n'


@contextmanager
def hosts(url: str, count: int, ttl: float = 30.0) -> Iterator[list[Daemon]]:
    with ExitStack() as stack:
        daemons = [stack.enter_context(started_daemon(400, lambda: False,
                                                      store_config(url, ttl)))
                   for _ in range(count)]
        for daemon in daemons:
            settle(daemon)
        yield daemons


class LockWaits:
    """Samples ``pg_locks`` for locks not granted, on a connection of its own."""

    def __init__(self, url: str) -> None:
        self._conn = psycopg.connect(url, autocommit=True)
        self._stop = threading.Event()
        self.samples = 0
        self.waiting = 0  # samples that found a lock waited for
        self.most = 0
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_SECS):
            row = self._conn.execute("SELECT count(*) FROM pg_locks WHERE NOT granted "
                                     "AND database = (SELECT oid FROM pg_database WHERE "
                                     "datname = current_database())").fetchone()
            found = int(row[0]) if row else 0
            self.samples += 1
            self.waiting += found > 0
            self.most = max(self.most, found)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._conn.close()


@dataclass(frozen=True, slots=True)
class DbState:
    commits: int
    connections: int
    backend_cpu: float  # seconds, the server's processes serving the database


def db_state(url: str) -> DbState:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT pg_stat_clear_snapshot()")
        commits = conn.execute("SELECT xact_commit FROM pg_stat_database "
                               "WHERE datname = current_database()").fetchone()
        pids = [int(pid) for pid, in conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> pg_backend_pid()").fetchall()]
    cpu = 0.0
    for pid in pids:  # only when the server runs here
        try:
            times = psutil.Process(pid).cpu_times()
            cpu += times.user + times.system
        except psutil.Error:
            pass
    return DbState(int(commits[0]) if commits else 0, len(pids), cpu)


def measure(url: str, count: int, clients: int, sizes: BenchSizes) -> dict[str, float]:
    with hosts(url, count) as daemons:
        paths = [daemon.socket_path for daemon in daemons]
        share = clients // count

        async def run() -> tuple[float, int]:
            samples = await asyncio.gather(*(turn_rate(share, sizes, p) for p in paths))
            return sum(sample.value for sample in samples), sum(s.count for s in samples)

        asyncio.run(turn_rate(share, BenchSizes(min_seconds=0.5, turns_each=3), paths[0]))
        before = db_state(url)
        waits = LockWaits(url)
        started = time.perf_counter()
        rate, turns = asyncio.run(run())
        seconds = time.perf_counter() - started
        waits.stop()
        time.sleep(1.2)  # the backends report their commits about once a second
        after = db_state(url)
    return {"turns/s": rate, "db commits/s": (after.commits - before.commits) / seconds,
            "db commits/turn": (after.commits - before.commits) / max(1, turns),
            "lock-wait samples %": 100 * waits.waiting / max(1, waits.samples),
            "most locks waiting": waits.most, "db connections": before.connections,
            "db cpu us/turn": 1e6 * (after.backend_cpu - before.backend_cpu) / max(1, turns)}


async def _first_answer(path: Path, sid: str, deadline: float) -> None:
    peer = await RpcPeer.connect(path)
    try:
        await peer.request("initialize", {"protocolVersion": 1})
        while True:
            try:
                await prompt(peer, sid)
                return
            except RpcFailure:  # -32004 while the dead host's lease lasts
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.02)
    finally:
        await peer.close()


def takeover(url: str, ttl: float) -> float:
    """Seconds from host 1's SIGKILL to host 2's first answer for host 1's session."""
    with hosts(url, 2, ttl) as (one, two):
        async def made() -> str:
            peer = await RpcPeer.connect(one.socket_path)
            try:
                await peer.request("initialize", {"protocolVersion": 1})
                sid = await new_session(peer, {"keep_siblings": True})
                await prompt(peer, sid)
                return sid
            finally:
                await peer.close()

        sid = asyncio.run(made())
        one.proc.kill()
        killed = time.monotonic()
        asyncio.run(_first_answer(two.socket_path, sid, killed + ttl + 30))
        return time.monotonic() - killed


def two_hosts(fresh_database: Any, url: str, clients: int, ttl: float,
              rounds: int) -> dict[str, Any]:
    """The cases, best of ``rounds`` alternated rounds for the rates."""
    sizes = BenchSizes(min_seconds=3.0, turns_each=10)
    best: dict[str, dict[str, float]] = {}
    for _ in range(rounds):
        for name, count in (("one host", 1), ("two hosts", 2)):
            with fresh_database(url) as database:
                measured = measure(database, count, clients, sizes)
            if measured["turns/s"] > best.get(name, {}).get("turns/s", 0.0):
                best[name] = measured
    with fresh_database(url) as database:
        moved = takeover(database, ttl)
    return {**best, "takeover": {"seconds": round(moved, 2), "ttl + 1 s": ttl + 1,
                                 "within": moved <= ttl + 1},
            "two/one turns": round(best["two hosts"]["turns/s"] / best["one host"]["turns/s"],
                                   2)}
