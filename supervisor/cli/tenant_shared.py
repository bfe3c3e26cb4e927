"""``zeroclaw tenant add|list|remove`` on a shared PostgreSQL store: tenants every host
serves, kept in the store's ``shared_tenants`` (:mod:`storage.shared_tenants`).

Runs on the main thread of the ``zeroclaw tenant`` process. When ``[store] url`` is
PostgreSQL:

- ``add NAME`` stores the tenant (its id, the token's SHA-256, its limits) in the
  store, not in ``config.toml``; every host on the store serves it within about a
  second, without a restart. A NAME already shared, or configured in this host's
  ``config.toml``, is refused (exit 1): a ``[tenants.NAME]`` section wins over a
  shared tenant of that name on the host that has it.
- ``list`` shows this host's ``config.toml`` tenants (``local``) and the shared ones
  (``shared``; ``shadowed`` when a local section of that name wins here).
- ``remove NAME`` removes the ``config.toml`` section when there is one (as on a
  single host, its revocation logged in the store); otherwise the shared tenant, whose
  row is deleted and whose revocation is logged in one transaction, so its token
  stops on every host within about a second.

A store that cannot be reached changes nothing (exit 1, the command can be rerun).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from storage import shared_tenants
from supervisor.cli.config_cmd import ConfigCommandError
from supervisor.cli.tenant_revoke import shared_store
from supervisor.config.config import Settings
from supervisor.config.errors import ConfigError
from supervisor.config.gateway_config import tenant_from_section

__all__ = ["add_shared", "list_shared", "remove_shared"]


def add_shared(settings: Settings, name: str, section: Mapping[str, object],
               local_names: Collection[str]) -> str:
    """Store the tenant ``section`` describes (checked as a ``[tenants.NAME]`` section
    of ``config.toml`` is) in the shared store; what to tell the user."""
    if name in local_names:
        raise ConfigCommandError(
            f"tenant {name} is configured in this host's config.toml, which wins over "
            "a shared tenant of that name here (remove it there first)")
    try:
        config = tenant_from_section(name, section)
    except ConfigError as error:
        raise ConfigCommandError(f"not saved: {error}", exit_code=2) from None
    tenant = shared_tenants.SharedTenant(
        name=name, tenant_id=config.id, token_sha256=config.token_sha256,
        admin=config.admin, max_sessions=config.max_sessions,
        workspace_root=None if config.workspace_root is None else str(config.workspace_root),
        sandbox_network=config.sandbox_network, created_by=settings.host_id)
    with shared_store(settings) as store:
        try:
            with store.writer.atomic():
                shared_tenants.add_tenant(store.writer, tenant)
        except shared_tenants.TenantExists:
            raise ConfigCommandError(f"tenant {name} already exists in the shared "
                                     f"store {store.where} (remove it first)") from None
    return (f"added to the shared store {store.where}: every host on it serves the "
            "tenant within seconds")


def list_shared(settings: Settings) -> list[shared_tenants.SharedTenant]:
    """The shared tenants, by name."""
    with shared_store(settings) as store:
        return shared_tenants.list_tenants(store.writer)


def remove_shared(settings: Settings, name: str) -> str:
    """Remove the shared tenant ``name`` (its revocation logged); what to tell the user."""
    with shared_store(settings) as store:
        removed = shared_tenants.remove_tenant(store.writer, name, settings.host_id)
    if removed is None:
        raise ConfigCommandError(f"no tenant {name}")
    return (f"removed from the shared store {store.where} and revoked: every host on it "
            "refuses the token within seconds")
