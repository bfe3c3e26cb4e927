"""Session ownership across real ``zeroclaw daemon`` hosts on one PostgreSQL database:
a new session's row and its lease are committed together (a watcher on its own
connection never sees one without the other while two hosts create sessions and race
for the same client-chosen ids), and ``[store] takeover``.

Runs against the throw-away cluster of ``scripts/test`` (``tests/pg_support.py``).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest

from tests.e2e.procs import write_config

from .helpers import DaemonProc, RpcClient, RpcFailure

Daemons = Callable[..., DaemonProc]

RACED_IDS = 12
PLAIN_PER_HOST = 15

#: Sessions without a lease and leases without a session, in one statement (one snapshot).
ORPHANS = ("SELECT (SELECT count(*) FROM sessions s WHERE s.closed_at IS NULL AND NOT EXISTS "
           "(SELECT 1 FROM session_leases l WHERE l.session_id = s.id)), "
           "(SELECT count(*) FROM session_leases l WHERE NOT EXISTS "
           "(SELECT 1 FROM sessions s WHERE s.id = l.session_id))")


def host_config(config_dir: Path, database: str, host_id: str, *, ttl: float = 30,
                extra: str = "") -> Path:
    write_config(config_dir, f'[store]\nurl = "{database}"\nhost_id = "{host_id}"\n'
                             f"lease_ttl_secs = {ttl}\n{extra}\n[acp]\nmax_sessions = 100\n")
    return config_dir


class OrphanWatch:
    """Polls :data:`ORPHANS` on a connection of its own until stopped."""

    def __init__(self, database: str) -> None:
        self._conn = psycopg.connect(database, autocommit=True)
        self._stop = threading.Event()
        self.polls = 0
        self.seen: list[tuple[int, int]] = []
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            found = self._conn.execute(ORPHANS).fetchone() or (-1, -1)
            self.polls += 1
            if found != (0, 0):
                self.seen.append((int(found[0]), int(found[1])))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self._conn.close()


def new_sessions(client: RpcClient, ids: list[str | None]) -> list[dict[str, object]]:
    """``session/new`` for each id (None: the host picks), all sent before any answer."""
    sent = []
    for sid in ids:
        params: dict[str, object] = {"keep_siblings": True}
        if sid is not None:
            params["sessionId"] = sid
        request_id = client.send("session/new", params)
        assert request_id is not None
        sent.append(request_id)
    return [client.wait_response(request_id, timeout=60) for request_id in sent]


def owners(database: str) -> dict[str, str]:
    with psycopg.connect(database) as check:
        return {str(sid): str(host) for sid, host in check.execute(
            "SELECT session_id, host_id FROM session_leases").fetchall()}


def test_a_new_sessions_row_and_lease_commit_together_on_two_hosts(
    daemons: Daemons, database: str, host_dirs: Callable[[], Path]
) -> None:
    one = daemons(host_config(host_dirs(), database, "host-one"))
    two = daemons(host_config(host_dirs(), database, "host-two"))
    raced: list[str | None] = [str(uuid.uuid4()) for _ in range(RACED_IDS)]
    answers: dict[str, list[dict[str, object]]] = {}
    with one.client() as a, two.client() as b:
        for client in (a, b):  # each host is up, its store open, nothing made yet
            assert client.request("session/list")["sessions"] == []
        watch = OrphanWatch(database)
        try:
            def create(name: str, client: RpcClient) -> None:
                answers[name] = new_sessions(client, [*raced, *[None] * PLAIN_PER_HOST])

            threads = [threading.Thread(target=create, args=("host-one", a)),
                       threading.Thread(target=create, args=("host-two", b))]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(90)
        finally:
            watch.stop()
    assert watch.polls > 50 and watch.seen == []  # never a row without its lease or back
    owned = owners(database)
    made = {host: [str(answer["result"]["sessionId"]) for answer in got  # type: ignore[index]
                   if "result" in answer] for host, got in answers.items()}
    for host, sids in made.items():
        assert len(sids) >= PLAIN_PER_HOST
        assert all(owned[sid] == host for sid in sids)  # who answered owns it
    for k, sid in enumerate(raced):  # each raced id: one host made it, the other was refused
        winners = [host for host in made if sid in made[host]]
        assert len(winners) == 1, (sid, winners)
        loser = next(host for host in answers if host != winners[0])
        error = answers[loser][k]["error"]
        assert error["code"] in (-32602, -32603, -32004), error  # type: ignore[index]
    assert sorted(owned) == sorted(sid for sids in made.values() for sid in sids)
    with psycopg.connect(database) as check:
        rows = check.execute("SELECT count(*) FROM sessions").fetchone()
    assert rows == (len(owned),)


def wait_expired(database: str, host_id: str, timeout: float = 20.0) -> None:
    """Until every lease of ``host_id`` has run out in the database's clock."""
    deadline = time.monotonic() + timeout
    with psycopg.connect(database, autocommit=True) as check:
        while check.execute("SELECT count(*) FROM session_leases WHERE host_id = %s AND "
                            "expires_at >= EXTRACT(EPOCH FROM clock_timestamp())",
                            (host_id,)).fetchone() != (0,):
            assert time.monotonic() < deadline, f"the leases of {host_id} never expired"
            time.sleep(0.05)


def test_takeover_never_refuses_a_dead_hosts_session_until_an_operator_frees_it(
    daemons: Daemons, database: str, host_dirs: Callable[[], Path]
) -> None:
    one = daemons(host_config(host_dirs(), database, "host-one", ttl=1))
    two = daemons(host_config(host_dirs(), database, "host-two", ttl=1,
                              extra='takeover = "never"'))
    with one.client() as client:
        sid = client.request("session/new")["sessionId"]
        client.request("session/prompt", {"sessionId": sid, "prompt": "before the crash"})
    one.proc.kill()
    one.wait(10)
    wait_expired(database, "host-one")
    with two.client() as other:
        for method, params in (("session/load", {"sessionId": sid}),
                               ("session/prompt", {"sessionId": sid, "prompt": "mine?"})):
            with pytest.raises(RpcFailure) as refused:
                other.request(method, params)
            assert refused.value.code == -32004
            assert "owned by host host-one (its lease expired" in refused.value.message
        assert owners(database) == {sid: "host-one"}
        with psycopg.connect(database) as admin:  # the operator frees the dead host's
            admin.execute("DELETE FROM session_leases WHERE host_id = 'host-one'")
        other.request("session/load", {"sessionId": sid})
        replay = [u.get("text") for u in other.updates() if u["type"] == "user_message_chunk"]
        assert replay == ["before the crash"]
        assert owners(database) == {sid: "host-two"}
