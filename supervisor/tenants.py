"""Tenants of the gateway: who a token belongs to, and which sessions a tenant may see.

Runs on the asyncio loop thread. A gateway connection carries a :class:`TenantScope`
in its endpoint's ``state["scope"]``; the ACP server (:mod:`supervisor.acp_server`)
asks it before it touches a session. A session belongs to the tenant that created
it (kept in the stored row's ``meta.tenant``); any other tenant is told the session
does not exist (-32000), whether it exists or not, so no tenant learns another's
session ids, titles or cwds. Local clients (the Unix sockets) carry no scope: they
are the host's owner and see every session, as before tenants existed.

Tokens are stored only as SHA-256 hex digests (``[tenants.NAME] token_sha256``) and
compared with :func:`hmac.compare_digest`; the token itself is never kept or logged.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from ipc.errors import InvalidParams, SessionLimitReached, SessionNotFound

if TYPE_CHECKING:
    from ipc.acp import NewSessionRequest
    from supervisor.gateway_config import TenantConfig
    from supervisor.sessions import Sessions

__all__ = ["TENANT_META_KEY", "Tenancy", "TenantScope", "hash_token", "tenant_of_token"]

TENANT_META_KEY = "tenant"
"""The key of a session's stored ``meta`` that names its tenant (absent: the owner's)."""


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
    """Session id → tenant name, for the sessions a gateway connection asked about.

    A session's tenant never changes, so an entry is good until the session is
    deleted. A miss reads the stored row once (a cheap indexed read on the loop, as
    ``session/prompt`` of an evicted session does anyway).
    """

    _OWNER = ""  # cached tenant of an owner's (local) session

    def __init__(self) -> None:
        self._tenant_of: dict[str, str] = {}

    def created(self, sid: str, tenant: str) -> None:
        self._tenant_of[sid] = tenant

    def forget(self, sid: str) -> None:
        self._tenant_of.pop(sid, None)

    def tenant_of(self, sessions: Sessions, sid: str) -> str | None:
        """The session's tenant name ("" for an owner's session), None if it is unknown."""
        cached = self._tenant_of.get(sid)
        if cached is not None:
            return cached
        info = sessions.host.reader.get_session(sid)
        if info is None:
            return None
        tenant = str(info.meta.get(TENANT_META_KEY) or self._OWNER)
        self._tenant_of[sid] = tenant
        return tenant

    def live_count(self, sessions: Sessions, tenant: str) -> int:
        """How many live sessions belong to ``tenant``."""
        return sum(1 for sid in sessions.host.routes if self._tenant_of.get(sid) == tenant)


@dataclass(frozen=True, slots=True)
class TenantScope:
    """What one gateway connection may do: its tenant, and its ``?agent=`` default."""

    tenant: TenantConfig
    tenancy: Tenancy
    default_agent: str | None = None

    @property
    def name(self) -> str:
        return self.tenant.name

    def check(self, sessions: Sessions, sid: str) -> None:
        """-32000 unless ``sid`` is one of this tenant's sessions (the same answer
        whether it belongs to someone else or does not exist)."""
        if self.tenancy.tenant_of(sessions, sid) != self.tenant.name:
            raise SessionNotFound(f"Session not found: {sid}")

    def check_capacity(self, sessions: Sessions, sid: str | None = None) -> None:
        """-32001 when opening one more session would pass the tenant's ``max_sessions``
        (``sid``: a session being restored, which does not count when already live)."""
        cap = self.tenant.max_sessions
        if cap is None or (sid is not None and sid in sessions.host.routes):
            return
        if self.tenancy.live_count(sessions, self.tenant.name) >= cap:
            raise SessionLimitReached(f"Maximum session limit reached ({cap})")

    def new_session_request(self, sessions: Sessions,
                            request: NewSessionRequest) -> NewSessionRequest:
        """The request with this connection's defaults (``?agent=``, the workspace root
        for an omitted cwd) applied and checked against the tenant's limits."""
        self.check_capacity(sessions)
        if request.agent_alias is None and self.default_agent:
            request = replace(request, agent_alias=self.default_agent)
        root = self.tenant.workspace_root
        if root is None:
            return request
        root_text = os.path.realpath(root)
        cwd = request.cwd
        if cwd is None or cwd.strip() in ("", "."):
            os.makedirs(root_text, mode=0o700, exist_ok=True)
            return replace(request, cwd=root_text)
        resolved = os.path.realpath(cwd) if os.path.isabs(cwd) else None
        if resolved is None or os.path.commonpath([resolved, root_text]) != root_text:
            raise InvalidParams("cwd must be inside the tenant's workspace root")
        return replace(request, cwd=resolved)

    def created(self, sid: str) -> None:
        self.tenancy.created(sid, self.tenant.name)

    def status_view(self, status: Mapping[str, Any], sessions: Sessions) -> dict[str, Any]:
        """``status`` as this tenant may see it: an admin sees everything; others only
        their own sessions, and none of the host's process or store details."""
        if self.tenant.admin:
            return dict(status)
        own = [entry for entry in status["sessions"]
               if self.tenancy.tenant_of(sessions, entry["sessionId"]) == self.tenant.name]
        hidden = {"pid", "workers", "usage", "store", "sessions", "activeSessions"}
        view = {key: value for key, value in status.items() if key not in hidden}
        view.update(sessions=own, activeSessions=len(own), tenant=self.tenant.name)
        return view
