"""Process plumbing shared by the end-to-end harnesses.

How a test starts ``zeroclaw acp`` (the same code path as the ``zeroclaw``
console script, from this source tree), and how it checks that a host leaves
no process behind. Runs on the test's main thread.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Iterable, Mapping
from pathlib import Path

import psutil

__all__ = [
    "REPO_ROOT",
    "alive",
    "descendants",
    "describe",
    "host_argv",
    "host_env",
    "reap_leaks",
    "tail",
    "write_config",
]

REPO_ROOT = Path(__file__).resolve().parents[2]

# Exactly what the ``zeroclaw = supervisor.cli.main:main`` console script runs.
_ENTRY_POINT = "import sys; from supervisor.cli.main import main; sys.exit(main())"


def host_argv(config_dir: Path | None, *extra: str) -> list[str]:
    """``zeroclaw acp [--config-dir DIR] [extra...]`` run by this interpreter."""
    flag = ["--config-dir", str(config_dir)] if config_dir is not None else []
    return [sys.executable, "-c", _ENTRY_POINT, "acp", *flag, *extra]


def host_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The test's environment without any ``ZEROCLAW_*`` leaking in, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ZEROCLAW_")}
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p
    )
    env.update(extra or {})
    return env


def write_config(config_dir: Path, text: str) -> Path:
    """Write ``<config_dir>/config.toml``."""
    config_dir.mkdir(parents=True, exist_ok=True)
    path = config_dir / "config.toml"
    path.write_text(text, encoding="utf-8")
    return path


def descendants(pid: int) -> list[psutil.Process]:
    """Every live descendant of ``pid`` (empty if ``pid`` is gone)."""
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def alive(proc: psutil.Process) -> bool:
    """True while ``proc`` runs; a zombie (dead, not yet reaped) counts as gone."""
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def describe(proc: psutil.Process) -> str:
    try:
        return f"pid {proc.pid} {' '.join(proc.cmdline())[:200]}"
    except psutil.Error:
        return f"pid {proc.pid}"


def reap_leaks(procs: Iterable[psutil.Process], timeout: float) -> list[str]:
    """Wait up to ``timeout`` for ``procs`` to exit; kill and describe the ones that did not."""
    pending = list(procs)
    deadline = time.monotonic() + timeout
    while pending and time.monotonic() < deadline:
        pending = [p for p in pending if alive(p)]
        if pending:
            time.sleep(0.05)
    leaks = [describe(p) for p in pending if alive(p)]
    for proc in pending:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    return leaks


def tail(path: Path, limit: int = 6000) -> str:
    """The last ``limit`` characters of a log file, for failure reports."""
    try:
        data = path.read_bytes()
    except OSError:
        return "(no stderr file)"
    return data[-limit:].decode("utf-8", "replace")
