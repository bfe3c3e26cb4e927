"""``zeroclaw tenant add|list|remove``: the gateway's tenants in ``config.toml``.

Runs on the main thread of a short-lived ``zeroclaw tenant`` process; the file is
edited as ``zeroclaw config set`` edits it (tomlkit, atomic, comments kept).

Wire (command line) format::

    zeroclaw tenant add NAME [--admin] [--max-sessions N] [--workspace-root DIR]
                             [--no-network]
        prints the new token once, on stdout (only its SHA-256 is stored); the
        tenant gets a new id (uuid4 hex), which owns its sessions
    zeroclaw tenant list [--json]     NAME, id, admin, max_sessions, workspace_root,
                                      sandbox_network
    zeroclaw tenant remove NAME       its id is retired (gateway.retired_tenant_ids): a
                                      tenant added again under NAME is another tenant;
                                      on a shared PostgreSQL store, every host on it
                                      refuses its token within seconds
                                      (:mod:`supervisor.cli.tenant_revoke`)

Exit codes: 0 done, 1 unknown or existing tenant / unusable file, 2 usage.

When ``[store] url`` is PostgreSQL (several hosts on one store), ``add`` keeps the
tenant in the store instead, for every host, ``list`` shows both kinds (``local`` and
``shared``), and ``remove`` takes the local section first, else the shared tenant: see
:mod:`supervisor.cli.tenant_shared`.

After ``add`` or ``remove``, a daemon running on this configuration's ``daemon.sock``
is asked to reload its tenants (``tenants/reload``; the socket is its owner's only):
the new token works at once, and a removed tenant's open gateway connections are
closed. No daemon running: nothing to do, the next one reads the file. A daemon
that does not answer or refuses is reported on stderr; the file is changed anyway,
so the exit code stays 0.
"""

from __future__ import annotations

import argparse
import json
import secrets
import sys
import uuid
from collections.abc import Mapping
from pathlib import Path

from supervisor.cli.config_cmd import (
    CONFIG_FILE_NAME,
    ConfigCommandError,
    _check,
    _load,
    _parent_table,
    _save,
)
from supervisor.cli.tenant_revoke import shared_settings
from supervisor.config.config import Settings
from supervisor.host.tenants import hash_token

__all__ = ["run"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="zeroclaw tenant",
                                     description="gateway tenants and their tokens")
    actions = parser.add_subparsers(dest="action", required=True)
    add = actions.add_parser("add", help="add a tenant; prints its token once")
    add.add_argument("name")
    add.add_argument("--admin", action="store_true", help="sees every session in status")
    add.add_argument("--max-sessions", type=int, help="live sessions of this tenant")
    add.add_argument("--workspace-root", help="session cwds must be under this directory "
                     "(default: <data_dir>/tenants/<id>)")
    add.add_argument("--no-network", action="store_true",
                     help="its commands run without network (sandbox_network = false)")
    listing = actions.add_parser("list", help="the tenants (never their tokens)")
    listing.add_argument("--json", action="store_true")
    remove = actions.add_parser("remove", help="remove a tenant (its token stops working)")
    remove.add_argument("name")
    return parser


def run(argv: list[str], config_dir: Path, config_flag: str | None = None) -> int:
    """Run ``zeroclaw tenant`` with ``argv`` (the words after ``tenant``); the exit code.

    ``config_flag``: ``--config-dir`` as given (None: not given), so that the daemon's
    socket is found as ``zeroclaw daemon`` with the same flag and environment finds it."""
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exit_request:
        return exit_request.code if isinstance(exit_request.code, int) else 2
    path = config_dir / CONFIG_FILE_NAME
    try:
        shared = shared_settings(config_flag)
        if shared is not None:
            return _run_shared(shared, path, args, config_flag)
        if args.action == "add":
            print(_add(path, args), flush=True)
        elif args.action == "list":
            _list(path, as_json=args.json)
            return 0
        else:
            _remove(path, args.name, config_flag)
    except ConfigCommandError as error:
        print(f"zeroclaw tenant: {error}", file=sys.stderr)
        return error.exit_code
    _reload_running_daemon(config_flag)
    return 0


def _run_shared(settings: Settings, path: Path, args: argparse.Namespace,
                config_flag: str | None) -> int:
    """``zeroclaw tenant`` on a shared store (see the module doc)."""
    from supervisor.cli.tenant_shared import add_shared, list_shared, remove_shared

    local = _tenants(_load(path))
    if args.action == "list":
        _list(path, as_json=args.json, settings=settings)
        return 0
    if args.action == "add":
        token, section = new_tenant_section(args)
        told = add_shared(settings, args.name, section, local)
        print(token, flush=True)
    elif args.name in local:
        _remove(path, args.name, config_flag)
        _reload_running_daemon(config_flag)
        told = f"removed {args.name} from this host's config.toml"
        if any(tenant.name == args.name for tenant in list_shared(settings)):
            told += (f"; the shared tenant {args.name} stays (run this again to remove "
                     "it too)")
    else:
        told = remove_shared(settings, args.name)
    print(f"zeroclaw tenant: {told}", file=sys.stderr)
    return 0


def _reload_running_daemon(config_flag: str | None) -> None:
    """Ask a daemon on this configuration's socket to reload its tenants (see above)."""
    from supervisor.cli.status_cmd import DaemonError, NoAnswer, NotRunning, StatusClient
    from supervisor.config.config import ConfigError, load_settings

    try:
        socket_path = load_settings(config_flag).socket_path
    except ConfigError:
        return  # not reachable: _check accepted the file
    client = StatusClient(socket_path)
    try:
        result = client.call("tenants/reload", {})
    except NotRunning:
        return
    except (NoAnswer, DaemonError) as error:
        print(f"zeroclaw tenant: saved, but the running daemon did not reload: {error}",
              file=sys.stderr)
        return
    finally:
        client.close()
    revoked = result.get("revokedConnections", 0) if isinstance(result, dict) else 0
    print(f"zeroclaw tenant: the running daemon reloaded its tenants ({revoked} gateway "
          "connection(s) closed)", file=sys.stderr)


def _add(path: Path, args: argparse.Namespace) -> str:
    """Store a new tenant with a fresh token's hash; the token."""
    document = _load(path)
    if args.name in _tenants(document):
        raise ConfigCommandError(f"tenant {args.name} already exists (remove it first)")
    token, section = new_tenant_section(args)
    table, _ = _parent_table(document, ["tenants", args.name, "token_sha256"])
    table.update(section)
    _check(path, document)
    _save(path, document)
    return token


def new_tenant_section(args: argparse.Namespace) -> tuple[str, dict[str, object]]:
    """A fresh token, and the ``[tenants.NAME]`` section ``add``'s flags ask for (a new
    id, the token's hash; only what differs from the defaults), unchecked."""
    token = secrets.token_urlsafe(32)
    section: dict[str, object] = {"id": uuid.uuid4().hex, "token_sha256": hash_token(token)}
    if args.admin:
        section["admin"] = True
    if args.max_sessions is not None:
        section["max_sessions"] = args.max_sessions
    if args.workspace_root is not None:
        section["workspace_root"] = str(Path(args.workspace_root).expanduser().absolute())
    if args.no_network:
        section["sandbox_network"] = False
    return token, section


def _tenants(document: Mapping[str, object]) -> Mapping[str, Mapping[str, object]]:
    tenants = document.get("tenants") or {}
    if not isinstance(tenants, Mapping):
        raise ConfigCommandError("[tenants] is not a table")
    return tenants


def _list(path: Path, *, as_json: bool, settings: Settings | None = None) -> None:
    """The tenants of ``config.toml``; with ``settings`` of a shared store, each says
    where it lives (``local`` or ``shared``), and the shared ones follow."""
    local = _tenants(_load(path))
    rows: list[dict[str, object]] = [
        {"name": name, "id": str(section.get("id", name)),
         "admin": bool(section.get("admin", False)),
         "maxSessions": section.get("max_sessions"),
         "workspaceRoot": section.get("workspace_root"),
         "sandboxNetwork": section.get("sandbox_network", True) is not False}
        for name, section in local.items()]
    if settings is not None:
        from supervisor.cli.tenant_shared import list_shared

        for row in rows:
            row["where"] = "local"
        rows += [{"name": t.name, "id": t.tenant_id, "admin": t.admin,
                  "maxSessions": t.max_sessions, "workspaceRoot": t.workspace_root,
                  "sandboxNetwork": t.sandbox_network,
                  "where": "shadowed" if t.name in local else "shared",
                  "createdBy": t.created_by, "createdAt": t.created_at,
                  "updatedAt": t.updated_at}
                 for t in list_shared(settings)]
    if as_json:
        print(json.dumps(rows))
        return
    for row in rows:
        extras = [f"max_sessions={row['maxSessions']}" if row["maxSessions"] else "",
                  f"workspace_root={row['workspaceRoot']}" if row["workspaceRoot"] else "",
                  "" if row["sandboxNetwork"] else "sandbox_network=false"]
        where = [str(row["where"])] if "where" in row else []
        print(" ".join([str(row["name"]), str(row["id"]), "admin" if row["admin"] else "-"]
                       + [e for e in extras if e] + where))


def _remove(path: Path, name: str, config_flag: str | None) -> None:
    from supervisor.cli.tenant_revoke import revoke_in_shared_store

    document = _load(path)
    tenants = _tenants(document)
    if name not in tenants:
        raise ConfigCommandError(f"no tenant {name}")
    tenant_id = str(tenants[name].get("id", name))
    told = revoke_in_shared_store(config_flag, tenant_id,
                                  str(tenants[name].get("token_sha256", "")))
    if told is not None:
        print(f"zeroclaw tenant: {told}", file=sys.stderr)
    del tenants[name]  # type: ignore[attr-defined]
    gateway, _ = _parent_table(document, ["gateway", "retired_tenant_ids"])
    retired = gateway.get("retired_tenant_ids", [])
    if isinstance(retired, list) and tenant_id not in retired:
        gateway["retired_tenant_ids"] = [*retired, tenant_id]
    _check(path, document)
    _save(path, document)
