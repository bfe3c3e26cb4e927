"""PersistenceActor: the only writer of the session store.

Every write of the host goes through this actor, which runs on its own pykka
thread and owns :attr:`storage.Store.writer`. A finished turn arrives as one
:class:`ipc.events.TurnRecord` and is written in one transaction (never one row
per chunk). Readers use :attr:`storage.Store.reader` on their own threads.

Every public method takes a last keyword argument ``reply`` (see
:mod:`actors.bridge`), called on this actor's thread once the write is
committed, ``reply(None, result)``, or failed, ``reply(StoreWriteError, None)``.
The methods never raise, so neither ``tell``-style calls (``proxy.m.defer()``)
nor a full disk can kill the actor; a later write succeeds again once the
store is writable. Failures are logged without any session content.

Stopping the actor (``stop()``) queues behind pending writes, so they finish.
"""

from __future__ import annotations

import logging
import sqlite3
import time
from collections.abc import Callable
from typing import Any, TypeVar

import peewee
import pykka

from actors.bridge import ReplyCallback, loop_reply
from ipc.events import TextItem, TurnRecord
from storage.models import MessageRow, SessionEventRow, SessionInfo, SessionRow, ToolCallRow
from storage.store import Store, write_transaction

__all__ = ["TITLE_MAX_CHARS", "PersistenceActor", "StoreWriteError", "loop_reply", "title_of"]

logger = logging.getLogger("zeroclaw.actors.persistence")

TITLE_MAX_CHARS = 80
_INSERT_BATCH = 500  # rows per INSERT, well below SQLite's bound-variable limit

T = TypeVar("T")


class StoreWriteError(RuntimeError):
    """A write that did not happen; the message says why, e.g.
    ``store write failed: database or disk is full``. The original error is ``__cause__``."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(f"store write failed: {reason}")


class PersistenceActor(pykka.ThreadingActor):
    """Serialises every write to the store. All methods run on the actor's thread."""

    def __init__(self, store: Store) -> None:
        super().__init__()
        self._store = store
        self._db = store.writer

    # --- sessions -------------------------------------------------------------

    def create_session(self, info: SessionInfo, reply: ReplyCallback | None = None) -> None:
        """Insert the session's row (a duplicate id fails)."""

        def insert() -> None:
            SessionRow.insert(info.to_row()).execute(self._db)

        self._run("create_session", info.id, insert, reply)

    def write_turn(self, record: TurnRecord, reply: ReplyCallback | None = None) -> int | None:
        """Write a finished turn in one transaction; returns the session's new turn count."""
        return self._run("write_turn", record.session_id, lambda: self._write_turn(record), reply)

    def touch(
        self, session_id: str, when: float, reply: ReplyCallback | None = None
    ) -> bool | None:
        """Set the last activity time; returns whether the session exists."""
        return self._update("touch", session_id, {SessionRow.last_activity: when}, reply)

    def set_mode(
        self, session_id: str, mode: str, reply: ReplyCallback | None = None
    ) -> bool | None:
        """Set the session's mode (autonomy level); returns whether the session exists."""
        return self._update("set_mode", session_id, {SessionRow.mode: mode}, reply)

    def set_title(
        self, session_id: str, title: str, reply: ReplyCallback | None = None
    ) -> bool | None:
        """Replace the title; returns whether the session exists."""
        return self._update("set_title", session_id, {SessionRow.title: title}, reply)

    def mark_closed(
        self, session_id: str, when: float, reply: ReplyCallback | None = None
    ) -> bool | None:
        """Record that the session was closed (the record stays restorable)."""
        return self._update("mark_closed", session_id, {SessionRow.closed_at: when}, reply)

    def mark_killed(self, session_id: str, reply: ReplyCallback | None = None) -> bool | None:
        """Record that the session's worker died during a turn."""
        return self._update("mark_killed", session_id, {SessionRow.killed: True}, reply)

    def reopen(
        self, session_id: str, when: float, reply: ReplyCallback | None = None
    ) -> bool | None:
        """A restored session: clear the closed and killed markers, set the activity time."""
        changes = {
            SessionRow.closed_at: None,
            SessionRow.killed: False,
            SessionRow.last_activity: when,
        }
        return self._update("reopen", session_id, changes, reply)

    def update_meta(
        self, session_id: str, changes: dict[str, Any], reply: ReplyCallback | None = None
    ) -> bool | None:
        """Merge ``changes`` into the session's ``meta`` (a key set to ``None`` is removed)."""
        return self._run(
            "update_meta", session_id, lambda: self._merge_meta(session_id, changes), reply
        )

    def record_event(
        self,
        session_id: str,
        type: str,
        payload: dict[str, Any],
        reply: ReplyCallback | None = None,
    ) -> None:
        """Store a custom event the client sent (an unknown session fails)."""

        def insert() -> None:
            row = {
                "session": session_id,
                "type": type,
                "payload": payload,
                "created_at": time.time(),
            }
            SessionEventRow.insert(row).execute(self._db)

        self._run("record_event", session_id, insert, reply)

    def delete_session(self, session_id: str, reply: ReplyCallback | None = None) -> bool | None:
        """Delete the session and everything recorded for it; an unknown id is a success.

        Returns whether a session was deleted.
        """
        return self._run("delete_session", session_id, lambda: self._delete(session_id), reply)

    # --- work (actor thread) --------------------------------------------------

    def _write_turn(self, record: TurnRecord) -> int:
        session_id = record.session_id
        with write_transaction(self._db):
            turn_count, title, next_seq = self._turn_state(session_id)
            turn = turn_count + 1
            messages, tool_calls = _turn_rows(record, turn, next_seq)
            for batch in peewee.chunked(messages, _INSERT_BATCH):
                MessageRow.insert_many(batch, fields=_MESSAGE_FIELDS).execute(self._db)
            for batch in peewee.chunked(tool_calls, _INSERT_BATCH):
                ToolCallRow.insert_many(batch, fields=_TOOL_CALL_FIELDS).execute(self._db)
            changes: dict[Any, Any] = {
                SessionRow.last_activity: record.finished_at,
                SessionRow.turn_count: turn,
                SessionRow.token_count: SessionRow.token_count + int(record.tokens),
            }
            new_title = title_of(record) if title is None else None
            if new_title:
                changes[SessionRow.title] = new_title
            SessionRow.update(changes).where(SessionRow.id == session_id).execute(self._db)
        return turn

    def _turn_state(self, session_id: str) -> tuple[int, str | None, int]:
        """(turn count, title, next free ``seq``) of a session, in one query.

        ``seq`` is shared by messages and tool calls. It is read inside the
        write transaction, not cached: another host process may share the file.
        """
        highest = [
            model.select(peewee.fn.MAX(model.seq)).where(model.session == session_id)
            for model in (MessageRow, ToolCallRow)
        ]
        query = (
            SessionRow.select(SessionRow.turn_count, SessionRow.title, *highest)
            .where(SessionRow.id == session_id)
            .tuples()
        )
        found = list(query.execute(self._db))
        if not found:
            raise StoreWriteError(f"no session {session_id}")
        turn_count, title, *seqs = found[0]
        next_seq = max((int(seq) for seq in seqs if seq is not None), default=-1) + 1
        return int(turn_count), title, next_seq

    def _merge_meta(self, session_id: str, changes: dict[str, Any]) -> bool:
        with write_transaction(self._db):
            query = SessionRow.select(SessionRow.meta).where(SessionRow.id == session_id).tuples()
            found = list(query.execute(self._db))
            if not found:
                return False
            meta = dict(found[0][0] or {})
            for key, value in changes.items():
                if value is None:
                    meta.pop(key, None)
                else:
                    meta[key] = value
            SessionRow.update({SessionRow.meta: meta}).where(SessionRow.id == session_id).execute(
                self._db
            )
        return True

    def _delete(self, session_id: str) -> bool:
        with write_transaction(self._db):
            for model in (MessageRow, ToolCallRow, SessionEventRow):
                model.delete().where(model.session == session_id).execute(self._db)
            deleted = SessionRow.delete().where(SessionRow.id == session_id).execute(self._db)
        return bool(deleted)

    def _update(
        self,
        operation: str,
        session_id: str,
        changes: dict[Any, Any],
        reply: ReplyCallback | None,
    ) -> bool | None:
        def update() -> bool:
            query = SessionRow.update(changes).where(SessionRow.id == session_id)
            return bool(query.execute(self._db))

        return self._run(operation, session_id, update, reply)

    def _run(
        self,
        operation: str,
        session_id: str,
        work: Callable[[], T],
        reply: ReplyCallback | None,
    ) -> T | None:
        """Do ``work``; report to ``reply``; never raise."""
        try:
            result = work()
        except Exception as exc:
            error = _write_error(exc)
            logger.warning(
                "store %s failed for session %s: %s", operation, session_id, error.reason
            )
            _deliver(reply, error, None, operation)
            return None
        _deliver(reply, None, result, operation)
        return result


def title_of(record: TurnRecord) -> str | None:
    """The first non-blank line of the turn's user text, trimmed to 80 characters."""
    for item in record.items:
        if isinstance(item, TextItem) and item.role == "user":
            for line in item.text.splitlines():
                if line.strip():
                    return line.strip()[:TITLE_MAX_CHARS]
    return None


_MESSAGE_FIELDS = [
    MessageRow.session,
    MessageRow.turn,
    MessageRow.seq,
    MessageRow.role,
    MessageRow.content,
    MessageRow.reasoning,
    MessageRow.created_at,
]
_TOOL_CALL_FIELDS = [
    ToolCallRow.session,
    ToolCallRow.turn,
    ToolCallRow.seq,
    ToolCallRow.tool_call_id,
    ToolCallRow.name,
    ToolCallRow.arguments,
    ToolCallRow.result,
    ToolCallRow.outcome,
    ToolCallRow.title,
    ToolCallRow.kind,
]


def _turn_rows(
    record: TurnRecord, turn: int, first_seq: int
) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """Rows for ``messages`` and ``tool_calls`` (in ``_*_FIELDS`` order), numbered in item order."""
    messages: list[tuple[Any, ...]] = []
    tool_calls: list[tuple[Any, ...]] = []
    session_id = record.session_id
    for seq, item in enumerate(record.items, start=first_seq):
        if isinstance(item, TextItem):
            created = record.started_at if item.role == "user" else record.finished_at
            messages.append((session_id, turn, seq, item.role, item.text, None, created))
        else:
            tool_calls.append(
                (
                    session_id,
                    turn,
                    seq,
                    item.tool_call_id,
                    item.name,
                    item.arguments,
                    item.result,
                    item.outcome,
                    item.title,
                    item.kind,
                )
            )
    return messages, tool_calls


def _write_error(exc: Exception) -> StoreWriteError:
    """``exc`` as a :class:`StoreWriteError` whose message carries no session content."""
    if isinstance(exc, StoreWriteError):
        return exc
    if isinstance(exc, peewee.PeeweeException | sqlite3.Error):
        reason = str(exc) or type(exc).__name__  # SQLite's own words, e.g. "database is locked"
    else:
        reason = type(exc).__name__  # e.g. an encoding error would quote the text
    error = StoreWriteError(reason)
    error.__cause__ = exc
    return error


def _deliver(
    reply: ReplyCallback | None, error: BaseException | None, value: Any, operation: str
) -> None:
    if reply is None:
        return
    try:
        reply(error, value)
    except Exception as exc:
        logger.error("reply callback of store %s raised %s", operation, type(exc).__name__)
