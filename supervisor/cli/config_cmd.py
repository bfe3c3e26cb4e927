"""``zeroclaw config get/set/list``: edit ``<config_dir>/config.toml`` in place.

Runs on the main thread of a short-lived ``zeroclaw config`` process. This is
not the ACP mode, so results go to stdout and problems to stderr.

Wire (command line) format::

    zeroclaw config get [--json] KEY        print one value (strings unquoted)
    zeroclaw config set KEY VALUE           write one value
    zeroclaw config list [--json]           every leaf as ``key = value``

KEY is dotted, ``section.key`` or deeper (``agents.main.provider``); a segment
that is not a bare TOML key can be quoted (``agents."my.agent".provider``).
VALUE is taken as TOML when it parses as one TOML value (``20``, ``true``,
``1.5``, ``["/etc", "~/.ssh"]``, ``"quoted"``), else as a plain string.

Exit codes: 0 success, 1 missing key / unreadable or conflicting file, 2 usage.
The file is edited with tomlkit, so comments and layout survive; a new file is
created with mode 0600 in a directory created with mode 0700.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
from collections.abc import Iterator, Mapping
from datetime import date, datetime, time
from pathlib import Path
from typing import Any

import tomlkit
from tomlkit.exceptions import TOMLKitError
from tomlkit.items import InlineTable, Item, Table

from supervisor.config.config import ConfigError, settings_from_document

__all__ = ["ConfigCommandError", "format_value", "parse_key", "parse_value", "run"]

CONFIG_FILE_NAME = "config.toml"
_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
_KEY_SEGMENT = re.compile(r'\s*(?:([A-Za-z0-9_-]+)|"((?:[^"\\]|\\.)*)"|\'([^\']*)\')\s*')


class ConfigCommandError(Exception):
    """A failure reported on stderr with ``exit_code`` (1 = runtime, 2 = usage)."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def run(argv: list[str], config_dir: Path) -> int:
    """Run ``zeroclaw config`` with ``argv`` (the words after ``config``); return the exit code."""
    parser = _build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_request:  # argparse already printed usage or help
        return _exit_code(exit_request.code)
    config_path = config_dir / CONFIG_FILE_NAME
    try:
        if args.action == "get":
            _get(config_path, args.key, as_json=args.json)
        elif args.action == "set":
            _set(config_path, args.key, args.value)
        else:
            _list(config_path, as_json=args.json)
    except ConfigCommandError as error:
        print(f"zeroclaw config: {error}", file=sys.stderr)
        return error.exit_code
    return 0


def parse_key(key: str) -> list[str]:
    """Split a dotted key into segments; quoted segments may contain dots."""
    segments: list[str] = []
    position = 0
    while True:
        match = _KEY_SEGMENT.match(key, position)
        if match is None:
            raise ConfigCommandError(f"invalid key: {key!r}", exit_code=2)
        bare, double_quoted, single_quoted = match.groups()
        if double_quoted is not None:
            segments.append(_unescape(double_quoted, key))
        else:
            segments.append(bare if bare is not None else single_quoted)
        position = match.end()
        if position == len(key):
            return segments
        if key[position] != ".":
            raise ConfigCommandError(f"invalid key: {key!r}", exit_code=2)
        position += 1


def _unescape(quoted: str, key: str) -> str:
    """The text of a double-quoted TOML key segment, escapes resolved the TOML way."""
    try:
        return str(next(iter(tomlkit.parse(f'"{quoted}" = 0'))))
    except (TOMLKitError, StopIteration) as error:
        raise ConfigCommandError(f"invalid key: {key!r}", exit_code=2) from error


def parse_value(text: str) -> Item:
    """The TOML item for a command-line VALUE: TOML when it is one value, else a string."""
    try:
        parsed = tomlkit.parse(f"value = {text}")
    except TOMLKitError:
        return tomlkit.item(text)
    item = parsed.item("value") if list(parsed.keys()) == ["value"] else None
    if not isinstance(item, Item) or isinstance(item, Table) or item.trivia.comment:
        return tomlkit.item(text)  # more than one value, or a trailing comment
    return item


def format_value(value: Any) -> str:
    """A value written as TOML on one line (tables become inline tables)."""
    return tomlkit.item(_to_inline(value)).as_string()


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="zeroclaw config", description="Read or edit <config_dir>/config.toml."
    )
    actions = parser.add_subparsers(dest="action", required=True, metavar="{get,set,list}")
    get = actions.add_parser("get", help="print one value")
    get.add_argument("--json", action="store_true", help="print the value as JSON")
    get.add_argument("key", help="dotted key, e.g. acp.max_sessions")
    set_ = actions.add_parser("set", help="write one value")
    set_.add_argument("key", help="dotted key, e.g. acp.max_sessions")
    set_.add_argument("value", help="a TOML value (20, true, [\"a\"]) or a plain string")
    list_ = actions.add_parser("list", help="print every key = value")
    list_.add_argument("--json", action="store_true", help="print one JSON object")
    return parser


def _exit_code(code: object) -> int:
    if code is None:
        return 0
    return code if isinstance(code, int) else 2


def _get(config_path: Path, key: str, *, as_json: bool) -> None:
    segments = parse_key(key)
    value: Any = _load(config_path)
    for segment in segments:
        if not isinstance(value, Mapping) or segment not in value:
            raise ConfigCommandError(f"key not found: {_join_key(segments)} (in {config_path})")
        value = value[segment]
    if as_json:
        print(_to_json(value))
    elif isinstance(value, Mapping):
        for leaf_key, leaf_value in _leaves(value, segments):
            print(f"{_join_key(leaf_key)} = {format_value(leaf_value)}")
    elif isinstance(value, str):
        print(str(value))
    else:
        print(format_value(value))


def _set(config_path: Path, key: str, raw_value: str) -> None:
    segments = parse_key(key)
    if len(segments) < 2:
        raise ConfigCommandError(f"key must be section.key, got {key!r}", exit_code=2)
    document = _load(config_path)
    parent, created = _parent_table(document, segments)
    leaf = segments[-1]
    if isinstance(parent.get(leaf), Mapping):
        raise ConfigCommandError(f"{_join_key(segments)} is a table; set its keys one by one")
    parent[leaf] = parse_value(raw_value)
    if created and isinstance(parent, Table):
        parent.add(tomlkit.nl())  # a blank line before whatever section follows
    _check(config_path, document)
    _save(config_path, document)


def _check(config_path: Path, document: tomlkit.TOMLDocument) -> None:
    """Refuse an edit that would stop ``zeroclaw acp`` from starting (exit 2)."""
    config_dir = config_path.parent
    try:
        settings_from_document(document.unwrap(), config_dir, config_dir / "data", {})
    except ConfigError as error:
        raise ConfigCommandError(f"not saved: {error}", exit_code=2) from None


def _parent_table(document: tomlkit.TOMLDocument, segments: list[str]) -> tuple[Any, bool]:
    """The table that holds the last segment, creating missing tables; and whether it is new."""
    parent: Any = document
    created = False
    for depth, segment in enumerate(segments[:-1]):
        created = segment not in parent
        if created:
            if depth == 0:
                _separate_new_section(document)
            parent[segment] = _new_table(parent, is_leaf_parent=depth == len(segments) - 2)
        parent = parent[segment]
        if not isinstance(parent, Mapping):
            shown = _join_key(segments[: depth + 1])
            raise ConfigCommandError(f"{shown} is a value, not a table")
    return parent, created


def _separate_new_section(document: tomlkit.TOMLDocument) -> None:
    """Leave one blank line between existing content and a section about to be added."""
    text = document.as_string()
    if not text:
        return
    trailing_newlines = len(text) - len(text.rstrip("\n"))
    for _ in range(2 - min(trailing_newlines, 2)):
        document.add(tomlkit.nl())


def _new_table(parent: Any, *, is_leaf_parent: bool) -> Table | InlineTable:
    """An empty table to create inside ``parent``: inline inside inline tables."""
    if isinstance(parent, InlineTable):
        return tomlkit.inline_table()
    return tomlkit.table(is_super_table=not is_leaf_parent)


def _list(config_path: Path, *, as_json: bool) -> None:
    document = _load(config_path)
    if as_json:
        print(_to_json(document))
        return
    for leaf_key, leaf_value in _leaves(document, []):
        print(f"{_join_key(leaf_key)} = {format_value(leaf_value)}")


def _load(config_path: Path) -> tomlkit.TOMLDocument:
    try:
        text = config_path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return tomlkit.document()
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigCommandError(f"cannot read {config_path}: {error}") from error
    try:
        return tomlkit.parse(text)
    except TOMLKitError as error:
        raise ConfigCommandError(f"{config_path} is not valid TOML: {error}") from error


def _save(config_path: Path, document: tomlkit.TOMLDocument) -> None:
    """Write atomically: temp file beside the target, fsync, rename (symlinks are followed)."""
    target = config_path.resolve() if config_path.is_symlink() else config_path
    try:
        target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        mode = target.stat().st_mode & 0o7777 if target.exists() else 0o600
        descriptor, temp_name = tempfile.mkstemp(prefix=".config.", dir=target.parent)
    except OSError as error:
        raise ConfigCommandError(f"cannot write {config_path}: {error}") from error
    try:
        with os.fdopen(descriptor, "w", encoding="utf-8") as temp_file:
            text = tomlkit.dumps(document).rstrip("\n")
            temp_file.write(text + "\n" if text else "")
            temp_file.flush()
            os.fsync(temp_file.fileno())
        os.chmod(temp_name, mode)
        os.replace(temp_name, target)
    except OSError as error:
        Path(temp_name).unlink(missing_ok=True)
        raise ConfigCommandError(f"cannot write {config_path}: {error}") from error


def _leaves(table: Mapping[str, Any], prefix: list[str]) -> Iterator[tuple[list[str], Any]]:
    for key, value in table.items():
        if isinstance(value, Mapping):
            yield from _leaves(value, [*prefix, key])
        else:
            yield [*prefix, key], value


def _join_key(segments: list[str]) -> str:
    return ".".join(s if _BARE_KEY.fullmatch(s) else json.dumps(s) for s in segments)


def _to_inline(value: Any) -> Any:
    """Plain Python data with every mapping turned into an inline table."""
    if isinstance(value, Item):
        value = value.unwrap()
    if isinstance(value, Mapping):
        inline = tomlkit.inline_table()
        for key, sub_value in value.items():
            inline[key] = _to_inline(sub_value)
        return inline
    if isinstance(value, list):
        array = tomlkit.array()
        array.extend(_to_inline(element) for element in value)
        return array
    return value


def _to_json(value: Any) -> str:
    plain = value.unwrap() if isinstance(value, Item | tomlkit.TOMLDocument) else value
    return json.dumps(plain, default=_json_default, ensure_ascii=False)


def _json_default(value: object) -> str:
    if isinstance(value, datetime | date | time):
        return value.isoformat()
    raise TypeError(f"cannot encode {type(value).__name__} as JSON")
