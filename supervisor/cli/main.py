"""The ``zeroclaw`` command.

Imports stay lazy: ``zeroclaw acp`` must reach its ``initialize`` answer fast, so
nothing heavy (pykka, zmq, peewee, psutil) is imported before it.
In ``acp`` mode stdout carries protocol frames only; logs go to stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from collections.abc import Coroutine, Sequence
from typing import Any

from supervisor import __version__

__all__ = ["main"]

LOG_LEVELS = ("debug", "info", "warning", "error")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="zeroclaw", description="ACP session host")
    parser.add_argument("--version", action="version", version=f"zeroclaw {__version__}")
    commands = parser.add_subparsers(dest="command")
    acp = commands.add_parser("acp", help="ACP v1 server on stdin/stdout")
    acp.add_argument("--config-dir", help="configuration directory (default ~/.zeroclaw)")
    acp.add_argument("--max-sessions", type=int, help="live sessions in memory")
    acp.add_argument("--session-timeout", type=float, metavar="SECS",
                     help="idle eviction and permission timeout")
    acp.add_argument("--log-level", choices=LOG_LEVELS, help="stderr log level")
    acp.add_argument("--attach", nargs="?", const="", default=None, metavar="URL",
                     help="bridge stdio to the shared daemon (started if needed), or to a "
                          "gateway's ws://HOST:PORT/acp or wss://… URL")
    acp.add_argument("--token-file", metavar="PATH",
                     help="--attach URL: the gateway token (default: $ZEROCLAW_GATEWAY_TOKEN)")
    acp.add_argument("--ca-file", metavar="PATH",
                     help="--attach wss://…: CA certificate(s) to verify the gateway with")
    _naming_arguments(acp)
    config = commands.add_parser("config", help="get, set or list config.toml keys")
    config.add_argument("--config-dir", help="configuration directory (default ~/.zeroclaw)")
    config.add_argument("args", nargs=argparse.REMAINDER)
    daemon = commands.add_parser("daemon", help="shared host on a Unix socket (daemon.sock)")
    daemon.add_argument("--ephemeral", action="store_true",
                        help="exit 1 s after the last client disconnects")
    daemon.add_argument("--config-dir", help="configuration directory (default ~/.zeroclaw)")
    daemon.add_argument("--log-level", choices=LOG_LEVELS, help="stderr log level (default info)")
    daemon.add_argument("--gateway", metavar="HOST:PORT",
                        help="also serve ACP over WebSocket and ops over HTTP (gateway.listen)")
    tenant = commands.add_parser("tenant", help="add, list or remove gateway tenants")
    tenant.add_argument("--config-dir", help="configuration directory (default ~/.zeroclaw)")
    tenant.add_argument("args", nargs=argparse.REMAINDER)
    store = commands.add_parser("store", help="copy an SQLite store into PostgreSQL")
    store.add_argument("--config-dir", help="configuration directory (default ~/.zeroclaw)")
    store.add_argument("args", nargs=argparse.REMAINDER)
    status = commands.add_parser(
        "status", help="the daemon's sessions, workers and limits",
        description="exit codes: 0 running, 1 degraded, 2 usage, 3 not running, 4 no answer",
    )
    status.add_argument("--json", action="store_true", help="print the exact wire result")
    status.add_argument("--watch", action="store_true", help="redraw every second until Ctrl-C")
    status.add_argument("--config-dir", help="configuration directory (default ~/.zeroclaw)")
    return parser


def _configure_logging(level: str) -> None:
    logging.basicConfig(
        stream=sys.stderr,
        level=getattr(logging, level.upper(), logging.WARNING),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


def main(argv: Sequence[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    if words[:2] == ["acp", "client"]:  # a client, not a server: flags of its own
        from supervisor.cli.acp_client_cli import run as run_client

        return run_client(words[2:])
    args = _parser().parse_args(words)
    if args.command == "acp":
        return _run_acp(args)
    if args.command == "config":
        from supervisor.cli.config_cmd import run
        from supervisor.config import resolve_config_dir

        return run(list(args.args), resolve_config_dir(args.config_dir))
    if args.command == "daemon":
        return _run_daemon(args)
    if args.command == "tenant":
        from supervisor.cli.tenant_cmd import run as run_tenant
        from supervisor.config import resolve_config_dir

        return run_tenant(list(args.args), resolve_config_dir(args.config_dir), args.config_dir)
    if args.command == "status":
        return _run_status(args)
    if args.command == "store":
        from supervisor.cli.store_cmd import run as run_store

        return run_store(list(args.args), args.config_dir)
    _parser().print_help(sys.stderr)
    return 2


def _naming_arguments(acp: argparse.ArgumentParser) -> None:
    """``--session KEY | --session-label LABEL [--require-existing] [--reset-session]``:
    what an editor's ``session/new`` names when it sends no ``_meta.sessionKey``."""
    which = acp.add_mutually_exclusive_group()
    which.add_argument("--session", metavar="KEY",
                       help="the editor's new session continues the stored session of this "
                            "key (created on first use)")
    which.add_argument("--session-label", metavar="LABEL",
                       help="the editor's new session continues the session with this label")
    acp.add_argument("--require-existing", action="store_true",
                     help="with --session: fail when no session has the key yet")
    acp.add_argument("--provenance", choices=("off", "meta", "meta+receipt"), default="off",
                     help="meta: each prompt result's _meta.provenance names the host, "
                          "agent and model; meta+receipt: also a source receipt at the end "
                          "of each prompt, for the agent to read")
    acp.add_argument("--reset-session", action="store_true",
                     help="give the key (or label) a fresh transcript before its first use; "
                          "the old session stays stored")


def _naming(args: argparse.Namespace) -> Any:
    """The :class:`ipc.session_names.SessionNaming` of the command line; exits 2 for a
    flag that needs --session or --session-label without one."""
    from ipc.errors import InvalidParams
    from ipc.session_names import SessionNaming, check_name

    if (args.require_existing or args.reset_session) and not (args.session
                                                               or args.session_label):
        _parser().error("--require-existing and --reset-session need --session or "
                        "--session-label")
    try:
        return SessionNaming(check_name(args.session, "--session"),
                             check_name(args.session_label, "--session-label"),
                             args.reset_session, args.require_existing)
    except InvalidParams as exc:
        _parser().error(str(exc))


def _run_acp(args: argparse.Namespace) -> int:
    from supervisor.config import ConfigError, load_settings

    naming = _naming(args)
    level = args.log_level or os.environ.get("ZEROCLAW_LOG") or "warning"
    _configure_logging(level)
    overrides = {"acp.max_sessions": args.max_sessions,
                 "acp.session_timeout_secs": args.session_timeout}
    try:
        settings = load_settings(args.config_dir, overrides)
    except ConfigError as exc:
        logging.getLogger("zeroclaw").error("configuration error: %s", exc)
        from supervisor.servers.stdio import serve_config_error

        return _serve_stdio(serve_config_error(str(exc)), 2)  # the editor gets the reason too
    if args.attach is None:
        from actors.worker.sandbox import detect_soon

        detect_soon(settings.sandbox)  # for the initialize answer, meanwhile the imports run
    if args.attach is not None:
        from supervisor.cli.attach import run_attach

        if args.max_sessions is not None or args.session_timeout is not None:
            logging.getLogger("zeroclaw").warning(
                "--attach: limits come from the daemon's configuration; flags ignored")
        return run_attach(settings, args.attach or None, args.token_file, args.ca_file,
                          naming, args.provenance)
    from supervisor.servers.stdio import serve_acp_stdio

    return _serve_stdio(serve_acp_stdio(settings, naming, args.provenance != "off",
                                        args.provenance == "meta+receipt"), 0)


def _serve_stdio(serving: Coroutine[Any, Any, None], exit_code: int) -> int:
    """Run a stdio server until EOF; ``exit_code`` then, 130 on Ctrl-C."""
    try:
        asyncio.run(serving)
    except KeyboardInterrupt:
        return 130
    return exit_code


def _run_daemon(args: argparse.Namespace) -> int:
    from supervisor.config import ConfigError, load_settings

    _configure_logging(args.log_level or os.environ.get("ZEROCLAW_LOG") or "info")
    try:
        settings = load_settings(args.config_dir, {"gateway.listen": args.gateway})
    except ConfigError as exc:
        logging.getLogger("zeroclaw").error("configuration error: %s", exc)
        return 2
    from supervisor.servers.daemon import run_daemon

    return run_daemon(settings, ephemeral=args.ephemeral)


def _run_status(args: argparse.Namespace) -> int:
    from supervisor.config import ConfigError, load_settings

    try:
        settings = load_settings(args.config_dir)
    except ConfigError as exc:
        print(f"zeroclaw status: configuration error: {exc}", file=sys.stderr)
        return 2
    from supervisor.cli.status_cmd import run_status

    return run_status(settings.socket_path, as_json=args.json, watch=args.watch)


if __name__ == "__main__":
    sys.exit(main())
