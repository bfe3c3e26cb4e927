"""The store probe answered before ``initialize`` (:func:`probe_store`) agrees with the
host's own open of the store (:func:`storage.store.open_store`), without waiting."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from storage.store import open_store
from supervisor.servers.acp_server import probe_store


def _garbage_after_header(path: Path) -> None:
    path.write_bytes(b"SQLite format 3\x00" + bytes(range(256)) * 16)


def _not_sqlite(path: Path) -> None:
    path.write_text("notes, not a database\n")


def _a_directory(path: Path) -> None:
    path.mkdir()


def _missing(path: Path) -> None:
    pass


def _a_store(path: Path) -> None:
    open_store(path).close()


@pytest.mark.parametrize(("make", "usable"), [
    (_missing, True), (_a_store, True), (_garbage_after_header, False), (_not_sqlite, False),
    (_a_directory, False),
])
def test_the_probe_says_what_the_hosts_open_finds(
        tmp_path: Path, make: Callable[[Path], None], usable: bool) -> None:
    path = tmp_path / "sessions" / "acp-sessions.db"
    path.parent.mkdir()
    make(path)
    assert probe_store(path) is usable
    store = open_store(path)
    try:
        assert store.persistent is usable
    finally:
        store.close()


def test_a_store_another_process_is_writing_is_usable_at_once(tmp_path: Path) -> None:
    path = tmp_path / "acp-sessions.db"
    _a_store(path)
    writer = sqlite3.connect(path, isolation_level=None)
    try:
        writer.execute("BEGIN IMMEDIATE")
        started = time.monotonic()
        assert probe_store(path) is True  # the host's writer waits for the lock; no reason
        assert time.monotonic() - started < 1.0  # to refuse the store, nor to wait here
    finally:
        writer.execute("ROLLBACK")
        writer.close()
