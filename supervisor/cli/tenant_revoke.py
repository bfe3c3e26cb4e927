"""``zeroclaw tenant remove`` on a shared PostgreSQL store: the revocation every host sees.

Runs on the main thread of the ``zeroclaw tenant`` process, before ``config.toml`` is
changed: the removed tenant's id and token hash are appended to the store's
``tenant_revocations`` (:mod:`storage.hosts`), which every host polls each second and
then refuses that token (its open gateway connections closed). When the store cannot
be reached the removal fails as a whole (exit 1), the file unchanged, so it can be
run again. An SQLite store (one host): nothing to do here.
"""

from __future__ import annotations

import peewee

from storage import hosts
from supervisor.cli.config_cmd import ConfigCommandError

__all__ = ["revoke_in_shared_store"]


def revoke_in_shared_store(config_flag: str | None, tenant_id: str,
                           token_sha256: str) -> str | None:
    """Log the tenant's revocation in the configured shared store; what to tell the
    user (None: the store is not shared). :class:`ConfigCommandError` on failure."""
    from storage.store import open_store_url
    from supervisor.config import ConfigError, load_settings
    from supervisor.store_open import store_password

    try:
        settings = load_settings(config_flag)
        if settings.store_url is None:
            return None
        store = open_store_url(settings.store_url, store_password(settings))
    except (ConfigError, peewee.PeeweeException) as error:
        raise ConfigCommandError(f"the shared store could not be told (nothing changed): "
                                 f"{error}") from None
    try:
        with store.writer.atomic():
            hosts.revoke(store.writer, tenant_id, token_sha256, settings.host_id)
    except peewee.PeeweeException as error:
        raise ConfigCommandError(f"the shared store could not be told (nothing changed): "
                                 f"{error}") from None
    finally:
        store.close()
    return (f"revoked in the shared store {store.where}: every host on it refuses the "
            "token within seconds")
