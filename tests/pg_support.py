"""PostgreSQL for the tests: the throw-away cluster that ``scripts/test`` starts.

``scripts/test`` exports ``ZC_TEST_PG_URL`` (a superuser's URL, no password); without
it (pytest run directly) the PostgreSQL tests skip and say so; when ``scripts/test``
could not start the cluster it exports ``ZC_TEST_PG_SKIP`` instead, and they fail:
under ``scripts/test`` they always run. Each test gets a database of its own.
"""

from __future__ import annotations

import os
import secrets
import sqlite3
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest

from storage import Store, open_store
from storage.store import open_store_url

__all__ = ["BACKENDS", "RawConnection", "committed_value", "fresh_database", "pg_server_url",
           "reopen", "rows", "stop_tracing", "trace_statements"]

BACKENDS = ("sqlite", "postgresql")
PG_ENV = "ZC_TEST_PG_URL"


def pg_server_url() -> str:
    """The test cluster's URL; skips (outside scripts/test) or fails (inside) without it."""
    url = os.environ.get(PG_ENV)
    if url:
        return url
    why = os.environ.get("ZC_TEST_PG_SKIP")
    if why:
        pytest.fail(f"scripts/test could not start PostgreSQL: {why}")
    pytest.skip(f"{PG_ENV} is unset: PostgreSQL tests run under scripts/test, which starts "
                "a throw-away cluster")


def database_url(server_url: str, name: str) -> str:
    return server_url.rsplit("/", 1)[0] + "/" + name


@contextmanager
def fresh_database() -> Iterator[str]:
    """A new, empty database on the test cluster (its URL), dropped afterwards."""
    server = pg_server_url()
    name = f"zc_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield database_url(server, name)
    finally:
        with psycopg.connect(server, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def committed_value(store: Store, sql: str, *params: object) -> object | None:
    """The first column of the first row of ``sql`` (``?`` placeholders) on a fresh
    connection to ``store``, which sees committed data only; ``None`` when no row."""
    if store.url is None:
        with sqlite3.connect(store.path) as check:
            found = check.execute(sql, params).fetchone()
    else:
        with psycopg.connect(store.url) as check:
            found = check.execute(sql.replace("?", "%s"), params).fetchone()
    return found[0] if found else None


class RawConnection:
    """A connection of its own to a store's database, outside zeroclaw (autocommit;
    ``BEGIN``/``COMMIT`` by hand): SQL with ``?`` placeholders and SQLite's
    ``BEGIN IMMEDIATE`` runs on both backends."""

    def __init__(self, store: Store) -> None:
        self._pg = store.url is not None
        self._conn: Any = (psycopg.connect(str(store.url), autocommit=True) if self._pg
                           else sqlite3.connect(store.path, isolation_level=None, timeout=5))

    def execute(self, sql: str, params: tuple[object, ...] = ()) -> Any:
        if self._pg:
            sql = sql.replace("BEGIN IMMEDIATE", "BEGIN").replace("?", "%s")
        return self._conn.execute(sql, params)

    def close(self) -> None:
        self._conn.close()


def rows(store: Store, sql: str) -> list[tuple[Any, ...]]:
    """Every row of ``sql`` on a connection of its own (committed data only)."""
    check = RawConnection(store)
    try:
        return [tuple(row) for row in check.execute(sql).fetchall()]
    finally:
        check.close()


def trace_statements(store: Store) -> list[str]:
    """Every statement the store's writer sends from now on (BEGIN and COMMIT too),
    appended to the returned list; :func:`stop_tracing` ends it."""
    statements: list[str] = []
    if store.url is None:
        store.writer.connection().set_trace_callback(statements.append)
        return statements
    writer: Any = store.writer
    make_cursor = type(writer).cursor

    def cursor(*args: Any, **kwargs: Any) -> Any:
        return _TracedCursor(make_cursor(writer, *args, **kwargs), statements)

    writer.cursor = cursor
    return statements


def stop_tracing(store: Store) -> None:
    if store.url is None:
        store.writer.connection().set_trace_callback(None)
    else:
        vars(store.writer).pop("cursor", None)


class _TracedCursor:
    def __init__(self, cursor: Any, statements: list[str]) -> None:
        self._cursor = cursor
        self._statements = statements

    def execute(self, sql: str, *args: Any) -> Any:
        self._statements.append(sql)
        return self._cursor.execute(sql, *args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cursor, name)


def reopen(store: Store, **options: Any) -> Store:
    """A second store on the same file or database (another host's, say)."""
    if store.url is None:
        return open_store(store.path, **options)
    return open_store_url(store.url, **options)


@contextmanager
def password_role_login() -> Iterator[tuple[str, str]]:
    """A role that must log in with a password (the cluster's ``zc_password_login``
    group), owning a database of its own: its URL (no password) and the password,
    made now."""
    server = pg_server_url()
    role = f"zc_pw_{uuid.uuid4().hex[:8]}"
    password = secrets.token_urlsafe(16)
    with psycopg.connect(server, autocommit=True) as admin:
        admin.execute(f"CREATE ROLE {role} LOGIN PASSWORD '{password}' IN ROLE zc_password_login")
        admin.execute(f"CREATE DATABASE {role} OWNER {role}")
    try:
        yield f"postgresql://{role}@{server.split('@', 1)[1].rsplit('/', 1)[0]}/{role}", password
    finally:
        with psycopg.connect(server, autocommit=True) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {role} WITH (FORCE)")
            admin.execute(f"DROP ROLE {role}")


def insert_old_session(admin: Any) -> None:
    """One session row ``old`` as an older release wrote it (``admin``: a psycopg
    connection to the database), for the schema-step tests."""
    admin.execute("INSERT INTO sessions (id, agent_alias, workspace_dir, cwd, mode, "
                  "created_at, last_activity, token_count, turn_count, killed, "
                  "mcp_servers, meta) VALUES ('old', 'a', '/w', '/w', 'full', 1, 1, 0, 0, "
                  "false, '[]', '{}')")
