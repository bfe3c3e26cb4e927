"""``zeroclaw acp --attach``: stdio bridged byte for byte to the daemon's ``acp.sock``.

Every editor that spawns ``zeroclaw acp --attach`` shares one host: sessions
outlive the editor, show in ``zeroclaw status`` and load from any editor. When no
daemon answers, an ``--ephemeral`` one is started first (detached, logging to
``<data_dir>/daemon.log``); it exits a second after its last client leaves.

Two plain threads move the bytes (no event loop): the main thread copies the
socket to stdout, a helper thread copies stdin to the socket and half-closes it
at EOF, so the daemon can finish in-flight answers before it closes its side.
Both also read the line structure (never changing a byte) to know which of the
editor's requests are still unanswered: if the daemon goes away first, each of
those gets a -32603 answer, the cause goes to stderr and the exit status is 1,
so the editor sees a failure rather than a silent end.
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
from collections.abc import Callable, Hashable
from pathlib import Path
from typing import Any

import orjson

from ipc.errors import InternalError
from supervisor.config import Settings

__all__ = ["run_attach"]

log = logging.getLogger("zeroclaw.attach")

DAEMON_START_SECS = 15.0
_CHUNK = 256 * 1024
LOST = InternalError("the zeroclaw daemon went away before answering").to_error()


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
    unanswered = _bridge(sock)
    if unanswered is None:
        return 0
    log.error("the zeroclaw daemon on %s closed the connection (%d request(s) unanswered; "
              "see %s)", path, unanswered, _daemon_log(settings))
    return 1


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


class Inflight:
    """The editor's requests the daemon has not answered yet (both threads use it)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ids: dict[Hashable, Any] = {}
        self.input_ended = False  # the editor closed stdin (set by the stdin thread)

    def sent(self, line: bytes) -> None:
        frame = _frame(line)
        if frame is not None and isinstance(frame.get("method"), str) and "id" in frame:
            with self._lock:
                self._ids[_id_key(frame["id"])] = frame["id"]

    def received(self, line: bytes) -> None:
        if b'"id"' not in line:
            return  # a notification: most of the traffic, not parsed
        frame = _frame(line)
        if frame is not None and "method" not in frame and "id" in frame:
            with self._lock:
                self._ids.pop(_id_key(frame["id"]), None)

    def unanswered(self) -> list[Any]:
        with self._lock:
            return list(self._ids.values())


def _frame(line: bytes) -> dict[str, Any] | None:
    try:
        frame = orjson.loads(line)
    except orjson.JSONDecodeError:
        return None
    return frame if isinstance(frame, dict) else None


def _id_key(value: Any) -> Hashable:
    return (type(value).__name__, value if isinstance(value, (str, int)) else repr(value))


class LineSplitter:
    """Feeds each complete line of a byte stream to ``on_line``; keeps the partial tail."""

    def __init__(self, on_line: Callable[[bytes], None]) -> None:
        self._on_line = on_line
        self._tail = b""

    def feed(self, data: bytes) -> None:
        if b"\n" not in data:
            self._tail += data
            return
        lines = (self._tail + data).split(b"\n")
        self._tail = lines.pop()
        for line in lines:
            if line.strip():
                self._on_line(line)


def _bridge(sock: socket.socket) -> int | None:
    """Copy both ways until the daemon closes; None when that was the normal end
    (the editor closed stdin and every request was answered), else how many
    requests were left unanswered (each answered -32603 here)."""
    stdin_fd, stdout_fd = sys.stdin.fileno(), sys.stdout.fileno()
    inflight = Inflight()
    threading.Thread(target=_copy_in, args=(stdin_fd, sock, inflight), daemon=True).start()
    replies = LineSplitter(inflight.received)
    with contextlib.suppress(OSError):
        while data := sock.recv(_CHUNK):
            replies.feed(data)
            _write_all(stdout_fd, data)
    sock.close()
    pending = inflight.unanswered()
    if inflight.input_ended and not pending:
        return None
    with contextlib.suppress(OSError):
        for request_id in pending:
            _write_all(stdout_fd, orjson.dumps(
                {"jsonrpc": "2.0", "id": request_id, "error": LOST}) + b"\n")
    return len(pending)


def _copy_in(stdin_fd: int, sock: socket.socket, inflight: Inflight) -> None:
    requests = LineSplitter(inflight.sent)
    with contextlib.suppress(OSError):
        while data := os.read(stdin_fd, _CHUNK):
            requests.feed(data)
            sock.sendall(data)
    inflight.input_ended = True
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_WR)  # EOF for the daemon; answers still come back


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
