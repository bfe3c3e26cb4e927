"""A host's watch on the PostgreSQL store it shares with other hosts.

Every second (a third of the lease TTL when that is shorter) one pass on the watch's
own connection: this host's heartbeat in ``zeroclaw_hosts``, the list of every host
with its live sessions (what ``status`` and ``/metrics`` show, as of the last pass),
and the tenant revocations logged since the last pass (:mod:`storage.hosts`; why a
poll and not LISTEN/NOTIFY is said there). A revocation of a tenant this host serves
calls :attr:`SharedStoreWatch.on_revoked`, and the daemon drops that tenant (its token
is refused, its open gateway connections closed) within about a second of the
``zeroclaw tenant remove`` on another host.

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
from typing import TYPE_CHECKING, TypeVar

import peewee

from storage import hosts

if TYPE_CHECKING:
    from supervisor.gateway_config import TenantConfig

__all__ = ["SharedStoreWatch"]

log = logging.getLogger("zeroclaw.host")
T = TypeVar("T")
TenantMap = Mapping[str, "TenantConfig"]


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
            before, found, revoked = await self._in_thread(self._pass)
        except Exception as exc:
            if not self._failing:
                log.warning("host %s: the shared store's hosts could not be read: %s",
                            self.host_id, exc)
            self._failing = True
            return
        self._failing = False
        self.hosts = tuple(found)
        self._check_own_row(before)
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

    def _pass(self, db: peewee.Database) -> tuple[float | None, list[hosts.HostRow],
                                                  list[hosts.Revocation]]:
        before = hosts.beat(db, self.host_id, self._started_at, self._version)
        return before, hosts.list_hosts(db), hosts.revocations_after(db, self._seq)

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
