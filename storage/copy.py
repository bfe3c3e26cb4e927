"""Copying an SQLite session store into an empty PostgreSQL store (``zeroclaw store copy``).

The target's schema is created (or migrated) first, as a host does when it starts;
then every table of :data:`storage.models.MODELS` (sessions, messages, tool calls,
turn updates, events, session keys) is copied in **one** PostgreSQL transaction, which
first takes an advisory lock and refuses a target that already has sessions
(:class:`TargetNotEmpty`): a copy is all there or not at all, never merged into
another host's sessions. Ids are kept (the serial columns' sequences are moved past
them), so every turn replays as it did from the file.

The source file is opened read-only and read in one transaction (a consistent
snapshot even while a host still writes it), never changed: an older schema is read
column by column (a column it does not have yet gets its default, a table it does not
have is skipped). The tenants themselves live in each host's ``config.toml``, not in
the store; a session's tenant is in its row's ``meta`` and moves with it.

Threads: the caller's (the ``zeroclaw store`` process's main thread).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import peewee

from storage.models import MODELS, SCHEMA_VERSION
from storage.pg import SCHEMA_LOCK_KEY, redact_url
from storage.store import open_store_url

__all__ = ["CopyRefused", "TargetNotEmpty", "copy_sqlite_to_postgresql"]

BATCH_ROWS = 1000


class CopyRefused(Exception):
    """The copy cannot be made (its message says why, without any password)."""


class TargetNotEmpty(CopyRefused):
    """The target store already has sessions."""


def copy_sqlite_to_postgresql(source: Path, target_url: str,
                              password: str | None = None) -> dict[str, int]:
    """Copy the SQLite store at ``source`` into the PostgreSQL store at ``target_url``
    (made if new); how many rows of each table. :class:`CopyRefused` (or
    ``peewee.PeeweeException``, its message free of the password) when it cannot."""
    reader = _open_source(source)
    try:
        store = open_store_url(target_url, password)
        try:
            return _copy(reader, store.writer, redact_url(target_url))
        finally:
            store.close()
    finally:
        reader.close()


def _open_source(source: Path) -> sqlite3.Connection:
    if not source.is_file():
        raise CopyRefused(f"no SQLite store at {source}")
    try:
        conn = sqlite3.connect(f"file:{source}?mode=ro", uri=True, isolation_level=None)
        version = int(conn.execute("PRAGMA user_version").fetchone()[0])
    except sqlite3.Error as exc:
        raise CopyRefused(f"{source} is not a readable SQLite store: {exc}") from None
    if version > SCHEMA_VERSION:
        conn.close()
        raise CopyRefused(f"{source} has schema {version}, newer than this zeroclaw's "
                          f"{SCHEMA_VERSION}: copy it with the release that made it")
    return conn


def _copy(reader: sqlite3.Connection, db: peewee.Database, shown: str) -> dict[str, int]:
    """Every table, in one transaction of ``db`` and one read transaction of ``reader``."""
    counts: dict[str, int] = {}
    with db.atomic():
        db.execute_sql("SELECT pg_advisory_xact_lock(%s)", (SCHEMA_LOCK_KEY,))
        present = int(db.execute_sql("SELECT count(*) FROM sessions").fetchone()[0])
        if present:
            raise TargetNotEmpty(f"{shown} already has {present} session(s): a store is "
                                 "copied only into an empty one (nothing was copied)")
        reader.execute("BEGIN")
        try:
            for model in MODELS:
                counts[model._meta.table_name] = _copy_table(reader, db, model)
        finally:
            reader.execute("ROLLBACK")
        for model in MODELS:
            _move_sequence(db, model)
    return counts


def _copy_table(reader: sqlite3.Connection, db: peewee.Database,
                model: type[peewee.Model]) -> int:
    table = model._meta.table_name
    present = {row[1] for row in reader.execute(f'PRAGMA table_info("{table}")')}
    fields = [f for f in model._meta.sorted_fields if f.column_name in present]
    if not fields:
        return 0  # a table an older schema did not have
    names = ", ".join(f'"{f.column_name}"' for f in fields)
    insert = (f'INSERT INTO "{table}" ({names}) VALUES '
              f"({', '.join(['%s'] * len(fields))})")
    booleans = [i for i, f in enumerate(fields) if isinstance(f, peewee.BooleanField)]
    copied = 0
    cursor = db.cursor()
    for batch in _batches(reader.execute(f'SELECT {names} FROM "{table}" ORDER BY rowid')):
        rows = [_converted(row, booleans) for row in batch]
        cursor.executemany(insert, rows)
        copied += len(rows)
    return copied


def _batches(cursor: sqlite3.Cursor) -> Iterator[list[tuple[Any, ...]]]:
    while batch := cursor.fetchmany(BATCH_ROWS):
        yield batch


def _converted(row: tuple[Any, ...], booleans: list[int]) -> tuple[Any, ...]:
    """SQLite's 0/1 booleans as PostgreSQL's; every other value as it is."""
    if not booleans:
        return row
    values = list(row)
    for index in booleans:
        if values[index] is not None:
            values[index] = bool(values[index])
    return tuple(values)


def _move_sequence(db: peewee.Database, model: type[peewee.Model]) -> None:
    """A serial id's sequence past the copied ids (the next row a host writes)."""
    key = model._meta.primary_key
    if not isinstance(key, peewee.AutoField):
        return
    table, column = model._meta.table_name, key.column_name
    db.execute_sql(f"SELECT setval(pg_get_serial_sequence('\"{table}\"', '{column}'), "
                   f'GREATEST(COALESCE(MAX("{column}"), 0), 1), MAX("{column}") IS NOT NULL) '
                   f'FROM "{table}"')
