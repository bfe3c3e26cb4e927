"""OS confinement for shell commands: the command line that runs one under bubblewrap or
Landlock.

What a confined command (and everything it starts) may do:

- read the whole filesystem except the forbidden paths (a forbidden directory looks
  empty, a forbidden file reads as empty under bubblewrap; both are refused under
  Landlock);
- write only beneath the session's roots (its cwd and the agent's workspace) and a
  private temporary directory (``TMPDIR``), never inside a forbidden path;
- nothing left running after the call: under bubblewrap the command runs in its own
  PID namespace (it cannot see the worker's processes, and ending the namespace ends
  all of it); under Landlock a launcher that is a child subreaper ends every leftover
  descendant once the shell exits.

Backends: ``bwrap`` (mount namespace with ``/`` read-only, the roots bound writable,
each forbidden path masked, a private ``/tmp``, a PID namespace, all capabilities
dropped, a new session, ``/proc/sys`` and ``/sys`` read-only) is preferred by ``auto``;
``landlock`` (Linux 5.13+; an allow-list applied by :mod:`actors.worker.tools.landlock_exec`
before it execs the shell; nothing is writable under ``/dev`` but a few devices, nor
under ``/proc`` or ``/sys``). The host's own paths (``policy.protected``: config and
data dirs, store, sockets, TLS key) are masked like forbidden paths, but for a root
the policy sanctions inside a protected directory (:mod:`actors.worker.protected`).
Landlock cannot subtract a path from an allowed tree, so a directory that contains a
forbidden path is allowed entry by entry (minus the forbidden one): such a directory
cannot be listed, and nothing can be created directly in it. The network stays open
unless the policy says ``network = False`` (``sandbox_network = false``): then bubblewrap
gives the command a network namespace of its own, with only loopback; Landlock has no
such thing, so such a command is refused there (the host refuses the session first).

An interpreter installed under ``/tmp`` or ``/var/tmp`` (a venv or checkout there) is
bound back read-only over bubblewrap's fresh ``/tmp``, so a confined hosted agent run by
it still starts.

:mod:`actors.worker.sandbox` detects the backend; :func:`confined` builds one call's command
line here. Safe from any thread (a session actor's thread runs it).
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from actors.worker.sandbox import BWRAP_ISOLATION, SandboxInfo
from actors.worker.tools.base import ToolError
from actors.worker.tools.paths import PathDenied, PathPolicy

__all__ = ["Confined", "confined", "confined_argv", "landlock_rules"]

_LAUNCHER = Path(__file__).with_name("landlock_exec.py")
#: The directory zeroclaw's packages are imported from (an editable install's checkout).
_PACKAGE_ROOT = Path(__file__).resolve().parents[3]
#: Directories bubblewrap replaces with a fresh tmpfs.
_PRIVATE_TMP_DIRS = (Path("/tmp"), Path("/var/tmp"))
_SHELL = "/bin/sh"
#: Never writable beneath a root (a session rooted at ``/`` still cannot write them).
_KERNEL_INTERFACES = (Path("/dev"), Path("/proc"), Path("/sys"))
#: Writable device files a command commonly needs (everything else under /dev is read-only).
_DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom", "/dev/tty")

# Landlock filesystem rights (linux/landlock.h), by the ABI version that introduced them.
_EXECUTE, _WRITE_FILE, _READ_FILE, _READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
_ABI1_ALL = (1 << 13) - 1
_REFER, _TRUNCATE, _IOCTL_DEV = 1 << 13, 1 << 14, 1 << 15
_FILE_RIGHTS = _EXECUTE | _WRITE_FILE | _READ_FILE | _TRUNCATE | _IOCTL_DEV
_READ_RIGHTS = _EXECUTE | _READ_FILE | _READ_DIR


@dataclass(frozen=True, slots=True)
class Confined:
    """A command line to run and the variables to add to its environment."""

    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)


@contextmanager
def confined(info: SandboxInfo, policy: PathPolicy, command: str) -> Iterator[Confined]:
    """``/bin/sh -c command`` under ``info``'s backend for a session with ``policy``; a
    private temporary directory lives as long as the context."""
    if info.backend != "landlock":  # bubblewrap makes its own /tmp
        yield confined_argv(info, policy, [_SHELL, "-c", command], Path("/tmp"))
        return
    private_tmp = tempfile.mkdtemp(prefix="zeroclaw-shell-")
    try:
        yield confined_argv(info, policy, [_SHELL, "-c", command], Path(private_tmp))
    finally:
        shutil.rmtree(private_tmp, ignore_errors=True)


def confined_argv(info: SandboxInfo, policy: PathPolicy, argv: list[str],
                  private_tmp: Path) -> Confined:
    """``argv`` (and all it starts) under ``info``'s backend: writes only beneath
    ``policy.roots`` and ``private_tmp`` (the caller's to create and remove; under
    bubblewrap a fresh ``/tmp`` instead), the forbidden and protected paths masked
    (a sanctioned root inside a protected directory stays reachable), no new Unix-socket
    connections under Landlock (it cannot mask a socket's path). :class:`PathDenied`
    while one of the host's files has a hard link elsewhere (a mask would miss it)."""
    linked = policy.protected.linked_files()
    if linked:
        raise PathDenied(f"the host's own file {linked[0]} has another hard link, which no "
                         "sandbox can mask; commands are refused until it is removed")
    if info.backend == "bwrap":
        return Confined(_bwrap_argv(policy, argv), {"TMPDIR": "/tmp"})
    if not policy.network:
        raise ToolError(f"sandbox_network = false needs the bubblewrap sandbox; commands run "
                        f"under {info.backend} here, which cannot take the network away")
    if info.backend != "landlock":
        return Confined(list(argv))
    rules = landlock_rules(policy, private_tmp, info.landlock_abi)
    spec = {"abi": info.landlock_abi, "rules": rules, "argv": list(argv),
            "deny_unix_sockets": True}
    spec_path = private_tmp / f".landlock-spec-{os.getpid()}-{id(spec)}.json"
    spec_path.write_text(json.dumps(spec), encoding="utf-8")  # too long for an argument
    launcher = [sys.executable, "-I", "-S", str(_LAUNCHER), str(spec_path)]
    return Confined(launcher, {"TMPDIR": str(private_tmp)})


def _bwrap_argv(policy: PathPolicy, command: list[str]) -> list[str]:
    """``/`` read-only, a fresh ``/tmp``, the roots writable, then fresh ``/dev`` and
    ``/proc`` with ``/proc/sys`` and ``/sys`` read-only (even a root of ``/`` does not
    reach raw disks or kernel settings), then the masks (last, so forbidden wins; a
    root inside a masked directory is bound again inside the mask)."""
    argv = [shutil.which("bwrap") or "bwrap", "--ro-bind", "/", "/", "--tmpfs", "/tmp"]
    if os.path.isdir("/var/tmp"):
        argv += ["--tmpfs", "/var/tmp"]
    for installed in _installed_under_tmp():
        argv += ["--ro-bind", installed, installed]
    roots = [root for root in policy.roots if root.is_dir()]  # a workspace may not exist yet
    for root in roots:
        argv += ["--bind", str(root), str(root)]
    argv += ["--dev", "/dev", "--proc", "/proc"]
    for kernel in ("/proc/sys", "/sys"):  # root may write sysctls without capabilities
        if os.path.isdir(kernel):
            argv += ["--ro-bind", kernel, kernel]
    if os.path.exists("/proc/sysrq-trigger"):
        argv += ["--ro-bind", "/dev/null", "/proc/sysrq-trigger"]
    masked = policy.masked
    masked_dirs = [path for path in masked if path.is_dir()]
    for forbidden in masked:
        if any(forbidden != d and forbidden.is_relative_to(d) for d in masked_dirs):
            continue  # already hidden by a masked directory above it (now read-only)
        if forbidden.is_dir():
            argv += ["--tmpfs", str(forbidden)]
            for root in policy.sanctioned:
                if root.is_dir() and root.is_relative_to(forbidden) and not any(
                        root.is_relative_to(f) for f in policy.forbidden):
                    argv += ["--bind", str(root), str(root)]
            argv += ["--remount-ro", str(forbidden)]
        elif forbidden.exists():
            argv += ["--ro-bind", "/dev/null", str(forbidden)]
    network = () if policy.network else ("--unshare-net",)
    return [*argv, *BWRAP_ISOLATION, *network, "--chdir", str(policy.cwd), "--", *command]


@functools.cache
def _installed_under_tmp() -> tuple[str, ...]:
    """The interpreter's prefixes and zeroclaw's own source dir that lie under a
    directory bubblewrap hides with a fresh tmpfs (outermost first, no duplicates);
    found once per process."""
    found: list[str] = []
    for place in sorted({os.path.realpath(p) for p in
                         (sys.prefix, sys.base_prefix, str(_PACKAGE_ROOT))}):
        path = Path(place)
        if (any(path.is_relative_to(tmp) and path != tmp for tmp in _PRIVATE_TMP_DIRS)
                and path.is_dir() and not any(path.is_relative_to(f) for f in found)):
            found.append(place)
    return tuple(found)


def landlock_rules(policy: PathPolicy, private_tmp: Path, abi: int) -> list[list[Any]]:
    """``[path, rights]`` rules: read (and execute) everywhere, full rights beneath the
    roots and ``private_tmp``, read-write on a few devices; never beneath a forbidden
    path, nor beneath a protected one but for a root the policy sanctions inside it."""
    everything = _ABI1_ALL | (_REFER if abi >= 2 else 0) | (_TRUNCATE if abi >= 3 else 0) \
        | (_IOCTL_DEV if abi >= 5 else 0)
    rules: list[list[Any]] = []
    forbidden, sanctioned = policy.masked, policy.sanctioned
    _carve(Path("/"), _READ_RIGHTS, (*forbidden, Path("/dev")), rules)  # no raw disks
    for root in (*policy.roots, private_tmp):  # even a root of / writes no kernel interface
        around = tuple(path for path in policy.protected.every
                       if root not in sanctioned or not root.is_relative_to(path))
        _carve(root, everything, (*policy.forbidden, *around, *_KERNEL_INTERFACES), rules)
    for device in _DEVICES:
        if os.path.exists(device):
            _carve(Path(device), _READ_FILE | _WRITE_FILE | (everything & _TRUNCATE),
                   forbidden, rules)
    return rules


def _carve(path: Path, rights: int, forbidden: tuple[Path, ...], rules: list[list[Any]]) -> None:
    """Allow ``rights`` beneath ``path`` minus the forbidden paths: a tree holding one is
    allowed child by child (symlinks are skipped: they resolve to a path judged on its own)."""
    if any(path == f or path.is_relative_to(f) for f in forbidden):
        return
    if not path.is_dir() or path.is_symlink():
        if path.exists() and not path.is_symlink():
            rules.append([str(path), rights & _FILE_RIGHTS])
        return
    if not any(f.is_relative_to(path) for f in forbidden):
        rules.append([str(path), rights])
        return
    try:
        entries = sorted(os.scandir(path), key=lambda e: e.name)
    except OSError:
        return
    for entry in entries:
        if not entry.is_symlink():
            _carve(Path(entry.path), rights, forbidden, rules)
