"""The gateway tenants kept in a shared PostgreSQL store, for every host on it.

``shared_tenants`` has one row per tenant ``zeroclaw tenant add`` made on any host of
the store: its name (unique), its id (what owns its sessions), the SHA-256 of its
token (never the token), what a ``[tenants.NAME]`` section of ``config.toml`` holds
besides (``admin``, ``max_sessions``, ``workspace_root``, ``sandbox_network``), when it
was made and last changed (the database's clock) and by which host.

Every host reads the whole table once a second (:func:`list_tenants`, on the
shared-store watch: :mod:`supervisor.host.shared_store`) and serves what it finds: a
tenant added, changed or removed on one host is served as such by the others within
about a second, with no restart. A poll, not LISTEN/NOTIFY: a notification sent while
a host's connection is down is lost, and the host would serve a stale set of tenants
until its restart; a poll of the table catches up with the first pass after any
outage. The table holds a team's tenants (tens, hundreds), so a full read is one
small index scan a second per host, and needs no change log of its own. A removal
(:func:`remove_tenant`) deletes the row and appends the tenant to the revocation log
(:func:`storage.hosts.revoke`) in one transaction, so its token stops everywhere even
on a host that would otherwise still hold the row from its previous pass.

Made by the PostgreSQL schema step :func:`create_table` (safe to rerun: a store of an
older release gets the table on its next start; an SQLite store has one host, whose
tenants are its configuration's).

Threads: every function runs on the caller's thread, on a connection it alone uses.
"""

from __future__ import annotations

from dataclasses import dataclass

import peewee

from storage import hosts

__all__ = ["SharedTenant", "TenantExists", "add_tenant", "create_table", "list_tenants",
           "remove_tenant"]

_NOW = "EXTRACT(EPOCH FROM clock_timestamp())"
_COLUMNS = ("name, tenant_id, token_sha256, admin, max_sessions, workspace_root, "
            "sandbox_network, created_at, updated_at, created_by")


def create_table(db: peewee.Database, version: int) -> None:
    """The PostgreSQL schema step that makes ``shared_tenants`` (safe to rerun)."""
    db.execute_sql("CREATE TABLE IF NOT EXISTS shared_tenants ("
                   "name TEXT PRIMARY KEY, tenant_id TEXT NOT NULL UNIQUE, "
                   "token_sha256 TEXT NOT NULL UNIQUE, admin BOOLEAN NOT NULL, "
                   "max_sessions INTEGER, workspace_root TEXT, "
                   "sandbox_network BOOLEAN NOT NULL, "
                   "created_at DOUBLE PRECISION NOT NULL, "
                   "updated_at DOUBLE PRECISION NOT NULL, created_by TEXT NOT NULL)")


@dataclass(frozen=True, slots=True)
class SharedTenant:
    """One row of ``shared_tenants`` (the token's hash, never the token)."""

    name: str
    tenant_id: str
    token_sha256: str
    admin: bool = False
    max_sessions: int | None = None
    workspace_root: str | None = None
    sandbox_network: bool = True
    created_at: float = 0.0
    updated_at: float = 0.0
    created_by: str = ""


class TenantExists(Exception):
    """A shared tenant of that name is there already."""


def add_tenant(db: peewee.Database, tenant: SharedTenant) -> None:
    """Insert ``tenant`` (its times are the database's now); :class:`TenantExists` if
    the name is taken."""
    row = db.execute_sql(
        f"INSERT INTO shared_tenants ({_COLUMNS}) VALUES (%s, %s, %s, %s, %s, %s, %s, "
        f"{_NOW}, {_NOW}, %s) ON CONFLICT (name) DO NOTHING RETURNING name",
        (tenant.name, tenant.tenant_id, tenant.token_sha256, tenant.admin,
         tenant.max_sessions, tenant.workspace_root, tenant.sandbox_network,
         tenant.created_by)).fetchone()
    if row is None:
        raise TenantExists(tenant.name)


def list_tenants(db: peewee.Database) -> list[SharedTenant]:
    """Every shared tenant, by name."""
    cursor = db.execute_sql(f"SELECT {_COLUMNS} FROM shared_tenants ORDER BY name")
    return [SharedTenant(str(name), str(tid), str(digest), bool(admin),
                         None if cap is None else int(cap),
                         None if root is None else str(root), bool(network),
                         float(created), float(updated), str(by))
            for name, tid, digest, admin, cap, root, network, created, updated, by
            in cursor.fetchall()]


def remove_tenant(db: peewee.Database, name: str, host_id: str) -> SharedTenant | None:
    """Delete the shared tenant ``name`` and log its revocation, in one transaction;
    the removed tenant (None: there was none)."""
    with db.atomic():
        row = db.execute_sql("DELETE FROM shared_tenants WHERE name = %s "
                             "RETURNING tenant_id, token_sha256", (name,)).fetchone()
        if row is None:
            return None
        hosts.revoke(db, str(row[0]), str(row[1]), host_id)
    return SharedTenant(name, str(row[0]), str(row[1]))
