"""Claiming the daemon's Unix socket (SPEC §4 security rules).

One daemon per socket path: a lock file beside the socket (``<socket>.lock``)
is ``flock``-ed for the daemon's whole life and holds its PID, so a second
daemon fails fast naming the owner. A socket file left by a dead daemon is
removed only when nothing answers on it. The socket is created 0600 inside a
0700 directory, and at exit it is removed only if it is still the one we bound
(same device and inode).

Runs on the main thread before the host starts (the umask change around
``bind`` is process-wide, so no other thread may be creating files then).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import socket
import stat
import struct
from dataclasses import dataclass
from pathlib import Path

from supervisor.config.protected import socket_lock_path

__all__ = [
    "MAX_SOCKET_PATH_BYTES",
    "DaemonAlreadyRunning",
    "SocketClaim",
    "SocketUnusable",
    "claim_socket",
    "peer_credentials",
]

log = logging.getLogger("zeroclaw.daemon")

MAX_SOCKET_PATH_BYTES = 106  # sun_path holds 108 bytes with its NUL
_PROBE_TIMEOUT = 1.0
_CREDS = struct.Struct("3i")


class DaemonAlreadyRunning(RuntimeError):
    """Another daemon owns the socket; ``pid`` is its PID when known."""

    def __init__(self, path: Path, pid: int | None) -> None:
        owner = f"pid {pid}" if pid else "an unknown process"
        super().__init__(f"another zeroclaw daemon ({owner}) already serves {path}")
        self.pid = pid


class SocketUnusable(RuntimeError):
    """The socket path cannot be used (too long, not a socket, no permission)."""


@dataclass(slots=True)
class SocketClaim:
    """A bound, listening socket plus the held lock; :meth:`release` undoes both."""

    path: Path
    lock_path: Path
    lock_fd: int
    sock: socket.socket
    identity: tuple[int, int]  # (st_dev, st_ino) of the socket file we bound

    def release(self) -> None:
        """Remove the socket file if it is still ours, then drop the lock."""
        self.sock.close()
        try:
            st = os.lstat(self.path)
        except FileNotFoundError:
            st = None
        if st is not None and (st.st_dev, st.st_ino) == self.identity:
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()
        elif st is not None:
            log.warning("%s was replaced by another process; left in place", self.path)
        if self.lock_fd >= 0:
            with contextlib.suppress(OSError):
                os.ftruncate(self.lock_fd, 0)
            os.close(self.lock_fd)  # drops the flock; the file stays (see module doc)
            self.lock_fd = -1


def peer_credentials(sock: socket.socket | None) -> tuple[int, int, int] | None:
    """``(pid, uid, gid)`` of the process at the other end (Linux SO_PEERCRED)."""
    if sock is None or not hasattr(socket, "SO_PEERCRED"):
        return None
    try:
        data = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CREDS.size)
    except OSError:
        return None
    pid, uid, gid = _CREDS.unpack(data)
    return pid, uid, gid


def claim_socket(path: Path, private_dir: Path | None = None) -> SocketClaim:
    """Lock, clear a stale socket, bind and listen on ``path``.

    The socket's directory is created 0700; an existing one is tightened to 0700
    when it is ``private_dir`` (the data dir) and ours, and otherwise only
    checked: an explicit ``ZEROCLAW_SOCKET`` may live in a shared directory such
    as ``/tmp``, where the socket's own 0600 mode is the protection, and a warning
    says so (sticky or not, other users can create files beside it there).
    Raises :class:`DaemonAlreadyRunning` or :class:`SocketUnusable`.
    """
    path = Path(os.path.abspath(path))
    if len(os.fsencode(path)) > MAX_SOCKET_PATH_BYTES:
        raise SocketUnusable(
            f"socket path is {len(os.fsencode(path))} bytes, over the "
            f"{MAX_SOCKET_PATH_BYTES}-byte limit of Unix sockets: set ZEROCLAW_SOCKET "
            "to a shorter path"
        )
    _prepare_dir(path.parent, private=private_dir is not None and path.parent == private_dir)
    lock_path = socket_lock_path(path)
    lock_fd = _lock(lock_path, path)
    try:
        _clear_stale(path)
        sock, identity = _bind(path)
    except BaseException:
        os.close(lock_fd)
        raise
    with contextlib.suppress(OSError):  # the pid is for messages; a full disk must not stop us
        os.ftruncate(lock_fd, 0)
        os.pwrite(lock_fd, f"{os.getpid()}\n".encode(), 0)
    return SocketClaim(path, lock_path, lock_fd, sock, identity)


def _prepare_dir(directory: Path, *, private: bool) -> None:
    try:
        if not directory.exists():
            os.makedirs(directory.parent, exist_ok=True)
            os.mkdir(directory, 0o700)
            os.chmod(directory, 0o700)  # whatever the umask
            return
        st = os.stat(directory)
    except OSError as exc:
        raise SocketUnusable(f"cannot prepare {directory}: {exc.strerror}") from None
    mode = stat.S_IMODE(st.st_mode)
    if private and st.st_uid == os.getuid() and mode != 0o700:
        os.chmod(directory, 0o700)
        log.info("tightened %s to 0700 (was %o)", directory, mode)
    elif mode & 0o077:  # sticky (/tmp) too: others can still create names beside ours
        log.warning("%s is accessible to other users (mode %o); the socket itself is 0600",
                    directory, mode)


def _lock(lock_path: Path, path: Path) -> int:
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    except OSError as exc:
        reason = "it is a symbolic link" if exc.errno == errno.ELOOP else exc.strerror
        raise SocketUnusable(f"cannot open {lock_path}: {reason}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        pid = _read_pid(fd)
        os.close(fd)
        raise DaemonAlreadyRunning(path, pid) from None
    return fd


def _read_pid(fd: int) -> int | None:
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _clear_stale(path: Path) -> None:
    """Remove a socket file nobody answers on; refuse anything else in the way."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise SocketUnusable(f"{path} exists and is not a socket; not touching it")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(_PROBE_TIMEOUT)
    try:
        probe.connect(str(path))
    except (ConnectionRefusedError, FileNotFoundError):
        log.info("removing stale socket %s", path)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        return
    except OSError as exc:
        if exc.errno == errno.EAGAIN:  # backlog full: something is alive there
            raise DaemonAlreadyRunning(path, None) from None
        raise SocketUnusable(f"cannot probe {path}: {exc.strerror or exc}") from None
    else:
        creds = peer_credentials(probe)
        raise DaemonAlreadyRunning(path, creds[0] if creds else None)
    finally:
        probe.close()


def _bind(path: Path) -> tuple[socket.socket, tuple[int, int]]:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old_umask = os.umask(0o177)  # born 0600: no window with a looser mode
    try:
        sock.bind(str(path))
    except OSError as exc:
        sock.close()
        raise SocketUnusable(f"cannot bind {path}: {exc.strerror}") from None
    finally:
        os.umask(old_umask)
    os.chmod(path, 0o600)
    sock.setblocking(False)
    st = os.lstat(path)
    return sock, (st.st_dev, st.st_ino)
