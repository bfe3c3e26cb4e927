"""``storage.copy``: stores the previous releases made (``tests/fixtures/stores``: schema 2,
without ``turn_updates``, ``tool_calls.step`` or ``session_keys``; schema 3) copied into
PostgreSQL read back the same sessions and turns as the SQLite file does once migrated,
the file itself untouched; a copy into a store with sessions is refused whole.
Runs against the throw-away cluster of ``scripts/test``."""

from __future__ import annotations

import hashlib
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from storage import open_store
from storage.copy import CopyRefused, TargetNotEmpty, copy_sqlite_to_postgresql
from storage.store import Store, open_store_url
from tests.pg_support import fresh_database, rows

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "stores"


@pytest.fixture
def database() -> Iterator[str]:
    with fresh_database() as url:
        yield url


def everything(store: Store) -> dict[str, object]:
    sessions = store.reader.list_sessions(limit=100)[0]
    return {s.id: (s, store.reader.load_turns(s.id), store.reader.load_events(s.id))
            for s in sessions}


@pytest.mark.parametrize("schema", ["schema2", "schema3"])
def test_an_older_store_copies_whole(schema: str, database: str, tmp_path: Path) -> None:
    source = tmp_path / "acp-sessions.db"
    shutil.copyfile(FIXTURES / schema / "acp-sessions.db", source)
    digest = hashlib.sha256(source.read_bytes()).hexdigest()
    counts = copy_sqlite_to_postgresql(source, database)
    assert hashlib.sha256(source.read_bytes()).hexdigest() == digest  # only read
    assert counts["sessions"] >= 3 and counts["messages"] > 0

    migrated = tmp_path / "migrated.db"
    shutil.copyfile(source, migrated)
    sqlite, pg = open_store(migrated), open_store_url(database)
    try:
        assert everything(pg) == everything(sqlite) and everything(pg)
        next_id = rows(pg, "SELECT nextval(pg_get_serial_sequence('messages', 'id'))")[0][0]
        assert next_id > rows(pg, "SELECT max(id) FROM messages")[0][0]
    finally:
        sqlite.close()
        pg.close()

    with pytest.raises(TargetNotEmpty, match="nothing was copied"):
        copy_sqlite_to_postgresql(source, database)


def test_a_missing_or_broken_source_is_refused(database: str, tmp_path: Path) -> None:
    with pytest.raises(CopyRefused, match="no SQLite store"):
        copy_sqlite_to_postgresql(tmp_path / "none.db", database)
    (tmp_path / "junk.db").write_bytes(b"not a database at all" * 100)
    with pytest.raises(CopyRefused, match="not a readable SQLite store"):
        copy_sqlite_to_postgresql(tmp_path / "junk.db", database)
