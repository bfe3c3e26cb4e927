"""The ``file_read``, ``file_write`` and ``file_edit`` tools, confined by the session's
:class:`PathPolicy`.

Run on the session actor's thread. Each opens its file through
:meth:`PathPolicy.open_parent`, relative to a directory descriptor held beneath
the root and never through a symlink, so a path swapped after its check cannot
escape the roots. Writes are atomic (a temporary file created in that same
opened directory, then ``os.replace`` between the two names under it), so a
reader never sees half a file.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

from actors.worker.tools.base import (
    Tool,
    ToolEnv,
    ToolError,
    ToolResult,
    optional_int,
    path_location,
    require_str,
)
from actors.worker.tools.paths import (
    OpenedParent,
    PathDenied,
    PathPolicy,
    changed_to_symlink,
    is_symlink_at,
)
from ipc.events import DiffContent, ToolContent, ToolLocation

__all__ = [
    "FileEditTool",
    "FileReadTool",
    "FileWriteTool",
    "opened_for_tool",
    "read_regular_file",
    "write_atomically",
]

_READ_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC
_MAX_PREVIEW_BYTES = 2 * 1024 * 1024
_TEMP_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


@contextlib.contextmanager
def opened_for_tool(paths: PathPolicy, given: str, verb: str, *, create: bool = False,
                    missing: str = "") -> Iterator[OpenedParent]:
    """:meth:`PathPolicy.open_parent`, with every failure (of the opening or of the body)
    turned into a :class:`ToolError` that names the path; ``verb`` says what was being
    done (``cannot <verb> <path>``), ``missing`` is added to "no such file"."""
    path = Path(given)
    try:
        with paths.open_parent(given, create=create) as parent:
            path = parent.path
            yield parent
    except PathDenied as exc:
        raise ToolError(str(exc)) from None
    except FileNotFoundError:
        raise ToolError(f"no such file: {path}{missing}") from None
    except IsADirectoryError:
        raise ToolError(f"is a directory, not a file: {path}") from None
    except OSError as exc:
        raise ToolError(f"cannot {verb} {path}: {exc.strerror or exc}") from None


def _path_title(verb: str, args: dict[str, Any]) -> str:
    path = args.get("path")
    return f"{verb} {path}" if isinstance(path, str) else verb


class FileReadTool(Tool):
    """Read a text file; argument ``path``. Large files are cut at ``max_bytes``.

    ``offset`` (the first line, counted from 1) and ``limit`` (how many lines)
    read a range of lines; without them the whole file is read.
    """

    name: ClassVar[str] = "file_read"
    kind: ClassVar[str] = "read"
    mutating: ClassVar[bool] = False

    def __init__(self, *, max_bytes: int = 1024 * 1024) -> None:
        self.max_bytes = max_bytes

    def title(self, args: dict[str, Any]) -> str:
        return _path_title("Read", args)

    def locations(self, args: dict[str, Any], paths: PathPolicy) -> tuple[ToolLocation, ...]:
        offset = args.get("offset")
        return path_location(args, paths, line=offset if isinstance(offset, int) else None)

    def run(self, args: dict[str, Any], env: ToolEnv) -> ToolResult:
        given = require_str(args, "path")
        offset = optional_int(args, "offset", minimum=1, default=None)
        limit = optional_int(args, "limit", minimum=1, default=None)
        with opened_for_tool(env.paths, given, "read") as parent:
            path = parent.path
            data = read_regular_file(parent, given, self.max_bytes + 1)
        truncated = len(data) > self.max_bytes
        text = data[: self.max_bytes].decode("utf-8", errors="replace")
        if offset is not None or limit is not None:
            return _line_range(path, text, offset or 1, limit, truncated)
        raw = {"path": str(path), "content": text, "truncated": truncated}
        if truncated:
            text += f"\n[file truncated at {self.max_bytes} bytes]"
        return ToolResult(text=text, raw_output=raw)


def _line_range(path: Path, text: str, offset: int, limit: int | None,
                truncated: bool) -> ToolResult:
    """Lines ``offset`` .. ``offset + limit - 1`` of ``text`` (1-based, ends kept)."""
    lines = text.splitlines(keepends=True)
    if offset > max(len(lines), 1):
        raise ToolError(f"offset {offset} is past the end of {path} ({len(lines)} lines)")
    chosen = lines[offset - 1: None if limit is None else offset - 1 + limit]
    content = "".join(chosen)
    last = offset + len(chosen) - 1
    raw = {"path": str(path), "content": content, "offset": offset, "lines": len(chosen),
           "total_lines": len(lines), "truncated": truncated}
    note = f"[lines {offset}-{last} of {len(lines)}{'+' if truncated else ''}]"
    body = content if content.endswith("\n") or not content else content + "\n"
    return ToolResult(text=body + note, raw_output=raw,
                      locations=(ToolLocation(str(path), offset),))


class FileWriteTool(Tool):
    """Create or replace a file; arguments ``path`` and ``content`` (text)."""

    name: ClassVar[str] = "file_write"
    kind: ClassVar[str] = "edit"
    mutating: ClassVar[bool] = True

    def title(self, args: dict[str, Any]) -> str:
        return _path_title("Write", args)

    def locations(self, args: dict[str, Any], paths: PathPolicy) -> tuple[ToolLocation, ...]:
        return path_location(args, paths)

    def preview(self, args: dict[str, Any], paths: PathPolicy) -> tuple[ToolContent, ...]:
        """The file's current text (None for a new file) against the new content."""
        try:
            given = require_str(args, "path")
            content = require_str(args, "content", allow_empty=True)
            if len(content) > _MAX_PREVIEW_BYTES:
                return ()
            try:
                with paths.open_parent(given) as parent:
                    path, before = parent.path, _current_text(parent, given)
            except FileNotFoundError:  # a directory still to be made
                path, before = paths.resolve(given), None
            return (DiffContent(str(path), before, content),)
        except (ToolError, PathDenied, OSError, UnicodeDecodeError):
            return ()

    def run(self, args: dict[str, Any], env: ToolEnv) -> ToolResult:
        given = require_str(args, "path")
        data = require_str(args, "content", allow_empty=True).encode("utf-8")
        with opened_for_tool(env.paths, given, "write", create=True) as parent:
            path = parent.path
            write_atomically(parent, data)
        raw = {"path": str(path), "bytes": len(data)}
        return ToolResult(text=f"wrote {len(data)} bytes to {path}", raw_output=raw)


class FileEditTool(Tool):
    """Replace an exact string in a text file: ``path``, ``old_string``, ``new_string``,
    optional ``replace_all``. ``old_string`` must occur exactly once unless
    ``replace_all`` is true. The result carries the change as a diff."""

    name: ClassVar[str] = "file_edit"
    kind: ClassVar[str] = "edit"
    mutating: ClassVar[bool] = True

    def __init__(self, *, max_bytes: int = 2 * 1024 * 1024) -> None:
        self.max_bytes = max_bytes

    def title(self, args: dict[str, Any]) -> str:
        return _path_title("Edit", args)

    def locations(self, args: dict[str, Any], paths: PathPolicy) -> tuple[ToolLocation, ...]:
        return path_location(args, paths)

    def preview(self, args: dict[str, Any], paths: PathPolicy) -> tuple[ToolContent, ...]:
        try:
            given, old, new, replace_all = _edit_arguments(args)
            with paths.open_parent(given) as parent:
                before = self._read_text(parent, given)
                after, _ = _replace(parent.path, before, old, new, replace_all)
                return (DiffContent(str(parent.path), before, after),)
        except (ToolError, PathDenied, OSError):
            return ()

    def run(self, args: dict[str, Any], env: ToolEnv) -> ToolResult:
        given, old, new, replace_all = _edit_arguments(args)
        with opened_for_tool(env.paths, given, "edit",
                             missing=" (file_write creates files)") as parent:
            path = parent.path
            before = self._read_text(parent, given)
            after, count = _replace(path, before, old, new, replace_all)
            write_atomically(parent, after.encode("utf-8"))
        line = before[: before.index(old)].count("\n") + 1
        raw = {"path": str(path), "replacements": count, "line": line}
        return ToolResult(
            text=f"edited {path}: {count} replacement{'s' if count > 1 else ''} (line {line})",
            raw_output=raw, content=(DiffContent(str(path), before, after),),
            locations=(ToolLocation(str(path), line),),
        )

    def _read_text(self, parent: OpenedParent, given: str) -> str:
        data = read_regular_file(parent, given, self.max_bytes + 1)
        if len(data) > self.max_bytes:
            raise ToolError(f"{parent.path} is larger than {self.max_bytes} bytes; "
                            "file_edit does not change files that large")
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            raise ToolError(f"{parent.path} is not UTF-8 text") from None


def _edit_arguments(args: dict[str, Any]) -> tuple[str, str, str, bool]:
    """``path``, ``old_string``, ``new_string`` and ``replace_all``, checked."""
    given = require_str(args, "path")
    old = require_str(args, "old_string")
    new = require_str(args, "new_string", allow_empty=True)
    replace_all = args.get("replace_all", False)
    if not isinstance(replace_all, bool):
        raise ToolError("argument 'replace_all' must be true or false")
    if old == new:
        raise ToolError("old_string and new_string are the same: nothing to change")
    return given, old, new, replace_all


def _replace(path: Path, text: str, old: str, new: str, replace_all: bool) -> tuple[str, int]:
    """``text`` with ``old`` replaced, and how many times; a clear error when ``old`` is
    absent, or ambiguous without ``replace_all``."""
    count = text.count(old)
    if count == 0:
        raise ToolError(f"old_string was not found in {path}; read the file and copy "
                        "the text exactly, whitespace included")
    if count > 1 and not replace_all:
        raise ToolError(f"old_string occurs {count} times in {path}; add surrounding "
                        "lines to make it unique, or set replace_all to change every one")
    return text.replace(old, new, -1 if replace_all else 1), count


def _current_text(parent: OpenedParent, given: str) -> str | None:
    """The file's text, None when it does not exist; ToolError when too large to show."""
    try:
        data = read_regular_file(parent, given, _MAX_PREVIEW_BYTES + 1)
    except FileNotFoundError:
        return None
    if len(data) > _MAX_PREVIEW_BYTES:
        raise ToolError("too large to preview")
    return data.decode("utf-8")


def read_regular_file(parent: OpenedParent, given: str, limit: int) -> bytes:
    """Up to ``limit`` bytes of a regular file; a FIFO or device could block the turn forever."""
    try:
        fd = os.open(parent.name, _READ_FLAGS, dir_fd=parent.fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP and is_symlink_at(parent.fd, parent.name):
            raise changed_to_symlink(given, parent.name) from None
        raise
    try:
        st = os.fstat(fd)
        parent.check_not_forbidden(st)
        if stat.S_ISDIR(st.st_mode):
            raise IsADirectoryError(parent.path)
        if not stat.S_ISREG(st.st_mode):
            raise ToolError(f"not a regular file: {parent.path}")
        with os.fdopen(fd, "rb", closefd=False) as handle:
            return handle.read(limit)
    finally:
        os.close(fd)


def _existing_mode(parent: OpenedParent) -> int:
    """The mode to keep: the current file's, or 0644 for a new one (a link is not followed)."""
    try:
        st = os.stat(parent.name, dir_fd=parent.fd, follow_symlinks=False)
    except FileNotFoundError:
        return 0o644
    if stat.S_ISDIR(st.st_mode):
        raise IsADirectoryError(parent.path)
    parent.check_not_forbidden(st)
    return stat.S_IMODE(st.st_mode) if stat.S_ISREG(st.st_mode) else 0o644


def write_atomically(parent: OpenedParent, data: bytes) -> None:
    mode = _existing_mode(parent)
    tmp_name, fd = _create_temp(parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fchmod(handle.fileno(), mode)
            os.fsync(handle.fileno())
        os.replace(tmp_name, parent.name, src_dir_fd=parent.fd, dst_dir_fd=parent.fd)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp_name, dir_fd=parent.fd)
        raise


def _create_temp(parent: OpenedParent) -> tuple[str, int]:
    """A new, empty temporary file beside the target, in the already opened directory."""
    prefix = f".{parent.name}." if parent.name != "." else "."
    for _ in range(100):
        name = f"{prefix}{secrets.token_hex(6)}.tmp"
        try:
            return name, os.open(name, _TEMP_FLAGS, 0o600, dir_fd=parent.fd)
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temporary name in {parent.path.parent}")
