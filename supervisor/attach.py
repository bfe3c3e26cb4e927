"""``zeroclaw acp --attach``: stdio bridged byte for byte to the daemon's ``acp.sock``.

Every editor that spawns ``zeroclaw acp --attach`` shares one host: sessions
outlive the editor, show in ``zeroclaw status`` and load from any editor. When no
daemon answers, an ``--ephemeral`` one is started first (detached, logging to
``<data_dir>/daemon.log``); it exits a second after its last client leaves.

Two plain threads move the bytes (no event loop): the main thread copies the
socket to stdout, a helper thread copies stdin to the socket and half-closes it
at EOF, so the daemon can finish in-flight answers before it closes its side.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from supervisor.config import Settings

__all__ = ["run_attach"]

log = logging.getLogger("zeroclaw.attach")

DAEMON_START_SECS = 15.0
_CHUNK = 256 * 1024


def run_attach(settings: Settings) -> int:
    from supervisor.daemon import acp_socket_path

    path = acp_socket_path(settings)
    sock = _connect(path)
    if sock is None:
        _start_daemon(settings)
        sock = _wait_for(path, DAEMON_START_SECS)
    if sock is None:
        log.error("no zeroclaw daemon answers on %s (see %s)", path, _daemon_log(settings))
        return 1
    _bridge(sock)
    return 0


def _connect(path: Path) -> socket.socket | None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(str(path))
    except OSError:
        sock.close()
        return None
    return sock


def _wait_for(path: Path, timeout: float) -> socket.socket | None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        sock = _connect(path)
        if sock is not None:
            return sock
        time.sleep(0.02)  # the daemon is starting: a bounded poll on its socket
    return None


def _daemon_log(settings: Settings) -> Path:
    return settings.data_dir / "daemon.log"


def _start_daemon(settings: Settings) -> None:
    """Start ``zeroclaw daemon --ephemeral`` in its own session, detached from us."""
    settings.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    argv = [sys.executable, "-P", "-m", "supervisor.cli", "daemon", "--ephemeral",
            "--config-dir", str(settings.config_dir)]
    with open(_daemon_log(settings), "ab") as daemon_log:
        subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=daemon_log, start_new_session=True, close_fds=True)
    log.info("started an ephemeral zeroclaw daemon (log: %s)", _daemon_log(settings))


def _bridge(sock: socket.socket) -> None:
    stdin_fd, stdout_fd = sys.stdin.fileno(), sys.stdout.fileno()
    threading.Thread(target=_copy_in, args=(stdin_fd, sock), daemon=True).start()
    with contextlib.suppress(OSError):
        while data := sock.recv(_CHUNK):
            _write_all(stdout_fd, data)
    sock.close()


def _copy_in(stdin_fd: int, sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        while data := os.read(stdin_fd, _CHUNK):
            sock.sendall(data)
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_WR)  # EOF for the daemon; answers still come back


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
