"""Tenants of the gateway: who a token belongs to, and which sessions a tenant may see.

Runs on the asyncio loop thread. A gateway connection carries a :class:`TenantScope`
in its endpoint's ``state["scope"]``; the ACP server (:mod:`supervisor.servers.acp_server`)
asks it before it touches a session. A session belongs to the tenant that created
it (kept in the stored row's ``meta.tenant``: the tenant's stable ``id``, with its
name beside it in ``meta.tenantName`` for display); any other tenant is told the
session does not exist (-32000), whether it exists or not, so no tenant learns
another's session ids, titles or cwds. Local clients (the Unix sockets) carry no
scope: they are the host's owner and see every session, as before tenants existed.

Every tenant is confined to a root of its own (:func:`tenant_root`): its
``workspace_root``, else ``<data_dir>/tenants/<id>/`` (made 0700). A session's cwd must
be inside it (:func:`confine_cwd`, -32602 otherwise); the root is the session's only
writable root for tools, and its hosted agent processes' too.

Tokens are stored only as SHA-256 hex digests (``[tenants.NAME] token_sha256``) and
compared with :func:`hmac.compare_digest`; the token itself is never kept or logged.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from actors.worker.protected import path_component, within
from ipc.errors import InvalidParams, SessionLimitReached, SessionNotFound
from supervisor.protected import canonical_dir

if TYPE_CHECKING:
    from ipc.acp import NewSessionRequest
    from supervisor.gateway_config import TenantConfig
    from supervisor.routes import Peer, Route
    from supervisor.session_keys import SessionNames
    from supervisor.sessions import Sessions

__all__ = [
    "TENANT_META_KEY",
    "TENANT_NAME_META_KEY",
    "Tenancy",
    "TenantScope",
    "confine_cwd",
    "hash_token",
    "make_private_dir",
    "tenant_of_token",
    "tenant_root",
]

TENANT_META_KEY = "tenant"
"""The key of a session's stored ``meta`` that holds its tenant's id (absent: the owner's)."""
TENANT_NAME_META_KEY = "tenantName"
"""The key of a session's stored ``meta`` with its tenant's name when it was made (display)."""


def tenant_root(data_dir: Path, tenant_id: str, tenant: TenantConfig | None) -> str:
    """The canonical root a tenant's sessions are confined to, made if missing: its
    ``workspace_root``, else ``<data_dir>/tenants/<id>`` (``tenant`` None: a removed
    tenant's sessions, opened by the owner, keep the default root of their id).
    Runs on the loop thread (a few ``mkdir`` at most)."""
    if tenant is not None and tenant.workspace_root is not None:
        root = Path(os.path.realpath(tenant.workspace_root))
    else:
        root = Path(os.path.realpath(data_dir)) / "tenants" / path_component(tenant_id)
    make_private_dir(root)
    return str(root)


def make_private_dir(path: Path) -> None:
    """``path`` and its missing parents made 0700; existing ones are left as they are."""
    missing = []
    while not path.exists():
        missing.append(path)
        path = path.parent
    for directory in reversed(missing):
        with contextlib.suppress(FileExistsError):  # made meanwhile (another open)
            directory.mkdir(mode=0o700)


def confine_cwd(cwd: str | None, root: str) -> str:
    """The canonical cwd of a tenant's session under its ``root`` (the root itself when
    omitted); -32602 for a relative cwd, one outside the root once ``..`` and symlinks
    are resolved, or one that is no directory."""
    if cwd is None or cwd.strip() in ("", "."):
        return root
    if not os.path.isabs(cwd):
        raise InvalidParams("cwd must be an absolute path inside the tenant's workspace root")
    resolved = canonical_dir(cwd)
    if resolved is None:
        if not within(Path(os.path.realpath(cwd)), Path(root)):
            raise InvalidParams("cwd must be inside the tenant's workspace root")
        raise InvalidParams(f"cwd is not a usable directory: {cwd[:200]}")
    if not within(Path(resolved), Path(root)):
        raise InvalidParams("cwd must be inside the tenant's workspace root")
    return resolved


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
        tenant's least recently used idle one (:meth:`supervisor.live.LiveTable.make_room`),
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
