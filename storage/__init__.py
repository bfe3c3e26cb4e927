"""The session store: peewee models, opening the SQLite file, and the read API.

Writes go through :class:`actors.persistence.PersistenceActor` only.
"""

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
    database_proxy,
)
from storage.store import (
    DEFAULT_BUSY_TIMEOUT_MS,
    MAX_PAGE_SIZE,
    Store,
    StoreReader,
    open_store,
    write_transaction,
)

__all__ = [
    "DEFAULT_BUSY_TIMEOUT_MS",
    "MAX_PAGE_SIZE",
    "MODELS",
    "SCHEMA_VERSION",
    "MessageRow",
    "SessionEvent",
    "SessionEventRow",
    "SessionKeyRow",
    "SessionName",
    "SessionRow",
    "Store",
    "StoreReader",
    "StoredSession",
    "ToolCallRow",
    "TurnUpdatesRow",
    "database_proxy",
    "open_store",
    "write_transaction",
]
