"""``zeroclaw acp client``: its flags, the server command it starts, its exit codes.

Runs on the main thread; the chosen mode (:mod:`supervisor.cli.acp_client_tui` for a
person, :mod:`supervisor.cli.acp_client_json` for scripts) runs its own asyncio loop.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

from supervisor.cli.acp_client_options import EXIT_USAGE, ClientOptions

__all__ = ["parse", "run"]

_EPILOG = """\
commands (interactive): /cancel  /mode [ID]  /load ID  /list  /help  /quit
auto-approval: only zeroclaw's file_read, file_list and search (named in the request's
_meta.zeroclaw.tool) whose every path resolves inside --cwd; a tool call's kind is never
trusted; everything else is asked (in --json mode: rejected unless --approve-all).
exit codes: 0 every prompt ended (or /quit), 1 a prompt got a JSON-RPC error,
2 usage error, 3 the server could not start or exited early"""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="zeroclaw acp client", epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Interactive ACP debug client: type prompts, watch updates stream, "
                    "answer permissions. Starts `zeroclaw acp` unless told otherwise.")
    parser.add_argument("--server", metavar="CMD",
                        help="the ACP server command to start (split like a shell would)")
    parser.add_argument("--server-args", nargs=argparse.REMAINDER, default=[], metavar="ARG",
                        help="arguments for --server's command (must come last)")
    parser.add_argument("--attach", nargs="?", const="", default=None, metavar="URL",
                        help="start `zeroclaw acp --attach [URL]` (the shared daemon, or a "
                             "gateway's ws://HOST:PORT/acp)")
    parser.add_argument("--config-dir", help="passed to `zeroclaw acp`")
    parser.add_argument("--cwd", default=".", metavar="DIR",
                        help="the session's working directory (default: the current one)")
    parser.add_argument("--no-auto-approve", action="store_true",
                        help="ask for every permission, reads inside --cwd too")
    parser.add_argument("--json", action="store_true",
                        help="no prompt UI: print every message from the server as one "
                             "JSON line; prompts from --prompt or stdin lines")
    parser.add_argument("--prompt", action="append", default=[], metavar="TEXT",
                        help="--json: a prompt to send (repeatable; default: stdin lines)")
    parser.add_argument("--approve-all", action="store_true",
                        help="--json: allow every permission request (default: reject)")
    return parser


def parse(argv: Sequence[str]) -> ClientOptions:
    """The options of ``argv``; exits 2 (argparse's usage error) when they are wrong."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.server is not None and args.attach is not None:
        parser.error("--server and --attach exclude each other")
    if args.server_args and args.server is None:
        parser.error("--server-args needs --server")
    if (args.prompt or args.approve_all) and not args.json:
        parser.error("--prompt and --approve-all go with --json")
    cwd = Path(args.cwd).expanduser().absolute()
    if not cwd.is_dir():
        parser.error(f"--cwd {args.cwd}: not a directory")
    return ClientOptions(server=_server_argv(args), cwd=cwd,
                         auto_approve=not args.no_auto_approve, json=args.json,
                         prompts=list(args.prompt), approve_all=args.approve_all)


def _server_argv(args: argparse.Namespace) -> list[str]:
    if args.server is not None:
        return [*shlex.split(args.server), *args.server_args]
    argv = [sys.executable, "-m", "supervisor.cli.main", "acp"]
    if args.config_dir is not None:
        argv += ["--config-dir", args.config_dir]
    if args.attach is not None:
        argv += ["--attach", *([args.attach] if args.attach else [])]
    return argv


def run(argv: Sequence[str]) -> int:
    """``zeroclaw acp client ARGV...``: the exit code (see the module's ``--help``)."""
    options = parse(argv)
    if not options.server:
        print("zeroclaw acp client: --server is empty", file=sys.stderr)
        return EXIT_USAGE
    if options.json:
        from supervisor.cli.acp_client_json import run_json

        return run_json(options)
    from supervisor.cli.acp_client_tui import run_interactive

    return run_interactive(options)
