"""Opening the session store the settings name: the SQLite file, or PostgreSQL by URL.

Runs on a thread of the host's start (``asyncio.to_thread``). The PostgreSQL password
is read from the variable ``[store] password_env`` names, once, and that variable is
then removed from this process's environment, so no worker, agent or tool process
started later inherits it (libpq's own ``~/.pgpass`` or service file works too).
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping

from storage.store import Store, open_store, open_store_url
from supervisor.config.config import ConfigError, Settings

__all__ = ["open_configured_store", "store_password"]


def store_password(settings: Settings, env: MutableMapping[str, str] | None = None) -> str | None:
    """The password of ``[store] password_env`` (removed from ``env``), or ``None``
    when no variable is named; :class:`ConfigError` when the named one is unset."""
    env = os.environ if env is None else env
    name = settings.store_password_env
    if name is None or settings.store_url is None:
        return None
    password = env.pop(name, None)
    if not password:
        raise ConfigError(f"store.password_env names {name}, which is not set")
    return password


def open_configured_store(settings: Settings) -> Store:
    """The store of ``settings``: PostgreSQL when ``store_url`` is set, else SQLite."""
    if settings.store_url is None:
        return open_store(settings.store_path)
    return open_store_url(settings.store_url, store_password(settings))
