"""PersistenceActor group commit and prepared turn writes, on real SQLite files.

Writes arrive as :class:`PersistRequest` messages (what the host sends). To make
several of them queue up, the actor is first held busy by a reply callback that
waits on an event (reply callbacks run on the actor's thread).
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import peewee
import pykka
import pytest

from actors.persistence import (
    CreateSession,
    DeleteSession,
    PersistenceActor,
    PersistRequest,
    StoreWrite,
    WriteMode,
    WriteTurn,
)
from ipc.events import TextItem, ToolItem, TurnItem, TurnRecord
from storage import Store, StoredSession, open_store
from storage.models import MessageRow
from storage.store import open_store_url
from tests.pg_support import (
    RawConnection,
    committed_value,
    reopen,
    rows,
    stop_tracing,
    trace_statements,
)

WAIT = 10.0


@pytest.fixture
def store(tmp_path: Path, store_url: str | None) -> Iterator[Store]:
    opened = (open_store(tmp_path / "acp-sessions.db", busy_timeout_ms=300)
              if store_url is None else open_store_url(store_url))
    yield opened
    opened.close()


@pytest.fixture
def actor(store: Store) -> Iterator[pykka.ActorRef[PersistenceActor]]:
    ref = PersistenceActor.start(store)
    yield ref
    ref.stop()


class Reply:
    """Records (error, value), which thread answered, and what the store held then."""

    def __init__(self, store: Store, sid: str | None = None) -> None:
        self.store = store
        self.sid = sid
        self.error: BaseException | None = None
        self.value: Any = None
        self.turns_on_disk: int | None = None
        self.done = threading.Event()

    def __call__(self, error: BaseException | None, value: Any) -> None:
        self.error, self.value = error, value
        if self.sid is not None:  # a fresh connection sees only committed data
            found = committed_value(self.store, "SELECT turn_count FROM sessions WHERE id = ?",
                                    self.sid)
            self.turns_on_disk = None if found is None else int(str(found))
        self.done.set()

    def wait(self) -> Reply:
        assert self.done.wait(WAIT), "no reply"
        return self


def session(sid: str) -> StoredSession:
    return StoredSession(id=sid, agent_alias="main", workspace_dir="/ws", cwd="/src",
                         mode="supervised", created_at=1.0, last_activity=1.0)


def turn(sid: str, n: int) -> TurnRecord:
    items: list[TurnItem] = [
        TextItem("user", f"prompt {n}"),
        ToolItem(f"call-{n}", "shell", {"command": "ls"}, "out", "completed"),
        TextItem("assistant", f"answer {n}"),
    ]
    return TurnRecord(sid, tuple(items), "end_turn", f"answer {n}", 1.0, 2.0 + n, 3)


def hold_busy(actor: pykka.ActorRef[PersistenceActor], store: Store) -> threading.Event:
    """Keep the actor's thread busy until the returned event is set."""
    release = threading.Event()
    entered = threading.Event()

    def block(error: BaseException | None, value: Any) -> None:
        entered.set()
        release.wait(WAIT)

    actor.tell(PersistRequest(WriteMode("nobody", "full"), block))
    assert entered.wait(WAIT)
    return release


def trace(store: Store) -> list[str]:
    return trace_statements(store)


def verbs(statements: list[str]) -> list[str]:
    return [s.split()[0].upper() for s in statements]


def test_queued_writes_commit_together_and_reply_after_the_commit(
    store: Store, actor: pykka.ActorRef[PersistenceActor]
) -> None:
    sids = [f"s{k}" for k in range(4)]
    release = hold_busy(actor, store)
    statements = trace(store)
    replies: list[Reply] = []
    for sid in sids:
        replies.append(reply := Reply(store, sid))
        actor.tell(PersistRequest(CreateSession(session(sid)), reply))
    for n in range(3):
        for sid in sids:
            replies.append(reply := Reply(store, sid))
            actor.tell(PersistRequest(WriteTurn(turn(sid, n)), reply))
    release.set()
    for reply in replies:
        reply.wait()
    stop_tracing(store)
    assert all(reply.error is None for reply in replies)
    assert [reply.value for reply in replies] == [None] * 4 + [1] * 4 + [2] * 4 + [3] * 4
    assert all(reply.turns_on_disk == 3 for reply in replies), "a reply came before the commit"
    said = verbs(statements)
    assert said.count("BEGIN") == 1 and said.count("COMMIT") == 1
    assert said.count("SELECT") == 0, "the next seq was read although it was known"
    for sid in sids:
        items = store.reader.load_items(sid)
        assert [getattr(i, "text", None) for i in items][::3] == [f"prompt {n}" for n in range(3)]
        assert rows(store, f"SELECT seq FROM tool_calls WHERE session_id = '{sid}'") == [
            (1,), (4,), (7,)
        ]


def test_one_bad_write_fails_alone(
    store: Store, actor: pykka.ActorRef[PersistenceActor]
) -> None:
    actor.tell(PersistRequest(CreateSession(session("s1")), Reply(store)))
    release = hold_busy(actor, store)
    good = [Reply(store), Reply(store)]
    bad = Reply(store)
    actor.tell(PersistRequest(WriteTurn(turn("s1", 0)), good[0]))
    actor.tell(PersistRequest(WriteTurn(turn("ghost", 0)), bad))
    actor.tell(PersistRequest(WriteTurn(turn("s1", 1)), good[1]))
    release.set()
    assert [r.wait().value for r in good] == [1, 2]
    assert str(bad.wait().error) == "store write failed: no session ghost"
    assert rows(store, "SELECT COUNT(*) FROM messages") == [(4,)]


def fail_next_commit(store: Store) -> None:
    """PostgreSQL: the next transaction that inserts a message fails at its COMMIT with
    "disk I/O error" (a deferred constraint trigger; a sequence, which no rollback
    undoes, lets it fire once)."""
    admin = RawConnection(store)
    try:
        admin.execute("CREATE SEQUENCE zc_fail_once")
        admin.execute("CREATE FUNCTION zc_fail_commit() RETURNS trigger LANGUAGE plpgsql AS "
                      "$$ BEGIN IF nextval('zc_fail_once') = 1 THEN "
                      "RAISE EXCEPTION 'disk I/O error'; END IF; RETURN NULL; END $$")
        admin.execute("CREATE CONSTRAINT TRIGGER zc_fail AFTER INSERT ON messages "
                      "DEFERRABLE INITIALLY DEFERRED FOR EACH ROW "
                      "EXECUTE FUNCTION zc_fail_commit()")
    finally:
        admin.close()


def test_a_failed_commit_fails_every_caller_of_the_group(
    store: Store, actor: pykka.ActorRef[PersistenceActor], monkeypatch: pytest.MonkeyPatch
) -> None:
    first = Reply(store)
    actor.tell(PersistRequest(CreateSession(session("s1")), first))
    assert first.wait().error is None
    release = hold_busy(actor, store)
    if store.url is None:
        real_commit = store.writer.commit

        def failing_commit() -> None:
            monkeypatch.setattr(store.writer, "commit", real_commit)  # only this once
            raise sqlite3.OperationalError("disk I/O error")

        monkeypatch.setattr(store.writer, "commit", failing_commit)
    else:  # the server refuses the next COMMIT (a deferred trigger), once
        fail_next_commit(store)
    group = [Reply(store) for _ in range(3)]
    actor.tell(PersistRequest(CreateSession(session("s2")), group[0]))
    actor.tell(PersistRequest(WriteTurn(turn("s1", 0)), group[1]))
    actor.tell(PersistRequest(WriteTurn(turn("s2", 0)), group[2]))
    release.set()
    for reply in group:
        assert str(reply.wait().error) == "store write failed: disk I/O error"
    assert rows(store, "SELECT id, turn_count FROM sessions") == [("s1", 0)]
    assert rows(store, "SELECT COUNT(*) FROM messages") == [(0,)]
    after = Reply(store)
    actor.tell(PersistRequest(WriteTurn(turn("s1", 1)), after))
    assert after.wait().value == 1
    assert rows(store, "SELECT MIN(seq), MAX(seq) FROM messages") == [(0, 2)]


def test_other_operations_keep_their_place_in_line(
    store: Store, actor: pykka.ActorRef[PersistenceActor]
) -> None:
    release = hold_busy(actor, store)
    created, written, deleted = Reply(store), Reply(store), Reply(store)
    actor.tell(PersistRequest(CreateSession(session("s1")), created))
    actor.tell(PersistRequest(WriteTurn(turn("s1", 0)), written))
    actor.tell(PersistRequest(DeleteSession("s1"), deleted))
    release.set()
    assert (created.wait().error, written.wait().value, deleted.wait().value) == (None, 1, True)
    assert rows(store, "SELECT COUNT(*) FROM sessions") == [(0,)]
    assert rows(store, "SELECT COUNT(*) FROM messages") == [(0,)]


def test_stop_writes_the_held_group(store: Store) -> None:
    ref = PersistenceActor.start(store)
    release = hold_busy(ref, store)
    ref.tell(PersistRequest(CreateSession(session("s1"))))
    for n in range(5):
        ref.tell(PersistRequest(WriteTurn(turn("s1", n))))
    stopping = ref.stop(block=False)
    release.set()
    stopping.get(timeout=WAIT)
    info = store.reader.get_session("s1")
    assert info is not None and info.turn_count == 5


def test_another_writer_on_the_same_file_is_noticed(
    store: Store, actor: pykka.ActorRef[PersistenceActor]
) -> None:
    """The remembered next seq is checked (turn count guard), not trusted blindly."""
    proxy = actor.proxy()
    proxy.perform(CreateSession(session("s1"))).get(timeout=WAIT)
    assert proxy.perform(WriteTurn(turn("s1", 0))).get(timeout=WAIT) == 1
    other_store = reopen(store)
    other = PersistenceActor.start(other_store)
    try:
        assert other.proxy().perform(WriteTurn(turn("s1", 1))).get(timeout=WAIT) == 2
    finally:
        other.stop()
        other_store.close()
    assert proxy.perform(WriteTurn(turn("s1", 2))).get(timeout=WAIT) == 3
    seqs = rows(store, "SELECT seq FROM messages UNION ALL SELECT seq FROM tool_calls "
                       "ORDER BY seq")
    assert [s for (s,) in seqs] == list(range(9))
    info = store.reader.get_session("s1")
    assert info is not None and info.turn_count == 3 and info.title == "prompt 0"


def test_a_held_group_is_written_whatever_message_came_last(
    store: Store, actor: pykka.ActorRef[PersistenceActor]
) -> None:
    """Held writes are not left waiting behind a proxy attribute read."""
    release = hold_busy(actor, store)
    replies = [Reply(store), Reply(store)]
    actor.tell(PersistRequest(CreateSession(session("s1")), replies[0]))
    actor.tell(PersistRequest(WriteTurn(turn("s1", 0)), replies[1]))
    attribute = actor.proxy().actor_urn  # a ProxyGetAttr message, last in the inbox
    release.set()
    assert attribute.get(timeout=WAIT)
    assert [reply.wait().value for reply in replies] == [None, 1]


def test_a_column_added_to_a_model_is_written_without_touching_the_statements(
    tmp_path: Path,
) -> None:
    """One schema: the prepared inserts come from the models, defaults included."""
    field = peewee.TextField(default="from-the-model")
    MessageRow._meta.add_field("note", field)
    try:
        opened = open_store(tmp_path / "extra.db")  # its tables come from the models too
        try:
            ref = PersistenceActor.start(opened)
            try:
                proxy = ref.proxy()
                proxy.perform(CreateSession(session("s1"))).get(timeout=WAIT)
                assert proxy.perform(WriteTurn(turn("s1", 0))).get(timeout=WAIT) == 1
            finally:
                ref.stop()
            notes = rows(opened, "SELECT DISTINCT note FROM messages")
        finally:
            opened.close()
    finally:
        MessageRow._meta.remove_field("note")
    assert notes == [("from-the-model",)]


class _Unhandled(StoreWrite[None]):
    """A write the actor does not know (a caller bug)."""


def test_an_unknown_write_is_answered_with_an_error_and_the_actor_lives_on(
    store: Store, actor: pykka.ActorRef[PersistenceActor]
) -> None:
    failed = Reply(store)
    actor.tell(PersistRequest(_Unhandled(), failed))
    assert str(failed.wait().error) == "store write failed: unknown operation _Unhandled"
    created = Reply(store)
    actor.tell(PersistRequest(CreateSession(session("s1")), created))
    assert created.wait().error is None
