"""peewee models of the session store, and the plain records read back from it.

The models are bound to :data:`database_proxy`, never to a concrete database,
so the backend can change (PostgreSQL for a host that outgrows one machine)
without touching them. Code in this package always passes its database
explicitly (``query.execute(db)``), so several stores can live in one process
(tests do that) whatever the proxy currently points at.

Times are UNIX seconds as floats. JSON columns hold orjson text.

Pure definitions: safe to import and use from any thread.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

import orjson
import peewee

__all__ = [
    "MODELS",
    "SCHEMA_VERSION",
    "JsonField",
    "MessageRow",
    "SessionEvent",
    "SessionEventRow",
    "SessionKeyRow",
    "SessionName",
    "SessionRow",
    "StoredSession",
    "ToolCallRow",
    "TurnUpdatesRow",
    "database_proxy",
    "stored_session_from_row",
]

#: Stored in ``PRAGMA user_version``; bump it when the tables change.
#: 3: ``turn_updates`` (each turn's ACP updates as sent); a tool call's arguments
#: may be absent (stored as JSON ``null``, so the column stays NOT NULL for older
#: releases reading the file).
#: 4: ``session_keys`` (a session's stable key and label, OpenClaw's session keys); a
#: new table only, so a schema 3 release still reads and writes the file.
SCHEMA_VERSION = 4

database_proxy = peewee.DatabaseProxy()


class JsonField(peewee.TextField):
    """Any JSON value, stored as orjson text."""

    def db_value(self, value: Any) -> str | None:
        if value is None:
            return None
        return orjson.dumps(value).decode()

    def python_value(self, value: Any) -> Any:
        if value is None:
            return None
        return orjson.loads(value)


class AbsentAsNullJsonField(JsonField):
    """:class:`JsonField` whose Python ``None`` (a value ACP lets an agent leave out) is
    the JSON text ``null``, never SQL NULL: a NOT NULL column takes it."""

    def db_value(self, value: Any) -> str | None:
        return orjson.dumps(value).decode()


class _BaseModel(peewee.Model):
    class Meta:
        database = database_proxy


class SessionRow(_BaseModel):
    """One ACP session, live or not; ``killed`` means its worker died mid-turn."""

    id = peewee.TextField(primary_key=True)
    agent_alias = peewee.TextField()
    workspace_dir = peewee.TextField()
    cwd = peewee.TextField()
    mode = peewee.TextField()
    title = peewee.TextField(null=True)
    created_at = peewee.FloatField()
    last_activity = peewee.FloatField()  # indexed with id, see Meta.indexes
    token_count = peewee.IntegerField(default=0)
    turn_count = peewee.IntegerField(default=0)
    closed_at = peewee.FloatField(null=True)
    killed = peewee.BooleanField(default=False)
    mcp_servers = JsonField(default=list)
    meta = JsonField(default=dict)

    class Meta:
        table_name = "sessions"
        indexes = (
            (("last_activity", "id"), False),
            (("cwd", "last_activity", "id"), False),
        )


class MessageRow(_BaseModel):
    """Text of a turn: role ``user``, ``assistant`` or ``thought``."""

    id = peewee.AutoField()

    session = peewee.ForeignKeyField(
        SessionRow, column_name="session_id", on_delete="CASCADE", index=False
    )
    turn = peewee.IntegerField()
    seq = peewee.IntegerField()
    role = peewee.TextField()
    content = peewee.TextField()
    reasoning = peewee.TextField(null=True)
    created_at = peewee.FloatField()

    class Meta:
        table_name = "messages"
        indexes = ((("session", "seq"), True),)


class ToolCallRow(_BaseModel):
    """A tool call of a turn with its outcome: ``completed``, ``failed`` or ``denied``."""

    id = peewee.AutoField()

    session = peewee.ForeignKeyField(
        SessionRow, column_name="session_id", on_delete="CASCADE", index=False
    )
    turn = peewee.IntegerField()
    seq = peewee.IntegerField()
    tool_call_id = peewee.TextField()
    name = peewee.TextField()
    arguments = AbsentAsNullJsonField()
    result = peewee.TextField()
    outcome = peewee.TextField()
    title = peewee.TextField(default="")
    kind = peewee.TextField(default="other")
    # added in schema 2; the SQL default lets an older zeroclaw still write the table
    step = peewee.IntegerField(default=0, constraints=[peewee.SQL("DEFAULT 0")])

    class Meta:
        table_name = "tool_calls"
        indexes = ((("session", "seq"), True),)


class TurnUpdatesRow(_BaseModel):
    """The ACP ``session/update`` objects of one turn as its client got them (a JSON
    array, each run of plain text chunks joined): what ``session/load`` replays. A
    turn without a row (stored before schema 3, or made by the host) replays from its
    messages and tool calls."""

    id = peewee.AutoField()

    session = peewee.ForeignKeyField(
        SessionRow, column_name="session_id", on_delete="CASCADE", index=False
    )
    turn = peewee.IntegerField()
    updates = JsonField()

    class Meta:
        table_name = "turn_updates"
        indexes = ((("session", "turn"), True),)


class SessionEventRow(_BaseModel):
    """A custom event a client sent about a session (``session/event``)."""

    id = peewee.AutoField()

    session = peewee.ForeignKeyField(
        SessionRow, column_name="session_id", on_delete="CASCADE", index=False
    )
    type = peewee.TextField()
    payload = JsonField()
    created_at = peewee.FloatField()

    class Meta:
        table_name = "session_events"
        indexes = ((("session", "created_at"), False),)


class SessionKeyRow(_BaseModel):
    """The names of one session: the stable ``key`` it was created for and its
    ``label`` (either may be absent), within its ``tenant`` (a gateway tenant's id;
    ``""``: the host's owner). A key names the newest session bound to it
    (``bound_at``): a reset binds a new session to the key, and the older one keeps
    its row (stored, listed, loadable). A label names one session per tenant."""

    session = peewee.ForeignKeyField(
        SessionRow, column_name="session_id", primary_key=True, on_delete="CASCADE"
    )
    tenant = peewee.TextField(default="")
    key = peewee.TextField(null=True)
    label = peewee.TextField(null=True)
    bound_at = peewee.FloatField()

    class Meta:
        table_name = "session_keys"
        indexes = (
            (("tenant", "key", "bound_at"), False),
            (("tenant", "label"), True),  # NULL labels are distinct (SQLite and PostgreSQL)
        )


#: Every table, parents first (the order to create them in).
MODELS: tuple[type[peewee.Model], ...] = (SessionRow, MessageRow, ToolCallRow, TurnUpdatesRow,
                                          SessionEventRow, SessionKeyRow)


@dataclass(frozen=True, slots=True)
class StoredSession:
    """A stored session, as a plain immutable record: one field per column of
    :class:`SessionRow`, with the same names."""

    id: str
    agent_alias: str
    workspace_dir: str
    cwd: str
    mode: str
    created_at: float
    last_activity: float
    title: str | None = None
    token_count: int = 0
    turn_count: int = 0
    closed_at: float | None = None
    killed: bool = False
    mcp_servers: list[Any] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)

    def to_row(self) -> dict[str, Any]:
        """Column values by field name, for an insert (JSON columns still as Python values)."""
        return {name: getattr(self, name) for name in _STORED_SESSION_FIELDS}


_STORED_SESSION_FIELDS = tuple(f.name for f in fields(StoredSession))


def stored_session_from_row(row: dict[str, Any]) -> StoredSession:
    """A :class:`StoredSession` from a ``.dicts()`` row of :class:`SessionRow`."""
    values = {name: row[name] for name in _STORED_SESSION_FIELDS}
    values["killed"] = bool(values["killed"])
    values["mcp_servers"] = values["mcp_servers"] if values["mcp_servers"] is not None else []
    values["meta"] = values["meta"] if values["meta"] is not None else {}
    return StoredSession(**values)


@dataclass(frozen=True, slots=True)
class SessionName:
    """A session's row of :class:`SessionKeyRow`; ``current``: it is the session its
    key names now (false for a key's sessions before its last reset)."""

    session_id: str
    tenant: str
    key: str | None
    label: str | None
    bound_at: float
    current: bool = True


@dataclass(frozen=True, slots=True)
class SessionEvent:
    """A stored custom event of a session."""

    type: str
    payload: Any
    created_at: float
