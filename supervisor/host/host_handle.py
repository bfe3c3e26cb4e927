"""The one host of a process, started in the background and shared by its connections.

Runs on the asyncio loop thread. ``zeroclaw acp`` (embedded) and ``zeroclaw
daemon`` (shared by every client of its sockets) both hold one. Imports of the
host's machinery (pykka, zmq, peewee) happen on the first :meth:`HostHandle.start`,
never on the way to the first ``initialize`` answer.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING

from supervisor.config.config import Settings
from supervisor.core.ownership import Owners

if TYPE_CHECKING:
    from supervisor.config.gateway_config import TenantConfig
    from supervisor.host.sessions import Sessions

__all__ = ["HostHandle"]

log = logging.getLogger("zeroclaw.host")


class HostHandle:
    """Starts the host once, in the background; every connection awaits :meth:`sessions`.

    ``owners``: which connections hold which session, one table for every socket
    of the host.
    """

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.owners = Owners()
        self.starting: asyncio.Task[Sessions] | None = None

    def start(self) -> asyncio.Task[Sessions]:
        if self.starting is None:
            self.starting = asyncio.ensure_future(self._start())
        return self.starting

    async def _start(self) -> Sessions:
        from supervisor.host.host import Host
        from supervisor.host.sessions import Sessions

        host = Host(self.settings)
        await host.start()
        sessions = Sessions(host)
        sessions.tenants = self.settings.tenants  # reloaded meanwhile: the new ones
        return sessions

    def reload_tenants(self, tenants: Mapping[str, TenantConfig]) -> None:
        """The gateway's tenants from now on (``tenants/reload``), for the sessions too:
        each tenant's root and ``sandbox_network`` are read when its session opens."""
        self.settings = dataclasses.replace(self.settings, tenants=tenants)
        sessions = self.started()
        if sessions is not None:
            sessions.tenants = tenants

    async def sessions(self) -> Sessions:
        from ipc.errors import RpcError

        try:
            return await asyncio.shield(self.start())
        except Exception as exc:
            log.error("host failed to start: %r", exc)
            raise RpcError(f"host failed to start: {type(exc).__name__}") from None

    async def settled(self) -> Sessions | None:
        """The host once its start finished (None if it never started or failed)."""
        if self.starting is not None and not self.starting.done():
            await asyncio.wait((self.starting,), timeout=60)
        return self.started()

    def started(self) -> Sessions | None:
        task = self.starting
        if task is None or not task.done() or task.cancelled() or task.exception():
            return None
        return task.result()
