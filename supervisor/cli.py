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
from collections.abc import Sequence

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
    acp.add_argument("--attach", action="store_true", help="share a daemon (not yet available)")
    config = commands.add_parser("config", help="get, set or list config.toml keys")
    config.add_argument("--config-dir", help="configuration directory (default ~/.zeroclaw)")
    config.add_argument("args", nargs=argparse.REMAINDER)
    for name in ("daemon", "status"):
        commands.add_parser(name, help="(planned)")
    return parser


def _configure_logging(level: str) -> None:
    logging.basicConfig(
        stream=sys.stderr,
        level=getattr(logging, level.upper(), logging.WARNING),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "acp":
        return _run_acp(args)
    if args.command == "config":
        from supervisor.config import resolve_config_dir
        from supervisor.config_cmd import run

        return run(list(args.args), resolve_config_dir(args.config_dir))
    if args.command in ("daemon", "status"):
        print(f"zeroclaw {args.command}: not available yet", file=sys.stderr)
        return 2
    _parser().print_help(sys.stderr)
    return 2


def _run_acp(args: argparse.Namespace) -> int:
    from supervisor.config import ConfigError, load_settings

    level = args.log_level or os.environ.get("ZEROCLAW_LOG") or "warning"
    _configure_logging(level)
    if args.attach:
        logging.getLogger("zeroclaw").error("--attach needs the daemon, which is not built yet")
        return 2
    overrides = {"acp.max_sessions": args.max_sessions,
                 "acp.session_timeout_secs": args.session_timeout}
    try:
        settings = load_settings(args.config_dir, overrides)
    except ConfigError as exc:
        logging.getLogger("zeroclaw").error("configuration error: %s", exc)
        return 2
    from supervisor.stdio import serve_acp_stdio

    try:
        asyncio.run(serve_acp_stdio(settings))
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
