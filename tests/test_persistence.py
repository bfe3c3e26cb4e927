"""PersistenceActor: the only writer, on real SQLite files.

Actors are stopped after each test by the autouse fixture in ``conftest.py``.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pykka
import pytest

from actors.bridge import loop_reply
from actors.persistence import (
    CreateSession,
    DeleteSession,
    MarkClosed,
    MarkKilled,
    PersistenceActor,
    RecordEvent,
    Reopen,
    SetLabel,
    StoreWriteError,
    UpdateMeta,
    WriteMode,
    WriteTurn,
)
from ipc.events import TextItem, ToolItem, TurnItem, TurnRecord
from storage import SessionEvent, SessionName, Store, StoredSession, open_store
from storage.store import open_store_url
from tests.pg_support import RawConnection, rows, stop_tracing, trace_statements


@pytest.fixture
def store(tmp_path: Path, store_url: str | None) -> Iterator[Store]:
    opened = (open_store(tmp_path / "sessions" / "acp-sessions.db", busy_timeout_ms=300)
              if store_url is None else open_store_url(store_url))
    yield opened
    opened.close()


@pytest.fixture
def actor_ref(store: Store) -> Iterator[pykka.ActorRef[PersistenceActor]]:
    ref = PersistenceActor.start(store)
    yield ref
    ref.stop()


@pytest.fixture
def writer(actor_ref: pykka.ActorRef[PersistenceActor]) -> Any:
    return actor_ref.proxy()


class Reply:
    """A reply callback that a test can wait on."""

    def __init__(self) -> None:
        self.error: BaseException | None = None
        self.value: Any = None
        self.thread: threading.Thread | None = None
        self._done = threading.Event()

    def __call__(self, error: BaseException | None, value: Any) -> None:
        self.error, self.value = error, value
        self.thread = threading.current_thread()
        self._done.set()

    def wait(self) -> Reply:
        assert self._done.wait(10), "no reply"
        return self

    def ok(self) -> Any:
        self.wait()
        assert self.error is None, self.error
        return self.value


def session(sid: str = "s1", **changes: Any) -> StoredSession:
    values: dict[str, Any] = {
        "id": sid,
        "agent_alias": "main",
        "workspace_dir": "/ws/main",
        "cwd": "/src/project",
        "mode": "supervised",
        "created_at": 100.0,
        "last_activity": 100.0,
    }
    values.update(changes)
    return StoredSession(**values)


def turn(
    sid: str, items: list[TurnItem], finished_at: float = 200.0, tokens: int = 0
) -> TurnRecord:
    return TurnRecord(sid, tuple(items), "end_turn", "", finished_at - 1, finished_at, tokens)


def ten_items(n: int) -> list[TurnItem]:
    """A 10-item turn: prompt, thought, 4 tool calls with text between, answer."""
    items: list[TurnItem] = [TextItem("user", f"prompt {n}"), TextItem("thought", f"think {n}")]
    for k in range(4):
        items.append(
            ToolItem(f"call-{n}-{k}", "shell", {"command": f"ls {k}"}, f"out {k}", "completed")
        )
        if k < 3:
            items.append(TextItem("assistant", f"step {k}"))
    items.append(TextItem("assistant", f"answer {n}"))
    assert len(items) == 10
    return items


def call(method: Any, *args: Any) -> Reply:
    reply = Reply()
    method(*args, reply=reply)
    return reply.wait()


# --- sessions ------------------------------------------------------------------


def test_create_session_replies_on_actor_thread_after_commit(store: Store, writer: Any) -> None:
    reply = Reply()
    writer.perform(CreateSession(session()), reply=reply)
    assert reply.ok() is None
    assert reply.thread is not None and reply.thread is not threading.current_thread()
    # Committed before the reply: visible to a brand-new connection.
    assert rows(store, "SELECT id FROM sessions") == [("s1",)]
    assert store.reader.get_session("s1") == session()


def test_duplicate_session_fails_and_actor_survives(
    store: Store, writer: Any, actor_ref: Any
) -> None:
    call(writer.perform, CreateSession(session()))
    failed = call(writer.perform, CreateSession(session(title="again")))
    assert isinstance(failed.error, StoreWriteError)
    assert str(failed.error) == "store write failed: " + (
        "UNIQUE constraint failed: sessions.id" if store.url is None
        else 'duplicate key value violates unique constraint "sessions_pkey"')
    assert actor_ref.is_alive()
    assert call(writer.perform, CreateSession(session("s2"))).error is None


def test_session_updates_round_trip(store: Store, writer: Any) -> None:
    call(writer.perform, CreateSession(session()))
    assert call(writer.perform, WriteMode("s1", "full")).value is True
    assert call(writer.perform, UpdateMeta("s1", {"client": "zed", "x": 1})).value is True
    assert call(writer.perform, UpdateMeta("s1", {"x": None, "y": [1]})).value is True
    assert call(writer.perform, MarkKilled("s1")).value is True
    assert call(writer.perform, MarkClosed("s1", 160.0)).value is True
    assert store.reader.get_session("s1") == session(
        mode="full",
        meta={"client": "zed", "y": [1]},
        killed=True,
        closed_at=160.0,
    )
    assert call(writer.perform, Reopen("s1", 170.0)).value is True
    info = store.reader.get_session("s1")
    assert info is not None
    assert (info.closed_at, info.killed, info.last_activity) == (None, False, 170.0)


def test_updates_of_unknown_session_report_false(store: Store, writer: Any) -> None:
    for write in [
        WriteMode("ghost", "full"),
        MarkClosed("ghost", 1.0),
        MarkKilled("ghost"),
        Reopen("ghost", 1.0),
        UpdateMeta("ghost", {"a": 1}),
    ]:
        reply = call(writer.perform, write)
        assert (reply.error, reply.value) == (None, False)
    assert store.reader.count_sessions() == 0


def test_record_event_round_trip(store: Store, writer: Any) -> None:
    call(writer.perform, CreateSession(session()))
    focus = RecordEvent("s1", "focus", {"file": "a.py", "line": 3})
    assert call(writer.perform, focus).error is None
    assert call(writer.perform, RecordEvent("s1", "blur", {})).error is None
    events = store.reader.load_events("s1")
    assert [(e.type, e.payload) for e in events] == [
        ("focus", {"file": "a.py", "line": 3}),
        ("blur", {}),
    ]
    assert all(isinstance(e, SessionEvent) and e.created_at > 0 for e in events)
    failed = call(writer.perform, RecordEvent("ghost", "focus", {}))
    assert ("FOREIGN KEY constraint failed" if store.url is None
            else "violates foreign key constraint") in str(failed.error)


def test_delete_session_removes_children(store: Store, writer: Any) -> None:
    call(writer.perform, CreateSession(session()))
    call(writer.perform, CreateSession(session("keep")))
    for sid in ("s1", "keep"):
        call(writer.perform, WriteTurn(turn(sid, ten_items(1))))
        call(writer.perform, RecordEvent(sid, "focus", {}))
    assert call(writer.perform, DeleteSession("s1")).value is True
    assert store.reader.get_session("s1") is None
    assert store.reader.load_items("s1") == []
    for table in ("messages", "tool_calls", "session_events"):
        assert rows(store, f"SELECT DISTINCT session_id FROM {table}") == [("keep",)]
    assert len(store.reader.load_items("keep")) == 10
    unknown = call(writer.perform, DeleteSession("never-existed"))
    assert (unknown.error, unknown.value) == (None, False)


# --- session keys and labels ---------------------------------------------------


def test_a_key_names_its_newest_session_per_tenant(store: Store, writer: Any) -> None:
    reader = store.reader
    call(writer.perform, CreateSession(session("old"), SessionName("old", "", "k", "l", 1.0)))
    call(writer.perform, CreateSession(session("other-tenant"),
                                       SessionName("other-tenant", "t2", "k", "l", 5.0)))
    assert reader.session_of_key("", "k") == "old"
    assert reader.session_of_key("t2", "k") == "other-tenant"
    call(writer.perform, CreateSession(session("new"), SessionName("new", "", "k", "l", 2.0)))
    assert reader.session_of_key("", "k") == "new"
    assert reader.session_of_label("", "l") == "new"  # the label moved with the reset
    assert reader.session_of_label("t2", "l") == "other-tenant"
    names = reader.names_of(["old", "new", "other-tenant", "unnamed"])
    assert names["old"] == SessionName("old", "", "k", None, 1.0, current=False)
    assert names["new"].current and names["other-tenant"].current
    assert "unnamed" not in names
    assert call(writer.perform, DeleteSession("new")).value is True
    assert reader.session_of_key("", "k") == "old"  # the key falls back to its older one
    assert rows(store, "SELECT session_id FROM session_keys ORDER BY session_id") == [
        ("old",), ("other-tenant",)]


def test_set_label_upserts_and_refuses_a_taken_label(store: Store, writer: Any) -> None:
    call(writer.perform, CreateSession(session("a"), SessionName("a", "", "k", "x", 1.0)))
    call(writer.perform, CreateSession(session("b")))
    assert call(writer.perform, SetLabel("b", "", "y")).value is True
    assert store.reader.session_of_label("", "y") == "b"
    taken = call(writer.perform, SetLabel("b", "", "x"))
    assert isinstance(taken.error, StoreWriteError) and "unique" in str(taken.error).lower()
    assert call(writer.perform, SetLabel("a", "", None)).value is True
    assert store.reader.names_of(["a"])["a"].label is None
    assert store.reader.session_of_key("", "k") == "a"
    assert call(writer.perform, SetLabel("never-existed", "", "z")).value is False


# --- turns ---------------------------------------------------------------------


def test_write_turn_orders_mixed_items_across_turns(store: Store, writer: Any) -> None:
    call(writer.perform, CreateSession(session()))
    turns = [ten_items(n) for n in range(3)]
    short: list[TurnItem] = [
        ToolItem("lonely", "file_read", {"path": "x"}, "", "denied", "Read x", "read"),
        TextItem("user", "late user text"),
    ]
    turns.append(short)
    results = [
        call(writer.perform, WriteTurn(turn("s1", items, 200.0 + n, tokens=7))).ok()
        for n, items in enumerate(turns)
    ]
    assert results == [1, 2, 3, 4]
    expected = [item for items in turns for item in items]
    assert store.reader.load_items("s1") == expected

    numbered = rows(
        store,
        "SELECT seq, turn FROM messages UNION ALL SELECT seq, turn FROM tool_calls ORDER BY seq",
    )
    assert [seq for seq, _ in numbered] == list(range(len(expected)))
    assert [t for _, t in numbered] == [1] * 10 + [2] * 10 + [3] * 10 + [4] * 2
    info = store.reader.get_session("s1")
    assert info is not None
    assert (info.turn_count, info.token_count, info.last_activity) == (4, 28, 203.0)
    assert info.title == "prompt 0"


@pytest.mark.parametrize(
    ("texts", "title"),
    [
        (["\n  \n  Fix the build  \nmore"], "Fix the build"),
        (["x" * 200], "x" * 80),
        (["   ", "second user item"], "second user item"),
        ([], None),
    ],
)
def test_title_comes_from_first_user_line(
    store: Store, writer: Any, texts: list[str], title: str | None
) -> None:
    call(writer.perform, CreateSession(session()))
    items: list[TurnItem] = [TextItem("assistant", "not a title")]
    items += [TextItem("user", text) for text in texts]
    call(writer.perform, WriteTurn(turn("s1", items))).ok()
    info = store.reader.get_session("s1")
    assert info is not None and info.title == title


def test_title_is_kept_once_set(store: Store, writer: Any) -> None:
    call(writer.perform, CreateSession(session(title="given")))
    call(writer.perform, WriteTurn(turn("s1", [TextItem("user", "other")]))).ok()
    info = store.reader.get_session("s1")
    assert info is not None and info.title == "given"


def test_write_turn_for_unknown_session_fails(store: Store, writer: Any) -> None:
    failed = call(writer.perform, WriteTurn(turn("ghost", ten_items(0))))
    assert isinstance(failed.error, StoreWriteError)
    assert str(failed.error) == "store write failed: no session ghost"
    assert rows(store, "SELECT COUNT(*) FROM messages") == [(0,)]


def test_turn_is_one_transaction_with_one_insert_per_table(store: Store, writer: Any) -> None:
    call(writer.perform, CreateSession(session()))
    statements = trace_statements(store)
    try:
        call(writer.perform, WriteTurn(turn("s1", ten_items(0)))).ok()
    finally:
        stop_tracing(store)
    verbs = [s.split()[0].upper() for s in statements]
    assert verbs[0] == "BEGIN" and verbs[-1] == "COMMIT"
    assert verbs.count("BEGIN") == 1 and verbs.count("COMMIT") == 1
    assert verbs.count("INSERT") == 2  # messages and tool_calls, never one per item
    assert verbs.count("UPDATE") == 1


def test_failure_mid_turn_leaves_nothing(store: Store, writer: Any) -> None:
    call(writer.perform, CreateSession(session()))
    broken = ten_items(0)
    # Messages are inserted first; the lone surrogate breaks the tool_calls insert.
    broken[-2] = ToolItem("bad", "shell", {}, "bad \ud800 text", "failed")
    failed = call(writer.perform, WriteTurn(turn("s1", broken)))
    assert isinstance(failed.error, StoreWriteError)
    assert "\ud800" not in str(failed.error)
    assert rows(store, "SELECT COUNT(*) FROM messages") == [(0,)]
    assert rows(store, "SELECT COUNT(*) FROM tool_calls") == [(0,)]
    assert store.reader.get_session("s1") == session()
    assert call(writer.perform, WriteTurn(turn("s1", ten_items(1)))).ok() == 1
    assert rows(store, "SELECT MIN(seq), MAX(seq) FROM messages") == [(0, 9)]


def test_disk_full_fails_clearly_then_recovers(store: Store, writer: Any) -> None:
    if store.url is not None:
        pytest.skip("SQLite's own cap (max_page_count); PostgreSQL has no per-database one")
    call(writer.perform, CreateSession(session()))
    big: list[TurnItem] = [TextItem("user", "q"), TextItem("assistant", "z" * 200_000)]
    # A real SQLITE_FULL: cap the file at its current size (the actor is idle).
    pages = store.writer.execute_sql("PRAGMA page_count").fetchone()[0]
    store.writer.execute_sql(f"PRAGMA max_page_count = {pages}")
    failed = call(writer.perform, WriteTurn(turn("s1", big)))
    assert str(failed.error) == "store write failed: database or disk is full"
    assert store.reader.load_items("s1") == []

    store.writer.execute_sql("PRAGMA max_page_count = 1073741823")
    assert call(writer.perform, WriteTurn(turn("s1", big))).ok() == 1
    assert store.reader.load_items("s1") == big


def test_locked_store_fails_clearly_then_recovers(store: Store, writer: Any) -> None:
    call(writer.perform, CreateSession(session()))
    intruder = RawConnection(store)
    try:
        intruder.execute("BEGIN IMMEDIATE")
        # SQLite: the file's write lock; PostgreSQL: the session row's.
        intruder.execute("UPDATE sessions SET title = 'intruder' WHERE id = 's1'")
        failed = call(writer.perform, WriteTurn(turn("s1", ten_items(0))))
        assert str(failed.error) == "store write failed: " + (
            "database is locked" if store.url is None
            else "canceling statement due to lock timeout")
    finally:
        intruder.execute("ROLLBACK")
        intruder.close()
    assert call(writer.perform, WriteTurn(turn("s1", ten_items(0)))).ok() == 1


def test_failures_never_kill_the_actor(store: Store, writer: Any, actor_ref: Any) -> None:
    call(writer.perform, CreateSession(session()))

    def exploding_reply(error: BaseException | None, value: Any) -> None:
        raise RuntimeError("caller bug")

    writer.perform(WriteTurn(turn("s1", ten_items(0))), reply=exploding_reply).get(timeout=10)
    writer.perform.defer(WriteTurn(turn("ghost", ten_items(0))))  # tell-style, fails
    writer.perform.defer(CreateSession(session()))  # tell-style, duplicate
    assert call(writer.perform, WriteTurn(turn("s1", ten_items(1)))).ok() == 2
    assert actor_ref.is_alive()


def test_stop_finishes_queued_writes(store: Store) -> None:
    ref = PersistenceActor.start(store)
    proxy = ref.proxy()
    proxy.perform.defer(CreateSession(session()))
    for n in range(50):
        proxy.perform.defer(WriteTurn(turn("s1", ten_items(n))))
    ref.stop(timeout=30)
    info = store.reader.get_session("s1")
    assert info is not None and info.turn_count == 50
    assert len(store.reader.load_items("s1")) == 500


def test_reader_sees_whole_turns_during_writes(store: Store, writer: Any) -> None:
    call(writer.perform, CreateSession(session()))
    stop = threading.Event()
    seen: list[int] = []
    errors: list[BaseException] = []

    reading = threading.Event()

    def read() -> None:
        try:
            while not stop.is_set():
                seen.append(len(store.reader.load_items("s1")))
                reading.set()
        except BaseException as exc:
            errors.append(exc)
            reading.set()

    reader = threading.Thread(target=read)
    reader.start()
    assert reading.wait(10)
    try:
        futures = [writer.perform(WriteTurn(turn("s1", ten_items(n)))) for n in range(200)]
        assert futures[-1].get(timeout=30) == 200
    finally:
        stop.set()
        reader.join(timeout=10)
    assert errors == []
    assert seen and all(count % 10 == 0 for count in seen)
    assert seen == sorted(seen)
    assert len(store.reader.load_items("s1")) == 2000


# --- the asyncio bridge --------------------------------------------------------


async def test_loop_reply_resolves_future(writer: Any) -> None:
    loop = asyncio.get_running_loop()
    created: asyncio.Future[Any] = loop.create_future()
    writer.perform(CreateSession(session()), reply=loop_reply(loop, created))
    assert await asyncio.wait_for(created, 10) is None

    written: asyncio.Future[Any] = loop.create_future()
    writer.perform(WriteTurn(turn("s1", ten_items(0))), reply=loop_reply(loop, written))
    assert await asyncio.wait_for(written, 10) == 1

    failed: asyncio.Future[Any] = loop.create_future()
    writer.perform(WriteTurn(turn("ghost", ten_items(0))), reply=loop_reply(loop, failed))
    with pytest.raises(StoreWriteError, match="no session ghost"):
        await asyncio.wait_for(failed, 10)


async def test_loop_reply_ignores_a_cancelled_future(writer: Any) -> None:
    loop = asyncio.get_running_loop()
    problems: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _loop, context: problems.append(context))
    abandoned: asyncio.Future[Any] = loop.create_future()
    abandoned.cancel()
    writer.perform(CreateSession(session()), reply=loop_reply(loop, abandoned))
    after: asyncio.Future[Any] = loop.create_future()
    # runs after the first reply:
    writer.perform(WriteMode("s1", "full"), reply=loop_reply(loop, after))
    assert await asyncio.wait_for(after, 10) is True
    await asyncio.sleep(0)  # let any callback queued behind it run
    assert abandoned.cancelled()
    assert problems == []


def test_loop_reply_after_loop_closed_is_dropped() -> None:
    loop = asyncio.new_event_loop()
    future: asyncio.Future[Any] = loop.create_future()
    reply = loop_reply(loop, future)
    loop.close()
    reply(None, 1)  # must not raise
    assert not future.done()
