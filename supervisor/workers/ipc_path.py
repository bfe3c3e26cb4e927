"""A private ``ipc://`` path for one host process's worker ROUTER.

Many host processes (every ``zeroclaw acp`` an editor starts) share one data
dir, and a second zmq bind on an ipc path silently steals it from the first.
So each host binds its own name, ``<run_dir>/w-<pid>-<random>.sock``, and
holds an ``flock`` on the ``.lock`` file beside it while it lives; a host
that starts later removes the socket and lock files nobody holds any more.
Unix socket paths must stay under 107 bytes: when ``run_dir`` is too deep (or
unusable), a short private directory from ``tempfile.mkdtemp`` is used.

Runs on the host's loop thread, once at start and once at close.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import secrets
import tempfile
from dataclasses import dataclass
from pathlib import Path

__all__ = ["MAX_IPC_PATH_BYTES", "IpcClaim", "claim_ipc_path"]

log = logging.getLogger("zeroclaw.workers")

MAX_IPC_PATH_BYTES = 106  # sun_path is 108 bytes with its NUL; stay clear of the edge
_ATTEMPTS = 5


@dataclass(slots=True)
class IpcClaim:
    """A locked, unused socket path; :meth:`release` removes it (and a private dir)."""

    path: Path
    lock_path: Path
    lock_fd: int
    private_dir: Path | None = None

    def release(self) -> None:
        for path in (self.path, self.lock_path):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        if self.lock_fd >= 0:
            os.close(self.lock_fd)  # drops the flock
            self.lock_fd = -1
        if self.private_dir is not None:
            with contextlib.suppress(OSError):
                self.private_dir.rmdir()


def claim_ipc_path(run_dir: Path) -> IpcClaim:
    """Lock and return a fresh socket path under ``run_dir`` (or a short private dir)."""
    usable = _prepare(run_dir)
    if usable:
        _sweep_stale(run_dir)
    for _ in range(_ATTEMPTS):
        name = f"w-{os.getpid()}-{secrets.token_hex(4)}"
        if usable and _fits(run_dir / f"{name}.sock"):
            claim = _try_claim(run_dir, name, private_dir=None)
        else:
            private = _short_private_dir()
            claim = _try_claim(private, "w", private_dir=private)
        if claim is not None:
            return claim
    raise RuntimeError(f"could not claim a worker socket path under {run_dir}")


def _fits(path: Path) -> bool:
    return len(os.fsencode(path)) <= MAX_IPC_PATH_BYTES


def _prepare(run_dir: Path) -> bool:
    """Create ``run_dir`` with mode 0700; False when it cannot be used."""
    try:
        run_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        if run_dir.stat().st_uid == os.getuid():
            run_dir.chmod(0o700)
        return os.access(run_dir, os.W_OK | os.X_OK)
    except OSError as exc:
        log.warning("run dir %s is not usable (%s); using a private temporary dir", run_dir, exc)
        return False


def _short_private_dir() -> Path:
    private = Path(tempfile.mkdtemp(prefix="zc-"))
    if _fits(private / "w.sock"):
        return private
    private.rmdir()
    return Path(tempfile.mkdtemp(prefix="zc-", dir="/tmp"))


def _try_claim(directory: Path, name: str, *, private_dir: Path | None) -> IpcClaim | None:
    lock_path = directory / f"{name}.lock"
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if os.fstat(fd).st_ino != os.stat(lock_path).st_ino:
            raise FileNotFoundError(lock_path)  # a sweeper removed it under us: try again
    except (BlockingIOError, FileNotFoundError):
        os.close(fd)
        return None
    with contextlib.suppress(OSError):  # the pid is for people; a full disk must not stop us
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
    path = directory / f"{name}.sock"
    with contextlib.suppress(FileNotFoundError):
        path.unlink()  # stale: the lock says nobody owns it
    return IpcClaim(path=path, lock_path=lock_path, lock_fd=fd, private_dir=private_dir)


def _sweep_stale(run_dir: Path) -> None:
    """Remove socket and lock files left by hosts that died without cleaning up."""
    for lock_path in run_dir.glob("w-*.lock"):
        try:
            fd = os.open(lock_path, os.O_RDWR | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue  # a live host holds it
        for path in (lock_path.with_suffix(".sock"), lock_path):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        os.close(fd)
        log.info("removed stale worker socket %s", lock_path.with_suffix(".sock"))
