"""A host's watch on the PostgreSQL store it shares with other hosts.

Every second (a third of the lease TTL when that is shorter) one pass on the watch's
own connection: this host's heartbeat in ``zeroclaw_hosts``, the list of every host
with its live sessions (what ``status`` and ``/metrics`` show, as of the last pass),
the tenant revocations logged since the last pass (:mod:`storage.hosts`; why a
poll and not LISTEN/NOTIFY is said there), and the shared tenants
(:mod:`storage.shared_tenants`). A revocation calls :attr:`SharedStoreWatch.on_revoked`,
and the daemon drops that tenant (its token is refused, its open gateway connections
closed) within about a second of the ``zeroclaw tenant remove`` on another host. A pass
that finds the shared tenants changed (one added, changed or removed on any host) calls
:attr:`SharedStoreWatch.on_tenants_changed`, and the daemon serves the new set
(:meth:`SharedStoreWatch.serving`: this host's ``config.toml`` tenants, then the shared
ones whose name is not configured here: a local section wins, and the clash is logged
once).

A pass that fails (the database down) is logged once and retried at the next tick;
the figures it would have refreshed keep their last values. A pass that finds this
host's row written by another process (its start time is not this host's) logs an
error once: two live hosts share one ``host_id``, and each would release the other's
leases when it starts.

Threads: the task and every attribute live on the asyncio loop; each pass's queries
run on the watch's one executor thread, so the connection is never used by two
threads at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import peewee

from storage import hosts, shared_tenants
from supervisor.config.errors import ConfigError
from supervisor.config.gateway_config import TenantConfig, tenant_from_section

__all__ = ["SharedStoreWatch"]

log = logging.getLogger("zeroclaw.host")
T = TypeVar("T")
TenantMap = Mapping[str, TenantConfig]


class SharedStoreWatch:
    """This host's heartbeat, the other hosts, and the revoked tenants (loop thread)."""

    def __init__(self, connect: Callable[[], peewee.Database], host_id: str, *,
                 ttl_secs: float, started_at: float, version: str) -> None:
        self.host_id = host_id
        self.ttl_secs = ttl_secs
        self.interval = min(1.0, ttl_secs / 3)
        self.hosts: tuple[hosts.HostRow, ...] = ()
        self.revoked_ids: frozenset[str] = frozenset()
        self.revoked_hashes: frozenset[str] = frozenset()
        #: Called on the loop after a pass that found new revocations.
        self.on_revoked: Callable[[], None] | None = None
        #: The tenants of the store's ``shared_tenants``, by name, as of the last pass.
        self.shared_tenants: dict[str, TenantConfig] = {}
        #: Called on the loop after a pass that found the shared tenants changed.
        self.on_tenants_changed: Callable[[], None] | None = None
        self._clashes: set[str] = set()
        self._refused: set[str] = set()  # shared rows that are no valid tenant (logged once)
        self._connect = connect
        self._started_at = started_at
        self._version = version
        self._db: peewee.Database | None = None
        self._seq = 0
        self._failing = False
        #: Whether another process was seen beating under this host's id.
        self.id_clash = False
        self._beaten = False
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="zeroclaw-hosts")
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """The first pass (so a host starts knowing the revoked tenants), then the ticks."""
        await self.tick()
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        """No more passes; this host's row is removed (it stopped, it did not die)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        try:
            await self._in_thread(lambda db: hosts.forget(db, self.host_id))
        except Exception as exc:
            log.warning("host %s: its row in zeroclaw_hosts stays: %s", self.host_id, exc)
        await asyncio.get_running_loop().run_in_executor(self._executor, self._close)
        self._executor.shutdown(wait=True)

    def serving(self, local: TenantMap) -> dict[str, TenantConfig]:
        """The tenants to serve: ``local`` (this host's ``config.toml``) and the shared
        ones of a name not configured here, without those revoked on any host."""
        clashes = set(local) & set(self.shared_tenants)
        for name in sorted(clashes - self._clashes):
            log.warning("host %s: tenant %s is both in config.toml and shared in the "
                        "store: this host serves its config.toml section", self.host_id,
                        name)
        self._clashes = clashes
        merged = {name: tenant for name, tenant in self.shared_tenants.items()
                  if name not in local}
        merged.update(local)
        return self.allowed(merged)

    def allowed(self, tenants: TenantMap) -> dict[str, TenantConfig]:
        """``tenants`` without those revoked on any host (by id or by token hash)."""
        return {name: tenant for name, tenant in tenants.items()
                if tenant.id not in self.revoked_ids
                and tenant.token_sha256 not in self.revoked_hashes}

    def hosts_wire(self) -> list[dict[str, object]]:
        """The hosts for ``status`` (an admin's), as of the last pass."""
        return [row.to_wire(self.ttl_secs, self.host_id) for row in self.hosts]

    async def tick(self) -> None:
        """One pass; its failure is logged (once until a pass succeeds again)."""
        try:
            before, found, revoked, shared = await self._in_thread(self._pass)
        except Exception as exc:
            if not self._failing:
                log.warning("host %s: the shared store's hosts could not be read: %s",
                            self.host_id, exc)
            self._failing = True
            return
        self._failing = False
        self.hosts = tuple(found)
        self._check_own_row(before)
        self._take_shared(shared)
        if revoked:
            self._seq = revoked[-1].seq
            self.revoked_ids |= {r.tenant_id for r in revoked}
            self.revoked_hashes |= {r.token_sha256 for r in revoked}
            log.info("host %s: %d tenant revocation(s) in the shared store",
                     self.host_id, len(revoked))
            if self.on_revoked is not None:
                try:
                    self.on_revoked()
                except Exception:  # the watch goes on; the next reload applies them
                    log.exception("host %s: applying the revocations failed", self.host_id)

    def _take_shared(self, rows: list[shared_tenants.SharedTenant]) -> None:
        """Keep the shared tenants of this pass; tell the daemon when they changed."""
        found = {}
        for row in rows:
            try:
                found[row.name] = _tenant_config(row)
            except ConfigError as error:
                if row.name not in self._refused:
                    log.warning("host %s: shared tenant %r not served: %s", self.host_id,
                                row.name, error)
                self._refused.add(row.name)
        if found == self.shared_tenants:
            return
        self.shared_tenants = found
        log.info("host %s: %d shared tenant(s) in the store", self.host_id, len(found))
        if self.on_tenants_changed is not None:
            try:
                self.on_tenants_changed()
            except Exception:  # the watch goes on; the next change or reload applies them
                log.exception("host %s: applying the shared tenants failed", self.host_id)

    def _check_own_row(self, before: float | None) -> None:
        """Once this host has beaten, its row must still say it started when this host
        did (``before``: what the row said before this pass's beat)."""
        clash = self._beaten and before is not None and before != self._started_at
        self._beaten = True
        if clash and not self.id_clash:
            log.error("host %s: another live process uses this host_id (it beats in "
                      "zeroclaw_hosts too): give every host its own [store] host_id",
                      self.host_id)
        self.id_clash = self.id_clash or clash

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            await self.tick()

    def _pass(self, db: peewee.Database) -> tuple[
            float | None, list[hosts.HostRow], list[hosts.Revocation],
            list[shared_tenants.SharedTenant]]:
        before = hosts.beat(db, self.host_id, self._started_at, self._version)
        return (before, hosts.list_hosts(db), hosts.revocations_after(db, self._seq),
                shared_tenants.list_tenants(db))

    async def _in_thread(self, work: Callable[[peewee.Database], T]) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self._with_db, work)

    def _close(self) -> None:
        if self._db is not None:
            self._db.close()

    def _with_db(self, work: Callable[[peewee.Database], T]) -> T:
        """Executor thread: ``work`` on the watch's connection (made or remade here)."""
        if self._db is None:
            self._db = self._connect()
        drop = getattr(self._db, "drop_if_broken", None)
        if drop is not None:
            drop()
        try:
            return work(self._db)
        except peewee.PeeweeException:
            with contextlib.suppress(Exception):
                self._db.close()
            raise


def _tenant_config(row: shared_tenants.SharedTenant) -> TenantConfig:
    """A shared tenant as the gateway serves a ``[tenants.NAME]`` section, checked as
    one (the row may come from another host or release); ConfigError when malformed."""
    section: dict[str, object] = {"id": row.tenant_id, "token_sha256": row.token_sha256,
                                  "admin": row.admin, "sandbox_network": row.sandbox_network}
    if row.max_sessions is not None:
        section["max_sessions"] = row.max_sessions
    if row.workspace_root is not None:
        section["workspace_root"] = row.workspace_root
    return tenant_from_section(row.name, section)
