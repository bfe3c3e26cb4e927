"""The PostgreSQL backend of the session store: connections, and its schema version.

Several hosts share one database, so the schema is created and migrated under a
transaction-level advisory lock (``pg_advisory_xact_lock``): two hosts starting at
once migrate once, the second waits and finds the work done. The version lives in
the table ``zeroclaw_schema`` (one row), where SQLite uses ``PRAGMA user_version``.

The driver is psycopg 3 through peewee's :class:`peewee.PostgresqlDatabase`
(``scripts/store_backends`` measured it against psycopg2; see docs/several-hosts.md).
The password comes from the caller (``[store] password_env``) or from libpq itself
(``~/.pgpass``, ``PGPASSFILE``, a service file); it is never in the URL that is shown
(:func:`redact_url`), and never in an error this module raises (:func:`scrub`).

Threads: :func:`connect_writer` runs on the opening thread; the writer is then used by
the persistence actor's thread only. :func:`reader_factory` makes one database object
per reading thread.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qs, urlsplit, urlunsplit

import peewee

from ipc.errors import InternalError

__all__ = [
    "SCHEMA_LOCK_KEY",
    "PgDatabase",
    "StoreUnreachable",
    "connect_writer",
    "connection_factory",
    "is_postgresql_url",
    "reader_factory",
    "redact_url",
    "scrub",
]

logger = logging.getLogger("zeroclaw.storage")

#: The advisory lock key every zeroclaw host takes to migrate (``zeroclaw`` in ASCII).
SCHEMA_LOCK_KEY = 0x7A65726F636C6177

#: The driver: ``"psycopg"`` (psycopg 3, the one setup.cfg pins) or ``"psycopg2"`` (when
#: installed; ``scripts/store_backends.py`` compares them).
DRIVER = "psycopg"

#: The server ends a writer's transaction that waits this long for its next statement (a
#: host cut off mid-transaction): its row locks (a lease, say) do not outlive it. A
#: transaction of zeroclaw's sends its statements back to back.
IDLE_TXN_MS = 5000

_READ_OPTIONS = "-c default_transaction_read_only=on " \
                "-c default_transaction_isolation=repeatable\\ read"


class StoreUnreachable(peewee.OperationalError, InternalError):
    """The PostgreSQL server cannot be reached, or the connection to it was lost: a
    -32603 that says so, with libpq's reason (never a password: :func:`scrub`)."""

    def __init__(self, reason: str) -> None:
        self.reason = f"the store is unreachable ({reason})"
        super().__init__(self.reason)


#: SQLSTATE classes and codes of a lost server: connection exceptions, shutdowns.
_LOST_STATES = ("08", "57P01", "57P02", "57P03")


def is_connection_failure(exc: BaseException) -> bool:
    """Whether ``exc`` (peewee's, or the driver's as its ``orig``) says the server is
    gone or cannot be reached, rather than that a statement was refused."""
    orig = getattr(exc, "orig", None) or exc
    if isinstance(orig, StoreUnreachable):
        return True
    state = getattr(orig, "sqlstate", None) or getattr(orig, "pgcode", None)
    if state:
        return str(state).startswith(_LOST_STATES)
    if type(orig).__name__ not in ("OperationalError", "InterfaceError"):
        return False
    text = str(orig)  # a failed connection attempt has no SQLSTATE: the server's words
    if "FATAL:" in text:  # it answered: a refused login, a missing database, unless
        return any(words in text for words in _LOST_WORDS)  # it is starting or stopping
    return True


_LOST_WORDS = ("the database system is", "terminating connection")


def _unreachable(exc: BaseException, password: str | None) -> StoreUnreachable:
    text = str(getattr(exc, "orig", None) or exc).strip().split("\n", 1)[0]
    return StoreUnreachable(scrub(text, password) or type(exc).__name__)


class PgDatabase(peewee.PostgresqlDatabase):
    """peewee's PostgreSQL database with SQLite's widths: ``FloatField`` is a double
    (UNIX times; peewee's default ``REAL`` keeps 7 digits), ``IntegerField`` 64 bits.

    A server that is gone raises :class:`StoreUnreachable`. Outside a transaction a
    connection the server closed is replaced before the next statement; a
    ``read_only`` database (a reader) also runs a statement again, once, on a new
    connection when its connection turns out to be gone under it."""

    field_types = {**peewee.PostgresqlDatabase.field_types,
                   "FLOAT": "DOUBLE PRECISION", "INT": "BIGINT", "AUTO": "BIGSERIAL"}

    def __init__(self, *args: Any, read_only: bool = False, secret: str | None = None,
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.read_only = read_only
        self._secret = secret
        self._in_transaction = False  # between this object's BEGIN and COMMIT/ROLLBACK

    def begin(self, isolation_level: Any = None) -> None:
        """``BEGIN``, on a new connection when the server dropped the old one (a
        restart, an idle timeout, ``pg_terminate_backend``): nothing of this
        transaction ran yet, so one retry is safe. A connection lost *inside* a
        transaction is never replaced under it: that transaction fails whole."""
        self.drop_if_broken()
        try:
            try:
                super().begin(isolation_level)
            except (peewee.OperationalError, peewee.InterfaceError):
                if not self.drop_if_broken():
                    raise
                super().begin(isolation_level)
        except peewee.PeeweeException as exc:
            raise self._failure(exc) from None
        self._in_transaction = True

    def commit(self) -> None:
        self._in_transaction = False
        try:
            super().commit()
        except peewee.PeeweeException as exc:
            raise self._failure(exc) from None

    def rollback(self) -> None:
        self._in_transaction = False
        super().rollback()

    def execute_sql(self, sql: str, params: Any = None) -> Any:
        if not self._in_transaction:
            self.drop_if_broken()
        try:
            return super().execute_sql(sql, params)
        except peewee.PeeweeException as exc:
            if not (self.read_only and not self._in_transaction and self.drop_if_broken()):
                raise self._failure(exc) from None
        try:  # a read on a connection that was gone: again, on a new one
            return super().execute_sql(sql, params)
        except peewee.PeeweeException as exc:
            raise self._failure(exc) from None

    def pipeline_connection(self) -> Any:
        """The driver's connection, for a transaction sent pipelined
        (:mod:`storage.pg_pipeline`); one the server closed is replaced first."""
        self.drop_if_broken()
        return self.connection()

    def pipeline_failed(self, exc: Exception) -> peewee.PeeweeException:
        """A pipelined transaction failed: it is rolled back (a connection that is gone
        is forgotten), and ``exc`` is returned as peewee's error or
        :class:`StoreUnreachable`."""
        if not self.drop_if_broken() and self.in_open_transaction():
            with contextlib.suppress(Exception):
                self.connection().execute("ROLLBACK")
        return self._failure(peewee.DatabaseError(exc, *exc.args))

    def _failure(self, exc: peewee.PeeweeException) -> peewee.PeeweeException:
        """``exc`` as :class:`StoreUnreachable` when the server is gone, else as it is."""
        if isinstance(exc, StoreUnreachable) or not is_connection_failure(exc):
            return exc
        return _unreachable(exc, self._secret)

    def drop_if_broken(self) -> bool:
        """Forget a connection the server closed (the next use opens a new one, peewee's
        autoconnect); whether there was one. Outside a transaction only."""
        conn = None if self.is_closed() else self.connection()
        if conn is None or not conn.closed:
            return False
        logger.warning("PostgreSQL connection lost; reconnecting")
        with contextlib.suppress(Exception):
            self.close()
        return True

    def in_open_transaction(self) -> bool:
        """Whether the connection is inside a transaction (also a failed one)."""
        conn = self.connection()
        status = conn.info.transaction_status if hasattr(conn, "info") else \
            conn.get_transaction_status()
        return int(status) != 0  # IDLE is 0 in both drivers


def is_postgresql_url(url: str | None) -> bool:
    return bool(url) and urlsplit(str(url)).scheme in ("postgresql", "postgres")


def redact_url(url: str) -> str:
    """``url`` without a password it may carry (``postgresql://u:***@h/db``)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)
    user = netloc[0].split(":", 1)[0]
    return urlunsplit(parts._replace(netloc=f"{user}:***@{netloc[1]}"))


def scrub(text: str, password: str | None) -> str:
    """``text`` with every occurrence of ``password`` replaced by ``***``."""
    return text.replace(password, "***") if password else text


#: libpq's parameters a connection gets unless the URL sets them: a server that does not
#: answer fails a connection attempt in seconds, and a connection whose peer went
#: silent (a partition) is found dead in about 15 s instead of the system's minutes.
CONNECTION_DEFAULTS = {"connect_timeout": "5", "keepalives": "1", "keepalives_idle": "5",
                       "keepalives_interval": "2", "keepalives_count": "3",
                       "tcp_user_timeout": "15000"}


def _database(url: str, password: str | None, *, read_only: bool = False,
              **params: Any) -> PgDatabase:
    if password is not None:
        params["password"] = password
    given = parse_qs(urlsplit(url).query)
    for key, value in CONNECTION_DEFAULTS.items():
        if key not in given:
            params.setdefault(key, value)
    return PgDatabase(url, thread_safe=False, prefer_psycopg3=DRIVER == "psycopg",
                      autorollback=False, read_only=read_only, secret=password, **params)


def connect_writer(url: str, password: str | None,
                   migrate: Callable[[peewee.Database], None], *,
                   lock_timeout_ms: int) -> PgDatabase:
    """The writer's connection, its schema migrated by ``migrate`` under the lock.

    Raises ``peewee.PeeweeException`` (the password scrubbed from its message) when the
    server cannot be reached, refuses the login, or the schema cannot be made."""
    writer = _database(url, password, application_name="zeroclaw",
                       options=f"-c lock_timeout={int(lock_timeout_ms)} "
                               f"-c idle_in_transaction_session_timeout={IDLE_TXN_MS}")
    try:
        writer.connect()
        with writer.atomic():
            writer.execute_sql("SELECT pg_advisory_xact_lock(%s)", (SCHEMA_LOCK_KEY,))
            migrate(writer)
    except StoreUnreachable:
        writer.close()
        raise
    except peewee.PeeweeException as exc:
        writer.close()
        raise type(exc)(scrub(str(exc), password)) from None
    except BaseException:
        writer.close()
        raise
    return writer


def reader_factory(url: str, password: str | None) -> Callable[[], peewee.Database]:
    """Makes one read-only (repeatable read) database object per calling thread."""

    def make() -> peewee.Database:
        return _database(url, password, read_only=True,
                         application_name="zeroclaw-reader", options=_READ_OPTIONS)

    return make


def connection_factory(url: str, password: str | None) -> Callable[[], PgDatabase]:
    """Makes a read-write database object (autocommit outside ``atomic``) for a caller
    that uses it from one thread at a time (the host's shared-store watch)."""

    def make() -> PgDatabase:
        return _database(url, password, application_name="zeroclaw-hosts",
                         options="-c lock_timeout=5000 -c statement_timeout=10000")

    return make


def read_version(db: peewee.Database) -> int:
    """The stored schema version (0: a new database); inside the migration transaction."""
    db.execute_sql("CREATE TABLE IF NOT EXISTS zeroclaw_schema "
                   "(id INTEGER PRIMARY KEY CHECK (id = 1), version INTEGER NOT NULL)")
    row = db.execute_sql("SELECT version FROM zeroclaw_schema WHERE id = 1").fetchone()
    return int(row[0]) if row else 0


def write_version(db: peewee.Database, version: int) -> None:
    db.execute_sql("INSERT INTO zeroclaw_schema (id, version) VALUES (1, %s) "
                   "ON CONFLICT (id) DO UPDATE SET version = EXCLUDED.version", (version,))
