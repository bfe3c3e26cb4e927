"""The ``file_read`` and ``file_write`` tools, confined by the session's :class:`PathPolicy`.

Run on the session actor's thread. Both open their file through
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
from pathlib import Path
from typing import Any, ClassVar

from actors.tools.base import Tool, ToolEnv, ToolError, ToolResult, require_str
from actors.tools.paths import OpenedParent, PathDenied, changed_to_symlink, is_symlink_at

__all__ = ["FileReadTool", "FileWriteTool"]

_READ_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC
_TEMP_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def _path_title(verb: str, args: dict[str, Any]) -> str:
    path = args.get("path")
    return f"{verb} {path}" if isinstance(path, str) else verb


class FileReadTool(Tool):
    """Read a text file; argument ``path``. Large files are cut at ``max_bytes``."""

    name: ClassVar[str] = "file_read"
    kind: ClassVar[str] = "read"
    mutating: ClassVar[bool] = False

    def __init__(self, *, max_bytes: int = 1024 * 1024) -> None:
        self.max_bytes = max_bytes

    def title(self, args: dict[str, Any]) -> str:
        return _path_title("Read", args)

    def run(self, args: dict[str, Any], env: ToolEnv) -> ToolResult:
        given = require_str(args, "path")
        path = Path(given)
        try:
            with env.paths.open_parent(given) as parent:
                path = parent.path
                data = _read_regular_file(parent, given, self.max_bytes + 1)
        except PathDenied as exc:
            raise ToolError(str(exc)) from None
        except FileNotFoundError:
            raise ToolError(f"no such file: {path}") from None
        except IsADirectoryError:
            raise ToolError(f"is a directory, not a file: {path}") from None
        except OSError as exc:
            raise ToolError(f"cannot read {path}: {exc.strerror or exc}") from None
        truncated = len(data) > self.max_bytes
        text = data[: self.max_bytes].decode("utf-8", errors="replace")
        raw = {"path": str(path), "content": text, "truncated": truncated}
        if truncated:
            text += f"\n[file truncated at {self.max_bytes} bytes]"
        return ToolResult(text=text, raw_output=raw)


class FileWriteTool(Tool):
    """Create or replace a file; arguments ``path`` and ``content`` (text)."""

    name: ClassVar[str] = "file_write"
    kind: ClassVar[str] = "edit"
    mutating: ClassVar[bool] = True

    def title(self, args: dict[str, Any]) -> str:
        return _path_title("Write", args)

    def run(self, args: dict[str, Any], env: ToolEnv) -> ToolResult:
        given = require_str(args, "path")
        data = require_str(args, "content", allow_empty=True).encode("utf-8")
        path = Path(given)
        try:
            with env.paths.open_parent(given, create=True) as parent:
                path = parent.path
                _write_atomically(parent, data)
        except PathDenied as exc:
            raise ToolError(str(exc)) from None
        except IsADirectoryError:
            raise ToolError(f"is a directory, not a file: {path}") from None
        except OSError as exc:
            raise ToolError(f"cannot write {path}: {exc.strerror or exc}") from None
        raw = {"path": str(path), "bytes": len(data)}
        return ToolResult(text=f"wrote {len(data)} bytes to {path}", raw_output=raw)


def _read_regular_file(parent: OpenedParent, given: str, limit: int) -> bytes:
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


def _write_atomically(parent: OpenedParent, data: bytes) -> None:
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
