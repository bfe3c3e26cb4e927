"""The ``file_list`` (glob) and ``search`` (regex) tools, over a confined tree.

Run on the session actor's thread. Both walk with :class:`actors.worker.tools.tree.Walk`:
never through a symbolic link, skipping ``.git``, forbidden paths and what
``.gitignore`` excludes; both stop at a bounded number of results and say so.
"""

from __future__ import annotations

import contextlib
import re
from typing import Any, ClassVar

from actors.worker.tools.base import (
    Tool,
    ToolEnv,
    ToolError,
    ToolResult,
    optional_int,
    path_location,
)
from actors.worker.tools.paths import PathDenied, PathPolicy
from actors.worker.tools.tree import Walk, WalkEntry, glob_regex, read_confined_file
from ipc.events import ToolLocation

__all__ = ["FileListTool", "SearchTool"]

_BINARY_SNIFF = 8192
_MAX_LINE_CHARS = 300
_MAX_LOCATIONS = 50


def _optional_str(args: dict[str, Any], key: str, default: str) -> str:
    value = args.get(key, default)
    if value is None:
        return default
    if not isinstance(value, str):
        raise ToolError(f"argument {key!r} must be a string")
    return value or default


def _relative_pattern(pattern: str, key: str) -> str:
    if pattern.startswith(("/", "~")) or ".." in pattern.split("/"):
        raise ToolError(f"argument {key!r} must be relative to 'path' (no '/', '~' or '..')")
    return pattern.removeprefix("./")


class FileListTool(Tool):
    """List files and directories matching a glob; arguments ``pattern`` (default
    ``**/*``), ``path`` (where to start, default the working directory) and ``limit``."""

    name: ClassVar[str] = "file_list"
    kind: ClassVar[str] = "search"
    mutating: ClassVar[bool] = False

    def __init__(self, *, default_limit: int = 500, max_limit: int = 5000) -> None:
        self.default_limit = default_limit
        self.max_limit = max_limit

    def title(self, args: dict[str, Any]) -> str:
        pattern = args.get("pattern")
        return f"List {pattern}" if isinstance(pattern, str) else "List files"

    def locations(self, args: dict[str, Any], paths: PathPolicy) -> tuple[ToolLocation, ...]:
        return path_location({"path": args.get("path") or "."}, paths)

    def run(self, args: dict[str, Any], env: ToolEnv) -> ToolResult:
        pattern = _relative_pattern(_optional_str(args, "pattern", "**/*"), "pattern")
        limit = optional_int(args, "limit", minimum=1, default=self.default_limit,
                             maximum=self.max_limit)
        assert limit is not None
        matcher = glob_regex(pattern)
        walk = Walk(env.paths, _optional_str(args, "path", "."), env.cancelled)
        found: list[str] = []
        more = False
        with contextlib.closing(walk.entries()) as entries:  # closes its directories
            for entry in entries:
                if matcher.match(entry.rel):
                    if len(found) == limit:
                        more = True
                        break
                    found.append(f"{entry.rel}/" if entry.is_dir else entry.rel)
        truncated = more or walk.exhausted
        raw = {"path": walk.base, "pattern": pattern, "files": found, "truncated": truncated}
        text = "\n".join(found) if found else f"no match for {pattern} under {walk.base}"
        if truncated:
            text += f"\n[stopped after {len(found)} entries; narrow the pattern or path]"
        return ToolResult(text=text, raw_output=raw)


class SearchTool(Tool):
    """Search file contents with a regular expression (Python ``re`` syntax, one line at
    a time); arguments ``pattern``, ``path``, ``glob`` (a file filter such as
    ``*.py``), ``ignore_case`` and ``limit``. Binary files are skipped."""

    name: ClassVar[str] = "search"
    kind: ClassVar[str] = "search"
    mutating: ClassVar[bool] = False

    def __init__(self, *, default_limit: int = 100, max_limit: int = 1000,
                 max_file_bytes: int = 4 * 1024 * 1024) -> None:
        self.default_limit = default_limit
        self.max_limit = max_limit
        self.max_file_bytes = max_file_bytes

    def title(self, args: dict[str, Any]) -> str:
        pattern = args.get("pattern")
        return f"Search {pattern}" if isinstance(pattern, str) else "Search"

    def locations(self, args: dict[str, Any], paths: PathPolicy) -> tuple[ToolLocation, ...]:
        return path_location({"path": args.get("path") or "."}, paths)

    def run(self, args: dict[str, Any], env: ToolEnv) -> ToolResult:
        regex = self._regex(args)
        files = self._file_filter(args)
        limit = optional_int(args, "limit", minimum=1, default=self.default_limit,
                             maximum=self.max_limit)
        assert limit is not None
        walk = Walk(env.paths, _optional_str(args, "path", "."), env.cancelled)
        matches: list[dict[str, Any]] = []
        searched = 0
        with contextlib.closing(walk.entries()) as entries:  # closes its directories
            for entry in entries:
                if entry.is_dir or entry.size > self.max_file_bytes:
                    continue
                if files is not None and not files(entry.rel):
                    continue
                searched += 1
                if _search_file(entry, regex, matches, limit + 1, walk.forbidden):
                    break
        truncated = len(matches) > limit or walk.exhausted
        return _search_result(walk.base, matches[:limit], truncated, searched)

    @staticmethod
    def _regex(args: dict[str, Any]) -> re.Pattern[str]:
        pattern = args.get("pattern")
        if not isinstance(pattern, str) or not pattern:
            raise ToolError("argument 'pattern' is required and must be a non-empty string")
        ignore_case = args.get("ignore_case", False)
        if not isinstance(ignore_case, bool):
            raise ToolError("argument 'ignore_case' must be true or false")
        try:
            return re.compile(pattern, re.IGNORECASE if ignore_case else 0)
        except re.error as exc:
            message = f"argument 'pattern' is not a valid regular expression: {exc}"
            raise ToolError(message) from None

    @staticmethod
    def _file_filter(args: dict[str, Any]) -> Any:
        """A test on a relative path: a glob without ``/`` matches the file name."""
        glob = args.get("glob")
        if glob is None or glob == "":
            return None
        if not isinstance(glob, str):
            raise ToolError("argument 'glob' must be a string")
        regex = glob_regex(_relative_pattern(glob, "glob"))
        if "/" in glob:
            return lambda rel: regex.match(rel) is not None
        return lambda rel: regex.match(rel.rsplit("/", 1)[-1]) is not None


def _search_file(entry: WalkEntry, regex: re.Pattern[str], matches: list[dict[str, Any]],
                 wanted: int, forbidden: frozenset[tuple[int, int]]) -> bool:
    """Add the file's matching lines to ``matches``; True once there are ``wanted``."""
    try:
        data = read_confined_file(entry.dir_fd, entry.name, entry.size + 1, forbidden)
    except (OSError, ToolError, PathDenied):
        return False  # replaced, removed or unreadable since it was listed
    if b"\0" in data[:_BINARY_SNIFF]:
        return False
    text = data.decode("utf-8", errors="replace")
    for number, line in enumerate(text.splitlines(), start=1):
        if regex.search(line):
            matches.append({"path": entry.rel, "line": number,
                            "text": line[:_MAX_LINE_CHARS]})
            if len(matches) >= wanted:
                return True
    return False


def _search_result(base: str, matches: list[dict[str, Any]], truncated: bool,
                   searched: int) -> ToolResult:
    lines = [f"{m['path']}:{m['line']}: {m['text']}" for m in matches]
    text = "\n".join(lines) if lines else f"no match in {searched} file(s) under {base}"
    if truncated:
        text += f"\n[stopped after {len(matches)} matches; narrow the pattern, path or glob]"
    raw = {"path": base, "matches": matches, "truncated": truncated, "files_searched": searched}
    locations = tuple(ToolLocation(f"{base}/{m['path']}", m["line"])
                      for m in matches[:_MAX_LOCATIONS])
    return ToolResult(text=text, raw_output=raw, locations=locations)
