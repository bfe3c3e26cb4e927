"""The hosts table and the tenant revocation log of a shared PostgreSQL store
(:mod:`storage.hosts`), and the schema step that adds them to a database made before
they existed. Runs against the throw-away cluster of ``scripts/test``."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from storage import hosts
from storage.leases import Leases
from storage.store import open_store_url
from tests.pg_support import fresh_database, insert_old_session, rows


@pytest.fixture
def database() -> Iterator[str]:
    with fresh_database() as url:
        yield url


def test_hosts_beat_and_list_each_other_with_their_live_sessions(database: str) -> None:
    store = open_store_url(database)
    db = store.writer
    try:
        hosts.beat(db, "a", 100.0, "1.0")
        hosts.beat(db, "b", 200.0, "1.1")
        with db.atomic():
            Leases("a", 30).take(db, "s1")
            Leases("a", 30).take(db, "s2")
            Leases("b", -1).take(db, "s3")  # expired at once: not live
        listed = hosts.list_hosts(db)
        assert [(h.host_id, h.started_at, h.version, h.live_sessions) for h in listed] \
            == [("a", 100.0, "1.0", 2), ("b", 200.0, "1.1", 0)]
        assert all(h.alive(30) and 0 <= h.heartbeat_age_secs < 5 for h in listed)
        with psycopg.connect(database, autocommit=True) as other:  # b stopped beating
            other.execute("UPDATE zeroclaw_hosts SET heartbeat_at = heartbeat_at - 60 "
                          "WHERE host_id = 'b'")
        wire = {h.host_id: h.to_wire(30, "a") for h in hosts.list_hosts(db)}
        assert (wire["a"]["self"], wire["a"]["alive"], wire["b"]["alive"]) == (True, True, False)
        with psycopg.connect(database, autocommit=True) as other:  # dead for a day: forgotten
            other.execute("UPDATE zeroclaw_hosts SET heartbeat_at = heartbeat_at - 86400 "
                          "WHERE host_id = 'b'")
        hosts.beat(db, "a", 100.0, "1.0")
        hosts.forget(db, "nobody")
        assert [h.host_id for h in hosts.list_hosts(db)] == ["a"]
        hosts.forget(db, "a")
        assert hosts.list_hosts(db) == []
    finally:
        store.close()


def test_revocations_are_read_after_the_last_one_seen(database: str) -> None:
    store = open_store_url(database)
    db = store.writer
    try:
        assert hosts.revocations_after(db, 0) == []
        first = hosts.revoke(db, "t1", "h1" * 32, "a")
        second = hosts.revoke(db, "t2", "h2" * 32, "b")
        assert [r.tenant_id for r in hosts.revocations_after(db, 0)] == ["t1", "t2"]
        assert hosts.revocations_after(db, first) == [
            hosts.Revocation(second, "t2", "h2" * 32, "b")]
        assert hosts.revocations_after(db, second) == []
    finally:
        store.close()


def test_a_database_of_the_previous_release_gets_the_tables(database: str) -> None:
    """A store made before these tables (the schema step adds them; its rows stay)."""
    open_store_url(database).close()
    with psycopg.connect(database, autocommit=True) as admin:
        admin.execute("DROP TABLE zeroclaw_hosts")
        admin.execute("DROP TABLE tenant_revocations")
        insert_old_session(admin)
    store = open_store_url(database)
    try:
        assert rows(store, "SELECT count(*) FROM zeroclaw_hosts") == [(0,)]
        assert rows(store, "SELECT count(*) FROM tenant_revocations") == [(0,)]
        assert store.reader.get_session("old") is not None
    finally:
        store.close()


def test_a_tenant_removal_the_shared_store_cannot_take_changes_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from supervisor.cli.tenant_cmd import run

    config = tmp_path / "config.toml"
    config.write_text('[store]\nurl = "postgresql://zeroclaw@127.0.0.1:1/zc?connect_timeout=2"\n'
                      f'[tenants.alice]\ntoken_sha256 = "{"ab" * 32}"\n')
    before = config.read_text()
    assert run(["remove", "alice"], tmp_path, str(tmp_path)) == 1
    assert "the shared store could not be told (nothing changed)" in capsys.readouterr().err
    assert config.read_text() == before


def test_a_tenant_removed_on_a_shared_store_is_logged_there(
        database: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from supervisor.cli.tenant_cmd import run

    config = tmp_path / "config.toml"
    config.write_text(f'[store]\nurl = "{database}"\nhost_id = "h1"\n'
                      f'[tenants.alice]\nid = "a1"\ntoken_sha256 = "{"ab" * 32}"\n')
    assert run(["remove", "alice"], tmp_path, str(tmp_path)) == 0
    assert "revoked in the shared store" in capsys.readouterr().err
    assert "alice" not in config.read_text()
    with psycopg.connect(database) as check:
        assert check.execute("SELECT tenant_id, token_sha256, host_id FROM "
                             "tenant_revocations").fetchall() == [("a1", "ab" * 32, "h1")]


def test_the_watch_finds_revocations_and_a_shared_host_id(database: str) -> None:
    from supervisor.config.gateway_config import TenantConfig
    from supervisor.host.shared_store import SharedStoreWatch

    store = open_store_url(database)
    assert store.connect is not None
    connect = store.connect

    def watch(host_id: str, started_at: float) -> SharedStoreWatch:
        return SharedStoreWatch(connect, host_id, ttl_secs=30, started_at=started_at,
                                version="t")

    async def scenario() -> tuple[bool, bool, bool, list[str]]:
        one, twin, other = watch("h", 1.0), watch("h", 2.0), watch("k", 3.0)
        called: list[str] = []
        other.on_revoked = lambda: called.append("revoked")
        for each in (one, twin, other):
            await each.tick()
        hosts.revoke(store.writer, "bob-id", "b" * 64, "k")
        for each in (one, twin, other):
            await each.tick()
        tenants = {name: TenantConfig(name=name, token_sha256=digest, id=f"{name}-id")
                   for name, digest in (("alice", "a" * 64), ("bob", "c" * 64),
                                        ("carol", "b" * 64))}
        assert sorted(other.allowed(tenants)) == ["alice"]  # bob by id, carol by hash
        for each in (one, twin, other):
            await each.stop()
        return one.id_clash, twin.id_clash, other.id_clash, called

    try:
        one, twin, other, called = asyncio.run(scenario())
    finally:
        store.close()
    assert (one or twin) and not other  # "h" is beaten by two processes
    assert called == ["revoked"]
