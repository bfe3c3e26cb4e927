"""The session store: opening, falling back, and the read API, on real SQLite files.

Rows are written through the real PersistenceActor (the only writer); actors are
stopped after each test by the autouse fixture in ``conftest.py``.
"""

from __future__ import annotations

import base64
import logging
import os
import sqlite3
import stat
import threading
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from actors.persistence import (
    CreateSession,
    PersistenceActor,
    Reopen,
    WriteTurn,
)
from ipc.events import TextItem, ToolItem, TurnRecord
from storage import SCHEMA_VERSION, Store, StoredSession, StoreReader, open_store
from storage.store import encode_cursor
from tests.pg_support import RawConnection


def session(sid: str, *, cwd: str = "/src/a", last_activity: float = 1000.0) -> StoredSession:
    return StoredSession(
        id=sid,
        agent_alias="main",
        workspace_dir="/ws/main",
        cwd=cwd,
        mode="supervised",
        created_at=last_activity - 1,
        last_activity=last_activity,
    )


def create_all(writer: Any, infos: list[StoredSession]) -> None:
    futures = [writer.perform(CreateSession(info)) for info in infos]
    for future in futures:
        future.get(timeout=10)


def walk_pages(
    store: Store, cwd: str | None, limit: int = 100
) -> tuple[list[StoredSession], list[int]]:
    """Every session of a listing, following cursors; and the page sizes."""
    seen: list[StoredSession] = []
    sizes: list[int] = []
    cursor: str | None = None
    while True:
        page, cursor = store.reader.list_sessions(cwd, cursor, limit)
        seen.extend(page)
        sizes.append(len(page))
        if cursor is None:
            return seen, sizes
        assert len(sizes) < 100, "pagination does not end"


def newest_first(infos: list[StoredSession]) -> list[str]:
    return [i.id for i in sorted(infos, key=lambda i: (i.last_activity, i.id), reverse=True)]


# --- opening -------------------------------------------------------------------


def test_open_creates_private_dirs_and_wal_file(tmp_path: Path) -> None:
    path = tmp_path / "data" / "sessions" / "acp-sessions.db"
    store = open_store(path)
    try:
        assert store.persistent is True
        assert store.path == path == store.requested_path
        for directory in (tmp_path / "data", tmp_path / "data" / "sessions"):
            assert stat.S_IMODE(directory.stat().st_mode) == 0o700
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        with sqlite3.connect(path) as check:
            assert check.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
            assert check.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
            tables = {r[0] for r in check.execute("SELECT name FROM sqlite_master")}
        assert {"sessions", "messages", "tool_calls", "session_events"} <= tables
        fk = store.writer.execute_sql("PRAGMA foreign_keys").fetchone()[0]
        sync = store.writer.execute_sql("PRAGMA synchronous").fetchone()[0]
        assert (fk, sync) == (1, 1)  # synchronous=NORMAL is 1
    finally:
        store.close()


def test_reopen_keeps_sessions(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    first = open_store(path)
    ref = PersistenceActor.start(first)
    ref.proxy().perform(CreateSession(session("kept"))).get(timeout=10)
    ref.stop()
    first.close()

    second = open_store(path)
    try:
        assert second.persistent is True
        assert second.reader.get_session("kept") == session("kept")
    finally:
        second.close()


def assert_ephemeral_store_works(store: Store) -> None:
    assert store.persistent is False
    ref = PersistenceActor.start(store)
    turn = TurnRecord("tmp", (TextItem("user", "hi"),), "end_turn", "hi", 1.0, 2.0)
    ref.proxy().perform(CreateSession(session("tmp"))).get(timeout=10)
    assert ref.proxy().perform(WriteTurn(turn)).get(timeout=10) == 1
    ref.stop()
    assert store.reader.load_items("tmp") == [TextItem("user", "hi")]


SCHEMA_1_TOOL_CALLS = (
    'CREATE TABLE "tool_calls" ("id" INTEGER NOT NULL PRIMARY KEY, "session_id" TEXT NOT NULL,'
    ' "turn" INTEGER NOT NULL, "seq" INTEGER NOT NULL, "tool_call_id" TEXT NOT NULL,'
    ' "name" TEXT NOT NULL, "arguments" TEXT NOT NULL, "result" TEXT NOT NULL,'
    ' "outcome" TEXT NOT NULL, "title" TEXT NOT NULL, "kind" TEXT NOT NULL)')


def test_a_schema_1_store_gets_the_step_column_and_keeps_its_rows(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    with sqlite3.connect(path) as old:
        old.execute(SCHEMA_1_TOOL_CALLS)
        old.execute("INSERT INTO tool_calls (session_id, turn, seq, tool_call_id, name,"
                    " arguments, result, outcome, title, kind) VALUES"
                    " ('s1', 1, 1, 'c1', 'shell', '{}', 'ok', 'completed', 't', 'execute')")
        old.execute("PRAGMA user_version = 1")
    for _ in range(2):  # the second open finds nothing to add
        open_store(path).close()
    with sqlite3.connect(path) as check:
        assert check.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 4
        columns = {r[1]: r[4] for r in check.execute("PRAGMA table_info(tool_calls)")}
        assert columns["step"] == "0"  # an SQL default: older versions can still insert
    [item] = StoreReader(path).load_items("s1")
    assert (item.tool_call_id, item.step) == ("c1", 0)


def test_fallback_when_parent_is_a_regular_file(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file, not a directory")
    requested = blocker / "sessions" / "acp-sessions.db"
    with caplog.at_level(logging.WARNING, logger="zeroclaw.storage"):
        store = open_store(requested)
    try:
        assert store.requested_path == store.path == requested
        assert store.location.startswith("file:/zeroclaw-")  # in memory: no file at all
        assert_ephemeral_store_works(store)
        assert any("unusable" in r.getMessage() for r in caplog.records)
    finally:
        store.close()
    assert blocker.read_text() == "a file, not a directory"


def test_fallback_without_memdb_uses_a_private_temporary_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An SQLite library older than 3.36 cannot keep the store in memory."""

    def no_memdb(*args: Any, **kwargs: Any) -> Store:
        raise sqlite3.OperationalError("no such vfs: memdb")

    monkeypatch.setattr("storage.store._open_in_memory", no_memdb)
    requested = tmp_path / "corrupt.db"
    requested.write_bytes(b"not an SQLite database\n" * 200)
    store = open_store(requested)
    try:
        assert store.requested_path == requested != store.path
        assert_ephemeral_store_works(store)
        temp_file = store.path
        assert temp_file.exists()
        assert stat.S_IMODE(temp_file.parent.stat().st_mode) == 0o700
    finally:
        store.close()
    assert not temp_file.exists()


def test_two_in_memory_stores_are_apart(tmp_path: Path) -> None:
    first, second = (open_store(Path("/proc/zeroclaw-no-such-dir/acp-sessions.db"))
                     for _ in range(2))
    try:
        ref = PersistenceActor.start(first)
        ref.proxy().perform(CreateSession(session("only-in-first"))).get(timeout=10)
        ref.stop()
        assert second.reader.get_session("only-in-first") is None
        assert first.reader.get_session("only-in-first") is not None
    finally:
        first.close()
        second.close()


def test_fallback_when_path_is_under_proc(tmp_path: Path) -> None:
    store = open_store(Path("/proc/zeroclaw-no-such-dir/acp-sessions.db"))
    try:
        assert_ephemeral_store_works(store)
    finally:
        store.close()


def test_fallback_on_corrupt_file_leaves_it_alone(tmp_path: Path) -> None:
    path = tmp_path / "acp-sessions.db"
    garbage = b"this is not an SQLite database\n" * 200
    path.write_bytes(garbage)
    store = open_store(path)
    try:
        assert_ephemeral_store_works(store)
    finally:
        store.close()
    assert path.read_bytes() == garbage


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores directory permissions")
def test_fallback_on_read_only_directory(tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    try:
        store = open_store(locked / "acp-sessions.db")
        try:
            assert_ephemeral_store_works(store)
        finally:
            store.close()
    finally:
        locked.chmod(0o700)


# --- reading -------------------------------------------------------------------


def test_unknown_session_reads_empty(store: Store) -> None:
    assert store.reader.get_session("nope") is None
    assert store.reader.load_items("nope") == []
    assert store.reader.load_events("nope") == []
    assert store.reader.count_sessions() == 0
    assert store.reader.list_sessions() == ([], None)


def test_get_session_round_trips_every_field(store: Store, writer: Any) -> None:
    info = StoredSession(
        id="0b8f0f7e-1c5e-4c39-9d1e-3f1f8f3f6a10",
        agent_alias="coder",
        workspace_dir="/ws/coder",
        cwd="/src/project",
        mode="full",
        created_at=1700000000.25,
        last_activity=1700000100.5,
        title="a title",
        token_count=42,
        turn_count=3,
        closed_at=1700000200.75,
        killed=True,
        mcp_servers=[{"name": "fs", "command": "mcp-fs", "args": ["--root", "/"], "env": []}],
        meta={"client": "zed", "nested": {"n": 1}},
    )
    writer.perform(CreateSession(info)).get(timeout=10)
    assert store.reader.get_session(info.id) == info


def test_list_pages_over_250_sessions_with_and_without_cwd(store: Store, writer: Any) -> None:
    infos = []
    for n in range(380):
        # Groups of three share a timestamp, so ties (ordered by id) cross page borders.
        cwd = "/src/a" if n % 3 != 2 else "/src/b"
        infos.append(session(f"s{n:04d}", cwd=cwd, last_activity=5000.0 - n // 3))
    create_all(writer, infos)

    everything, sizes = walk_pages(store, None)
    assert sizes == [100, 100, 100, 80]
    assert [i.id for i in everything] == newest_first(infos)

    under_a = [i for i in infos if i.cwd == "/src/a"]
    listed_a, sizes_a = walk_pages(store, "/src/a")
    assert len(under_a) > 250
    assert sizes_a == [100, 100, len(under_a) - 200]
    assert [i.id for i in listed_a] == newest_first(under_a)

    under_b = [i for i in infos if i.cwd == "/src/b"]
    listed_b, sizes_b = walk_pages(store, "/src/b")
    assert len(under_b) > 100
    assert sizes_b == [100, len(under_b) - 100]
    assert [i.id for i in listed_b] == newest_first(under_b)

    assert store.reader.count_sessions() == 380
    assert store.reader.count_sessions("/src/b") == len(under_b)
    assert walk_pages(store, "/nowhere") == ([], [0])


def test_list_page_size_boundaries(store: Store, writer: Any) -> None:
    create_all(writer, [session(f"s{n:03d}", last_activity=float(n)) for n in range(100)])
    page, cursor = store.reader.list_sessions()
    assert (len(page), cursor) == (100, None)
    assert walk_pages(store, None, limit=30)[1] == [30, 30, 30, 10]
    assert walk_pages(store, None, limit=25)[1] == [25, 25, 25, 25]
    assert len(store.reader.list_sessions(limit=1000)[0]) == 100  # capped


def test_list_sees_activity_changes(store: Store, writer: Any) -> None:
    create_all(writer, [session("old", last_activity=1.0), session("new", last_activity=2.0)])
    assert [i.id for i in store.reader.list_sessions()[0]] == ["new", "old"]
    writer.perform(Reopen("old", 3.0)).get(timeout=10)
    assert [i.id for i in store.reader.list_sessions()[0]] == ["old", "new"]


def test_cursor_from_another_filter_is_rejected(store: Store, writer: Any) -> None:
    create_all(writer, [session(f"s{n:03d}", last_activity=float(n)) for n in range(150)])
    _, cursor = store.reader.list_sessions(None, None)
    assert cursor is not None
    with pytest.raises(ValueError, match="another cwd filter"):
        store.reader.list_sessions("/src/a", cursor)
    _, cursor_a = store.reader.list_sessions("/src/a", None)
    assert cursor_a is not None
    with pytest.raises(ValueError, match="another cwd filter"):
        store.reader.list_sessions(None, cursor_a)
    with pytest.raises(ValueError, match="another cwd filter"):
        store.reader.list_sessions("/src/b", cursor_a)
    assert len(store.reader.list_sessions("/src/a", cursor_a)[0]) == 50


def b64(value: bytes) -> str:
    return base64.urlsafe_b64encode(value).decode()


@pytest.mark.parametrize(
    "cursor",
    [
        "",
        "!!!not base64!!!",
        "é",
        b64(b"not json"),
        b64(b"[1, 2]"),
        b64(orjson.dumps({"a": 1.0, "i": "x"})),
        b64(orjson.dumps({"a": "1.0", "i": "x", "c": None})),
        b64(orjson.dumps({"a": True, "i": "x", "c": None})),
        b64(orjson.dumps({"a": 1.0, "i": 7, "c": None})),
        b64(orjson.dumps({"a": 1.0, "i": "x", "c": None, "extra": 1})),
    ],
)
def test_malformed_cursor_is_rejected(store: Store, cursor: str) -> None:
    with pytest.raises(ValueError, match="malformed cursor"):
        store.reader.list_sessions(None, cursor)


def test_relative_cwd_filter_is_rejected(store: Store) -> None:
    with pytest.raises(ValueError, match="absolute"):
        store.reader.list_sessions("src/a")


def test_cursor_round_trips_exact_float(store: Store, writer: Any) -> None:
    moments = [1700000000.123456789 + n * 1e-6 for n in range(3)]
    create_all(writer, [session(f"s{n}", last_activity=t) for n, t in enumerate(moments)])
    first, cursor = store.reader.list_sessions(None, None, limit=1)
    assert cursor == encode_cursor(first[0].last_activity, first[0].id, None)
    rest, _ = store.reader.list_sessions(None, cursor, limit=10)
    assert [i.id for i in first + rest] == ["s2", "s1", "s0"]


def test_reads_from_many_threads_at_once(store: Store, writer: Any) -> None:
    create_all(writer, [session(f"s{n:02d}", last_activity=float(n)) for n in range(40)])
    turn = (TextItem("user", "q"), ToolItem("t1", "shell", {"command": "ls"}, "out", "completed"))
    writer.perform(WriteTurn(TurnRecord("s07", turn, "end_turn", "", 1.0, 2.0))).get(timeout=10)
    errors: list[BaseException] = []
    barrier = threading.Barrier(8)

    def read() -> None:
        try:
            barrier.wait(timeout=10)
            for n in range(100):
                sid = f"s{n % 40:02d}"
                info = store.reader.get_session(sid)
                assert info is not None and info.id == sid
                assert store.reader.load_items("s07") == list(turn)
                assert len(store.reader.list_sessions(limit=10)[0]) == 10
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=read) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert errors == []
    store.reader.close()
    assert store.reader.count_sessions() == 40  # reopens after close


def test_read_runs_while_a_write_transaction_is_open(store: Store, writer: Any) -> None:
    create_all(writer, [session("committed")])
    other_writer = RawConnection(store)
    try:
        other_writer.execute("BEGIN IMMEDIATE")
        other_writer.execute("UPDATE sessions SET title = 'uncommitted' WHERE id = 'committed'")
        started = time.monotonic()
        info = store.reader.get_session("committed")
        assert time.monotonic() - started < 1.0  # not waiting on the writer's lock
        assert info is not None and info.title is None
        other_writer.execute("COMMIT")
        info = store.reader.get_session("committed")
        assert info is not None and info.title == "uncommitted"
    finally:
        other_writer.close()


def test_stored_session_has_one_field_per_session_column() -> None:
    """The record and the model are one schema: the same names, nothing missing."""
    from dataclasses import fields

    from storage.models import SessionRow

    assert {f.name for f in fields(StoredSession)} == set(SessionRow._meta.fields)
