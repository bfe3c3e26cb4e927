"""Opening the session store, and the read API.

:func:`open_store` opens (or creates) the SQLite file in WAL mode. When the
file cannot be used (read-only disk, full disk, bad permissions, a parent that
is not a directory, a corrupt file) it falls back to an *ephemeral* store kept
in memory (SQLite's ``memdb`` VFS: one database shared by this process's
connections, no file at all, so a full disk cannot break it; a private
temporary file only where the SQLite library is too old for ``memdb``). The
host then works with in-memory-only sessions; callers check
:attr:`Store.persistent` (plain ``:memory:`` cannot be used: it is one database
per connection, and the writer and the readers need to share one).

While the host runs, :meth:`Store.check_file` tells whether the file it opened
is still the one at its path (it was not deleted or replaced); the writer asks
before each commit, so writes into a deleted file fail instead of being lost.

Threads:

* :attr:`Store.writer` is one peewee database over one connection; after
  :func:`open_store` returns, only the persistence actor's thread uses it.
* :attr:`Store.reader` (:class:`StoreReader`) is safe from any thread: each
  calling thread gets its own read-only connection (a peewee ``SqliteDatabase``
  per thread, opened on first use). WAL lets those reads run during writes.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import itertools
import logging
import os
import secrets
import shutil
import sqlite3
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import peewee

from ipc.events import StoredTurn, TextItem, ToolItem, TurnItem
from storage import hosts, leases, pg, shared_tenants
from storage.models import (
    MODELS,
    SCHEMA_VERSION,
    MessageRow,
    SessionEvent,
    SessionEventRow,
    SessionKeyRow,
    SessionName,
    SessionRow,
    StoredSession,
    ToolCallRow,
    TurnUpdatesRow,
    stored_session_from_row,
)

__all__ = [
    "DEFAULT_BUSY_TIMEOUT_MS",
    "MAX_PAGE_SIZE",
    "Store",
    "StoreFileGone",
    "StoreReader",
    "decode_cursor",
    "encode_cursor",
    "in_open_transaction",
    "open_store",
    "open_store_url",
    "write_failure_reason",
    "write_transaction",
]

logger = logging.getLogger("zeroclaw.storage")

DEFAULT_BUSY_TIMEOUT_MS = 5000

_OPEN_ERRORS = (OSError, sqlite3.Error, peewee.PeeweeException)

#: What usually lies behind an SQLite result code whose words say little to a user.
#: A write that fails with ENOSPC is SQLite's clear "database or disk is full"; any
#: other failed write (EFBIG past a file size limit, EDQUOT, EPERM on an immutable
#: file, EROFS, EIO) is its "disk I/O error".
_FAILURE_HINTS = {
    sqlite3.SQLITE_IOERR: "the disk may be full or read-only, or the file too large",
    sqlite3.SQLITE_READONLY: "the store's file or its directory is read-only",
}


class StoreFileGone(Exception):
    """The store's file was deleted or replaced while the host had it open: what is
    written now would be lost at exit, so nothing more is written (see
    :meth:`Store.check_file`). The message says so, for the user and the log."""


class Store:
    """An open session store: where it lives, the writer, and the reader.

    ``backend`` is ``"sqlite"`` or ``"postgresql"``; ``url`` is a PostgreSQL store's URL
    without any password (what status and logs show), ``None`` for SQLite.

    ``path`` is the file in use (a temporary file when ``persistent`` is false
    and the SQLite library cannot keep the store in memory; the requested path
    when it is in memory); ``requested_path`` is the one :func:`open_store` was
    asked for; ``location`` is what SQLite opened (a file name, or a ``file:``
    URI when ``uri``). Close it with :meth:`close` once the persistence actor
    has stopped.
    """

    def __init__(
        self,
        *,
        path: Path,
        requested_path: Path,
        persistent: bool,
        writer: peewee.Database,
        busy_timeout_ms: int,
        location: str | None = None,
        uri: bool = False,
        temp_dir: Path | None = None,
        reader: StoreReader | None = None,
        url: str | None = None,
    ) -> None:
        self.path = path
        self.requested_path = requested_path
        self.persistent = persistent
        self.location = str(path) if location is None else location
        #: UNIX time of the last successful write, set by the persistence actor's
        #: thread; read anywhere (a float assignment is atomic).
        self.last_commit: float | None = None
        self.writer = writer
        self.reader = reader or StoreReader(self.location, busy_timeout_ms, uri=uri)
        self.url = url
        self.backend = "sqlite" if url is None else "postgresql"
        #: A PostgreSQL store's factory of further read-write connections (the
        #: password inside, never shown); None for SQLite.
        self.connect: Callable[[], peewee.Database] | None = None
        self._temp_dir = temp_dir
        self._file_id = _file_id(path) if persistent and url is None else None

    @property
    def where(self) -> str:
        """Where the store is, for people: the file, or the URL without a password."""
        return str(self.path) if self.url is None else self.url

    def check_file(self) -> None:
        """Raise :class:`StoreFileGone` when the file at ``path`` is no longer the one
        this store opened (deleted, or replaced by another). One ``stat``; any thread."""
        if self._file_id is None:
            return
        try:
            same = _file_id(self.path) == self._file_id
        except FileNotFoundError:
            same = False
        if not same:
            raise StoreFileGone(
                "the store file was deleted or replaced while zeroclaw was running; "
                "nothing more can be saved until zeroclaw is restarted"
            )

    def close(self) -> None:
        """Close every connection; an ephemeral store's file is removed. Any thread."""
        self.reader.close()
        self.writer.close()
        if self._temp_dir is not None:
            shutil.rmtree(self._temp_dir, ignore_errors=True)

    def __repr__(self) -> str:
        return f"Store({self.where!r}, persistent={self.persistent})"


def open_store(path: Path, *, busy_timeout_ms: int = DEFAULT_BUSY_TIMEOUT_MS) -> Store:
    """Open the store at ``path``, or an ephemeral one if that file is unusable.

    Runs on the caller's thread (the host's startup). Missing parent
    directories are created with mode 0700 and a new file with mode 0600.
    """
    path = Path(path).expanduser()
    try:
        writer = _open_file_writer(path, busy_timeout_ms, create_parents=True)
    except _OPEN_ERRORS as exc:
        logger.warning(
            "session store %s is unusable (%s); sessions will be kept in memory until exit",
            path,
            _describe(exc),
        )
    else:
        return Store(
            path=path,
            requested_path=path,
            persistent=True,
            writer=writer,
            busy_timeout_ms=busy_timeout_ms,
        )
    try:
        return _open_in_memory(path, busy_timeout_ms)
    except _OPEN_ERRORS as exc:  # an SQLite library older than 3.36 has no memdb
        logger.info("in-memory store unavailable (%s); using a temporary file", _describe(exc))
    return _open_temporary(path, busy_timeout_ms)


def open_store_url(url: str, password: str | None = None, *,
                   busy_timeout_ms: int = DEFAULT_BUSY_TIMEOUT_MS) -> Store:
    """Open the PostgreSQL store at ``url`` (``postgresql://user@host:port/db``),
    creating or migrating its schema; ``password`` overrides libpq's own sources.

    No fallback: a shared store that cannot be reached is an error (a host with its
    own in-memory sessions would serve them beside the other hosts'). Raises
    ``peewee.PeeweeException`` with a message that holds no password. A write that
    waits on another connection's lock longer than ``busy_timeout_ms`` fails."""
    writer = pg.connect_writer(url, password, _migrate_pg, lock_timeout_ms=busy_timeout_ms)
    shown = pg.redact_url(url)
    reader = StoreReader(shown, connect=pg.reader_factory(url, password))
    store = Store(path=Path(), requested_path=Path(), persistent=True, writer=writer,
                  busy_timeout_ms=DEFAULT_BUSY_TIMEOUT_MS, location=shown, reader=reader,
                  url=shown)
    store.connect = pg.connection_factory(url, password)
    return store


def in_open_transaction(db: peewee.Database) -> bool:
    """Whether ``db``'s connection is inside a transaction (one the server may have
    rolled back by itself counts). Runs on the database's thread."""
    if isinstance(db, pg.PgDatabase):
        return db.in_open_transaction()
    return bool(db.connection().in_transaction)


def _open_in_memory(requested: Path, busy_timeout_ms: int) -> Store:
    """An ephemeral store in memory: a ``memdb`` database named for this store alone."""
    location = f"file:/zeroclaw-{os.getpid()}-{secrets.token_hex(8)}?vfs=memdb"
    writer = _connect_writer(location, busy_timeout_ms, uri=True)
    return Store(path=requested, requested_path=requested, persistent=False, writer=writer,
                 busy_timeout_ms=busy_timeout_ms, location=location, uri=True)


def _open_temporary(requested: Path, busy_timeout_ms: int) -> Store:
    """An ephemeral store in a private temporary file (removed by :meth:`Store.close`)."""
    temp_dir = Path(tempfile.mkdtemp(prefix="zeroclaw-store-"))
    temp_path = temp_dir / "sessions.db"
    try:
        writer = _open_file_writer(temp_path, busy_timeout_ms, create_parents=False)
    except BaseException:
        shutil.rmtree(temp_dir, ignore_errors=True)
        raise
    return Store(path=temp_path, requested_path=requested, persistent=False, writer=writer,
                 busy_timeout_ms=busy_timeout_ms, temp_dir=temp_dir)


def _file_id(path: Path) -> tuple[int, int]:
    """Which file ``path`` names: (device, inode)."""
    found = os.stat(path)
    return found.st_dev, found.st_ino


@contextlib.contextmanager
def write_transaction(db: peewee.Database) -> Iterator[None]:
    """One write transaction (``BEGIN IMMEDIATE`` on the writer): all or nothing.

    Unlike ``db.atomic()``, an error that SQLite already rolled back by itself
    (``SQLITE_FULL``, ``SQLITE_IOERR``) is re-raised as is, instead of being
    replaced by "cannot rollback - no transaction is active".
    Runs on the writer's thread.
    """
    db.begin()
    try:
        yield
        db.commit()
    except BaseException:
        if in_open_transaction(db):
            with contextlib.suppress(*_OPEN_ERRORS):
                db.rollback()
        raise


def write_failure_reason(exc: BaseException) -> str:
    """Why a write failed, for the user and the log; any thread.

    SQLite's own words (e.g. "database is locked"; never session content), followed
    by what usually causes them when the words alone say little, e.g. "disk I/O
    error (the disk may be full or read-only, or the file too large)".
    """
    reason = str(exc).split("\n", 1)[0] or type(exc).__name__  # PostgreSQL: no DETAIL
    hint = _FAILURE_HINTS.get(_sqlite_result_code(exc) & 0xFF)
    return f"{reason} ({hint})" if hint else reason


def _sqlite_result_code(exc: BaseException) -> int:
    """The SQLite result code behind ``exc`` (peewee keeps sqlite3's error as ``orig``), or 0."""
    for candidate in (exc, getattr(exc, "orig", None), exc.__cause__, exc.__context__):
        code = getattr(candidate, "sqlite_errorcode", None)
        if isinstance(code, int):
            return code
    return 0


def _open_file_writer(
    path: Path, busy_timeout_ms: int, *, create_parents: bool
) -> peewee.SqliteDatabase:
    if create_parents:
        _make_private_dirs(path.parent)
    _create_private_file(path)
    return _connect_writer(str(path), busy_timeout_ms, uri=False)


def _connect_writer(location: str, busy_timeout_ms: int, *, uri: bool) -> peewee.SqliteDatabase:
    """The writer's connection, schema created (which proves the store is writable)."""
    writer = peewee.SqliteDatabase(
        location,
        pragmas=[
            ("journal_mode", "wal"),
            ("synchronous", "normal"),
            ("foreign_keys", 1),
            ("busy_timeout", int(busy_timeout_ms)),
        ],
        timeout=busy_timeout_ms / 1000,
        lock_type="IMMEDIATE",
        uri=uri,
        # One connection, handed from the opening thread to the actor's thread.
        thread_safe=False,
        check_same_thread=False,
    )
    try:
        writer.connect()
        journal_mode = writer.execute_sql("PRAGMA journal_mode").fetchone()[0]
        if str(journal_mode).lower() != "wal" and not uri:  # memory has no WAL
            logger.warning(
                "session store %s: WAL unavailable (journal_mode=%s)", location, journal_mode
            )
        _create_schema(writer)
    except BaseException:
        writer.close()
        raise
    return writer


def _create_schema(db: peewee.SqliteDatabase) -> None:
    """Create missing tables and stamp the schema version (also proves the file is writable)."""
    with write_transaction(db):
        version = int(db.execute_sql("PRAGMA user_version").fetchone()[0])
        _run_schema_steps(db, version)
        db.execute_sql(f"PRAGMA user_version = {max(version, SCHEMA_VERSION)}")


def _migrate_pg(db: peewee.Database) -> None:
    """The PostgreSQL schema, inside the writer's transaction that holds the lock."""
    version = pg.read_version(db)
    _run_schema_steps(db, version)
    for step in PG_SCHEMA_STEPS:
        step(db, version)
    pg.write_version(db, max(version, SCHEMA_VERSION))


def _run_schema_steps(db: peewee.Database, version: int) -> None:
    """Every step of :data:`SCHEMA_STEPS` (each safe to rerun), inside the caller's
    transaction; ``version`` is the stored one (0: a new store)."""
    if version > SCHEMA_VERSION:
        logger.warning("session store has schema %d, newer than %d", version, SCHEMA_VERSION)
    for step in SCHEMA_STEPS:
        step(db, version)


def _create_missing_tables(db: peewee.Database, version: int) -> None:
    """Every table and index of :data:`storage.models.MODELS` that is not there yet."""
    for model in MODELS:
        peewee.SchemaManager(model, database=db).create_all(safe=True)


def _add_missing_columns(db: peewee.Database, version: int) -> None:
    """Add the columns a newer schema gave a table an older version made (each has an
    SQL default, so older versions can still write rows, and ignore them)."""
    for model in MODELS:
        table = model._meta.table_name
        present = {column.name for column in db.get_columns(table)}
        for field in model._meta.sorted_fields:
            if field.column_name not in present:
                context = db.get_sql_context()
                column, params = context.sql(field.ddl(context)).query()
                db.execute_sql(f'ALTER TABLE "{table}" ADD COLUMN {column}', params)


#: The schema's steps, in order, on both backends: each gets the stored version (0 for
#: a new store) and is safe to rerun; a schema change appends its step (and bumps
#: :data:`storage.models.SCHEMA_VERSION`).
SCHEMA_STEPS: tuple[Callable[[peewee.Database, int], None], ...] = (
    _create_missing_tables,
    _add_missing_columns,
)

#: The steps of a PostgreSQL store only, after :data:`SCHEMA_STEPS`: what several hosts
#: on one database need (an SQLite file has one host).
PG_SCHEMA_STEPS: tuple[Callable[[peewee.Database, int], None], ...] = (
    leases.create_table,
    hosts.create_tables,
    shared_tenants.create_table,
)


def _make_private_dirs(directory: Path) -> None:
    """Create ``directory`` and its missing parents, each with mode 0700."""
    missing: list[Path] = []
    current = directory
    while not current.exists():
        missing.append(current)
        if current.parent == current:
            break
        current = current.parent
    for entry in reversed(missing):
        with contextlib.suppress(FileExistsError):
            entry.mkdir(mode=0o700)
    if not directory.is_dir():
        raise NotADirectoryError(f"not a directory: {directory}")


def _create_private_file(path: Path) -> None:
    """Create an empty ``path`` with mode 0600 unless it exists (SQLite's -wal/-shm copy it)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    os.close(fd)


def _describe(exc: BaseException) -> str:
    """A short reason for logs: the error's own message, never file content."""
    return f"{type(exc).__name__}: {exc}"


# --- reading ------------------------------------------------------------------

MAX_PAGE_SIZE = 100


class StoreReader:
    """The read API (load, list, status). Safe from any thread; each call takes a few ms.

    Each calling thread gets its own read-only (``query_only``) connection, a
    peewee ``SqliteDatabase`` opened on first use and kept for that thread.
    :meth:`close` closes all of them; call it only when no read is running.
    """

    def __init__(self, path: Path | str, busy_timeout_ms: int = DEFAULT_BUSY_TIMEOUT_MS,
                 *, uri: bool = False,
                 connect: Callable[[], peewee.Database] | None = None) -> None:
        """``path``: the store's file, or a ``file:`` URI when ``uri``; ``connect``
        makes a thread's database instead (PostgreSQL: ``path`` is then only shown)."""
        self._path = path
        self._uri = uri
        self._busy_timeout_ms = busy_timeout_ms
        self._connect = connect or self._sqlite_database
        self._sqlite = connect is None
        self._local = threading.local()
        self._lock = threading.Lock()
        self._databases: list[peewee.Database] = []

    def get_session(self, session_id: str) -> StoredSession | None:
        """The stored session, or ``None`` if there is no such record."""
        query = SessionRow.select().where(SessionRow.id == session_id).dicts()
        rows = list(query.execute(self._database()))
        return stored_session_from_row(rows[0]) if rows else None

    def load_items(self, session_id: str) -> list[TurnItem]:
        """Every message and tool call of the session, in the order they happened."""
        with self._database().atomic():  # one snapshot of both tables
            return [item for _, _, item in self._numbered_items(session_id)]

    def load_turns(self, session_id: str) -> list[StoredTurn]:
        """Every turn of the session in order: its items, and the ACP updates its client
        got (none for a turn stored before they were kept): what ``session/load``
        replays."""
        db = self._database()
        query = (TurnUpdatesRow.select(TurnUpdatesRow.turn, TurnUpdatesRow.updates)
                 .where(TurnUpdatesRow.session == session_id))
        with db.atomic():  # one snapshot of the three tables
            numbered = self._numbered_items(session_id)
            updates = {turn: orjson.loads(text) for turn, text in db.execute(query).fetchall()}
        turns: list[StoredTurn] = []
        for turn, run in itertools.groupby(numbered, key=_turn_of):
            items = tuple(item for _, _, item in run)
            turns.append(StoredTurn(items, tuple(updates.get(turn) or ())))
        return turns

    def _numbered_items(self, session_id: str) -> list[tuple[int, int, TurnItem]]:
        """``(seq, turn, item)`` of every message and tool call, by seq (inside the
        caller's transaction)."""
        db = self._database()
        messages = (
            MessageRow.select(MessageRow.seq, MessageRow.turn, MessageRow.role,
                              MessageRow.content)
            .where(MessageRow.session == session_id)
            .order_by(MessageRow.seq)
        )
        tools = (
            ToolCallRow.select(
                ToolCallRow.seq,
                ToolCallRow.turn,
                ToolCallRow.tool_call_id,
                ToolCallRow.name,
                ToolCallRow.arguments,
                ToolCallRow.result,
                ToolCallRow.outcome,
                ToolCallRow.title,
                ToolCallRow.kind,
                ToolCallRow.step,
            )
            .where(ToolCallRow.session == session_id)
            .order_by(ToolCallRow.seq)
        )
        # Raw rows (db.execute, no per-value converters): 3x faster on long sessions.
        text_items: list[tuple[int, int, TurnItem]] = [
            (seq, turn, TextItem(role=role, text=text))
            for seq, turn, role, text in db.execute(messages).fetchall()
        ]
        tool_items: list[tuple[int, int, TurnItem]] = [
            (seq, turn, ToolItem(call_id, name, _json_or_none(arguments), *rest))
            for seq, turn, call_id, name, arguments, *rest in db.execute(tools).fetchall()
        ]
        merged = text_items + tool_items
        merged.sort(key=_by_seq)  # two sorted runs: one linear merge in C
        return merged

    def list_sessions(
        self, cwd: str | None = None, cursor: str | None = None, limit: int = MAX_PAGE_SIZE,
        *, tenant: str | None = None,
    ) -> tuple[list[StoredSession], str | None]:
        """A page of stored sessions, newest activity first (ties: larger id first).

        Returns the page and the cursor of the next one (``None`` on the last
        page). ``limit`` is capped at :data:`MAX_PAGE_SIZE`. Raises
        ``ValueError`` for a relative ``cwd``, or a cursor that is malformed or
        was made under another ``cwd`` filter. ``tenant``: only the sessions whose
        ``meta.tenant`` is that name (a gateway tenant's).
        """
        if cwd is not None and not os.path.isabs(cwd):
            raise ValueError(f"cwd must be an absolute path, got {cwd!r}")
        page_size = max(1, min(int(limit), MAX_PAGE_SIZE))
        query = SessionRow.select()
        if cwd is not None:
            query = query.where(SessionRow.cwd == cwd)
        if tenant is not None:
            query = query.where(self._tenant_of_meta() == tenant)
        if cursor is not None:
            last_activity, last_id = decode_cursor(cursor, cwd)
            query = query.where(
                peewee.Tuple(SessionRow.last_activity, SessionRow.id)
                < peewee.Tuple(last_activity, last_id)
            )
        query = query.order_by(SessionRow.last_activity.desc(), SessionRow.id.desc())
        rows = list(query.limit(page_size + 1).dicts().execute(self._database()))
        page = [stored_session_from_row(row) for row in rows[:page_size]]
        if len(rows) <= page_size:
            return page, None
        last = page[-1]
        return page, encode_cursor(last.last_activity, last.id, cwd)

    def count_sessions(self, cwd: str | None = None) -> int:
        """How many sessions are stored (under ``cwd`` when given)."""
        query = SessionRow.select()
        if cwd is not None:
            query = query.where(SessionRow.cwd == cwd)
        return int(query.count(self._database()))

    def usage_totals(self) -> tuple[int, int]:
        """``(tokens, turns)`` summed over every stored session."""
        query = SessionRow.select(
            peewee.fn.COALESCE(peewee.fn.SUM(SessionRow.token_count), 0),
            peewee.fn.COALESCE(peewee.fn.SUM(SessionRow.turn_count), 0),
        ).tuples()
        tokens, turns = query.execute(self._database())[0]
        return int(tokens), int(turns)

    def load_events(self, session_id: str) -> list[SessionEvent]:
        """The custom events recorded for the session, oldest first."""
        query = (
            SessionEventRow.select(
                SessionEventRow.type, SessionEventRow.payload, SessionEventRow.created_at
            )
            .where(SessionEventRow.session == session_id)
            .order_by(SessionEventRow.created_at, SessionEventRow.id)
            .tuples()
        )
        return [SessionEvent(*row) for row in query.execute(self._database())]

    # --- session keys and labels (schema 4) ---------------------------------------------

    def session_of_key(self, tenant: str, key: str) -> str | None:
        """The session ``key`` names in ``tenant`` now (the newest bound to it), or None."""
        query = (SessionKeyRow.select(SessionKeyRow.session)
                 .where((SessionKeyRow.tenant == tenant) & (SessionKeyRow.key == key))
                 .order_by(SessionKeyRow.bound_at.desc()).limit(1).tuples())
        rows = list(query.execute(self._database()))
        return str(rows[0][0]) if rows else None

    def session_of_label(self, tenant: str, label: str) -> str | None:
        """The session labelled ``label`` in ``tenant``, or None."""
        query = (SessionKeyRow.select(SessionKeyRow.session)
                 .where((SessionKeyRow.tenant == tenant) & (SessionKeyRow.label == label))
                 .tuples())
        rows = list(query.execute(self._database()))
        return str(rows[0][0]) if rows else None

    def names_of(self, session_ids: list[str]) -> dict[str, SessionName]:
        """The key and label rows of these sessions (those that have one), each marked
        whether it is its key's current session."""
        if not session_ids:
            return {}
        db = self._database()
        model = SessionKeyRow
        query = (model.select(model.session, model.tenant, model.key, model.label,
                              model.bound_at)
                 .where(model.session.in_(session_ids)).tuples())
        with db.atomic():  # one snapshot of the rows and their keys' newest binding
            rows = list(query.execute(db))
            keys = {(tenant, key) for _, tenant, key, _, _ in rows if key is not None}
            newest = self._newest_bindings(keys)
        return {
            str(sid): SessionName(str(sid), tenant, key, label, bound_at,
                                  key is None or newest.get((tenant, key)) == bound_at)
            for sid, tenant, key, label, bound_at in rows
        }

    def _newest_bindings(self, keys: set[tuple[str, str]]) -> dict[tuple[str, str], float]:
        """``(tenant, key)``: when its newest session was bound (inside the caller's
        transaction)."""
        if not keys:
            return {}
        model = SessionKeyRow
        newest = peewee.fn.MAX(model.bound_at)
        query = (model.select(model.tenant, model.key, newest)
                 .where(model.key.in_(sorted({key for _, key in keys})))
                 .group_by(model.tenant, model.key).tuples())
        return {(tenant, key): float(when) for tenant, key, when in query.execute(
            self._database()) if (tenant, key) in keys}

    def close(self) -> None:
        """Close the connections of every thread that read."""
        with self._lock:
            databases, self._databases = self._databases, []
        for db in databases:
            db.close()
        self._local = threading.local()

    def _tenant_of_meta(self) -> peewee.ColumnBase:
        """``meta.tenant`` as SQL text, in the backend's JSON functions."""
        if self._sqlite:
            return peewee.fn.json_extract(SessionRow.meta, "$.tenant")
        return peewee.fn.jsonb_extract_path_text(peewee.Cast(SessionRow.meta, "jsonb"),
                                                 "tenant")

    def _database(self) -> peewee.Database:
        db: peewee.Database | None = getattr(self._local, "db", None)
        if isinstance(db, pg.PgDatabase):
            db.drop_if_broken()  # a server restart: reconnect
        if db is None:
            db = self._connect()
            self._local.db = db
            with self._lock:
                self._databases.append(db)
        return db

    def _sqlite_database(self) -> peewee.Database:
        return peewee.SqliteDatabase(
            str(self._path),
            pragmas=[("query_only", 1), ("busy_timeout", int(self._busy_timeout_ms))],
            timeout=self._busy_timeout_ms / 1000,
            uri=self._uri,
            thread_safe=False,
            # Used by one thread only; close() may run on another one.
            check_same_thread=False,
        )


def _turn_of(numbered: tuple[int, int, TurnItem]) -> int:
    return numbered[1]


def _json_or_none(text: str | None) -> Any:
    """A JSON column's value read raw (SQL NULL: None)."""
    return None if text is None else orjson.loads(text)


def _by_seq(pair: tuple[int, int, TurnItem]) -> int:
    return pair[0]


def encode_cursor(last_activity: float, session_id: str, cwd: str | None) -> str:
    """An opaque ``session/list`` cursor: where the previous page ended, under which filter."""
    payload = orjson.dumps({"a": last_activity, "i": session_id, "c": cwd})
    return base64.urlsafe_b64encode(payload).decode("ascii")


def decode_cursor(cursor: str, cwd: str | None) -> tuple[float, str]:
    """The position stored in ``cursor``; ``ValueError`` if malformed or made for another cwd."""
    try:
        data = orjson.loads(base64.b64decode(cursor.encode("ascii"), altchars=b"-_", validate=True))
    except (ValueError, TypeError, AttributeError, binascii.Error) as exc:
        raise ValueError("malformed cursor") from exc
    if (
        not isinstance(data, dict)
        or set(data) != {"a", "i", "c"}
        or isinstance(data["a"], bool)
        or not isinstance(data["a"], int | float)
        or not isinstance(data["i"], str)
        or not isinstance(data["c"], str | None)
    ):
        raise ValueError("malformed cursor")
    if data["c"] != cwd:
        raise ValueError("cursor was made for another cwd filter; start again without it")
    return float(data["a"]), data["i"]
