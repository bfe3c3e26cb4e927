"""Path confinement for tools: the session cwd plus the agent's workspace, minus forbidden paths.

Every path a tool touches is made absolute (relative paths are taken from the
session cwd), ``~`` is expanded, and symlinks are resolved before it is checked,
so a link inside the workspace that points at ``/etc`` is judged as ``/etc``.

Checking a path and then opening it by name would race: a link swapped in
between (``toc.txt`` flipped to point at ``~/.ssh/id_rsa``) escapes the check.
So the file tools open what they checked through :meth:`PathPolicy.open_parent`:
from a descriptor held on the root, one component at a time with
``O_NOFOLLOW`` (the checked path has no symlinks and no ``..`` left), creating
missing directories with ``mkdirat``-style steps. A symlink that appears on the
way fails the call instead of being followed, and every directory opened (and
the file a tool opens) is compared by device and inode with the forbidden
paths, so a forbidden directory is refused under any name it is reached by.
Symlinks inside the roots that point inside them keep working: the check
resolves them, and the walk follows their resolved path.

The host's own paths (:class:`ProtectedPaths`: its config and data dirs, store files,
sockets, TLS key) are refused to every session whatever its forbidden paths say: a
path inside a protected directory only through a root that lies strictly inside that
directory and holds no protected path itself (a tenant's root under the data dir,
the owner's agent workspace under the config dir); a protected file never. A root
equal to or above a protected path (``/``, HOME, the config dir) unmasks nothing.
The same policy confines the shell sandbox and a hosted agent's jail and relays.

Functions over the filesystem: safe from any thread (a session actor's thread
runs them, once per tool call); each open descriptor is owned by one call.
"""

from __future__ import annotations

import errno
import os
import shlex
import stat
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

from actors.worker.protected import (
    NOTHING_PROTECTED,
    PROTECTED_VARIABLE,
    ProtectedPaths,
    within,
)

__all__ = [
    "PROTECTED_VARIABLE",
    "OpenedParent",
    "PathDenied",
    "PathPolicy",
    "ProtectedPaths",
    "canonical",
    "changed_to_symlink",
    "is_symlink_at",
]

#: How each directory of a confined path is opened: never through a symlink.
_DIR_FLAGS = os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC | getattr(os, "O_PATH", os.O_RDONLY)


class PathDenied(Exception):
    """A path outside the allowed roots or inside a forbidden one; the message says which."""


def canonical(path: str | Path, base: Path | None = None) -> Path:
    """``path`` with ``~`` expanded, made absolute against ``base`` and symlinks resolved.

    Parts that do not exist yet (a file about to be written) are kept as given.
    Plain ``os.path`` strings up to the one Path made of the result: a session's open
    makes four of these (its roots and the forbidden paths).
    """
    text = os.path.expanduser(str(path))
    if not os.path.isabs(text):
        text = os.path.join(os.getcwd() if base is None else str(base), text)
    return Path(os.path.realpath(text))


def _forbidden_entry(entry: str) -> Path:
    """A forbidden path, canonical; a relative one would be judged from the worker's own
    cwd and protect nothing, so it is refused (ValueError; the config loader refuses it first)."""
    if not os.path.isabs(os.path.expanduser(entry)):
        raise ValueError(f"forbidden path {entry!r} is not absolute")
    return canonical(entry)


@dataclass(frozen=True, slots=True)
class OpenedParent:
    """A confined path's directory, opened beneath its root (valid inside ``open_parent``).

    ``name`` is the last component, to open or replace with ``dir_fd=fd``
    (``"."`` when the path is a root itself); ``path`` is the canonical path,
    for messages and results.
    """

    fd: int
    name: str
    path: Path
    forbidden: frozenset[tuple[int, int]]

    def check_not_forbidden(self, st: os.stat_result) -> None:
        """Refuse a file whose device and inode are a forbidden path's."""
        if (st.st_dev, st.st_ino) in self.forbidden:
            raise PathDenied(f"path {str(self.path)!r} is forbidden (a forbidden file)")


@dataclass(frozen=True, slots=True)
class PathPolicy:
    """Where a session's tools may read and write.

    ``cwd`` is where relative paths start; ``roots`` are the canonical directories
    a file tool may touch; ``forbidden`` wins over ``roots``; ``protected`` (the
    host's own paths) wins over both, but for a root it sanctions. ``tenant``: a
    gateway tenant's session, whose commands never run unconfined. ``network`` False:
    the session's confined commands get no network but loopback (:mod:`.sandbox`).
    """

    cwd: Path
    roots: tuple[Path, ...]
    forbidden: tuple[Path, ...]
    protected: ProtectedPaths = NOTHING_PROTECTED
    tenant: bool = False
    network: bool = True

    @classmethod
    def build(cls, cwd: str, workspace_dir: str, forbidden_paths: Iterable[str], *,
              protected: ProtectedPaths | None = None, tenant: bool = False,
              network: bool = True) -> PathPolicy:
        """Canonicalise everything once, when the session opens; ``protected``
        defaults to what the host told this process. A cwd inside the workspace is no
        root of its own (were it replaced by a symlink later, a sandbox binding it
        would follow the link)."""
        cwd_path, workspace = canonical(cwd), canonical(workspace_dir)
        roots = (workspace,) if within(cwd_path, workspace) else (cwd_path, workspace)
        forbidden = tuple(_forbidden_entry(p) for p in forbidden_paths if str(p).strip())
        return cls(cwd=cwd_path, roots=roots, forbidden=forbidden,
                   protected=ProtectedPaths.from_env() if protected is None else protected,
                   tenant=tenant, network=network)

    def with_roots(self, cwd: Path, roots: Iterable[Path]) -> PathPolicy:
        """The same forbidden and protected paths and network with other roots (an
        agent's jail)."""
        return PathPolicy(cwd=cwd, roots=tuple(dict.fromkeys(roots)), forbidden=self.forbidden,
                          protected=self.protected, tenant=self.tenant, network=self.network)

    @property
    def sanctioned(self) -> tuple[Path, ...]:
        """The roots that reach inside a protected directory (:meth:`ProtectedPaths.sanctions`)."""
        return tuple(root for root in self.roots if self.protected.sanctions(root))

    @property
    def masked(self) -> tuple[Path, ...]:
        """Every path a sandbox masks: the forbidden and the protected ones."""
        return (*self.forbidden, *self.protected.every)

    def resolve(self, path: str) -> Path:
        """The canonical form of ``path`` if a file tool may use it, else :class:`PathDenied`."""
        if not isinstance(path, str) or not path.strip():
            raise PathDenied("path must be a non-empty string")
        if "\x00" in path:
            raise PathDenied("path contains a NUL byte")
        try:
            resolved = canonical(path, self.cwd)
        except OSError:  # realpath met a link that changed under it (lstat, then readlink)
            raise PathDenied(f"path {path!r} changed while it was checked; refused") from None
        self._check_forbidden(path, resolved)
        if not any(within(resolved, root) for root in self.roots):
            allowed = ", ".join(str(r) for r in self.roots)
            raise PathDenied(
                f"path {path!r} resolves to {resolved}, outside the allowed directories ({allowed})"
            )
        return resolved

    @contextmanager
    def open_parent(self, path: str, *, create: bool = False) -> Iterator[OpenedParent]:
        """Check ``path`` as :meth:`resolve` does, then open its directory beneath the root.

        ``create`` makes missing directories (0777 less the umask). Raises
        :class:`PathDenied` (including for a symlink met on the way: the path
        changed after the check), ``FileNotFoundError`` or another ``OSError``.
        """
        resolved = self.resolve(path)
        root = max((r for r in self.roots if within(resolved, r)), key=lambda r: len(r.parts))
        parts = resolved.relative_to(root).parts
        forbidden = self._forbidden_identities()
        fd = os.open(root, _DIR_FLAGS)
        try:
            _check_identity(fd, forbidden, path)
            for part in parts[:-1]:
                child = _open_child_dir(fd, part, create=create, given=path)
                os.close(fd)
                fd = child
                _check_identity(fd, forbidden, path)
            yield OpenedParent(fd, parts[-1] if parts else ".", resolved, forbidden)
        finally:
            os.close(fd)

    def _forbidden_identities(self) -> frozenset[tuple[int, int]]:
        """(device, inode) of each forbidden path that exists now."""
        found = set()
        for forbidden in self.masked:
            try:
                st = os.stat(forbidden)
            except OSError:
                continue
            found.add((st.st_dev, st.st_ino))
        return frozenset(found)

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
                    try:
                        resolved = canonical(piece, self.cwd)
                    except OSError as exc:  # e.g. /proc/1/root: a link it may not read
                        raise PathDenied(
                            f"path {piece!r} cannot be checked ({exc.strerror}); refused") from None
                    self._check_forbidden(piece, resolved)

    def _check_forbidden(self, given: str, resolved: Path) -> None:
        for forbidden in self.forbidden:
            if within(resolved, forbidden):
                raise PathDenied(f"path {given!r} is forbidden (inside {forbidden})")
        why = self.protected.refusal(resolved, self.roots)
        if why is not None:
            raise PathDenied(f"path {given!r} is forbidden ({why})")


def _open_child_dir(fd: int, name: str, *, create: bool, given: str) -> int:
    """Open directory ``name`` under ``fd`` (made first if ``create``), never through a link."""
    if create:
        with suppress(FileExistsError):
            os.mkdir(name, 0o777, dir_fd=fd)
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=fd)
    except OSError as exc:
        if exc.errno in (errno.ENOTDIR, errno.ELOOP) and is_symlink_at(fd, name):
            raise changed_to_symlink(given, name) from None
        raise


def is_symlink_at(fd: int, name: str) -> bool:
    """Whether ``name`` under directory ``fd`` is a symbolic link right now."""
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode)
    except OSError:
        return False


def changed_to_symlink(given: str, name: str) -> PathDenied:
    """The refusal for a link met where the check saw none (the path changed in between)."""
    return PathDenied(
        f"path {given!r} changed while it was opened: {name!r} is now a symbolic link; refused")


def _is_symlink(fd: int, name: str) -> bool:
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode)
    except OSError:
        return False


def _check_identity(fd: int, forbidden: frozenset[tuple[int, int]], given: str) -> None:
    st = os.fstat(fd)
    if (st.st_dev, st.st_ino) in forbidden:
        raise PathDenied(f"path {given!r} is forbidden (it passes through a forbidden directory)")
