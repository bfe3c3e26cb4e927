"""Which OS sandbox confines shell commands here: bubblewrap, Landlock, or none.

:func:`detect` runs a real probe once per process: ``bwrap`` must run a
trial command with the isolation flags the shell uses (user namespaces may be
disabled, or seccomp may forbid them), Landlock must answer its ABI version. It is
called on the host's loop thread at startup (the ``initialize`` answer and
``status`` show the result) and, lazily, on a session actor's thread in a worker,
which is told by the host which backend to use (:func:`worker_sandbox_settings`).
The confinement itself is :mod:`actors.worker.tools.sandbox`. Imports little: it is on the
path to ``zeroclaw acp``'s first answer.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from actors.worker.protected import NOTHING_PROTECTED, PROTECTED_VARIABLE, ProtectedPaths

__all__ = [
    "BWRAP_ISOLATION",
    "SANDBOX_CHOICES",
    "SandboxInfo",
    "detect",
    "detect_soon",
    "worker_sandbox_environment",
    "worker_sandbox_settings",
]

#: The values of ``[autonomy] sandbox``.
SANDBOX_CHOICES = ("auto", "bwrap", "landlock", "none")
#: How the host tells its workers the backend it chose and whether unconfined runs are
#: allowed (its own paths go in :data:`~actors.worker.protected.PROTECTED_VARIABLE`,
#: for every tool at once), and where the state dirs (HOME) of the tenants' agent
#: processes live.
SANDBOX_VARIABLE = "ZEROCLAW_SHELL_SANDBOX"
UNSANDBOXED_VARIABLE = "ZEROCLAW_ALLOW_UNSANDBOXED_SHELL"
AGENT_STATE_VARIABLE = "ZEROCLAW_AGENT_STATE"
_PROBE_TIMEOUT = 10.0
_SHELL = "/bin/sh"
_CREATE_RULESET, _CREATE_RULESET_VERSION = 444, 1
_detect_lock = threading.Lock()
_detected: dict[str, SandboxInfo] = {}
#: The isolation flags every bwrap run gets (the probe checks they work here).
BWRAP_ISOLATION = ("--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
                    "--die-with-parent", "--new-session", "--cap-drop", "ALL")


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


def detect(requested: str = "auto") -> SandboxInfo:
    """The backend ``requested`` resolves to here: ``auto`` prefers bubblewrap (it adds a
    PID namespace), then Landlock; a named backend that does not work gives ``none``.
    Probed once per process; a caller during the probe waits for its result."""
    with _detect_lock:
        found = _detected.get(requested)
        if found is None:
            found = _detected[requested] = _probe(requested)
        return found


def detect_soon(requested: str) -> None:
    """Start :func:`detect` on a thread, so that the probe overlaps the rest of startup
    (``zeroclaw acp`` calls it before its heavier imports)."""
    threading.Thread(target=detect, args=(requested,), name="sandbox-detect",
                     daemon=True).start()


def _probe(requested: str) -> SandboxInfo:
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
    import shutil

    binary = shutil.which("bwrap")
    if binary is None:
        return "", "bwrap is not installed (Debian/Ubuntu package: bubblewrap)"
    trial = [binary, *BWRAP_ISOLATION, "--ro-bind", "/", "/", "--dev", "/dev",
             "--proc", "/proc", "--", _SHELL, "-c", "exit 0"]
    try:  # both at once: this is on the path to the first answer
        with _quietly([binary, "--version"]) as asked, _quietly(trial) as tried:
            version, _ = asked.communicate(timeout=_PROBE_TIMEOUT)
            _, trial_error = tried.communicate(timeout=_PROBE_TIMEOUT)
    except (OSError, subprocess.SubprocessError) as exc:
        return "", f"bwrap cannot run: {exc}"
    if tried.returncode != 0:
        return "", f"bwrap cannot create its namespaces here: {trial_error.strip()[:200]}"
    return version.strip() or "bubblewrap", ""


def _quietly(argv: list[str]) -> subprocess.Popen[str]:
    return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env={"PATH": os.defpath}, text=True)


def _probe_landlock() -> tuple[int, str]:
    """(ABI version, "") when the kernel enforces Landlock, else (0, why)."""
    if not sys.platform.startswith("linux"):
        return 0, "landlock needs Linux"
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    abi = libc.syscall(_CREATE_RULESET, None, ctypes.c_size_t(0), _CREATE_RULESET_VERSION)
    if abi < 1:
        return 0, f"landlock is not enabled in this kernel ({os.strerror(ctypes.get_errno())})"
    return int(abi), ""


# --- the worker's view ----------------------------------------------------------------------


def worker_sandbox_environment(info: SandboxInfo, allow_unsandboxed: bool,
                               protected: ProtectedPaths = NOTHING_PROTECTED,
                               agent_state: Path | None = None) -> dict[str, str]:
    """The variables the host gives its workers: the backend it resolved, the switch, the
    host's own paths (refused to every session and every tool, one list), and the
    agents' state dirs."""
    return {SANDBOX_VARIABLE: info.backend if info.confines else "none",
            UNSANDBOXED_VARIABLE: "1" if allow_unsandboxed else "0",
            PROTECTED_VARIABLE: protected.to_env(),
            AGENT_STATE_VARIABLE: str(agent_state or "")}


def worker_sandbox_settings(env: Mapping[str, str] | None = None) -> tuple[SandboxInfo, bool]:
    """The sandbox this process's commands use (``auto`` when the host said nothing) and
    whether running them unconfined is allowed (never for a tenant's session)."""
    env = os.environ if env is None else env
    requested = env.get(SANDBOX_VARIABLE) or "auto"
    return detect(requested), env.get(UNSANDBOXED_VARIABLE) == "1"
