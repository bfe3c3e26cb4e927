"""The PostgreSQL store: its configuration, its schema version under a lock, passwords.

Runs against the throw-away cluster of ``scripts/test`` (``tests/pg_support.py``); each
test has a database of its own.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import peewee
import psycopg
import pytest

from storage import SCHEMA_VERSION, StoredSession
from storage.pg import SCHEMA_LOCK_KEY, redact_url
from storage.store import open_store_url, write_transaction
from supervisor.config.config import ConfigError, load_settings
from supervisor.host.store_open import store_password
from tests.pg_support import (
    fresh_database,
    insert_old_session,
    password_role_login,
    pg_server_url,
    rows,
)

WAIT = 20.0


@pytest.fixture
def database() -> Iterator[str]:
    with fresh_database() as url:
        yield url


def session(sid: str) -> StoredSession:
    return StoredSession(id=sid, agent_alias="main", workspace_dir="/w", cwd="/w",
                         mode="supervised", created_at=time.time(), last_activity=time.time())


# --- configuration ------------------------------------------------------------------


def test_the_store_url_comes_from_the_file_or_the_environment(tmp_path: Path) -> None:
    (tmp_path / "config.toml").write_text(
        '[store]\nurl = "postgresql://zc@db.example:5432/zeroclaw"\npassword_env = "PG_PW"\n')
    settings = load_settings(str(tmp_path), env={})
    assert settings.store_url == "postgresql://zc@db.example:5432/zeroclaw"
    assert settings.store_password_env == "PG_PW"
    overridden = load_settings(str(tmp_path),
                               env={"ZEROCLAW_store__url": "postgresql://other@h/db"})
    assert overridden.store_url == "postgresql://other@h/db"


def test_sqlite_urls_and_the_default_stay_the_sqlite_file(tmp_path: Path) -> None:
    default = load_settings(str(tmp_path), env={})
    assert default.store_url is None
    assert default.store_path == tmp_path / "data" / "sessions" / "acp-sessions.db"
    chosen = load_settings(str(tmp_path),
                           env={"ZEROCLAW_store__url": f"sqlite://{tmp_path}/elsewhere.db"})
    assert chosen.store_url is None and chosen.store_path == tmp_path / "elsewhere.db"


def test_takeover_is_expired_by_default_never_on_request_and_nothing_else(
    tmp_path: Path
) -> None:
    assert load_settings(str(tmp_path), env={}).takeover == "expired"
    never = load_settings(str(tmp_path), env={"ZEROCLAW_store__takeover": "never"})
    assert never.takeover == "never"
    (tmp_path / "config.toml").write_text('[store]\ntakeover = "always"\n')
    with pytest.raises(ConfigError, match=r"store\.takeover must be one of 'expired', 'never'"):
        load_settings(str(tmp_path), env={})


@pytest.mark.parametrize(("url", "words"), [
    ("postgresql://zc:hunter2@h/db", "must not hold a password"),
    ("postgresql://zc@h/db?password=hunter2", "must not hold a password"),
    ("mysql://zc@h/db", "must start with postgresql:// or sqlite:///"),
    ("sqlite://relative.db", "use sqlite:///ABSOLUTE/PATH"),
])
def test_unusable_store_urls_are_refused_without_echoing_a_password(
    tmp_path: Path, url: str, words: str
) -> None:
    with pytest.raises(ConfigError) as info:
        load_settings(str(tmp_path), env={"ZEROCLAW_store__url": url})
    assert words in str(info.value) and "hunter2" not in str(info.value)


def test_the_password_variable_is_read_once_and_removed(tmp_path: Path) -> None:
    env = {"ZEROCLAW_store__url": "postgresql://zc@h/db",
           "ZEROCLAW_store__password_env": "PG_PW", "PG_PW": "s3cret"}
    settings = load_settings(str(tmp_path), env=env)
    assert store_password(settings, env) == "s3cret"
    assert "PG_PW" not in env  # no child process started later inherits it
    with pytest.raises(ConfigError, match=r"store\.password_env names PG_PW, which is not set"):
        store_password(settings, env)


def test_a_password_in_a_url_is_redacted_for_display() -> None:
    assert redact_url("postgresql://u:pw@h:5/d") == "postgresql://u:***@h:5/d"
    assert redact_url("postgresql://u@h:5/d") == "postgresql://u@h:5/d"


# --- schema ---------------------------------------------------------------------------


def test_a_new_database_gets_the_tables_and_a_version_row(database: str) -> None:
    store = open_store_url(database)
    try:
        assert rows(store, "SELECT id, version FROM zeroclaw_schema") == [(1, SCHEMA_VERSION)]
        tables = {name for (name,) in rows(
            store, "SELECT tablename FROM pg_tables WHERE schemaname = 'public'")}
        assert {"sessions", "messages", "tool_calls", "turn_updates", "session_events",
                "zeroclaw_schema"} <= tables
        kinds = dict(rows(store, "SELECT column_name, data_type FROM information_schema.columns"
                                 " WHERE table_name = 'sessions'"))
        assert kinds["last_activity"] == "double precision"  # not REAL: 7 digits
        assert kinds["token_count"] == "bigint"
    finally:
        store.close()


def test_an_older_schema_is_migrated(database: str) -> None:
    """A database missing a table and a column of the current schema (version 2) gets
    them, and its rows stay."""
    open_store_url(database).close()
    with psycopg.connect(database, autocommit=True) as admin:
        admin.execute("DROP TABLE turn_updates")
        admin.execute("ALTER TABLE tool_calls DROP COLUMN step")
        admin.execute("UPDATE zeroclaw_schema SET version = 2")
        insert_old_session(admin)
    store = open_store_url(database)
    try:
        assert rows(store, "SELECT version FROM zeroclaw_schema") == [(SCHEMA_VERSION,)]
        assert rows(store, "SELECT count(*) FROM turn_updates") == [(0,)]
        assert rows(store, "SELECT column_default FROM information_schema.columns "
                           "WHERE table_name = 'tool_calls' AND column_name = 'step'") \
            == [("0",)]
        old = store.reader.get_session("old")
        assert old is not None and old.mode == "full"
    finally:
        store.close()


def test_hosts_starting_at_once_migrate_one_after_the_other(database: str) -> None:
    """The migration waits on the advisory lock another host holds, then finds the
    work done; two hosts racing on an empty database both start, with one schema."""
    holder = psycopg.connect(database)
    holder.execute("SELECT pg_advisory_xact_lock(%s)", (SCHEMA_LOCK_KEY,))
    opened: list[object] = []
    errors: list[BaseException] = []

    def open_one() -> None:
        try:
            opened.append(open_store_url(database))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=open_one) for _ in range(2)]
    for thread in threads:
        thread.start()
    try:
        deadline = time.monotonic() + WAIT
        while _advisory_waiters(database) < 2:  # both wait on the lock, nothing done
            assert time.monotonic() < deadline, "the hosts did not wait on the lock"
            time.sleep(0.02)
        assert opened == [] and errors == []
    finally:
        holder.rollback()
        holder.close()
    for thread in threads:
        thread.join(WAIT)
    assert errors == [] and len(opened) == 2
    with psycopg.connect(database) as check:
        assert check.execute("SELECT id, version FROM zeroclaw_schema").fetchall() \
            == [(1, SCHEMA_VERSION)]
    for store in opened:
        store.close()  # type: ignore[attr-defined]


def _advisory_waiters(database: str) -> int:
    with psycopg.connect(database) as check:
        found = check.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' "
                              "AND NOT granted AND database = (SELECT oid FROM pg_database "
                              "WHERE datname = current_database())").fetchone()
    return int(found[0]) if found else 0


# --- passwords ---------------------------------------------------------------------------


@pytest.fixture
def password_role() -> Iterator[tuple[str, str]]:
    """See :func:`tests.pg_support.password_role_login`."""
    with password_role_login() as login:
        yield login


def test_a_password_login_works_and_its_errors_hold_no_password(
    password_role: tuple[str, str],
) -> None:
    url, password = password_role
    store = open_store_url(url, password)
    try:
        with write_transaction(store.writer):
            store.writer.execute_sql("SELECT 1")
        assert password not in repr(store) and password not in store.where
    finally:
        store.close()
    wrong = password[::-1]
    with pytest.raises(peewee.PeeweeException) as info:
        open_store_url(url, wrong)
    assert "password authentication failed" in str(info.value)
    assert wrong not in str(info.value) and password not in str(info.value)


def test_a_dropped_connection_is_replaced_and_no_turn_is_half_written(database: str) -> None:
    """The server drops every connection of zeroclaw's (as a restart does): the next
    write opens a new one before its BEGIN; a read that finds its connection gone runs
    again on a new one."""
    from actors.persistence import CreateSession, PersistenceActor, WriteTurn
    from ipc.events import TextItem, TurnRecord

    store = open_store_url(database)
    ref = PersistenceActor.start(store)
    try:
        proxy = ref.proxy()
        proxy.perform(CreateSession(session("s1"))).get(timeout=WAIT)
        record = TurnRecord("s1", (TextItem("user", "q"), TextItem("assistant", "a")),
                            "end_turn", "a", 1.0, 2.0)
        assert proxy.perform(WriteTurn(record)).get(timeout=WAIT) == 1
        assert store.reader.get_session("s1") is not None  # the reader's connection too
        with psycopg.connect(pg_server_url(), autocommit=True) as admin:
            dropped = admin.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE datname = %s AND application_name LIKE 'zeroclaw%%'",
                (database.rsplit("/", 1)[1],)).fetchone()
        assert dropped is not None and dropped[0] == 2
        assert proxy.perform(WriteTurn(record)).get(timeout=WAIT) == 2
        info = store.reader.get_session("s1")  # finds it gone: again, on a new one
        assert info is not None and info.turn_count == 2
        assert rows(store, "SELECT count(*) FROM messages") == [(4,)]
    finally:
        ref.stop()
        store.close()
