"""A tenant's mark on its sessions and the directory it is confined to.

Every tenant is confined to a root of its own (:func:`tenant_root`): its
``workspace_root``, else ``<data_dir>/tenants/<id>/`` (made 0700). A session's cwd must
be inside it (:func:`confine_cwd`, -32602 otherwise); the root is the session's only
writable root for tools, and its hosted agent processes' too. A session's stored
``meta`` names its tenant (:data:`TENANT_META_KEY`).

Runs on the asyncio loop thread. Below both the session operations
(:mod:`supervisor.host.sessions`), which mark and confine a tenant's new session, and
the tenants' scopes (:mod:`supervisor.host.tenants`), which check them.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import TYPE_CHECKING

from actors.worker.protected import path_component, within
from ipc.errors import InvalidParams
from supervisor.config.protected import canonical_dir

if TYPE_CHECKING:
    from supervisor.config.gateway_config import TenantConfig

__all__ = [
    "TENANT_META_KEY",
    "TENANT_NAME_META_KEY",
    "confine_cwd",
    "make_private_dir",
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
