"""The hot writes of the store (new session, finished turn) as prepared SQL text.

Building SQL through peewee's query objects on every write costs ~40-60 µs a
row; a host that persists every turn would pay it on every prompt
(``scripts/store_write_cost.py`` measures both ways). :class:`PreparedWrites`
has peewee compile each statement once per database, from queries built on the
models of :mod:`storage.models` (the one schema: every column, default, JSON
encoding and the backend's quoting and parameter marker come from there), with
named placeholders whose position in the compiled parameters is recorded; a
write then only binds its values and runs the text through the peewee database
object (``execute_sql``).

It also remembers, per session, what the last committed turn left behind (turn
count, next free ``seq``, whether a title is set), so a turn normally needs no
SELECT: the session's UPDATE is guarded by ``turn_count = <expected>``, and when
another writer (another host process on the same file) moved the count, the
state is read back inside the same transaction instead. Staged state becomes
the remembered state only after the caller's commit (:meth:`PreparedWrites.commit_staged`).

Threads: used by the persistence actor's thread only (not thread-safe).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import peewee

from ipc.events import TextItem, TurnRecord
from storage.models import (
    JsonField,
    MessageRow,
    SessionRow,
    StoredSession,
    ToolCallRow,
    TurnUpdatesRow,
)

__all__ = ["TITLE_MAX_CHARS", "MissingSession", "MultiRowInsert", "PreparedWrites", "Rows",
           "Statement", "TurnState", "title_of"]

TITLE_MAX_CHARS = 80
_ROWS_PER_INSERT = 500  # rows per INSERT, within SQLite's bound-variable limit
_MAX_REMEMBERED = 50_000  # sessions whose turn state is kept; past that the map restarts


#: SQL text and its parameters, for a caller that runs it (pipelined, say).
Statement = tuple[str, list[Any]]


class MissingSession(LookupError):
    """A turn for a session that has no row."""


@dataclass(frozen=True, slots=True)
class TurnState:
    """What a session's next turn starts from."""

    turn_count: int
    next_seq: int
    has_title: bool


def title_of(record: TurnRecord) -> str | None:
    """The first non-blank line of the turn's user text, trimmed to 80 characters."""
    for item in record.items:
        if isinstance(item, TextItem) and item.role == "user":
            for line in item.text.splitlines():
                if line.strip():
                    return line.strip()[:TITLE_MAX_CHARS]
    return None


class _Slot:
    """A named parameter while a statement is compiled (see :func:`_compile`)."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name


def _slot(name: str) -> peewee.Value:
    return peewee.Value(_Slot(name), converter=False)  # passed through as it is


@dataclass(frozen=True, slots=True)
class _Statement:
    """SQL text compiled by peewee once, and where each named value goes in its params."""

    sql: str
    params: tuple[Any, ...]  # a slot name (str) or a constant peewee put there (_Const)

    def bind(self, values: dict[str, Any]) -> list[Any]:
        return [values[p] if isinstance(p, str) else p.value for p in self.params]


@dataclass(frozen=True, slots=True)
class _Const:
    value: Any


def _compile(db: peewee.Database, query: peewee.Query) -> _Statement:
    """``query`` (built from the models with :func:`_slot` values) as SQL text for ``db``,
    by peewee's own compiler (so quoting and parameter markers are the backend's)."""
    sql, params = db.get_sql_context().parse(query)
    return _Statement(sql, tuple(p.name if isinstance(p, _Slot) else _Const(p) for p in params))


def _stored_fields(model: type[peewee.Model]) -> list[peewee.Field]:
    """The model's columns that an insert fills (every one but an auto-increment id)."""
    return [f for f in model._meta.sorted_fields if not isinstance(f, peewee.AutoField)]


class _RowLayout:
    """How a row given by field name becomes a model's column values, in the order of
    :func:`_stored_fields`: a missing value takes the field's default; a JSON column is
    encoded by its field (other values go to the driver as they are, as peewee would
    pass them: str, int, float, bool, None)."""

    def __init__(self, model: type[peewee.Model]) -> None:
        self.fields = _stored_fields(model)
        self._names = [field.name for field in self.fields]
        self._encoders = {field.name: field.db_value for field in self.fields
                          if isinstance(field, JsonField)}
        self._defaults = {field.name: field.default for field in self.fields}

    def values(self, row: dict[str, Any]) -> list[Any]:
        values = []
        for name in self._names:
            value = row[name] if name in row else self._default(name)
            encode = self._encoders.get(name)
            values.append(value if encode is None else encode(value))
        return values

    def _default(self, name: str) -> Any:
        default = self._defaults[name]
        return default() if callable(default) else default


class MultiRowInsert:
    """``INSERT ... VALUES (...), (...)`` of a model's rows: one statement per
    :data:`_ROWS_PER_INSERT` rows, compiled by peewee once per row count."""

    def __init__(self, db: peewee.Database, model: type[peewee.Model]) -> None:
        self._db = db
        self._model = model
        self._layout = _RowLayout(model)
        self.fields = self._layout.fields
        self._texts: dict[int, str] = {}

    def _text(self, rows: int) -> str:
        text = self._texts.get(rows)
        if text is None:
            names = [f"{n}.{field.name}" for n in range(rows) for field in self.fields]
            query = self._model.insert_many(
                [[_slot(f"{n}.{field.name}") for field in self.fields] for n in range(rows)],
                fields=self.fields)
            statement = _compile(self._db, query)
            if list(statement.params) != names:  # row after row, field after field
                raise RuntimeError(f"unexpected parameter order inserting {self._model}")
            text = self._texts[rows] = statement.sql
        return text

    def run(self, rows: list[dict[str, Any]]) -> None:
        for sql, params in self.statements(rows):
            self._db.execute_sql(sql, params)

    def guarded_statements(self, rows: list[dict[str, Any]], types: dict[str, str],
                           condition: str) -> list[Statement]:
        """PostgreSQL: ``INSERT ... SELECT`` of ``rows`` that inserts them only where
        ``condition`` holds (a CTE of the caller's names it), each value cast to its
        column's type (``types``: peewee's field type → the server's)."""
        table = self._model._meta.table_name
        columns = ", ".join(f'"{field.column_name}"' for field in self.fields)
        row_text = "(" + ", ".join(f"%s::{types[field.field_type]}"
                                   for field in self.fields) + ")"
        made = []
        for start in range(0, len(rows), _ROWS_PER_INSERT):
            chunk = rows[start : start + _ROWS_PER_INSERT]
            params = [value for row in chunk for value in self._layout.values(row)]
            made.append((f'INSERT INTO "{table}" ({columns}) SELECT * FROM (VALUES '
                         + ", ".join([row_text] * len(chunk)) + f") AS v WHERE {condition}",
                         params))
        return made

    def statements(self, rows: list[dict[str, Any]]) -> list[Statement]:
        """The statements that insert ``rows``, with their parameters."""
        made = []
        for start in range(0, len(rows), _ROWS_PER_INSERT):
            chunk = rows[start : start + _ROWS_PER_INSERT]
            params = [value for row in chunk for value in self._layout.values(row)]
            made.append((self._text(len(chunk)), params))
        return made


#: A table's inserter and the rows to insert.
Rows = tuple[MultiRowInsert, list[dict[str, Any]]]


def _update_turn(db: peewee.Database) -> _Statement:
    """The session's row after a turn, guarded by the turn count it is expected to have."""
    s = SessionRow
    return _compile(db, s.update({
        s.last_activity: _slot("when"),
        s.turn_count: s.turn_count + 1,
        s.token_count: s.token_count + _slot("tokens"),
        s.title: peewee.fn.COALESCE(s.title, _slot("title")),
    }).where((s.id == _slot("sid")) & (s.turn_count == _slot("turns"))))


def _read_turn_state(db: peewee.Database) -> _Statement:
    """Turn count, whether a title is set, and the highest seq of each child table."""

    def max_seq(model: type[MessageRow] | type[ToolCallRow]) -> peewee.Query:
        return model.select(peewee.fn.MAX(model.seq)).where(model.session == _slot("sid"))

    s = SessionRow
    return _compile(db, s.select(s.turn_count, s.title.is_null(False), max_seq(MessageRow),
                                 max_seq(ToolCallRow)).where(s.id == _slot("sid")))


class PreparedWrites:
    """Prepared statements and remembered turn state for one writer database."""

    def __init__(self, db: peewee.Database) -> None:
        self._db = db
        self._insert_session = MultiRowInsert(db, SessionRow)
        self._insert_messages = MultiRowInsert(db, MessageRow)
        self._insert_tools = MultiRowInsert(db, ToolCallRow)
        self._insert_updates = MultiRowInsert(db, TurnUpdatesRow)
        self._update_turn = _update_turn(db)
        self._read_state = _read_turn_state(db)
        self._known: dict[str, TurnState] = {}
        self._staged: dict[str, TurnState] = {}

    # --- the remembered state ------------------------------------------------------

    def commit_staged(self) -> None:
        """The caller committed: what this transaction wrote is now the known state."""
        if len(self._known) + len(self._staged) > _MAX_REMEMBERED:
            self._known.clear()
        self._known.update(self._staged)
        self._staged.clear()

    def discard_staged(self) -> None:
        """The caller rolled back: forget the staged state and what it touched."""
        for sid in self._staged:
            self._known.pop(sid, None)
        self._staged.clear()

    def forget(self, session_id: str) -> None:
        """The session was deleted or changed outside these statements."""
        self._known.pop(session_id, None)
        self._staged.pop(session_id, None)

    # --- writes (inside the caller's transaction) --------------------------------------

    def insert_session(self, info: StoredSession) -> None:
        """Insert the session's row (a duplicate id raises ``IntegrityError``)."""
        for sql, params in self.session_statements(info):
            self._db.execute_sql(sql, params)

    def session_statements(self, info: StoredSession) -> list[Statement]:
        """:meth:`insert_session`'s statements, for the caller to run; staged as written."""
        self._staged[info.id] = TurnState(info.turn_count, 0, info.title is not None)
        return self._insert_session.statements([info.to_row()])

    def planned_turn(self, record: TurnRecord) -> tuple[Statement, list[Rows], int] | None:
        """The turn from the remembered state, for a caller that builds its own
        statements (PostgreSQL: one per turn): the guarded UPDATE of the session, whose
        row count must be 1 (else the remembered state is wrong: nothing may be kept),
        the rows to insert, and the new turn count; staged as written. None: nothing is
        remembered of the session (:meth:`write_turn` reads it)."""
        sid = record.session_id
        state = self._staged.get(sid) or self._known.get(sid)
        if state is None:
            return None
        title = None if state.has_title else title_of(record)
        statement = self._update_turn
        guard = (statement.sql, statement.bind({
            "when": record.finished_at, "tokens": int(record.tokens), "title": title,
            "sid": sid, "turns": state.turn_count}))
        turn = state.turn_count + 1
        rows, next_seq = self._item_rows(record, turn, state.next_seq)
        self._staged[sid] = TurnState(turn, next_seq, state.has_title or bool(title))
        return guard, rows, turn

    def write_turn(self, record: TurnRecord) -> int:
        """Insert the turn's rows and update the session; returns its new turn count."""
        sid = record.session_id
        state = self._staged.get(sid) or self._known.get(sid)
        title = None if state is not None and state.has_title else title_of(record)
        if state is None or not self._update_session(record, state.turn_count, title):
            state = self._read_turn_state(sid)
            if not self._update_session(record, state.turn_count, title):
                raise MissingSession(sid)  # cannot happen inside our write transaction
        turn = state.turn_count + 1
        next_seq = self._insert_items(record, turn, state.next_seq)
        has_title = state.has_title or bool(title)
        self._staged[sid] = TurnState(turn, next_seq, has_title)
        return turn

    def _update_session(self, record: TurnRecord, expected_turns: int, title: str | None) -> bool:
        statement = self._update_turn
        params = statement.bind({"when": record.finished_at, "tokens": int(record.tokens),
                                 "title": title, "sid": record.session_id,
                                 "turns": expected_turns})
        return bool(self._db.execute_sql(statement.sql, params).rowcount == 1)

    def _read_turn_state(self, sid: str) -> TurnState:
        statement = self._read_state
        found = self._db.execute_sql(statement.sql, statement.bind({"sid": sid})).fetchone()
        if found is None:
            raise MissingSession(sid)
        turn_count, has_title, *seqs = found
        next_seq = max((int(seq) for seq in seqs if seq is not None), default=-1) + 1
        return TurnState(int(turn_count), next_seq, bool(has_title))

    def _insert_items(self, record: TurnRecord, turn: int, first_seq: int) -> int:
        """Insert messages and tool calls numbered in item order, and the turn's updates;
        returns the next seq."""
        tables, next_seq = self._item_rows(record, turn, first_seq)
        for inserter, rows in tables:
            inserter.run(rows)
        return next_seq

    def _item_rows(self, record: TurnRecord, turn: int,
                   first_seq: int) -> tuple[list[Rows], int]:
        """The turn's messages, tool calls (numbered in item order) and updates, by
        table; and the next seq."""
        messages: list[dict[str, Any]] = []
        tools: list[dict[str, Any]] = []
        sid = record.session_id
        seq = first_seq
        for item in record.items:
            if isinstance(item, TextItem):
                created = record.started_at if item.role == "user" else record.finished_at
                messages.append({"session": sid, "turn": turn, "seq": seq, "role": item.role,
                                 "content": item.text, "created_at": created})
            else:
                tools.append({"session": sid, "turn": turn, "seq": seq,
                              "tool_call_id": item.tool_call_id, "name": item.name,
                              "arguments": item.arguments, "result": item.result,
                              "outcome": item.outcome, "title": item.title, "kind": item.kind,
                              "step": item.step})
            seq += 1
        tables: list[Rows] = []
        if messages:
            tables.append((self._insert_messages, messages))
        if tools:
            tables.append((self._insert_tools, tools))
        if record.updates:
            tables.append((self._insert_updates, [{"session": sid, "turn": turn,
                                                   "updates": list(record.updates)}]))
        return tables, seq
