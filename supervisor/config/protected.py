"""The host's own paths, computed once: what no session, tool, sandbox or agent may reach.

Directories: the config dir, the data dir, its ``run`` dir (worker sockets), and the
parents of the per-tenant dirs (``agent-homes``, ``tenants``: a session may sit in one
tenant's dir, never in the dir of all of them). Files: ``config.toml``, the store with
its ``-wal``, ``-shm`` and ``-journal``, ``daemon.sock`` and ``acp.sock`` with their lock
files, the gateway's TLS key and cert. The host hands them to its workers in one
variable (:data:`actors.worker.protected.PROTECTED_VARIABLE`), and refuses a
``session/new`` whose cwd lies in a protected directory but is not a root the rule
sanctions (:func:`cwd_refusal`). Runs on the host's loop thread (at start and on every
``session/new``).
"""

from __future__ import annotations

import os
from pathlib import Path

from actors.worker.protected import ProtectedPaths
from supervisor.config.config import Settings

__all__ = [
    "acp_socket_path",
    "canonical_dir",
    "cwd_refusal",
    "host_protected_paths",
    "socket_lock_path",
]

#: Beside the store: SQLite's write-ahead log, its shared memory, a rollback journal.
_STORE_SIDECARS = ("-wal", "-shm", "-journal")


def acp_socket_path(settings: Settings) -> Path:
    """``<data_dir>/acp.sock`` (SPEC §6), whatever ``ZEROCLAW_SOCKET`` says: two daemons
    with different config dirs never meet on it."""
    return settings.data_dir / "acp.sock"


def socket_lock_path(path: Path) -> Path:
    """The lock file a host holds beside its socket ``path`` while it serves it
    (:mod:`supervisor.servers.daemon_socket` takes it)."""
    return path.with_name(path.name + ".lock")


def host_protected_paths(settings: Settings) -> ProtectedPaths:
    """The host's own directories and files, canonical (symlinks resolved)."""
    data = settings.data_dir
    dirs = [settings.config_dir, data, data / "run", data / "agent-homes", data / "tenants"]
    store = settings.store_path
    files = [settings.config_dir / "config.toml", store,
             *(store.with_name(store.name + s) for s in _STORE_SIDECARS)]
    for sock in (settings.socket_path, acp_socket_path(settings)):
        files += [sock, socket_lock_path(sock)]
    gateway = settings.gateway
    if gateway is not None:
        files += [p for p in (gateway.tls_key, gateway.tls_cert) if p is not None]
    return ProtectedPaths(dirs=_canonical(dirs), files=_canonical(files))


def _canonical(paths: list[Path]) -> tuple[Path, ...]:
    return tuple(dict.fromkeys(Path(os.path.realpath(p)) for p in paths))


def cwd_refusal(cwd: str, protected: ProtectedPaths) -> str | None:
    """Why a session may not have the canonical ``cwd`` (it is, or lies inside, one of
    the host's own paths, and is no root the rule sanctions), or None."""
    path = Path(cwd)
    if not protected.holds(path) or protected.sanctions(path):
        return None
    return (f"cwd {cwd[:200]} is, or lies inside, one of the host's own directories "
            "(config, data, sockets), which no session may use")


def canonical_dir(path: str, base: str | None = None) -> str | None:
    """``path`` resolved (symlinks, ``..``) when it is a usable directory, else None.

    Plain ``os.path`` strings: this is on the way of every ``session/new``.
    """
    candidate = path if os.path.isabs(path) else os.path.join(base or os.getcwd(), path)
    try:
        resolved = os.path.realpath(candidate)
        usable = os.path.isdir(resolved) and os.access(resolved, os.R_OK | os.X_OK)
    except (ValueError, OSError):  # an embedded NUL, a name too long
        return None
    return resolved if usable else None
