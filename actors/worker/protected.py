"""The host's own paths, refused to every session: its config and data dirs, store
files, sockets and their locks, TLS key and cert.

The host computes them once (:func:`supervisor.config.protected.host_protected_paths`) and
gives them to its workers in one variable, :data:`PROTECTED_VARIABLE`; a session's
:class:`~actors.worker.tools.paths.PathPolicy` carries them to every way in (the file
tools, the shell sandbox, a hosted agent's jail and its fs/terminal relay).

The rule: a path inside a protected directory is refused unless it lies inside one of
the session's roots that is strictly inside that directory and holds no protected path
itself (a tenant's root under the data dir, the owner's agent workspace under the
config dir); a root equal to or above a protected path (the config dir, ``/``, HOME)
unmasks nothing; a protected file is never unmasked. Pure functions over paths (the
caller canonicalises), safe from any thread; imports only the standard library. Also
the two path rules every side shares: :func:`within` and :func:`path_component`.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

__all__ = ["NOTHING_PROTECTED", "PROTECTED_VARIABLE", "ProtectedPaths", "path_component",
           "within"]

#: The one variable through which the host gives its workers its own paths
#: (``os.pathsep``-joined; a directory ends with ``/``).
PROTECTED_VARIABLE = "ZEROCLAW_PROTECTED_PATHS"


_PLAIN_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")


def within(path: Path, root: Path) -> bool:
    """Whether canonical ``path`` is ``root`` or lies beneath it. On their strings: a
    Path is normalised (no ``.``, no doubled or trailing ``/`` but the root's), and
    ``is_relative_to`` parses both again, on the way of every session/new."""
    text, base = str(path), str(root)
    return text == base or text.startswith(base if base.endswith("/") else base + "/")


def path_component(name: str) -> str:
    """``name`` as one path component ("." and ".." and odd characters hashed): a
    tenant's or an agent's directory never leaves the directory it is made in."""
    if name not in (".", "..") and _PLAIN_NAME.fullmatch(name):
        return name
    return "_" + hashlib.sha256(name.encode()).hexdigest()[:16]


@dataclass(frozen=True, slots=True)
class ProtectedPaths:
    """The host's own directories and files, canonical: refused to every session.

    Built once by the host (:func:`supervisor.config.protected.host_protected_paths`) and
    given to workers in :data:`PROTECTED_VARIABLE`; read here by :meth:`from_env`.
    """

    dirs: tuple[Path, ...] = ()
    files: tuple[Path, ...] = ()

    @property
    def every(self) -> tuple[Path, ...]:
        return (*self.dirs, *self.files)

    def sanctions(self, root: Path) -> bool:
        """Whether ``root`` may reach inside a protected directory: it lies strictly
        inside one and contains no protected path itself."""
        return any(root != d and root.is_relative_to(d) for d in self.dirs) and not any(
            within(path, root) for path in self.every)

    def holds(self, path: Path) -> bool:
        """Whether ``path`` is or lies inside a protected path (whatever the roots)."""
        return any(within(path, protected) for protected in self.every)

    def refusal(self, path: Path, roots: Iterable[Path]) -> str | None:
        """Why ``path`` is refused to a session with ``roots``, or None."""
        if path in self.files:
            return "one of the host's own files"
        inside = [d for d in self.dirs if within(path, d)]
        if inside and not any(within(path, r) for r in roots if self.sanctions(r)):
            return f"inside the host's own directory {inside[0]}"
        return None

    def linked_files(self) -> tuple[Path, ...]:
        """The protected files that have another name now (a hard link elsewhere): a
        sandbox masks paths, not inodes, so commands are refused while one exists."""
        linked = []
        for path in self.files:
            try:
                if os.lstat(path).st_nlink > 1:
                    linked.append(path)
            except OSError:
                continue
        return tuple(linked)

    def to_env(self) -> str:
        """The value of :data:`PROTECTED_VARIABLE`."""
        return os.pathsep.join([*(f"{d}/" for d in self.dirs), *map(str, self.files)])

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> ProtectedPaths:
        """What the host put in :data:`PROTECTED_VARIABLE` (none: nothing protected).
        Every session of a worker asks for it: they share one parse of each value."""
        return _parsed((os.environ if env is None else env).get(PROTECTED_VARIABLE) or "")


@lru_cache(maxsize=16)
def _parsed(text: str) -> ProtectedPaths:
    """:meth:`ProtectedPaths.from_env` of one value (immutable, so shared)."""
    entries = [e for e in text.split(os.pathsep) if os.path.isabs(e)]
    return ProtectedPaths(
        dirs=tuple(Path(os.path.realpath(e)) for e in entries if e.endswith("/")),
        files=tuple(Path(os.path.realpath(e)) for e in entries if not e.endswith("/")))


#: No host paths (a policy built outside a host: unit tests, tools used on their own).
NOTHING_PROTECTED = ProtectedPaths()
