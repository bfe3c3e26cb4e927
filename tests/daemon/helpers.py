"""Harness for daemon tests: a real ``zeroclaw daemon`` process and a blocking NDJSON client.

Config dirs are short ``/tmp`` directories, since a Unix socket path must stay
under 107 bytes. Every wait is bounded; the client reads frames with deadlines.
Runs on the test's main thread.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from tests.e2e.procs import alive, descendants, host_env, reap_leaks, tail

__all__ = [
    "DaemonProc",
    "RpcClient",
    "RpcFailure",
    "short_dir",
    "until",
    "wait_session_idle",
    "zeroclaw_argv",
]

_ENTRY_POINT = "import sys; from supervisor.cli.main import main; sys.exit(main())"
FRAME_TIMEOUT = 15.0


def zeroclaw_argv(*args: str) -> list[str]:
    return [sys.executable, "-c", _ENTRY_POINT, *args]


def until(check: Callable[[], Any], what: str, timeout: float = 10.0) -> Any:
    """``check()``'s first truthy answer, polled every 50 ms; fails after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not (found := check()):
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.05)
    return found


def short_dir() -> Path:
    return Path(tempfile.mkdtemp(prefix="zc", dir="/tmp"))


class RpcFailure(Exception):
    def __init__(self, error: dict[str, Any]) -> None:
        self.code = error.get("code")
        self.message = str(error.get("message"))
        super().__init__(f"{self.code}: {self.message}")


class RpcClient:
    """A blocking client on ``daemon.sock``; notifications are kept in order."""

    def __init__(self, path: Path, *, initialize: bool = True) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(FRAME_TIMEOUT)
        self.sock.connect(str(path))
        self.notifications: list[dict[str, Any]] = []
        self.frames: list[dict[str, Any]] = []  # everything, in arrival order
        self._buffer = b""
        self._next_id = 1
        self._sent_at: dict[int, int] = {}  # a request's id: len(frames) when it was sent
        if initialize:
            self.request("initialize", {"protocolVersion": 1})

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> RpcClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def send(self, method: str, params: Any = None, *, notify: bool = False) -> int | None:
        frame: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            frame["params"] = params
        request_id = None
        if not notify:
            request_id = self._next_id
            self._next_id += 1
            frame["id"] = request_id
            self._sent_at[request_id] = len(self.frames)
        self._write(json.dumps(frame))
        return request_id

    def _write(self, text: str) -> None:
        """Send one message (one line here; a transport of its own overrides this)."""
        self.sock.sendall(text.encode() + b"\n")

    def read_frame(self, timeout: float = FRAME_TIMEOUT) -> dict[str, Any]:
        frame: dict[str, Any] = json.loads(self._read_message(timeout))
        self.frames.append(frame)
        if "method" in frame and "id" not in frame:
            self.notifications.append(frame)
        return frame

    def _read_message(self, timeout: float) -> bytes | str:
        """The next message's text (a line here; a transport of its own overrides this)."""
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("no frame from the daemon")
            self.sock.settimeout(remaining)
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("the daemon closed the connection")
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line

    def wait_response(self, request_id: int, timeout: float = FRAME_TIMEOUT) -> dict[str, Any]:
        """The answer to ``request_id``: one read since it was sent (while waiting for
        another's: two requests in flight may be answered in either order), else the
        next. An answer to a line written by hand with the same id, before, is not it."""
        for frame in self.frames[self._sent_at.pop(request_id, len(self.frames)):]:
            if frame.get("id") == request_id and "method" not in frame:
                return frame
        deadline = time.monotonic() + timeout
        while True:
            frame = self.read_frame(max(0.01, deadline - time.monotonic()))
            if frame.get("id") == request_id and "method" not in frame:
                return frame

    def wait_update(self, kind: str, timeout: float = FRAME_TIMEOUT) -> dict[str, Any]:
        """The next ``session/update`` of type ``kind`` (earlier ones stay recorded)."""
        deadline = time.monotonic() + timeout
        while True:
            frame = self.read_frame(max(0.01, deadline - time.monotonic()))
            if frame.get("method") == "session/update" and frame["params"].get("type") == kind:
                return frame["params"]

    def request(self, method: str, params: Any = None, timeout: float = FRAME_TIMEOUT) -> Any:
        request_id = self.send(method, params)
        assert request_id is not None
        response = self.wait_response(request_id, timeout)
        if "error" in response:
            raise RpcFailure(response["error"])
        return response["result"]

    def updates(self) -> list[dict[str, Any]]:
        return [n["params"] for n in self.notifications if n.get("method") == "session/update"]


def wait_session_idle(client: RpcClient, sid: str, turns: int,
                      timeout: float = FRAME_TIMEOUT) -> dict[str, Any]:
    """Poll ``status`` until ``sid`` is live, idle and has ``turns`` turns; its entry."""
    deadline = time.monotonic() + timeout
    while True:
        entries = [s for s in client.request("status")["sessions"] if s["sessionId"] == sid]
        if entries and entries[0]["state"] == "idle" and entries[0]["turns"] == turns:
            return entries[0]
        assert time.monotonic() < deadline, f"session {sid} not idle with {turns} turns: {entries}"
        time.sleep(0.05)


def work_dir(config_dir: Path) -> Path:
    """``<config_dir>/work``, made and canonical: a session cwd beside the host's files
    (the config dir itself is one of them, refused as a cwd)."""
    path = config_dir / "work"
    path.mkdir(parents=True, exist_ok=True)
    return Path(os.path.realpath(path))


class DaemonProc:
    """One ``zeroclaw daemon`` process with its own config dir."""

    def __init__(self, config_dir: Path | None = None, *args: str,
                 env_extra: dict[str, str] | None = None,
                 preexec_fn: Callable[[], None] | None = None) -> None:
        """``preexec_fn`` runs in the child before the daemon starts (limits, a
        process group of its own)."""
        self.config_dir = config_dir or short_dir()
        self.owns_dir = config_dir is None
        self.env = host_env(env_extra)
        self.socket_path = Path(self.env.get("ZEROCLAW_SOCKET")
                                or self.config_dir / "data" / "daemon.sock")
        self.stderr_path = self.config_dir / f"daemon-{time.monotonic_ns()}.stderr"
        self._stderr = self.stderr_path.open("ab")
        self.proc = subprocess.Popen(
            zeroclaw_argv("daemon", "--config-dir", str(self.config_dir), "--log-level", "debug",
                          *args),
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=self._stderr,
            env=self.env, preexec_fn=preexec_fn,
        )
        self.children: list[psutil.Process] = []

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def work_dir(self) -> Path:
        """A session cwd of this daemon's (:func:`work_dir`)."""
        return work_dir(self.config_dir)

    def stderr(self) -> str:
        return tail(self.stderr_path)

    def wait_listening(self, timeout: float = 20.0, *, probe: bool = True) -> None:
        """Until a connection to the socket succeeds (the daemon is accepting).

        ``probe=False`` waits for the daemon's "listening" log line instead, so that
        no connection is made (an ephemeral daemon counts every connection).
        """
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"daemon exited {self.proc.returncode}:\n{self.stderr()}")
            if not probe:
                if " listening on " in self.stderr():
                    return
                time.sleep(0.02)
                continue
            attempt = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                attempt.connect(str(self.socket_path))
                return
            except OSError:
                time.sleep(0.02)
            finally:
                attempt.close()
        raise AssertionError(f"daemon not listening after {timeout} s:\n{self.stderr()}")

    def client(self, **kwargs: Any) -> RpcClient:
        return RpcClient(self.socket_path, **kwargs)

    def snapshot_children(self) -> None:
        self.children = descendants(self.pid)

    def terminate(self, timeout: float = 20.0) -> int:
        """SIGTERM and wait; the exit code."""
        if self.proc.poll() is None:
            self.snapshot_children()
            self.proc.send_signal(signal.SIGTERM)
        return self.wait(timeout)

    def wait(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"daemon still running after {timeout} s:\n{self.stderr()}") from None

    def cleanup(self) -> list[str]:
        """Kill if still running; the descriptions of processes left behind."""
        if self.proc.poll() is None:
            self.snapshot_children()
            self.proc.kill()
            self.proc.wait(10)
        leaks = reap_leaks([p for p in self.children if alive(p)], timeout=10)
        self._stderr.close()
        if self.owns_dir:
            shutil.rmtree(self.config_dir, ignore_errors=True)
        return leaks

