"""Tenants of the gateway: who a token belongs to, and which sessions a tenant may see.

Runs on the asyncio loop thread. A gateway connection carries a :class:`TenantScope`
in its endpoint's ``state["scope"]``; the ACP server (:mod:`supervisor.servers.acp_server`)
asks it before it touches a session. A session belongs to the tenant that created
it (kept in the stored row's ``meta.tenant``: the tenant's stable ``id``, with its
name beside it in ``meta.tenantName`` for display); any other tenant is told the
session does not exist (-32000), whether it exists or not, so no tenant learns
another's session ids, titles or cwds. Local clients (the Unix sockets) carry no
scope: they are the host's owner and see every session, as before tenants existed.

Every tenant is confined to a root of its own (:mod:`supervisor.host.tenant_dirs`, where
the session operations find it too).

Tokens are stored only as SHA-256 hex digests (``[tenants.NAME] token_sha256``) and
compared with :func:`hmac.compare_digest`; the token itself is never kept or logged.
"""

from __future__ import annotations

import hashlib
import hmac
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from ipc.errors import SessionLimitReached, SessionNotFound
from supervisor.host.tenant_dirs import TENANT_META_KEY, confine_cwd, tenant_root

if TYPE_CHECKING:
    from ipc.acp import NewSessionRequest
    from supervisor.config.gateway_config import TenantConfig
    from supervisor.core.peer import Peer
    from supervisor.core.routes import Route
    from supervisor.host.session_keys import SessionNames
    from supervisor.host.sessions import Sessions

__all__ = [
    "Tenancy",
    "TenantScope",
    "hash_token",
    "tenant_of_token",
]

def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def tenant_of_token(token: str, tenants: Mapping[str, TenantConfig]) -> TenantConfig | None:
    """The tenant whose hash matches ``token``; every tenant is compared (constant work)."""
    digest = hash_token(token)
    found = None
    for tenant in tenants.values():
        if hmac.compare_digest(digest, tenant.token_sha256):
            found = tenant
    return found


class Tenancy:
    """Which tenant a session belongs to, for every gateway connection of one host.

    A live session's tenant is on its route (read from its stored row when it was
    opened); any other session's is read from the store (one indexed read on the
    loop, as ``session/prompt`` of an evicted session does anyway). Nothing is
    cached, so nothing can go stale when a session is deleted or an id reused.
    ``creating`` counts each tenant's ``session/new`` under way (not yet admitted),
    for the quick check of its cap.
    """

    def __init__(self) -> None:
        self.creating: Counter[str] = Counter()

    @staticmethod
    def tenant_of(sessions: Sessions, sid: str) -> str | None:
        """The session's tenant id ("" for the owner's), None if there is no such session."""
        route = sessions.host.live.route(sid)
        if route is not None:
            return route.tenant or ""
        info = sessions.host.reader.get_session(sid)
        if info is None:
            return None
        return str(info.meta.get(TENANT_META_KEY) or "")


@dataclass(frozen=True, slots=True)
class TenantScope:
    """What one gateway connection may do: its tenant, and its ``?agent=`` default."""

    tenant: TenantConfig
    tenancy: Tenancy
    default_agent: str | None = None

    @property
    def name(self) -> str:
        return self.tenant.name

    @property
    def id(self) -> str:
        return self.tenant.id

    def check(self, sessions: Sessions, sid: str) -> None:
        """-32000 unless ``sid`` is one of this tenant's sessions (the same answer
        whether it belongs to someone else or does not exist)."""
        if self.tenancy.tenant_of(sessions, sid) != self.tenant.id:
            raise SessionNotFound(f"Session not found: {sid}")

    def check_capacity(self, sessions: Sessions, sid: str | None = None) -> None:
        """-32001 at once when the tenant is at its ``max_sessions`` and every live
        session of it is busy (``sid``: a session being restored, which needs no room
        when already live). At the cap with an idle session, admission evicts the
        tenant's least recently used idle one (:meth:`supervisor.core.live.LiveTable.make_room`),
        as the host does at its own cap."""
        cap = self.tenant.max_sessions
        live = sessions.host.live
        if cap is None or (sid is not None and live.route(sid) is not None):
            return
        if not live.tenant_has_room(self.id, cap, self.tenancy.creating[self.id]):
            raise SessionLimitReached(f"Maximum session limit reached ({cap})")

    async def new_session(self, sessions: Sessions, peer: Peer,
                          request: NewSessionRequest,
                          names: SessionNames | None = None) -> Route:
        """``session/new`` for this tenant: its cap checked (-32001), this connection's
        ``?agent=`` applied, the session confined to the tenant's root and stored as the
        tenant's (:meth:`Sessions.new`)."""
        self.check_capacity(sessions)
        if request.agent_alias is None and self.default_agent:
            request = replace(request, agent_alias=self.default_agent)
        creating = self.tenancy.creating
        creating[self.id] += 1
        try:
            if names is None:
                return await sessions.new(peer, request, tenant=self.tenant)
            return await sessions.new(peer, request, tenant=self.tenant, names=names)
        finally:
            creating[self.id] -= 1
            if not creating[self.id]:
                del creating[self.id]

    def check_cwd(self, sessions: Sessions, cwd: str | None) -> None:
        """-32602 when a ``session/load``'s or ``resume``'s ``cwd`` is outside the root."""
        if cwd is not None:
            confine_cwd(cwd, tenant_root(sessions.settings.data_dir, self.id, self.tenant))

    def status_view(self, status: Mapping[str, Any], sessions: Sessions) -> dict[str, Any]:
        """``status`` as this tenant may see it: an admin sees everything; others only
        their own sessions and turns, and none of the host's process or store details
        (only the keys of :data:`_SHARED_STATUS`, so a key added to ``status`` later is
        not shown to tenants by default)."""
        if self.tenant.admin:
            return dict(status)
        own = [entry for entry in status["sessions"]
               if self.tenancy.tenant_of(sessions, entry["sessionId"]) == self.tenant.id]
        view = {key: status[key] for key in _SHARED_STATUS if key in status}
        view.update(sessions=own, activeSessions=len(own), tenant=self.tenant.name,
                    turnsCommitted=sessions.host.turn_stats.by_tenant.get(self.tenant.id, 0))
        return view


_SHARED_STATUS = ("serverVersion", "protocolVersion", "uptimeSecs", "limits", "sandbox")
"""The keys of ``status`` every tenant sees (the rest are the host's or an admin's: not
the host id either, which by default names the machine)."""
