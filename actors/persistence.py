"""PersistenceActor: the only writer of the session store.

Every write of the host goes through this actor, which runs on its own pykka
thread and owns :attr:`storage.Store.writer`. A finished turn arrives as one
:class:`ipc.events.TurnRecord` and is written inside one transaction (never one
row per chunk, never split across transactions); turns and new sessions that
queue up share one transaction (group commit, see :class:`PersistenceActor`).
The hot writes use prepared SQL (:mod:`storage.prepared_writes`). Readers use
:attr:`storage.Store.reader` on their own threads.

The host sends :class:`PersistRequest` messages (``tell``, no pykka future;
what one pass of its loop asked for goes as one :class:`PersistBatch`), each
carrying one typed write (:class:`CreateSession`, :class:`WriteTurn`,
:class:`WriteMode`, :class:`MarkClosed`, ...; a :class:`StoreWrite` subclass whose
type parameter is its reply value) and a ``reply`` callback (see
:mod:`actors.bridge`), called on this actor's thread once the write is
committed, ``reply(None, value)``, or failed, ``reply(StoreWriteError, None)``.
Through a proxy, :meth:`PersistenceActor.perform` does the same (tests, tools).
Nothing raises, so neither ``tell``-style calls (``proxy.perform.defer()``)
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
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import peewee

from actors.bridge import ReplyCallback, SimpleInboxActor, loop_reply, reply_all
from ipc.errors import InternalError, SessionOwnedByAnotherHost
from ipc.events import TurnRecord
from storage.leases import LeaseHeld, LeaseLost, Leases
from storage.models import (
    MessageRow,
    SessionEventRow,
    SessionKeyRow,
    SessionName,
    SessionRow,
    StoredSession,
    ToolCallRow,
    TurnUpdatesRow,
)
from storage.pg import PgDatabase
from storage.pg_pipeline import write_pipelined
from storage.prepared_writes import TITLE_MAX_CHARS, MissingSession, PreparedWrites, title_of
from storage.store import (
    Store,
    StoreFileGone,
    in_open_transaction,
    write_failure_reason,
    write_transaction,
)

__all__ = [
    "TITLE_MAX_CHARS",
    "CreateSession",
    "DeleteSession",
    "MarkClosed",
    "MarkKilled",
    "PersistBatch",
    "PersistRequest",
    "PersistenceActor",
    "RecordEvent",
    "ReleaseAllLeases",
    "ReleaseLease",
    "RenewLeases",
    "Reopen",
    "SetLabel",
    "StoreWrite",
    "StoreWriteError",
    "TakeLease",
    "UpdateMeta",
    "WriteMode",
    "WriteTurn",
    "loop_reply",
    "title_of",
]

logger = logging.getLogger("zeroclaw.actors.persistence")

MAX_GROUP = 256  # queued writes committed together, at most

R = TypeVar("R", covariant=True)


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


class StoreWrite(Generic[R]):
    """A write the actor can do; ``R`` is the type of its reply value."""

    __slots__ = ()


@dataclass(frozen=True, slots=True)
class CreateSession(StoreWrite[None]):
    """Insert the session's row (a duplicate id fails), with its key and label when
    ``name`` is given: the label moves to it from any other session of its tenant (the
    host decided it may: a reset's). On a shared store, this host's lease of the session
    is taken in the same transaction (a row never exists without its owner, nor a new
    session's lease without its row). Group-committed."""

    info: StoredSession
    name: SessionName | None = None

    @property
    def session_id(self) -> str:
        return self.info.id


@dataclass(frozen=True, slots=True)
class WriteTurn(StoreWrite[int]):
    """A finished turn in one transaction; replies the session's new turn count.
    Group-committed."""

    record: TurnRecord

    @property
    def session_id(self) -> str:
        return self.record.session_id


@dataclass(frozen=True, slots=True)
class WriteMode(StoreWrite[bool]):
    """Set the session's mode (autonomy level); replies whether the session exists."""

    session_id: str
    mode: str


@dataclass(frozen=True, slots=True)
class MarkClosed(StoreWrite[bool]):
    """The session was closed at ``when`` (the record stays restorable)."""

    session_id: str
    when: float


@dataclass(frozen=True, slots=True)
class MarkKilled(StoreWrite[bool]):
    """The session's worker died during a turn."""

    session_id: str


@dataclass(frozen=True, slots=True)
class Reopen(StoreWrite[bool]):
    """A restored session: clear the closed and killed markers, activity at ``when``."""

    session_id: str
    when: float


@dataclass(frozen=True, slots=True)
class UpdateMeta(StoreWrite[bool]):
    """Merge ``changes`` into the session's ``meta`` (a key set to ``None`` is removed)."""

    session_id: str
    changes: dict[str, Any]


@dataclass(frozen=True, slots=True)
class SetLabel(StoreWrite[bool]):
    """Set (None: remove) the session's label in its tenant; replies whether the
    session exists. A label another session holds fails (the table's unique index)."""

    session_id: str
    tenant: str
    label: str | None


@dataclass(frozen=True, slots=True)
class RecordEvent(StoreWrite[None]):
    """Store a custom event the client sent (an unknown session fails)."""

    session_id: str
    type: str
    payload: dict[str, Any]


@dataclass(frozen=True, slots=True)
class DeleteSession(StoreWrite[bool]):
    """Delete the session and all recorded for it; replies whether one was deleted
    (another live host's session: :class:`ipc.errors.SessionOwnedByAnotherHost`)."""

    session_id: str


@dataclass(frozen=True, slots=True)
class TakeLease(StoreWrite[None]):
    """Own the session's lease (a shared store): fails with
    :class:`ipc.errors.SessionOwnedByAnotherHost` while another live host owns it."""

    session_id: str


@dataclass(frozen=True, slots=True)
class ReleaseLease(StoreWrite[None]):
    """The session closed or was evicted here: its lease is free."""

    session_id: str


@dataclass(frozen=True, slots=True)
class RenewLeases(StoreWrite[list[str]]):
    """The heartbeat: the leases of the sessions ``live`` on this host (None: all of its
    leases) last the TTL from now, its others are released; replies the ids renewed
    (:meth:`storage.leases.Leases.renew`)."""

    live: tuple[str, ...] | None = None


@dataclass(frozen=True, slots=True)
class ReleaseAllLeases(StoreWrite[int]):
    """At start and at stop: this host owns no session."""


@dataclass(frozen=True, slots=True)
class PersistRequest:
    """Actor message (``tell``): do ``write``; ``reply(error, value)`` after its commit.

    The cheap way in from the loop (no pykka future). :class:`CreateSession`
    and :class:`WriteTurn` requests that queue up are committed together.
    """

    write: StoreWrite[Any]
    reply: ReplyCallback | None = None


@dataclass(frozen=True, slots=True)
class PersistBatch:
    """Actor message: the requests the loop made during one pass, in order (one
    hand-off, one wake-up of the actor's thread, however many turns ended)."""

    requests: tuple[PersistRequest, ...]


class PersistenceActor(SimpleInboxActor):
    """Serialises every write to the store. All methods run on the actor's thread.

    Group commit: a :class:`PersistRequest` for :class:`CreateSession` or
    :class:`WriteTurn` is held while more messages wait in the inbox (up to
    :data:`MAX_GROUP`); the group is then written in one transaction and every
    caller is answered after its commit. Any other message writes the held
    group first, so writes keep their arrival order. When one write of a group
    fails, the group is rolled back and each write is redone alone (so only
    the bad one fails); when the commit itself fails, every caller gets the error.
    """

    def __init__(self, store: Store, leases: Leases | None = None) -> None:
        """``leases``: this host's, on a store several hosts share (PostgreSQL); every
        turn then checks its session's lease in its transaction."""
        super().__init__()
        self._store = store
        self._leases = leases
        self._db = store.writer
        self._prepared = PreparedWrites(self._db)
        self._held: list[PersistRequest] = []
        self._store_gone_logged = False

    # --- messages and group commit -----------------------------------------------

    def on_receive(self, message: Any) -> Any:
        match message:
            case PersistRequest():
                self._take(message)
            case PersistBatch(requests=requests):
                for request in requests:
                    self._take(request)
            case _:
                logger.warning("unexpected message %s; dropped", type(message).__name__)
        if self._held and self.actor_inbox.empty():
            self.flush()
        return None

    def _take(self, request: PersistRequest) -> None:
        """Hold a group-committed write (writing the group once it is full); do any
        other write now, after what is held."""
        if isinstance(request.write, CreateSession | WriteTurn):
            self._held.append(request)
            if len(self._held) >= MAX_GROUP:
                self.flush()
        else:
            self.perform(request.write, request.reply)

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
        try:
            results = self._pipelined(held)
        except Exception as exc:
            self._group_failed(held, exc)
            return
        if results is not None:
            self._group_committed(held, results)
        elif len(held) == 1:
            self.perform(held[0].write, held[0].reply)
        else:
            self._write_group(held)

    def _write_group(self, held: list[PersistRequest]) -> None:
        """The group statement by statement, in one transaction."""
        db = self._db
        try:
            db.begin()
            results = [self._apply(request.write) for request in held]
        except Exception:
            self._abandon()
            for request in held:  # one of them is bad: each on its own
                self.perform(request.write, request.reply)
            return
        try:
            self._store.check_file()
            db.commit()
        except Exception as exc:
            self._abandon()
            self._group_failed(held, exc)
            return
        self._group_committed(held, results)

    def _pipelined(self, held: list[PersistRequest]) -> list[Any] | None:
        """On PostgreSQL, the group in one pipelined transaction (two round trips,
        :mod:`storage.pg_pipeline`); None when it is to be written the usual way: an
        SQLite store, a new session with a key or label, or a check that failed
        (nothing was committed then). Raises when its commit failed."""
        if not isinstance(self._db, PgDatabase):
            return None
        writes: list[StoredSession | TurnRecord] = []
        for request in held:
            match request.write:
                case CreateSession(info=info, name=None):
                    writes.append(info)
                case WriteTurn(record=record):
                    writes.append(record)
                case _:
                    return None
        return write_pipelined(self._db, self._prepared, self._leases, writes)

    def _group_failed(self, held: list[PersistRequest], exc: Exception) -> None:
        error = self._failure(exc, f"group commit of {len(held)} writes", None)
        reply_all([(request.reply, error, None) for request in held
                   if request.reply is not None])

    def _group_committed(self, held: list[PersistRequest], results: list[Any]) -> None:
        self._prepared.commit_staged()
        self._store.last_commit = time.time()
        logger.debug("%d writes committed together", len(held))
        reply_all([(request.reply, None, result) for request, result
                   in zip(held, results, strict=True) if request.reply is not None])

    def _abandon(self) -> None:
        """Roll back the open group transaction (if SQLite has not already)."""
        self._prepared.discard_staged()
        if in_open_transaction(self._db):
            with contextlib.suppress(peewee.PeeweeException, sqlite3.Error):
                self._db.rollback()

    def _apply(self, write: StoreWrite[Any]) -> Any:
        """One group-committed write inside the group's transaction (actor thread)."""
        match write:
            case CreateSession(info=info, name=name):
                self._prepared.insert_session(info)
                if name is not None:
                    self._insert_name(name)
                if self._leases is not None:  # owned from its first commit: no window
                    self._leases.take(self._db, info.id)
                return None
            case WriteTurn(record=record):
                if self._leases is not None:
                    self._leases.hold(self._db, record.session_id)
                return self._prepared.write_turn(record)
        raise TypeError(f"{type(write).__name__} is not group-committed")

    # --- one write, in its own transaction ---------------------------------------------

    def perform(self, write: StoreWrite[R], reply: ReplyCallback | None = None) -> R | None:
        """Write what is held first (arrival order), then ``write`` in its own
        transaction; report to ``reply``; return the reply value (None on failure).
        Never raises, so neither a tell-style call nor a full disk kills the actor."""
        if self._held:
            self.flush()
        try:
            self._store.check_file()
            result = self._work(write)
        except Exception as exc:
            failure = self._failure(exc, type(write).__name__, _session_of(write))
            _deliver(reply, failure, None, write)
            return None
        self._store.last_commit = time.time()
        _deliver(reply, None, result, write)
        return result

    def _work(self, write: StoreWrite[Any]) -> Any:
        """Do ``write`` (actor thread); raises on failure."""
        match write:
            case CreateSession() | WriteTurn():
                with self._transaction():
                    return self._apply(write)
            case WriteMode(session_id=sid, mode=mode):
                return self._update(sid, {SessionRow.mode: mode})
            case MarkClosed(session_id=sid, when=when):
                return self._update(sid, {SessionRow.closed_at: when})
            case MarkKilled(session_id=sid):
                return self._update(sid, {SessionRow.killed: True})
            case Reopen(session_id=sid, when=when):
                return self._update(sid, {SessionRow.closed_at: None, SessionRow.killed: False,
                                          SessionRow.last_activity: when})
            case UpdateMeta(session_id=sid, changes=changes):
                return self._merge_meta(sid, changes)
            case RecordEvent(session_id=sid, type=kind, payload=payload):
                return self._insert_event(sid, kind, payload)
            case SetLabel(session_id=sid, tenant=tenant, label=label):
                return self._set_label(sid, tenant, label)
            case DeleteSession(session_id=sid):
                return self._delete(sid)
            case TakeLease() | ReleaseLease() | RenewLeases() | ReleaseAllLeases():
                return self._lease_work(write)
        raise StoreWriteError(f"unknown operation {type(write).__name__}")

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

    # --- work (actor thread) --------------------------------------------------

    def _lease_work(self, write: StoreWrite[Any]) -> Any:
        leases = self._leases
        if leases is None:  # one host owns the store: nothing to hold
            return {RenewLeases: [], ReleaseAllLeases: 0}.get(type(write))
        with write_transaction(self._db):
            match write:
                case TakeLease(session_id=sid):
                    return leases.take(self._db, sid)
                case ReleaseLease(session_id=sid):
                    return leases.release(self._db, sid)
                case RenewLeases(live=live):
                    return leases.renew(self._db, live)
                case ReleaseAllLeases():
                    return leases.release_all(self._db)
        raise TypeError(type(write).__name__)

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
        """On a shared store, a session another live host owns is not deleted under it
        (-32004), and its lease goes with its rows."""
        self._prepared.forget(session_id)
        with write_transaction(self._db):
            if self._leases is not None:
                self._leases.take(self._db, session_id)
                self._leases.release(self._db, session_id)
            for model in (MessageRow, ToolCallRow, TurnUpdatesRow, SessionEventRow,
                          SessionKeyRow):
                model.delete().where(model.session == session_id).execute(self._db)
            deleted = SessionRow.delete().where(SessionRow.id == session_id).execute(self._db)
        return bool(deleted)

    def _insert_name(self, name: SessionName) -> None:
        """The new session's key and label row (inside the caller's transaction)."""
        if name.label is not None:
            (SessionKeyRow.update({SessionKeyRow.label: None})
             .where((SessionKeyRow.tenant == name.tenant) & (SessionKeyRow.label == name.label))
             .execute(self._db))
        SessionKeyRow.insert({
            SessionKeyRow.session: name.session_id, SessionKeyRow.tenant: name.tenant,
            SessionKeyRow.key: name.key, SessionKeyRow.label: name.label,
            SessionKeyRow.bound_at: name.bound_at,
        }).execute(self._db)

    def _set_label(self, session_id: str, tenant: str, label: str | None) -> bool:
        with write_transaction(self._db):
            if not SessionRow.select().where(SessionRow.id == session_id).exists(self._db):
                return False
            (SessionKeyRow.insert({
                SessionKeyRow.session: session_id, SessionKeyRow.tenant: tenant,
                SessionKeyRow.label: label, SessionKeyRow.bound_at: time.time(),
            }).on_conflict(conflict_target=[SessionKeyRow.session],
                           update={SessionKeyRow.label: label})
             .execute(self._db))
        return True

    def _update(self, session_id: str, changes: dict[Any, Any]) -> bool:
        query = SessionRow.update(changes).where(SessionRow.id == session_id)
        return bool(query.execute(self._db))

    def _insert_event(self, session_id: str, kind: str, payload: dict[str, Any]) -> None:
        row = {"session": session_id, "type": kind, "payload": payload,
               "created_at": time.time()}
        SessionEventRow.insert(row).execute(self._db)

    def _failure(self, exc: Exception, operation: str,
                 session_id: str | None) -> InternalError | SessionOwnedByAnotherHost:
        """``exc`` as the error callers get, logged (a vanished store file: once)."""
        error = _write_error(exc)
        if isinstance(error, SessionOwnedByAnotherHost):
            logger.info("%s", error.message)
            return error
        if isinstance(exc, StoreFileGone):
            if not self._store_gone_logged:
                self._store_gone_logged = True
                logger.error("session store %s: %s", self._store.where, exc)
            return error
        where = "" if session_id is None else f" for session {session_id}"
        logger.warning("store %s failed%s: %s", operation, where,
                       getattr(error, "reason", error.message))
        return error


def _session_of(write: StoreWrite[Any]) -> str | None:
    sid = getattr(write, "session_id", None)
    return sid if isinstance(sid, str) else None


def _write_error(exc: Exception) -> InternalError | SessionOwnedByAnotherHost:
    """``exc`` as a :class:`StoreWriteError` whose message carries no session content
    (another host's lease: :class:`SessionOwnedByAnotherHost`)."""
    if isinstance(exc, StoreWriteError):
        return exc
    if isinstance(exc, LeaseHeld):
        return SessionOwnedByAnotherHost(
            str(exc)[0].upper() + str(exc)[1:],
            {"ownerHost": exc.owner, "leaseExpiresInSecs": round(exc.expires_in, 1)})
    if isinstance(exc, LeaseLost):
        return StoreWriteError(str(exc))
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
    reply: ReplyCallback | None, error: BaseException | None, value: Any,
    write: StoreWrite[Any],
) -> None:
    if reply is None:
        return
    try:
        reply(error, value)
    except Exception as exc:
        logger.error("reply callback of store %s raised %s", type(write).__name__,
                     type(exc).__name__)
