"""``zeroclaw store copy``: move an SQLite session store into PostgreSQL.

Runs on the main thread of a short-lived ``zeroclaw store`` process. Wire (command
line) format::

    zeroclaw store copy --to postgresql://USER@HOST:PORT/DB [--from PATH | sqlite:///PATH]
                        [--password-env NAME] [--config-dir DIR]

``--from`` defaults to the configured SQLite store (``[store] path``, or the default
file under the data dir). The target's password comes from the variable
``--password-env`` names (default: ``[store] password_env`` when the configured
``[store] url`` is the target), else from libpq (``~/.pgpass``, ``PGPASSFILE``, a
service file); a password in the URL is refused, and none is ever printed. The copy
is one transaction into an empty store (:mod:`storage.copy`). Prints what was
copied on stdout. Exit codes: 0 copied, 1 refused or failed (nothing copied), 2 usage.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from urllib.parse import urlsplit

__all__ = ["run"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="zeroclaw store", description="the session store")
    actions = parser.add_subparsers(dest="action", required=True)
    copy = actions.add_parser("copy", help="copy an SQLite store into an empty PostgreSQL one")
    copy.add_argument("--to", required=True, metavar="URL", help="postgresql://USER@HOST/DB")
    copy.add_argument("--from", dest="source", metavar="PATH",
                      help="the SQLite file (default: the configured store)")
    copy.add_argument("--password-env", metavar="NAME",
                      help="the variable holding the target's password (default: libpq's "
                           "sources, or [store] password_env for the configured url)")
    return parser


class _Refused(Exception):
    pass


def run(argv: list[str], config_flag: str | None) -> int:
    """Run ``zeroclaw store`` with ``argv`` (the words after ``store``); the exit code."""
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exit_request:
        return exit_request.code if isinstance(exit_request.code, int) else 2
    import peewee

    from storage.copy import CopyRefused, copy_sqlite_to_postgresql
    from storage.pg import is_postgresql_url, redact_url

    if not is_postgresql_url(args.to) or urlsplit(args.to).password is not None:
        print("zeroclaw store: --to must be a postgresql:// URL without a password "
              "(give it in --password-env or ~/.pgpass)", file=sys.stderr)
        return 2
    try:
        source, password = _source_and_password(args, config_flag)
        counts = copy_sqlite_to_postgresql(source, args.to, password)
    except (_Refused, CopyRefused, peewee.PeeweeException) as error:
        print(f"zeroclaw store: {error}", file=sys.stderr)
        return 1
    rows = ", ".join(f"{n} {table}" for table, n in counts.items())
    print(f"copied {source} into {redact_url(args.to)}: {rows}")
    return 0


def _source_and_password(args: argparse.Namespace,
                         config_flag: str | None) -> tuple[Path, str | None]:
    from supervisor.config import ConfigError, load_settings

    try:
        settings = load_settings(config_flag)
    except ConfigError as error:
        raise _Refused(f"configuration error: {error}") from None
    if args.source is not None:
        source = Path(args.source.removeprefix("sqlite://")).expanduser()
    elif settings.store_url is None:
        source = settings.store_path
    else:
        raise _Refused("the configured store is PostgreSQL already: give --from PATH of "
                       "the SQLite file to copy")
    name = args.password_env
    if name is None and settings.store_url == args.to:
        name = settings.store_password_env
    if name is None:
        return source, None
    password = os.environ.get(name)
    if not password:
        raise _Refused(f"--password-env names {name}, which is not set")
    return source, password
