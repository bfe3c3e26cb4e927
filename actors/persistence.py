"""PersistenceActor: the only writer of the session store.

Every write of the host goes through this actor, which runs on its own pykka
thread and owns :attr:`storage.Store.writer`. A finished turn arrives as one
:class:`ipc.events.TurnRecord` and is written inside one transaction (never one
row per chunk, never split across transactions); turns and new sessions that
queue up share one transaction (group commit, see :class:`PersistenceActor`).
The hot writes use prepared SQL (:mod:`storage.prepared_writes`). Readers use
:attr:`storage.Store.reader` on their own threads.

The host sends :class:`PersistRequest` messages (``tell``, no pykka future);
the methods can also be called through a proxy (tests, tools).

Every public method takes a last keyword argument ``reply`` (see
:mod:`actors.bridge`), called on this actor's thread once the write is
committed, ``reply(None, result)``, or failed, ``reply(StoreWriteError, None)``.
The methods never raise, so neither ``tell``-style calls (``proxy.m.defer()``)
nor a full disk can kill the actor; a later write succeeds again once the
store is writable. Failures are logged without any session content.

Before each commit the actor checks that the store's file is still the one it
opened (:meth:`storage.Store.check_file`: one ``stat``). Once it was deleted or
replaced, every write fails with that reason (logged once, at error level):
writing on into the unlinked file would report success for data that is gone
at the next start. A restart creates a new store.

Stopping the actor (``stop()``) queues behind pending writes, so they finish.
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import peewee

from actors.bridge import ReplyCallback, SimpleInboxActor, loop_reply
from ipc.errors import InternalError
from ipc.events import TurnRecord
from storage.models import MessageRow, SessionEventRow, SessionInfo, SessionRow, ToolCallRow
from storage.prepared_writes import TITLE_MAX_CHARS, MissingSession, PreparedWrites, title_of
from storage.store import Store, StoreFileGone, write_failure_reason, write_transaction

__all__ = [
    "TITLE_MAX_CHARS",
    "PersistRequest",
    "PersistenceActor",
    "StoreWriteError",
    "loop_reply",
    "title_of",
]

logger = logging.getLogger("zeroclaw.actors.persistence")

MAX_GROUP = 256  # queued writes committed together, at most
_BATCHED = frozenset({"create_session", "write_turn"})
_OPERATIONS = frozenset({
    "touch", "set_mode", "set_title", "mark_closed", "mark_killed", "reopen", "update_meta",
    "record_event", "delete_session",
})

T = TypeVar("T")


class StoreWriteError(InternalError):
    """A write that did not happen; the message says why, e.g.
    ``store write failed: database or disk is full`` (see
    :func:`storage.store.write_failure_reason`). The original error is ``__cause__``.

    An :class:`ipc.errors.InternalError`: a request whose handler lets it escape is
    answered -32603 with this message, whatever the operation that needed the write.
    """

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(f"store write failed: {reason}")


@dataclass(frozen=True, slots=True)
class PersistRequest:
    """Actor message (``tell``): run ``method(*args)``; ``reply(error, value)`` after commit.

    The cheap way in from the loop (no pykka future). ``create_session`` and
    ``write_turn`` requests that queue up are committed together (group commit).
    """

    method: str
    args: tuple[Any, ...]
    reply: ReplyCallback | None = None


class PersistenceActor(SimpleInboxActor):
    """Serialises every write to the store. All methods run on the actor's thread.

    Group commit: a :class:`PersistRequest` for ``create_session`` or
    ``write_turn`` is held while more messages wait in the inbox (up to
    :data:`MAX_GROUP`); the group is then written in one transaction and every
    caller is answered after its commit. Any other message writes the held
    group first, so writes keep their arrival order. When one write of a group
    fails, the group is rolled back and each write is redone alone (so only
    the bad one fails); when the commit itself fails, every caller gets the error.
    """

    def __init__(self, store: Store) -> None:
        super().__init__()
        self._store = store
        self._db = store.writer
        self._prepared = PreparedWrites(self._db)
        self._held: list[PersistRequest] = []
        self._store_gone_logged = False

    # --- messages and group commit -----------------------------------------------

    def on_receive(self, message: Any) -> Any:
        if not isinstance(message, PersistRequest):
            logger.warning("unexpected message %s; dropped", type(message).__name__)
            return None
        if message.method in _BATCHED:
            self._held.append(message)
            if len(self._held) >= MAX_GROUP or self.actor_inbox.empty():
                self.flush()
            return None
        if message.method not in _OPERATIONS:
            _deliver(message.reply, StoreWriteError(f"unknown operation {message.method}"),
                     None, message.method)
            return None
        try:
            getattr(self, message.method)(*message.args, reply=message.reply)
        except TypeError as exc:  # wrong arguments: a caller bug, answered, never fatal
            _deliver(message.reply, _write_error(exc), None, message.method)
        return None

    def on_stop(self) -> None:
        self.flush()

    def _handle_receive(self, message: Any) -> Any:
        # Safety net over pykka's dispatcher: whatever message came last (a proxy
        # attribute read, say), a held group is written once the inbox is empty.
        try:
            return super()._handle_receive(message)
        finally:
            if self._held and self.actor_inbox.empty():
                self.flush()

    def flush(self) -> None:
        """Write the held group in one transaction, then answer its callers."""
        held, self._held = self._held, []
        if not held:
            return
        if len(held) == 1:
            self._run_request(held[0])
            return
        db = self._db
        try:
            db.begin()
            results = [self._apply(request) for request in held]
        except Exception:
            self._abandon()
            for request in held:  # one of them is bad: each on its own
                self._run_request(request)
            return
        try:
            self._store.check_file()
            db.commit()
        except Exception as exc:
            self._abandon()
            error = self._failure(exc, f"group commit of {len(held)} writes", None)
            for request in held:
                _deliver(request.reply, error, None, request.method)
            return
        self._prepared.commit_staged()
        self._store.last_commit = time.time()
        for request, result in zip(held, results, strict=True):
            _deliver(request.reply, None, result, request.method)

    def _abandon(self) -> None:
        """Roll back the open group transaction (if SQLite has not already)."""
        self._prepared.discard_staged()
        if self._db.connection().in_transaction:
            with contextlib.suppress(peewee.PeeweeException, sqlite3.Error):
                self._db.rollback()

    def _run_request(self, request: PersistRequest) -> None:
        """One held write in its own transaction (the method's usual path)."""
        getattr(self, request.method)(*request.args, reply=request.reply)

    def _apply(self, request: PersistRequest) -> Any:
        """One batched write inside the group's transaction (actor thread)."""
        if request.method == "create_session":
            self._prepared.insert_session(request.args[0])
            return None
        return self._prepared.write_turn(request.args[0])

    # --- sessions -------------------------------------------------------------

    def create_session(self, info: SessionInfo, reply: ReplyCallback | None = None) -> None:
        """Insert the session's row (a duplicate id fails)."""

        def insert() -> None:
            with self._transaction():
                self._prepared.insert_session(info)

        self._run("create_session", info.id, insert, reply)

    def write_turn(self, record: TurnRecord, reply: ReplyCallback | None = None) -> int | None:
        """Write a finished turn in one transaction; returns the session's new turn count."""

        def write() -> int:
            with self._transaction():
                return self._prepared.write_turn(record)

        return self._run("write_turn", record.session_id, write, reply)

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[None]:
        """A write transaction whose staged turn state is kept only once committed."""
        try:
            with write_transaction(self._db):
                yield
        except BaseException:
            self._prepared.discard_staged()
            raise
        self._prepared.commit_staged()

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
        self._prepared.forget(session_id)
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
        """Write what is held first (arrival order), then do ``work``; report; never raise."""
        if self._held:
            self.flush()
        try:
            self._store.check_file()
            result = work()
        except Exception as exc:
            _deliver(reply, self._failure(exc, operation, session_id), None, operation)
            return None
        self._store.last_commit = time.time()
        _deliver(reply, None, result, operation)
        return result

    def _failure(self, exc: Exception, operation: str, session_id: str | None) -> StoreWriteError:
        """``exc`` as the error callers get, logged (a vanished store file: once)."""
        error = _write_error(exc)
        if isinstance(exc, StoreFileGone):
            if not self._store_gone_logged:
                self._store_gone_logged = True
                logger.error("session store %s: %s", self._store.path, exc)
            return error
        where = "" if session_id is None else f" for session {session_id}"
        logger.warning("store %s failed%s: %s", operation, where, error.reason)
        return error


def _write_error(exc: Exception) -> StoreWriteError:
    """``exc`` as a :class:`StoreWriteError` whose message carries no session content."""
    if isinstance(exc, StoreWriteError):
        return exc
    if isinstance(exc, MissingSession):
        return StoreWriteError(f"no session {exc}")
    if isinstance(exc, StoreFileGone):
        return StoreWriteError(str(exc))
    if isinstance(exc, peewee.PeeweeException | sqlite3.Error):
        reason = write_failure_reason(exc)  # SQLite's words, e.g. "database is locked"
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
