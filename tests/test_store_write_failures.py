"""What a failed store write tells the user (:func:`storage.store.write_failure_reason`).

SQLite's own words, plus the likely causes when the words say little: SQLite
reports a write that failed with anything but ENOSPC (EFBIG past a file size
limit, EPERM on an immutable file, EROFS, EDQUOT, EIO) as "disk I/O error". The
end-to-end faults are in ``tests/e2e/test_store_faults.py``; here the reason
itself, a real SQLITE_READONLY through the persistence actor, and a store file
deleted under the actor.
"""

from __future__ import annotations

import logging
import sqlite3
from typing import Any

import peewee
import pytest

from actors.persistence import (
    CreateSession,
    StoreWriteError,
    WriteMode,
    WriteTurn,
)
from ipc.errors import InternalError
from storage import Store
from storage.store import write_failure_reason
from tests.test_persistence import call, session, ten_items, turn


@pytest.fixture
def store_backend() -> str:
    """These faults are the SQLite file's own (read-only, deleted, full): SQLite only."""
    return "sqlite"

IO_HINT = "the disk may be full or read-only, or the file too large"



def sqlite_error(message: str, code: int | None) -> sqlite3.OperationalError:
    """An error as sqlite3 raises it (``code`` None: as a test or a library builds it)."""
    error = sqlite3.OperationalError(message)
    if code is not None:
        error.sqlite_errorcode = code
    return error


def peewee_error(error: sqlite3.Error) -> peewee.OperationalError:
    """``error`` wrapped the way peewee re-raises it."""
    return peewee.OperationalError(error, *error.args)


def test_an_io_error_names_its_likely_causes_also_wrapped_by_peewee() -> None:
    raw = sqlite_error("disk I/O error", sqlite3.SQLITE_IOERR_WRITE)
    assert write_failure_reason(raw) == f"disk I/O error ({IO_HINT})"
    assert write_failure_reason(peewee_error(raw)) == f"disk I/O error ({IO_HINT})"


def test_clear_words_and_unknown_codes_are_kept_as_they_are() -> None:
    full = sqlite_error("database or disk is full", sqlite3.SQLITE_FULL)
    locked = sqlite_error("database is locked", sqlite3.SQLITE_BUSY)
    assert write_failure_reason(full) == "database or disk is full"
    assert write_failure_reason(peewee_error(locked)) == "database is locked"
    assert write_failure_reason(sqlite_error("disk I/O error", None)) == "disk I/O error"


def test_a_read_only_store_fails_clearly_as_a_json_rpc_error_then_recovers(
    store: Store, writer: Any
) -> None:
    call(writer.perform, CreateSession(session()))
    store.writer.execute_sql("PRAGMA query_only = 1")  # a real SQLITE_READONLY (the actor is idle)
    failed = call(writer.perform, WriteTurn(turn("s1", ten_items(0))))
    assert isinstance(failed.error, StoreWriteError) and isinstance(failed.error, InternalError)
    assert failed.error.to_error() == {"code": -32603, "message": (
        "store write failed: attempt to write a readonly database "
        "(the store's file or its directory is read-only)")}
    store.writer.execute_sql("PRAGMA query_only = 0")
    assert call(writer.perform, WriteTurn(turn("s1", ten_items(0)))).ok() == 1


def test_a_deleted_store_file_fails_every_write_and_is_logged_once(
    store: Store, writer: Any, caplog: pytest.LogCaptureFixture
) -> None:
    call(writer.perform, CreateSession(session()))
    for path in store.path.parent.glob(f"{store.path.name}*"):
        path.unlink()  # rm acp-sessions.db*: the writer's connection still works
    gone = {"code": -32603, "message": (
        "store write failed: the store file was deleted or replaced while zeroclaw was "
        "running; nothing more can be saved until zeroclaw is restarted")}
    with caplog.at_level(logging.WARNING, logger="zeroclaw.actors.persistence"):
        for _ in range(3):
            failed = call(writer.perform, WriteTurn(turn("s1", ten_items(0))))
            assert isinstance(failed.error, StoreWriteError) and failed.error.to_error() == gone
        assert call(writer.perform, WriteMode("s1", "full")).error.to_error() == gone
    assert [r.levelname for r in caplog.records] == ["ERROR"]
    store.path.touch()  # another file where the store was: still not the one opened
    assert call(writer.perform, WriteTurn(turn("s1", ten_items(0)))).error.to_error() == gone
