"""The hot writes of the store (new session, finished turn) as prepared SQL text.

Building SQL through peewee's query objects costs ~40-60 µs a row; a host that
persists every turn pays it on every prompt. :class:`PreparedWrites` builds the
statement text once per database, from the models' metadata and the database's
own parameter marker (so it stays backend-neutral), and runs it through the
peewee database object (``execute_sql`` and the cursor's ``executemany``).

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

import orjson
import peewee

from ipc.events import TextItem, TurnRecord
from storage.models import MessageRow, SessionInfo, SessionRow, ToolCallRow

__all__ = ["TITLE_MAX_CHARS", "MissingSession", "PreparedWrites", "TurnState", "title_of"]

TITLE_MAX_CHARS = 80
_ROWS_PER_INSERT = 500  # rows per INSERT, within SQLite's bound-variable limit
_MAX_REMEMBERED = 50_000  # sessions whose turn state is kept; past that the map restarts


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


def _columns(model: type[peewee.Model], names: list[str]) -> str:
    return ", ".join(model._meta.fields[name].column_name for name in names)


def _insert_sql(db: peewee.Database, model: type[peewee.Model], names: list[str]) -> str:
    marks = ", ".join(db.param for _ in names)
    return f"INSERT INTO {model._meta.table_name} ({_columns(model, names)}) VALUES ({marks})"


class _MultiRowInsert:
    """``INSERT ... VALUES (...), (...)`` for any number of rows: one statement per
    :data:`_ROWS_PER_INSERT` rows, its text built once per row count."""

    def __init__(self, db: peewee.Database, model: type[peewee.Model], names: list[str]) -> None:
        self._db = db
        self._head = f"INSERT INTO {model._meta.table_name} ({_columns(model, names)}) VALUES "
        self._one = "(" + ", ".join(db.param for _ in names) + ")"
        self._texts: dict[int, str] = {}

    def run(self, rows: list[tuple[Any, ...]]) -> None:
        for start in range(0, len(rows), _ROWS_PER_INSERT):
            chunk = rows[start : start + _ROWS_PER_INSERT]
            text = self._texts.get(len(chunk))
            if text is None:
                text = self._texts[len(chunk)] = self._head + ", ".join([self._one] * len(chunk))
            self._db.execute_sql(text, [value for row in chunk for value in row])


_SESSION_FIELDS = [
    "id", "agent_alias", "workspace_dir", "cwd", "mode", "title", "created_at",
    "last_activity", "token_count", "turn_count", "closed_at", "killed", "mcp_servers", "meta",
]
_MESSAGE_FIELDS = ["session", "turn", "seq", "role", "content", "reasoning", "created_at"]
_TOOL_FIELDS = [
    "session", "turn", "seq", "tool_call_id", "name", "arguments", "result", "outcome",
    "title", "kind", "step",
]


class PreparedWrites:
    """Prepared statements and remembered turn state for one writer database."""

    def __init__(self, db: peewee.Database) -> None:
        self._db = db
        p = db.param
        sessions = SessionRow._meta.table_name
        self._insert_session = _insert_sql(db, SessionRow, _SESSION_FIELDS)
        self._session_fields = [SessionRow._meta.fields[name] for name in _SESSION_FIELDS]
        self._insert_messages = _MultiRowInsert(db, MessageRow, _MESSAGE_FIELDS)
        self._insert_tools = _MultiRowInsert(db, ToolCallRow, _TOOL_FIELDS)
        self._update_turn = (
            f"UPDATE {sessions} SET last_activity = {p}, turn_count = turn_count + 1, "
            f"token_count = token_count + {p}, title = COALESCE(title, {p}) "
            f"WHERE id = {p} AND turn_count = {p}"
        )
        max_seq = "(SELECT MAX(seq) FROM {table} WHERE session_id = {p})"
        self._read_state = (
            f"SELECT turn_count, title IS NOT NULL, "
            f"{max_seq.format(table=MessageRow._meta.table_name, p=p)}, "
            f"{max_seq.format(table=ToolCallRow._meta.table_name, p=p)} "
            f"FROM {sessions} WHERE id = {p}"
        )
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

    def insert_session(self, info: SessionInfo) -> None:
        """Insert the session's row (a duplicate id raises ``IntegrityError``)."""
        row = info.to_row()
        values = [field.db_value(row[field.name]) for field in self._session_fields]
        self._db.execute_sql(self._insert_session, values)
        self._staged[info.id] = TurnState(info.turn_count, 0, info.title is not None)

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
        params = (record.finished_at, int(record.tokens), title, record.session_id,
                  expected_turns)
        return bool(self._db.execute_sql(self._update_turn, params).rowcount == 1)

    def _read_turn_state(self, sid: str) -> TurnState:
        found = self._db.execute_sql(self._read_state, (sid, sid, sid)).fetchone()
        if found is None:
            raise MissingSession(sid)
        turn_count, has_title, *seqs = found
        next_seq = max((int(seq) for seq in seqs if seq is not None), default=-1) + 1
        return TurnState(int(turn_count), next_seq, bool(has_title))

    def _insert_items(self, record: TurnRecord, turn: int, first_seq: int) -> int:
        """Insert messages and tool calls numbered in item order; returns the next seq."""
        messages: list[tuple[Any, ...]] = []
        tools: list[tuple[Any, ...]] = []
        sid = record.session_id
        seq = first_seq
        for item in record.items:
            if isinstance(item, TextItem):
                created = record.started_at if item.role == "user" else record.finished_at
                messages.append((sid, turn, seq, item.role, item.text, None, created))
            else:
                arguments = None if item.arguments is None else orjson.dumps(item.arguments)
                tools.append((sid, turn, seq, item.tool_call_id, item.name,
                              arguments.decode() if arguments is not None else None,
                              item.result, item.outcome, item.title, item.kind, item.step))
            seq += 1
        if messages:
            self._insert_messages.run(messages)
        if tools:
            self._insert_tools.run(tools)
        return seq
