"""The ``deliver_file`` tool: hand a workspace file to the client as an attachment.

Runs on the session actor's thread. The file is read through
:meth:`PathPolicy.open_parent` (same confinement as ``file_read``), at most
10 MiB, and stored under the session's ``uploads/`` by its content hash (an
atomic write into the opened directory, like ``file_write``). The stored copy is
then read back and hashed again, and only bytes whose hash still matches are
embedded: a file swapped between the check and the delivery is refused, never
trusted. The client gets an ACP embedded resource with the opaque uri
``attachment://deliver/<sha256>.<ext>``; the result text stays short (no base64).
"""

from __future__ import annotations

import base64
import hashlib
import mimetypes
from pathlib import Path
from typing import Any, ClassVar

from actors.worker.tools.base import (
    Tool,
    ToolEnv,
    ToolError,
    ToolResult,
    path_location,
    require_str,
)
from actors.worker.tools.files import opened_for_tool, read_regular_file, write_atomically
from actors.worker.tools.paths import PathDenied, PathPolicy
from ipc.acp import MAX_BLOB_BYTES, Blob
from ipc.events import ResourceContent, ToolLocation

__all__ = ["DELIVER_URI_PREFIX", "DeliverFileTool"]

DELIVER_URI_PREFIX = "attachment://deliver/"


def _optional_text(args: dict[str, Any], *keys: str) -> str | None:
    for key in keys:
        value = args.get(key)
        if value is None:
            continue
        if not isinstance(value, str):
            raise ToolError(f"argument {key!r} must be a string")
        return value.strip() or None
    return None


class DeliverFileTool(Tool):
    """Deliver a file to the client; arguments ``path``, optional ``mimeType`` and
    ``title`` (the label the client shows; the file name by default)."""

    name: ClassVar[str] = "deliver_file"
    kind: ClassVar[str] = "read"
    mutating: ClassVar[bool] = False

    def title(self, args: dict[str, Any]) -> str:
        label = args.get("title") or args.get("path")
        return f"Deliver {label}" if isinstance(label, str) else "Deliver a file"

    def locations(self, args: dict[str, Any], paths: PathPolicy) -> tuple[ToolLocation, ...]:
        return path_location(args, paths)

    def run(self, args: dict[str, Any], env: ToolEnv) -> ToolResult:
        given = require_str(args, "path")
        mime = _optional_text(args, "mimeType", "mime_type")
        label = _optional_text(args, "title")
        path, data = _read(env.paths, given)
        mime = mime or mimetypes.guess_type(path.name)[0] or "application/octet-stream"
        stored_name = Blob(0, path.as_uri(), mime, data).file_name  # <sha256 hex>.<ext>
        copy = _store_and_reread(env.paths, stored_name, data)
        if hashlib.sha256(copy).hexdigest() != stored_name.split(".", 1)[0]:
            raise ToolError(f"the stored copy of {path} changed before it was delivered; "
                            "not delivered")
        uri = DELIVER_URI_PREFIX + stored_name
        label = label or path.name
        raw = {"uri": uri, "mimeType": mime, "bytes": len(copy), "title": label,
               "path": str(path)}
        return ToolResult(
            text=f"delivered {label} ({len(copy)} bytes, {mime}) as {uri}",
            raw_output=raw, title=label,
            content=(ResourceContent(uri, mime, base64.b64encode(copy).decode("ascii")),),
        )


def _read(paths: PathPolicy, given: str) -> tuple[Path, bytes]:
    with opened_for_tool(paths, given, "read") as parent:
        path = parent.path
        data = read_regular_file(parent, given, MAX_BLOB_BYTES + 1)
    if len(data) > MAX_BLOB_BYTES:
        raise ToolError(f"{path} is larger than 10 MiB; it cannot be delivered")
    return path, data


def _store_and_reread(paths: PathPolicy, stored_name: str, data: bytes) -> bytes:
    """Write ``uploads/<stored_name>`` under the session cwd, then read it back."""
    target = str(paths.cwd / "uploads" / stored_name)
    try:
        with paths.open_parent(target, create=True) as stored:
            write_atomically(stored, data)
            return read_regular_file(stored, target, MAX_BLOB_BYTES + 1)
    except PathDenied as exc:
        raise ToolError(str(exc)) from None
    except OSError as exc:
        raise ToolError(f"cannot store the delivered file: {exc.strerror or exc}") from None
