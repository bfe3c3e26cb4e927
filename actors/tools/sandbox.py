"""OS confinement for shell commands: bubblewrap or Landlock, detected once per process.

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
dropped, a new session) is preferred by ``auto``; ``landlock`` (Linux 5.13+; an
allow-list applied by :mod:`actors.tools.landlock_exec` before it execs the shell).
Landlock cannot subtract a path from an allowed tree, so a directory that contains a
forbidden path is allowed entry by entry (minus the forbidden one): such a directory
cannot be listed, and nothing can be created directly in it. Neither backend confines
the network.

:func:`detect` runs a real probe once per process (cached); it is called on the host's
loop thread at startup and, lazily, on a session actor's thread in a worker.
:func:`confined` builds one call's command line; safe from any thread.
"""

from __future__ import annotations

import ctypes
import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from actors.tools.paths import PathPolicy

__all__ = [
    "SANDBOX_CHOICES",
    "Confined",
    "SandboxInfo",
    "confined",
    "detect",
    "worker_sandbox_environment",
    "worker_sandbox_settings",
]

#: The values of ``[autonomy] sandbox``.
SANDBOX_CHOICES = ("auto", "bwrap", "landlock", "none")
#: How the host tells its workers the backend it chose, whether unconfined runs are allowed,
#: and its own files a command must not see (the store, the sockets; ``os.pathsep``-joined).
SANDBOX_VARIABLE = "ZEROCLAW_SHELL_SANDBOX"
UNSANDBOXED_VARIABLE = "ZEROCLAW_ALLOW_UNSANDBOXED_SHELL"
HIDDEN_VARIABLE = "ZEROCLAW_SHELL_HIDDEN"

_LAUNCHER = Path(__file__).with_name("landlock_exec.py")
_PROBE_TIMEOUT = 10.0
_SHELL = "/bin/sh"
#: Writable device files a command commonly needs (everything else under /dev is read-only).
_DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom", "/dev/tty")

# Landlock filesystem rights (linux/landlock.h), by the ABI version that introduced them.
_EXECUTE, _WRITE_FILE, _READ_FILE, _READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
_ABI1_ALL = (1 << 13) - 1
_REFER, _TRUNCATE, _IOCTL_DEV = 1 << 13, 1 << 14, 1 << 15
_FILE_RIGHTS = _EXECUTE | _WRITE_FILE | _READ_FILE | _TRUNCATE | _IOCTL_DEV
_READ_RIGHTS = _EXECUTE | _READ_FILE | _READ_DIR
_CREATE_RULESET, _CREATE_RULESET_VERSION = 444, 1


@dataclass(frozen=True, slots=True)
class SandboxInfo:
    """The backend in use: ``bwrap``, ``landlock`` or ``none``; ``reason`` says why none
    (or why the requested one was not available)."""

    backend: str
    version: str
    requested: str
    reason: str = ""
    landlock_abi: int = 0

    @property
    def confines(self) -> bool:
        return self.backend != "none"

    def to_wire(self) -> dict[str, Any]:
        wire: dict[str, Any] = {"backend": self.backend, "version": self.version,
                                "requested": self.requested}
        if self.reason:
            wire["reason"] = self.reason
        return wire


@functools.cache
def detect(requested: str = "auto") -> SandboxInfo:
    """The backend ``requested`` resolves to here: ``auto`` prefers bubblewrap (it adds a
    PID namespace), then Landlock; a named backend that does not work gives ``none``."""
    if requested not in SANDBOX_CHOICES:
        return SandboxInfo("none", "", requested, f"unknown sandbox {requested!r}")
    if requested == "none":
        return SandboxInfo("none", "", requested, "disabled by [autonomy] sandbox = \"none\"")
    reasons = []
    if requested in ("auto", "bwrap"):
        version, why = _probe_bwrap()
        if version:
            return SandboxInfo("bwrap", version, requested)
        reasons.append(why)
    if requested in ("auto", "landlock"):
        abi, why = _probe_landlock()
        if abi:
            return SandboxInfo("landlock", f"landlock ABI {abi}", requested, landlock_abi=abi)
        reasons.append(why)
    return SandboxInfo("none", "", requested, "; ".join(reasons))


def _probe_bwrap() -> tuple[str, str]:
    """(version, "") when ``bwrap`` runs a trial command with our flags, else ("", why)."""
    binary = shutil.which("bwrap")
    if binary is None:
        return "", "bwrap is not installed (Debian/Ubuntu package: bubblewrap)"
    trial = [binary, *_BWRAP_ISOLATION, "--ro-bind", "/", "/", "--dev", "/dev",
             "--proc", "/proc", "--", _SHELL, "-c", "exit 0"]
    try:
        version = subprocess.run([binary, "--version"], capture_output=True, text=True,
                                 timeout=_PROBE_TIMEOUT, env={"PATH": os.defpath})
        done = subprocess.run(trial, capture_output=True, text=True, timeout=_PROBE_TIMEOUT,
                              env={"PATH": os.defpath}, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError) as exc:
        return "", f"bwrap cannot run: {exc}"
    if done.returncode != 0:
        return "", f"bwrap cannot create its namespaces here: {done.stderr.strip()[:200]}"
    return version.stdout.strip() or "bubblewrap", ""


def _probe_landlock() -> tuple[int, str]:
    """(ABI version, "") when the kernel enforces Landlock, else (0, why)."""
    if not sys.platform.startswith("linux"):
        return 0, "landlock needs Linux"
    libc = ctypes.CDLL(None, use_errno=True)
    abi = libc.syscall(_CREATE_RULESET, None, ctypes.c_size_t(0), _CREATE_RULESET_VERSION)
    if abi < 1:
        return 0, f"landlock is not enabled in this kernel ({os.strerror(ctypes.get_errno())})"
    return int(abi), ""


# --- the worker's view ----------------------------------------------------------------------


def worker_sandbox_environment(info: SandboxInfo, allow_unsandboxed: bool,
                               hidden: Iterable[Path] = ()) -> dict[str, str]:
    """The variables the host gives its workers: the backend it resolved, the switch, and
    the host's own paths (data dir, sockets) that commands must not see."""
    return {SANDBOX_VARIABLE: info.backend if info.confines else "none",
            UNSANDBOXED_VARIABLE: "1" if allow_unsandboxed else "0",
            HIDDEN_VARIABLE: os.pathsep.join(str(path) for path in hidden)}


def worker_sandbox_settings(
    env: Mapping[str, str] | None = None,
) -> tuple[SandboxInfo, bool, tuple[Path, ...]]:
    """The sandbox this process's commands use (``auto`` when the host said nothing),
    whether running them unconfined is allowed, and the host paths they must not see."""
    env = os.environ if env is None else env
    requested = env.get(SANDBOX_VARIABLE) or "auto"
    hidden = tuple(Path(os.path.realpath(p)) for p in
                   (env.get(HIDDEN_VARIABLE) or "").split(os.pathsep) if os.path.isabs(p))
    return detect(requested), env.get(UNSANDBOXED_VARIABLE) == "1", hidden


# --- one call -------------------------------------------------------------------------------


_BWRAP_ISOLATION = ("--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
                    "--die-with-parent", "--new-session", "--cap-drop", "ALL")


@dataclass(frozen=True, slots=True)
class Confined:
    """A command line to run and the variables to add to its environment."""

    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)


@contextmanager
def confined(info: SandboxInfo, policy: PathPolicy, command: str,
             hidden: tuple[Path, ...] = ()) -> Iterator[Confined]:
    """``/bin/sh -c command`` under ``info``'s backend for a session with ``policy``, the
    ``hidden`` paths masked like forbidden ones; a private temporary directory lives as
    long as the context."""
    masked = (*policy.forbidden, *hidden)
    if info.backend == "bwrap":
        yield Confined(_bwrap_argv(policy, masked, command), {"TMPDIR": "/tmp"})
        return
    if info.backend != "landlock":
        yield Confined([_SHELL, "-c", command])
        return
    private_tmp = tempfile.mkdtemp(prefix="zeroclaw-shell-")
    try:
        rules = landlock_rules(policy, Path(private_tmp), info.landlock_abi, hidden)
        spec = {"abi": info.landlock_abi, "rules": rules, "argv": [_SHELL, "-c", command]}
        argv = [sys.executable, "-I", "-S", str(_LAUNCHER), json.dumps(spec)]
        yield Confined(argv, {"TMPDIR": private_tmp})
    finally:
        shutil.rmtree(private_tmp, ignore_errors=True)


def _bwrap_argv(policy: PathPolicy, masked: tuple[Path, ...], command: str) -> list[str]:
    """``/`` read-only, fresh /dev, /proc and /tmp, the roots writable, forbidden masked
    (after the roots, so forbidden wins)."""
    argv = [shutil.which("bwrap") or "bwrap", "--ro-bind", "/", "/", "--dev", "/dev",
            "--proc", "/proc", "--tmpfs", "/tmp"]
    if os.path.isdir("/var/tmp"):
        argv += ["--tmpfs", "/var/tmp"]
    for root in policy.roots:
        if root.is_dir():  # an agent workspace may not exist yet
            argv += ["--bind", str(root), str(root)]
    for forbidden in masked:
        if forbidden.is_dir():
            argv += ["--tmpfs", str(forbidden), "--remount-ro", str(forbidden)]
        elif forbidden.exists():
            argv += ["--ro-bind", "/dev/null", str(forbidden)]
    return [*argv, *_BWRAP_ISOLATION, "--chdir", str(policy.cwd), "--", _SHELL, "-c", command]


def landlock_rules(policy: PathPolicy, private_tmp: Path, abi: int,
                   hidden: tuple[Path, ...] = ()) -> list[list[Any]]:
    """``[path, rights]`` rules: read (and execute) everywhere, full rights beneath the
    roots and ``private_tmp``, read-write on a few devices; never beneath a forbidden or
    hidden path."""
    everything = _ABI1_ALL | (_REFER if abi >= 2 else 0) | (_TRUNCATE if abi >= 3 else 0) \
        | (_IOCTL_DEV if abi >= 5 else 0)
    rules: list[list[Any]] = []
    forbidden = (*policy.forbidden, *hidden)
    _carve(Path("/"), _READ_RIGHTS, (*forbidden, Path("/dev")), rules)  # no raw disks
    for root in (*policy.roots, private_tmp):
        _carve(root, everything, forbidden, rules)
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
