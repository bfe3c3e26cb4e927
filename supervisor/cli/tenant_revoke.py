"""``zeroclaw tenant remove`` on a shared PostgreSQL store: the revocation every host sees.

Runs on the main thread of the ``zeroclaw tenant`` process, before ``config.toml`` is
changed: the removed tenant's id and token hash are appended to the store's
``tenant_revocations`` (:mod:`storage.hosts`), which every host polls each second and
then refuses that token (its open gateway connections closed). When the store cannot
be reached the removal fails as a whole (exit 1), the file unchanged, so it can be
run again. An SQLite store (one host): nothing to do here.

:func:`shared_store` opens that store for ``zeroclaw tenant`` (the shared tenants of
:mod:`supervisor.cli.tenant_shared` use it too).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING

import peewee

from storage import hosts
from supervisor.cli.config_cmd import ConfigCommandError

if TYPE_CHECKING:
    from storage.store import Store
    from supervisor.config.config import Settings

__all__ = ["revoke_in_shared_store", "shared_settings", "shared_store"]

_UNREACHABLE = "the shared store could not be told (nothing changed)"


def shared_settings(config_flag: str | None) -> Settings | None:
    """The settings when their store is a shared (PostgreSQL) one, else None (an
    SQLite store, or a configuration that cannot be read: the caller reports it)."""
    from supervisor.config.config import ConfigError, load_settings

    try:
        settings = load_settings(config_flag)
    except ConfigError:
        return None
    return settings if settings.store_url is not None else None


@contextlib.contextmanager
def shared_store(settings: Settings) -> Iterator[Store]:
    """The shared store of ``settings``, closed afterwards; a database error in it or
    in the block is a :class:`ConfigCommandError` (nothing changed)."""
    from storage.store import open_store_url
    from supervisor.config.config import ConfigError
    from supervisor.host.store_open import store_password

    assert settings.store_url is not None
    try:
        store = open_store_url(settings.store_url, store_password(settings))
    except (ConfigError, peewee.PeeweeException) as error:
        raise ConfigCommandError(f"{_UNREACHABLE}: {error}") from None
    try:
        yield store
    except peewee.PeeweeException as error:
        raise ConfigCommandError(f"{_UNREACHABLE}: {error}") from None
    finally:
        store.close()


def revoke_in_shared_store(config_flag: str | None, tenant_id: str,
                           token_sha256: str) -> str | None:
    """Log the tenant's revocation in the configured shared store; what to tell the
    user (None: the store is not shared). :class:`ConfigCommandError` on failure."""
    from supervisor.config.config import ConfigError, load_settings

    try:
        settings = load_settings(config_flag)
    except ConfigError as error:
        raise ConfigCommandError(f"{_UNREACHABLE}: {error}") from None
    if settings.store_url is None:
        return None
    with shared_store(settings) as store, store.writer.atomic():
        hosts.revoke(store.writer, tenant_id, token_sha256, settings.host_id)
    return (f"revoked in the shared store {store.where}: every host on it refuses the "
            "token within seconds")
