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

from dataclasses import dataclass, field
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
    "SessionInfo",
    "SessionRow",
    "ToolCallRow",
    "database_proxy",
    "session_info_from_row",
]

#: Stored in ``PRAGMA user_version``; bump it when the tables change.
SCHEMA_VERSION = 2

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
    arguments = JsonField()
    result = peewee.TextField()
    outcome = peewee.TextField()
    title = peewee.TextField(default="")
    kind = peewee.TextField(default="other")
    # added in schema 2; the SQL default lets an older zeroclaw still write the table
    step = peewee.IntegerField(default=0, constraints=[peewee.SQL("DEFAULT 0")])

    class Meta:
        table_name = "tool_calls"
        indexes = ((("session", "seq"), True),)


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


#: Every table, parents first (the order to create them in).
MODELS: tuple[type[peewee.Model], ...] = (SessionRow, MessageRow, ToolCallRow, SessionEventRow)


@dataclass(frozen=True, slots=True)
class SessionInfo:
    """A stored session, as a plain immutable record (mirrors :class:`SessionRow`)."""

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
        """Column values for an insert (JSON columns still as Python values)."""
        return {
            "id": self.id,
            "agent_alias": self.agent_alias,
            "workspace_dir": self.workspace_dir,
            "cwd": self.cwd,
            "mode": self.mode,
            "title": self.title,
            "created_at": self.created_at,
            "last_activity": self.last_activity,
            "token_count": self.token_count,
            "turn_count": self.turn_count,
            "closed_at": self.closed_at,
            "killed": self.killed,
            "mcp_servers": self.mcp_servers,
            "meta": self.meta,
        }


def session_info_from_row(row: dict[str, Any]) -> SessionInfo:
    """A :class:`SessionInfo` from a ``.dicts()`` row of :class:`SessionRow`."""
    return SessionInfo(
        id=row["id"],
        agent_alias=row["agent_alias"],
        workspace_dir=row["workspace_dir"],
        cwd=row["cwd"],
        mode=row["mode"],
        created_at=row["created_at"],
        last_activity=row["last_activity"],
        title=row["title"],
        token_count=row["token_count"],
        turn_count=row["turn_count"],
        closed_at=row["closed_at"],
        killed=bool(row["killed"]),
        mcp_servers=row["mcp_servers"] if row["mcp_servers"] is not None else [],
        meta=row["meta"] if row["meta"] is not None else {},
    )


@dataclass(frozen=True, slots=True)
class SessionEvent:
    """A stored custom event of a session."""

    type: str
    payload: Any
    created_at: float
