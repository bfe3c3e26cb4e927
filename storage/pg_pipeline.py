"""New sessions and finished turns on PostgreSQL: one statement per turn, two round
trips per transaction.

Statement by statement, a turn costs six statements and round trips to the server
(``BEGIN``, the lease, the session's row, its messages, its updates, ``COMMIT``), each
a wake-up of the server's process and of this one and the client library's work. Here
a turn is one statement (:func:`turn_statement`): alone, it is its own transaction,
one round trip. In psycopg's pipeline mode the statements of a group go without
waiting for each answer: :func:`write_pipelined` sends ``BEGIN`` and every write's
statement, waits once, checks what each did, then sends ``COMMIT``: two round trips
for a whole group of writes (group commit), however many sessions it holds.

Whatever the check does not confirm (another host's lease, a session this writer
remembers nothing of, or whose turn count moved) is rolled back before anything is
committed, and the caller writes the group the usual way, statement by statement
(which reads back the state, or fails the one bad write with its own error).

Threads: the persistence actor's (the writer's connection).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import peewee
import psycopg

from ipc.events import TurnRecord
from storage.leases import Leases
from storage.models import StoredSession
from storage.pg import PgDatabase, is_connection_failure
from storage.prepared_writes import PreparedWrites, Statement

__all__ = ["write_pipelined"]


@dataclass(slots=True)
class _Plan:
    """The group's statements, each with what confirms it (checked after the wait)."""

    checked: list[tuple[Statement, str]] = field(default_factory=list)
    results: list[int | None] = field(default_factory=list)


def turn_statement(db: PgDatabase, prepared: PreparedWrites, leases: Leases | None,
                   record: TurnRecord) -> tuple[Statement, int] | None:
    """The whole turn as one statement (data-modifying CTEs): the lease renewed, the
    session's row updated only where the lease is this host's and the turn count is
    the remembered one, the turn's rows inserted only where that update was; it returns
    one row, ``1`` when all of it was done, ``0`` when none of the turn was (the lease
    may have been renewed). With the new turn count; None: nothing is remembered."""
    planned = prepared.planned_turn(record)
    if planned is None:
        return None
    (update_sql, update_params), tables, turn = planned
    parts: list[str] = []
    params: list[Any] = []
    guard = ""
    if leases is not None:
        sql, lease_params = leases.hold_statement(record.session_id)
        parts.append(f"held AS ({sql} RETURNING 1)")
        params += lease_params
        guard = " AND EXISTS (SELECT 1 FROM held)"
    parts.append(f"s AS ({update_sql}{guard} RETURNING 1)")
    params += update_params
    types = db.get_context_options()["field_types"]
    for inserter, rows in tables:
        for sql, row_params in inserter.guarded_statements(rows, types,
                                                           "EXISTS (SELECT 1 FROM s)"):
            parts.append(f"i{len(parts)} AS ({sql})")
            params += row_params
    return ("WITH " + ", ".join(parts) + " SELECT count(*) FROM s", params), turn


def _plan(db: PgDatabase, prepared: PreparedWrites, leases: Leases | None,
          writes: Sequence[StoredSession | TurnRecord]) -> _Plan | None:
    plan = _Plan()
    for write in writes:
        if isinstance(write, StoredSession):
            plan.checked += [(statement, "") for statement in prepared.session_statements(write)]
            if leases is not None:
                plan.checked.append((leases.take_statement(write.id), "row"))
            plan.results.append(None)
            continue
        made = turn_statement(db, prepared, leases, write)
        if made is None:
            return None
        plan.checked.append((made[0], "all"))
        plan.results.append(made[1])
    return plan


def _confirmed(cursor: Any, check: str) -> bool:
    if check == "row":
        return cursor.fetchone() is not None
    if check == "all":
        return bool(cursor.fetchone()[0] == 1)
    return True


def write_pipelined(db: PgDatabase, prepared: PreparedWrites, leases: Leases | None,
                    writes: Sequence[StoredSession | TurnRecord]) -> list[int | None] | None:
    """Write ``writes`` (new sessions, finished turns, in order) in one transaction,
    pipelined; each turn's new turn count (None for a session). None: nothing was
    written, and the caller writes them statement by statement. Staged state is the
    caller's to commit (:meth:`PreparedWrites.commit_staged`) or discard. Raises what
    the server or the connection raised (:class:`storage.pg.StoreUnreachable` when it
    is gone) once ``COMMIT`` may have been sent."""
    if len(writes) == 1 and isinstance(writes[0], TurnRecord):
        return _write_turn_alone(db, prepared, leases, writes[0])
    plan = _plan(db, prepared, leases, writes)
    if plan is None:
        prepared.discard_staged()
        return None
    conn = db.pipeline_connection()
    committing = False
    try:
        with conn.pipeline() as pipeline:
            cursor = db.cursor()
            cursor.execute("BEGIN")
            checks = []
            for (sql, params), check in plan.checked:
                checked = db.cursor()
                checked.execute(sql, params)
                checks.append((checked, check))
            pipeline.sync()  # the one wait before the end
            if not all(_confirmed(checked, check) for checked, check in checks):
                cursor.execute("ROLLBACK")
                prepared.discard_staged()
                return None
            committing = True
            cursor.execute("COMMIT")
        # leaving the pipeline waits for the COMMIT
    except psycopg.Error as exc:
        prepared.discard_staged()
        failure = db.pipeline_failed(exc)
        if committing:
            raise failure from None
        return None  # nothing was committed: written the usual way (a new connection)
    return plan.results


def _write_turn_alone(db: PgDatabase, prepared: PreparedWrites, leases: Leases | None,
                      record: TurnRecord) -> list[int | None] | None:
    """A turn with nothing grouped with it: its one statement, which is its own
    transaction (one round trip). When the connection is lost under it, whether the
    server committed it is read back on a new connection (this host is the session's
    only writer while it holds the lease): done, or written the usual way."""
    made = turn_statement(db, prepared, leases, record)
    if made is None:
        prepared.discard_staged()
        return None
    (sql, params), turn = made
    try:
        done = db.execute_sql(sql, params).fetchone()[0] == 1
    except peewee.PeeweeException as exc:
        prepared.discard_staged()
        if not is_connection_failure(exc):
            return None  # refused whole: the usual way says why
        return [turn] if _stored_turns(db, record.session_id) == turn else None
    if not done:
        prepared.discard_staged()
        return None
    return [turn]


def _stored_turns(db: PgDatabase, session_id: str) -> int | None:
    """The session's stored turn count, on a new connection; raises when the server is
    still gone (the turn's fate is then unknown: it is reported failed)."""
    db.drop_if_broken()
    row = db.execute_sql("SELECT turn_count FROM sessions WHERE id = %s",
                         (session_id,)).fetchone()
    return int(row[0]) if row else None
