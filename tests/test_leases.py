"""Session leases on a shared PostgreSQL store (storage.leases), through the real
persistence actors of two "hosts" on one database.

Runs against the throw-away cluster of ``scripts/test`` (``tests/pg_support.py``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import psycopg
import pykka
import pytest

from actors.persistence import (
    CreateSession,
    DeleteSession,
    PersistBatch,
    PersistenceActor,
    PersistRequest,
    ReleaseLease,
    RenewLeases,
    StoreWriteError,
    TakeLease,
    WriteTurn,
)
from ipc.errors import SessionOwnedByAnotherHost
from ipc.events import TextItem, TurnRecord
from storage import Store, StoredSession
from storage.leases import Leases
from storage.store import open_store_url
from tests.pg_support import fresh_database, stop_tracing, trace_statements

WAIT = 20.0
RACED = 100


@pytest.fixture
def database() -> Iterator[str]:
    with fresh_database() as url:
        yield url


class Host:
    """A store and a persistence actor with this host's leases."""

    def __init__(self, database: str, host_id: str, ttl: float = 30.0, *,
                 take_over_expired: bool = True) -> None:
        self.store: Store = open_store_url(database)
        self.ref = PersistenceActor.start(self.store, Leases(host_id, ttl, take_over_expired))
        self.proxy = self.ref.proxy()

    def write(self, write: object) -> object:
        done = threading.Event()
        outcome: list[object] = []

        def reply(error: BaseException | None, value: object) -> None:
            outcome.append(error if error is not None else value)
            done.set()

        self.ref.tell(PersistRequest(write, reply))  # type: ignore[arg-type]
        assert done.wait(WAIT)
        return outcome[0]

    def close(self) -> None:
        self.ref.stop()
        self.store.close()


@pytest.fixture
def hosts(database: str) -> Iterator[list[Host]]:
    made: list[Host] = []
    yield made
    for host in made:
        host.close()
    pykka.ActorRegistry.stop_all()


def session(sid: str) -> StoredSession:
    return StoredSession(id=sid, agent_alias="main", workspace_dir="/w", cwd="/w",
                         mode="supervised", created_at=time.time(), last_activity=time.time())


def turn(sid: str, text: str) -> TurnRecord:
    return TurnRecord(sid, (TextItem("user", text), TextItem("assistant", text)), "end_turn",
                      text, 1.0, 2.0)


def expire(database: str, host_id: str) -> None:
    """The host's leases run out now (as after its death and the TTL)."""
    with psycopg.connect(database) as admin:
        admin.execute("UPDATE session_leases SET expires_at = 0 WHERE host_id = %s",
                      (host_id,))


def owners(database: str) -> dict[str, str]:
    with psycopg.connect(database) as check:
        return dict(check.execute("SELECT session_id, host_id FROM session_leases").fetchall())


def test_a_live_lease_refuses_another_host_and_names_the_owner(
    database: str, hosts: list[Host]
) -> None:
    one, two = Host(database, "one"), Host(database, "two")
    hosts += [one, two]
    assert one.write(CreateSession(session("s1"))) is None
    assert one.write(TakeLease("s1")) is None
    refused = two.write(TakeLease("s1"))
    assert isinstance(refused, SessionOwnedByAnotherHost)
    assert refused.to_error()["code"] == -32004
    assert "owned by host one" in refused.message
    assert refused.data["ownerHost"] == "one"
    assert one.write(TakeLease("s1")) is None  # its own: renewed
    assert one.write(RenewLeases()) == ["s1"]
    one.write(ReleaseLease("s1"))
    assert two.write(TakeLease("s1")) is None
    assert owners(database) == {"s1": "two"}


def test_a_host_whose_lease_was_taken_over_commits_no_turn(
    database: str, hosts: list[Host]
) -> None:
    one, two = Host(database, "one"), Host(database, "two")
    hosts += [one, two]
    one.write(CreateSession(session("s1")))
    one.write(TakeLease("s1"))
    assert one.write(WriteTurn(turn("s1", "first"))) == 1
    expire(database, "one")  # one stalled past its TTL
    assert two.write(TakeLease("s1")) is None
    stale = one.write(WriteTurn(turn("s1", "too late")))
    assert isinstance(stale, StoreWriteError) and "no longer owned by this host" in str(stale)
    info = two.store.reader.get_session("s1")
    assert info is not None and info.turn_count == 1
    assert two.write(WriteTurn(turn("s1", "on two"))) == 2


def test_hosts_racing_for_expired_sessions_never_both_own_one(
    database: str, hosts: list[Host]
) -> None:
    """100 sessions whose leases expired (a dead host's): two hosts take them all at
    once; every session ends with exactly one owner, and each host was told the truth
    (a take that succeeded is the owner in the database)."""
    dead = Host(database, "dead")
    hosts.append(dead)
    for k in range(RACED):
        dead.write(CreateSession(session(f"s{k}")))
        dead.write(TakeLease(f"s{k}"))
    expire(database, "dead")
    racers = [Host(database, "one"), Host(database, "two")]
    hosts += racers
    won: dict[str, list[str]] = {"one": [], "two": []}
    start = threading.Barrier(2)

    def race(host: Host, name: str, order: list[int]) -> None:
        start.wait(WAIT)
        for k in order:
            if host.write(TakeLease(f"s{k}")) is None:
                won[name].append(f"s{k}")

    threads = [threading.Thread(target=race, args=(racers[0], "one", list(range(RACED)))),
               threading.Thread(target=race, args=(racers[1], "two",
                                                    list(reversed(range(RACED)))))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT)
    assert not set(won["one"]) & set(won["two"])
    assert len(won["one"]) + len(won["two"]) == RACED
    assert owners(database) == {**dict.fromkeys(won["one"], "one"),
                                **dict.fromkeys(won["two"], "two")}


def test_a_new_session_is_owned_from_its_first_commit_and_deleted_only_by_its_owner(
    database: str, hosts: list[Host]
) -> None:
    one, two = Host(database, "one"), Host(database, "two")
    hosts += [one, two]
    assert one.write(CreateSession(session("s1"))) is None
    assert owners(database) == {"s1": "one"}  # no TakeLease: the row came with it
    refused = two.write(CreateSession(session("s1")))
    assert isinstance(refused, StoreWriteError)  # the row's key; one still owns it
    refused = two.write(DeleteSession("s1"))
    assert isinstance(refused, SessionOwnedByAnotherHost)
    assert one.store.reader.get_session("s1") is not None
    assert one.write(DeleteSession("s1")) is True
    assert owners(database) == {}


def test_a_grouped_new_session_whose_id_another_host_holds_fails_alone(
    database: str, hosts: list[Host]
) -> None:
    """A lease left on an id without a row (a host that died mid-open, say): the group
    it is committed in is redone one by one, and only that session is refused."""
    one, two = Host(database, "one"), Host(database, "two")
    hosts += [one, two]
    with psycopg.connect(database) as admin:
        admin.execute("INSERT INTO session_leases VALUES ('held', 'two', "
                      "EXTRACT(EPOCH FROM clock_timestamp()) + 30)")
    outcomes: list[object] = []
    done = threading.Event()

    def reply(error: BaseException | None, value: object) -> None:
        outcomes.append(error if error is not None else value)
        if len(outcomes) == 3:
            done.set()

    one.ref.tell(PersistBatch(tuple(PersistRequest(CreateSession(session(sid)), reply)
                                    for sid in ("a", "held", "b"))))
    assert done.wait(WAIT)
    assert outcomes.count(None) == 2
    refused = next(o for o in outcomes if o is not None)
    assert isinstance(refused, SessionOwnedByAnotherHost) and "host two" in refused.message
    assert owners(database) == {"a": "one", "b": "one", "held": "two"}
    assert one.store.reader.get_session("held") is None


def test_a_host_that_takes_over_nothing_is_refused_an_expired_lease_until_it_is_freed(
    database: str, hosts: list[Host]
) -> None:
    one = Host(database, "one")
    careful = Host(database, "careful", take_over_expired=False)
    hosts += [one, careful]
    one.write(CreateSession(session("s1")))
    expire(database, "one")  # one died; its TTL ran out
    refused = careful.write(TakeLease("s1"))
    assert isinstance(refused, SessionOwnedByAnotherHost)
    assert "owned by host one (its lease expired" in refused.message
    assert 'takeover = "never"' in refused.message
    assert refused.data["leaseExpiresInSecs"] < 0
    assert owners(database) == {"s1": "one"}
    with psycopg.connect(database) as admin:  # an operator frees it
        admin.execute("DELETE FROM session_leases WHERE host_id = 'one'")
    assert careful.write(TakeLease("s1")) is None
    assert owners(database) == {"s1": "careful"}


def test_a_turn_is_one_statement_and_a_group_one_transaction_of_them(
    database: str, hosts: list[Host]
) -> None:
    """storage.pg_pipeline: a turn of a session this host knows is one statement (alone:
    its own transaction); a group
    is BEGIN, one statement per write, COMMIT (sent pipelined)."""
    one = Host(database, "one")
    hosts.append(one)
    for k in range(8):
        one.write(CreateSession(session(f"s{k}")))
        one.write(WriteTurn(turn(f"s{k}", "first")))
    statements = trace_statements(one.store)
    assert one.write(WriteTurn(turn("s0", "alone"))) == 2
    assert [s.split()[0] for s in statements] == ["WITH"]  # its own transaction
    statements.clear()
    done = threading.Event()
    counts: list[object] = []

    def reply(error: BaseException | None, value: object) -> None:
        counts.append(error or value)
        if len(counts) == 8:
            done.set()

    one.ref.tell(PersistBatch(tuple(PersistRequest(WriteTurn(turn(f"s{k}", "grouped")), reply)
                                    for k in range(8))))
    assert done.wait(WAIT)
    stop_tracing(one.store)
    assert counts == [3] + [2] * 7
    assert [s.split()[0] for s in statements] == ["BEGIN", *["WITH"] * 8, "COMMIT"]
    assert [getattr(i, "text", None) for i in one.store.reader.load_items("s0")] == [
        "first", "first", "alone", "alone", "grouped", "grouped"]
