"""The ``file_read`` and ``file_write`` tools, confined by the session's :class:`PathPolicy`.

Run on the session actor's thread. Writes are atomic (a temporary file in the
same directory, then ``os.replace``), so a reader never sees half a file.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from pathlib import Path
from typing import Any, ClassVar

from actors.tools.base import Tool, ToolEnv, ToolError, ToolResult, require_str
from actors.tools.paths import PathDenied

__all__ = ["FileReadTool", "FileWriteTool"]


def _confined(args: dict[str, Any], env: ToolEnv) -> Path:
    try:
        return env.paths.resolve(require_str(args, "path"))
    except PathDenied as exc:
        raise ToolError(str(exc)) from None


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
        path = _confined(args, env)
        try:
            data = _read_regular_file(path, self.max_bytes + 1)
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
        path = _confined(args, env)
        data = require_str(args, "content", allow_empty=True).encode("utf-8")
        if path.is_dir():
            raise ToolError(f"is a directory, not a file: {path}")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            _write_atomically(path, data)
        except OSError as exc:
            raise ToolError(f"cannot write {path}: {exc.strerror or exc}") from None
        raw = {"path": str(path), "bytes": len(data)}
        return ToolResult(text=f"wrote {len(data)} bytes to {path}", raw_output=raw)


def _read_regular_file(path: Path, limit: int) -> bytes:
    """Up to ``limit`` bytes of a regular file; a FIFO or device could block the turn forever."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(path)
        if not stat.S_ISREG(mode):
            raise ToolError(f"not a regular file: {path}")
        with os.fdopen(fd, "rb", closefd=False) as handle:
            return handle.read(limit)
    finally:
        os.close(fd)


def _write_atomically(path: Path, data: bytes) -> None:
    try:
        mode = stat.S_IMODE(path.stat().st_mode)
    except FileNotFoundError:
        mode = 0o644
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp_name, mode)
        os.replace(tmp_name, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp_name)
        raise
