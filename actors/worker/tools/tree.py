"""Walking a confined directory tree, for ``file_list`` and ``search``.

Runs on the session actor's thread (inside a tool call). The walk starts from a
directory opened through :meth:`PathPolicy.open_parent` and goes down one
directory descriptor at a time with ``O_NOFOLLOW``: symbolic links are neither
followed nor reported, so nothing outside the roots is reached through one,
even if a link is swapped in while the walk runs. Forbidden files and
directories (by device and inode) are skipped, and so is every ``.git``
directory.

``.gitignore`` files are honoured the way git reads them, through ``pathspec``'s
``GitIgnoreSpec``: each directory's file applies to what is beneath it, a deeper
file's rules (``!negations`` included) win over a shallower one's, and an
ignored directory is not entered. ``.git/info/exclude`` and the user's global
excludes file are not read.
"""

from __future__ import annotations

import errno
import os
import re
import stat
import threading
from collections.abc import Generator, Iterator
from dataclasses import dataclass, field

from pathspec import GitIgnoreSpec

from actors.worker.tools.base import ToolError
from actors.worker.tools.paths import PathDenied, PathPolicy, changed_to_symlink, is_symlink_at

__all__ = ["Walk", "WalkEntry", "glob_regex", "read_confined_file"]

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC
_MAX_GITIGNORE_BYTES = 256 * 1024
_MAX_DEPTH = 64


@dataclass(frozen=True, slots=True)
class WalkEntry:
    """A file or directory found; ``dir_fd`` (its directory) is valid until the walk
    moves on. ``rel`` is its path from the walk's base, ``/``-separated."""

    dir_fd: int
    name: str
    rel: str
    is_dir: bool
    size: int


@dataclass(slots=True)
class Walk:
    """One walk under ``path`` (relative paths start at the session cwd).

    At most ``max_entries`` entries are looked at; ``exhausted`` tells that the
    walk stopped there (or because the turn was cancelled) before the end.
    """

    paths: PathPolicy
    path: str
    cancelled: threading.Event
    max_entries: int = 200_000
    exhausted: bool = False
    base: str = ""
    _seen: int = 0
    _forbidden: frozenset[tuple[int, int]] = field(default_factory=frozenset)

    @property
    def forbidden(self) -> frozenset[tuple[int, int]]:
        """(device, inode) of the forbidden paths, once :meth:`entries` has started."""
        return self._forbidden

    def entries(self) -> Generator[WalkEntry, None, None]:
        """Every file and directory beneath the base, depth first, in name order."""
        try:
            with self.paths.open_parent(self.path) as parent:
                self.base = str(parent.path)
                self._forbidden = parent.forbidden
                fd = _open_dir(parent.fd, parent.name, self.path)
                try:
                    parent.check_not_forbidden(os.fstat(fd))
                    yield from self._walk(fd, "", [], 0)
                finally:
                    os.close(fd)
        except PathDenied as exc:
            raise ToolError(str(exc)) from None
        except FileNotFoundError:
            raise ToolError(f"no such directory: {self.path}") from None
        except NotADirectoryError:
            raise ToolError(f"not a directory: {self.path}") from None

    def _walk(self, fd: int, rel: str, ignores: list[tuple[str, GitIgnoreSpec]],
              depth: int) -> Iterator[WalkEntry]:
        spec = _gitignore(fd)
        if spec is not None:
            ignores = [*ignores, (rel, spec)]
        with os.scandir(fd) as listing:
            found = sorted(listing, key=lambda e: e.name)
        for entry in found:
            if self._stop():
                return
            if entry.name == ".git" or entry.is_symlink():
                continue
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            is_dir = stat.S_ISDIR(st.st_mode)
            path = f"{rel}{entry.name}"
            if (st.st_dev, st.st_ino) in self._forbidden or _ignored(ignores, path, is_dir):
                continue
            if is_dir:
                yield WalkEntry(fd, entry.name, path, True, 0)
                if depth < _MAX_DEPTH:
                    yield from self._descend(fd, entry.name, path, ignores, depth)
            elif stat.S_ISREG(st.st_mode):
                yield WalkEntry(fd, entry.name, path, False, st.st_size)

    def _descend(self, fd: int, name: str, path: str,
                 ignores: list[tuple[str, GitIgnoreSpec]], depth: int) -> Iterator[WalkEntry]:
        try:
            child = os.open(name, _DIR_FLAGS, dir_fd=fd)
        except OSError:
            return  # swapped for a link or removed since it was listed: not followed
        try:
            st = os.fstat(child)
            if (st.st_dev, st.st_ino) not in self._forbidden:
                yield from self._walk(child, f"{path}/", ignores, depth + 1)
        finally:
            os.close(child)

    def _stop(self) -> bool:
        self._seen += 1
        if self._seen > self.max_entries or self.cancelled.is_set():
            self.exhausted = True
        return self.exhausted


def _open_dir(parent_fd: int, name: str, given: str) -> int:
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR) and is_symlink_at(parent_fd, name):
            raise changed_to_symlink(given, name) from None
        raise


def _ignored(ignores: list[tuple[str, GitIgnoreSpec]], path: str, is_dir: bool) -> bool:
    """Whether the ``.gitignore`` files above ``path`` exclude it (the deepest rule wins)."""
    verdict: bool | None = None
    for prefix, spec in ignores:
        relative = path[len(prefix):]
        result = spec.check_file(f"{relative}/" if is_dir else relative).include
        if result is not None:
            verdict = result
    return bool(verdict)


def _gitignore(fd: int) -> GitIgnoreSpec | None:
    """The ``.gitignore`` of the directory ``fd``, if it has a readable regular one."""
    try:
        data = read_confined_file(fd, ".gitignore", _MAX_GITIGNORE_BYTES, frozenset())
    except (OSError, ToolError, PathDenied):
        return None
    return GitIgnoreSpec.from_lines(data.decode("utf-8", errors="replace").splitlines())


def read_confined_file(dir_fd: int, name: str, limit: int,
                       forbidden: frozenset[tuple[int, int]]) -> bytes:
    """Up to ``limit`` bytes of the regular file ``name`` under ``dir_fd``, never through
    a link; a FIFO or device is refused (it could block the turn)."""
    fd = os.open(name, _FILE_FLAGS, dir_fd=dir_fd)
    try:
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino) in forbidden:
            raise PathDenied(f"{name!r} is forbidden")
        if not stat.S_ISREG(st.st_mode):
            raise ToolError(f"not a regular file: {name}")
        with os.fdopen(fd, "rb", closefd=False) as handle:
            return handle.read(limit)
    finally:
        os.close(fd)


def glob_regex(pattern: str) -> re.Pattern[str]:
    """A shell-style glob over ``/``-separated relative paths as a regex: ``*`` and ``?``
    stay within one component, ``[...]`` is a character class, and a ``**`` component
    matches any number of directories (``src/**/*.py`` matches ``src/a.py`` too)."""
    parts = [p for p in pattern.strip("/").split("/") if p not in ("", ".")]
    if not parts:
        parts = ["**"]
    regex = ""
    for index, part in enumerate(parts):
        last = index == len(parts) - 1
        if part == "**":
            regex += ".*" if last else "(?:[^/]+/)*"
        else:
            regex += _component(part) + ("" if last else "/")
    return re.compile(regex + r"\Z")


def _component(part: str) -> str:
    out, i = "", 0
    while i < len(part):
        char = part[i]
        if char == "*":
            out += "[^/]*"
        elif char == "?":
            out += "[^/]"
        elif char == "[" and part.find("]", i + 2) != -1:
            end = part.find("]", i + 2)
            body = part[i + 1:end]
            negate = body.startswith("!")
            body = re.escape(body[1:] if negate else body).replace(r"\-", "-")
            out += f"[{'^' if negate else ''}{body}]"
            i = end
        else:
            out += re.escape(char)
        i += 1
    return out
