"""Path confinement for tools: the session cwd plus the agent's workspace, minus forbidden paths.

Every path a tool touches is made absolute (relative paths are taken from the
session cwd), ``~`` is expanded, and symlinks are resolved before it is checked,
so a link inside the workspace that points at ``/etc`` is judged as ``/etc``.

Pure functions over the filesystem: safe from any thread (a session actor's
thread runs them, once per tool call).
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

__all__ = ["PathDenied", "PathPolicy", "canonical"]


class PathDenied(Exception):
    """A path outside the allowed roots or inside a forbidden one; the message says which."""


def canonical(path: str | Path, base: Path | None = None) -> Path:
    """``path`` with ``~`` expanded, made absolute against ``base`` and symlinks resolved.

    Parts that do not exist yet (a file about to be written) are kept as given.
    """
    expanded = Path(os.path.expanduser(str(path)))
    if not expanded.is_absolute():
        expanded = (base or Path.cwd()) / expanded
    return Path(os.path.realpath(expanded))


def _within(path: Path, root: Path) -> bool:
    return path == root or path.is_relative_to(root)


@dataclass(frozen=True, slots=True)
class PathPolicy:
    """Where a session's tools may read and write.

    ``cwd`` is where relative paths start; ``roots`` are the canonical directories
    a file tool may touch; ``forbidden`` wins over ``roots``.
    """

    cwd: Path
    roots: tuple[Path, ...]
    forbidden: tuple[Path, ...]

    @classmethod
    def build(cls, cwd: str, workspace_dir: str, forbidden_paths: Iterable[str]) -> PathPolicy:
        """Canonicalise everything once, when the session opens."""
        cwd_path = canonical(cwd)
        roots = tuple(dict.fromkeys((cwd_path, canonical(workspace_dir))))
        forbidden = tuple(canonical(p) for p in forbidden_paths if str(p).strip())
        return cls(cwd=cwd_path, roots=roots, forbidden=forbidden)

    def resolve(self, path: str) -> Path:
        """The canonical form of ``path`` if a file tool may use it, else :class:`PathDenied`."""
        if not isinstance(path, str) or not path.strip():
            raise PathDenied("path must be a non-empty string")
        if "\x00" in path:
            raise PathDenied("path contains a NUL byte")
        resolved = canonical(path, self.cwd)
        self._check_forbidden(path, resolved)
        if not any(_within(resolved, root) for root in self.roots):
            allowed = ", ".join(str(r) for r in self.roots)
            raise PathDenied(
                f"path {path!r} resolves to {resolved}, outside the allowed directories ({allowed})"
            )
        return resolved

    def check_command(self, command: str) -> None:
        """Refuse a shell command that names a forbidden path in one of its words.

        This is a guard against the obvious (``cat ~/.ssh/id_rsa``), not a sandbox:
        the shell runs with the user's rights.
        """
        try:
            words = shlex.split(command, comments=False)
        except ValueError:
            words = command.split()
        for word in words:
            for piece in word.split("="):
                if piece.startswith(("/", "~", ".")) or "/" in piece:
                    self._check_forbidden(piece, canonical(piece, self.cwd))

    def _check_forbidden(self, given: str, resolved: Path) -> None:
        for forbidden in self.forbidden:
            if _within(resolved, forbidden):
                raise PathDenied(f"path {given!r} is forbidden (inside {forbidden})")
