#!/usr/bin/env python3
"""The store's hot writes on each backend, side by side: finished turns per second and
new sessions per second, SQLite against PostgreSQL through psycopg 3 and psycopg2.

Usage: ``.venv/bin/python scripts/store_backends.py --url postgresql://user@host:port/db
[--turns N] [--sessions N]`` (``--url`` defaults to ``$ZC_TEST_PG_URL``; the role must
be allowed to create databases: each run gets a fresh one, dropped at the end).

Each case writes through :class:`storage.prepared_writes.PreparedWrites` statement by
statement on a fresh store (on PostgreSQL with the lease each write takes or renews):
a 10-row turn (user, assistant, four tool calls) round-robin over 8 sessions, either
one transaction per turn or a group of 16 turns per transaction (the actor's group
commit under load); sessions likewise, alone or 16 per transaction. A psycopg2 case
is skipped when psycopg2 is not installed. ``postgresql/psycopg/pipelined`` writes
as the host does on PostgreSQL (``storage.pg_pipeline``, with a lease): a turn alone
as one statement, a group of 16 in one pipelined transaction.
Prints a table and a JSON line. Runs on the main thread.

``--hosts``: the same comparison through a whole host instead (``zeroclaw daemon``
with the echo agent, ``[store] url`` of a fresh database against the SQLite
default): prompt turns per second at 8 and 64 sessions at once (a connection
each) and sequential ``session/new`` per second, best of ``--rounds`` alternated
rounds (the daemons of scripts/bench's load_lib; the bench's asyncio clients).

``--two-hosts [--clients 64] [--ttl 3]``: two daemons on one database against one
(turns/s, the database's commits/s, lock waits, connections, its CPU per turn) and
the takeover time after a SIGKILL (``store_hosts_lib.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from store_write_cost import ten_items

from ipc.events import TurnRecord
from storage import pg
from storage.models import StoredSession
from storage.prepared_writes import PreparedWrites
from storage.store import Store, open_store, open_store_url, write_transaction

GROUP = 16
SESSIONS_AT_ONCE = 8


def session(sid: str) -> StoredSession:
    now = time.time()
    return StoredSession(id=sid, agent_alias="main", workspace_dir="/ws", cwd="/src",
                         mode="supervised", created_at=now, last_activity=now)


def rate(count: int, group: int, write: Callable[[int], None], store: Store) -> float:
    """Writes per second: ``count`` writes, ``group`` per transaction."""
    started = time.perf_counter()
    for first in range(0, count, group):
        with write_transaction(store.writer):
            for n in range(first, min(count, first + group)):
                write(n)
    return count / (time.perf_counter() - started)


def pipelined_rates(store: Store, turns: int, sessions: int) -> dict[str, float]:
    """The same writes as the PostgreSQL host sends them (:mod:`storage.pg_pipeline`,
    with this writer's leases): a turn alone as its one statement, 16 at once as one
    pipelined transaction; new sessions likewise."""
    from storage.leases import Leases
    from storage.pg import PgDatabase
    from storage.pg_pipeline import write_pipelined

    db = store.writer
    assert isinstance(db, PgDatabase)
    prepared, leases = PreparedWrites(db), Leases("bench", 30.0)
    tag = uuid.uuid4().hex[:6]
    write_pipelined(db, prepared, leases, [session(f"{tag}-s{k}")
                                           for k in range(SESSIONS_AT_ONCE)])
    prepared.commit_staged()

    def run(count: int, group: int, make: Callable[[int], StoredSession | TurnRecord]) -> float:
        started = time.perf_counter()
        for first in range(0, count, group):
            done = write_pipelined(db, prepared, leases,
                                   [make(n) for n in range(first, min(count, first + group))])
            assert done is not None, "a pipelined write fell back"
            prepared.commit_staged()
        return count / (time.perf_counter() - started)

    def turn(n: int) -> TurnRecord:
        return TurnRecord(f"{tag}-s{n % SESSIONS_AT_ONCE}", ten_items(n), "end_turn", "",
                          1.0, 2.0)

    run(50, 1, turn)  # warm
    results = {f"turns/s x{group}": run(turns, group, turn) for group in (1, GROUP)}
    for group in (1, GROUP):
        offset = group * sessions  # fresh ids for each run

        def new(n: int, offset: int = offset) -> StoredSession:
            return session(f"{tag}-new-{n + offset}")

        results[f"sessions/s x{group}"] = run(sessions, group, new)
    return results


def measure(store: Store, turns: int, sessions: int) -> dict[str, float]:
    """Statement by statement; on PostgreSQL with the lease each write takes or renews
    there (what the host did before :mod:`storage.pg_pipeline`)."""
    from storage.leases import Leases

    prepared = PreparedWrites(store.writer)
    leases = Leases("bench", 30.0) if store.url is not None else None
    tag = uuid.uuid4().hex[:6]

    def create(n: int) -> None:
        prepared.insert_session(session(f"{tag}-new-{n}"))
        if leases is not None:
            leases.take(store.writer, f"{tag}-new-{n}")

    def turn(n: int) -> None:
        sid = f"{tag}-s{n % SESSIONS_AT_ONCE}"
        if leases is not None:
            leases.hold(store.writer, sid)
        prepared.write_turn(TurnRecord(sid, ten_items(n), "end_turn", "", 1.0, 2.0))

    with write_transaction(store.writer):
        for k in range(SESSIONS_AT_ONCE):
            prepared.insert_session(session(f"{tag}-s{k}"))
            if leases is not None:
                leases.take(store.writer, f"{tag}-s{k}")
    prepared.commit_staged()
    rate(50, 1, turn, store)  # warm: statements compiled, the server's plans cached
    results = {}
    for group in (1, GROUP):
        results[f"turns/s x{group}"] = rate(turns, group, turn, store)
        prepared.commit_staged()
    for group in (1, GROUP):
        offset = group * sessions  # fresh ids for each run

        def create_next(n: int, offset: int = offset) -> None:
            create(n + offset)

        results[f"sessions/s x{group}"] = rate(sessions, group, create_next, store)
        prepared.commit_staged()
    return results


@contextmanager
def fresh_database(url: str) -> Iterator[str]:
    """A new database on the server of ``url`` (its URL), dropped afterwards."""
    import psycopg

    name = f"zc_bench_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield url.rsplit("/", 1)[0] + "/" + name
    finally:
        with psycopg.connect(url, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')


def run_case(name: str, url: str | None, turns: int, sessions: int) -> dict[str, float]:
    if url is None:
        with tempfile.TemporaryDirectory() as temp:
            store = open_store(Path(temp) / "s.db")
            try:
                return measure(store, turns, sessions)
            finally:
                store.close()
    pg.DRIVER = name.split("/")[1]  # psycopg or psycopg2
    with fresh_database(url) as database:
        store = open_store_url(database)
        try:
            if name.endswith("pipelined"):
                return pipelined_rates(store, turns, sessions)
            return measure(store, turns, sessions)
        finally:
            store.close()


async def host_rates(daemon_path: Path) -> dict[str, float]:
    """Turns/s at 8 and 64 sessions and session/new per second on one daemon."""
    from bench_daemon_lib import turn_rate
    from bench_lib import BenchSizes, new_session
    from bench_rpc_lib import RpcPeer

    sizes = BenchSizes(min_seconds=2.0, turns_each=10)
    results = {f"turns/s {n} sessions": (await turn_rate(n, sizes, daemon_path)).value
               for n in (8, 64)}
    peer = await RpcPeer.connect(daemon_path)
    try:
        await peer.request("initialize", {"protocolVersion": 1})
        started = time.perf_counter()
        ids = [await new_session(peer, {"keep_siblings": True}) for _ in range(300)]
        results["session/new per s"] = len(ids) / (time.perf_counter() - started)
        for sid in ids:
            await peer.request("session/close", {"sessionId": sid})
    finally:
        await peer.close()
    return results


def run_host(url: str | None) -> dict[str, float]:
    import asyncio

    from bench_daemon_lib import settle
    from load_lib import started_daemon

    store = "" if url is None else f'[store]\nurl = "{url}"\n'
    with started_daemon(400, lambda: False, store) as daemon:
        settle(daemon)
        return asyncio.run(host_rates(daemon.socket_path))


def main_hosts(url: str, rounds: int) -> dict[str, dict[str, float]]:
    best: dict[str, dict[str, float]] = {}
    with fresh_database(url) as database:
        for _ in range(rounds):
            for name, target in (("sqlite", None), ("postgresql/psycopg", database)):
                print(f"round: {name}", file=sys.stderr)
                measured = run_host(target)
                kept = best.setdefault(name, measured)
                for key, value in measured.items():
                    kept[key] = max(kept[key], value)
    return best


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--url", default=os.environ.get("ZC_TEST_PG_URL"))
    parser.add_argument("--turns", type=int, default=2000)
    parser.add_argument("--sessions", type=int, default=2000)
    parser.add_argument("--hosts", action="store_true",
                        help="compare whole daemons (turns, session/new), not the store")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--two-hosts", action="store_true",
                        help="two daemons on one database against one (and a takeover)")
    parser.add_argument("--clients", type=int, default=64, help="--two-hosts: connections")
    parser.add_argument("--ttl", type=float, default=3.0, help="--two-hosts: lease TTL")
    args = parser.parse_args(argv)
    if args.two_hosts:
        if not args.url:
            parser.error("--two-hosts needs --url (or ZC_TEST_PG_URL)")
        from store_hosts_lib import two_hosts

        found = two_hosts(fresh_database, args.url, args.clients, args.ttl, args.rounds)
        for name in ("one host", "two hosts"):
            print(f"{name:10s} " + "  ".join(f"{k} {v:.1f}" for k, v in found[name].items()))
        print(json.dumps(found))
        return 0
    if args.hosts:
        if not args.url:
            parser.error("--hosts needs --url (or ZC_TEST_PG_URL)")
        results = main_hosts(args.url, args.rounds)
        _print(results)
        sqlite = results["sqlite"]
        print(json.dumps({"postgresql/sqlite": {
            k: round(v / sqlite[k], 2) for k, v in results["postgresql/psycopg"].items()}}))
        return 0
    cases: list[tuple[str, str | None]] = [("sqlite", None)]
    if args.url:
        cases.append(("postgresql/psycopg", args.url))
        cases.append(("postgresql/psycopg/pipelined", args.url))
        try:
            import psycopg2  # noqa: F401
        except ImportError:
            print("psycopg2 is not installed: its case is skipped", file=sys.stderr)
        else:
            cases.append(("postgresql/psycopg2", args.url))
    else:
        print("no --url (or ZC_TEST_PG_URL): SQLite only", file=sys.stderr)
    results = {name: run_case(name, url, args.turns, args.sessions) for name, url in cases}
    _print(results)
    return 0


def _print(results: dict[str, dict[str, float]]) -> None:
    columns = list(next(iter(results.values())))
    print(f"{'backend':30s}" + "".join(f"{c:>22s}" for c in columns))
    for name, row in results.items():
        print(f"{name:30s}" + "".join(f"{row[c]:22.0f}" for c in columns))
    print(json.dumps({name: {c: round(v) for c, v in row.items()}
                      for name, row in results.items()}))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
