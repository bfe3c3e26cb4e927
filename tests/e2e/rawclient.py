"""A deliberately small NDJSON client over a ``zeroclaw acp`` subprocess's pipes.

For what no well-behaved client sends (broken JSON, huge lines, odd ids) and for
methods outside the ACP schema. The test's thread writes to stdin; a reader
thread splits stdout into lines and parses each, so "stdout carries only
JSON-RPC frames" can be checked over the whole run.
"""

from __future__ import annotations

import contextlib
import json
import queue
import signal
import subprocess
import threading
import uuid
from pathlib import Path
from typing import Any

import psutil

from .procs import descendants, host_argv, host_env, reap_leaks, tail

__all__ = ["RawError", "RawHost"]

FRAME_TIMEOUT = 10.0


class RawError(Exception):
    """An error response: ``code``, ``message`` and the whole frame."""

    def __init__(self, frame: dict[str, Any]) -> None:
        error = frame.get("error") or {}
        self.code = error.get("code")
        self.message = str(error.get("message"))
        self.frame = frame
        super().__init__(f"{self.code}: {self.message}")


class RawHost:
    """One ``zeroclaw acp`` process, spoken to byte by byte."""

    def __init__(self, config_dir: Path | None, stderr_path: Path, *extra_args: str,
                 env: dict[str, str] | None = None) -> None:
        """``config_dir`` None: no ``--config-dir`` flag (the env or the default decides)."""
        self.config_dir = config_dir
        self.stderr_path = stderr_path
        self._stderr = stderr_path.open("ab")
        self.proc = subprocess.Popen(
            host_argv(config_dir, *extra_args), stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=self._stderr, env=env or host_env(), bufsize=0,
        )
        self.stdout_lines: list[bytes] = []
        self.unparsable: list[bytes] = []
        self.sent: list[bytes] = []
        self.notifications: list[dict[str, Any]] = []
        self.host_requests: list[dict[str, Any]] = []
        self.children_snapshot: list[psutil.Process] = []
        self.problems: list[str] = []
        self.killed = False
        self.closed = False
        self._frames: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self._next_id = 1000
        self._reader = threading.Thread(target=self._read_stdout, daemon=True)
        self._reader.start()

    @property
    def pid(self) -> int:
        return self.proc.pid

    # -- reader thread ---------------------------------------------------------

    def _read_stdout(self) -> None:
        assert self.proc.stdout is not None
        for line in iter(self.proc.stdout.readline, b""):
            self.stdout_lines.append(line)
            try:
                frame = json.loads(line)
            except ValueError:
                self.unparsable.append(line)
                continue
            if isinstance(frame, dict) and frame.get("jsonrpc") == "2.0":
                self._frames.put(frame)
            else:
                self.unparsable.append(line)
        self._frames.put(None)

    # -- sending ---------------------------------------------------------------

    def send_bytes(self, data: bytes) -> None:
        assert self.proc.stdin is not None
        self.sent.append(data if len(data) < 2000 else data[:2000] + b"...(truncated)")
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def send(self, frame: Any) -> None:
        self.send_bytes(json.dumps(frame).encode() + b"\n")

    def new_id(self) -> int:
        self._next_id += 1
        return self._next_id

    # -- receiving -------------------------------------------------------------

    def next_frame(self, timeout: float = FRAME_TIMEOUT) -> dict[str, Any]:
        """The next frame from the host (any kind); fails on timeout or EOF."""
        try:
            frame = self._frames.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"no frame from the host within {timeout}s") from None
        if frame is None:
            self._frames.put(None)
            raise AssertionError(f"host closed stdout (exit code {self.proc.poll()})")
        return frame

    def next_response(self, timeout: float = FRAME_TIMEOUT) -> dict[str, Any]:
        """The next response frame; notifications and host requests are kept aside."""
        while True:
            frame = self.next_frame(timeout)
            if "method" not in frame:
                return frame
            if "id" in frame:
                self.host_requests.append(frame)
            else:
                self.notifications.append(frame)

    def request(self, method: str, params: Any = None, *, req_id: Any = None,
                timeout: float = FRAME_TIMEOUT) -> dict[str, Any]:
        """Send a request, return its whole response frame (which must carry its id)."""
        req_id = self.new_id() if req_id is None else req_id
        frame: dict[str, Any] = {"jsonrpc": "2.0", "id": req_id, "method": method}
        if params is not None:
            frame["params"] = params
        self.send(frame)
        response = self.next_response(timeout)
        assert response.get("id") == req_id, f"expected the answer to {req_id!r}, got {response}"
        return response

    def call(self, method: str, params: Any = None, timeout: float = FRAME_TIMEOUT) -> Any:
        """Send a request; return its result or raise :class:`RawError`."""
        response = self.request(method, params, timeout=timeout)
        if "error" in response:
            raise RawError(response)
        return response["result"]

    def initialize(self) -> dict[str, Any]:
        result: dict[str, Any] = self.call("initialize", {"protocolVersion": 1})
        return result

    def new_session(self, cwd: Path) -> str:
        return str(self.call("session/new", {"cwd": str(cwd), "mcpServers": []})["sessionId"])

    def assert_alive(self, cwd: Path) -> None:
        """A normal request is still served (after init: a real ``session/new``)."""
        session_id = self.new_session(cwd)
        assert uuid.UUID(session_id)

    # -- lifecycle ---------------------------------------------------------------

    def kill9(self) -> None:
        self.children_snapshot = descendants(self.pid)
        self.killed = True
        self.proc.send_signal(signal.SIGKILL)

    def close(self, timeout: float = 10.0) -> None:
        """EOF on stdin; the host must exit 0 and leave no process behind (idempotent)."""
        if self.closed:
            return
        self.closed = True
        if not self.killed:
            self.children_snapshot = descendants(self.pid)
        if self.proc.stdin is not None:
            with contextlib.suppress(BrokenPipeError):
                self.proc.stdin.close()
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
            self.problems.append(f"host pid {self.pid} did not exit within {timeout}s of EOF")
        if not self.killed and code != 0:
            self.problems.append(f"host pid {self.pid} exited with {code} on EOF")
        self._reader.join(timeout)
        self._stderr.close()
        leaks = reap_leaks(self.children_snapshot, 15.0)
        if leaks:
            self.problems.append(f"processes left behind by host {self.pid}: {leaks}")
        if self.unparsable:
            self.problems.append(f"non-JSON-RPC lines on stdout: {self.unparsable[:5]!r}")

    def diagnostics(self) -> str:
        sent = "\n".join(f"-> {s[:600]!r}" for s in self.sent[-40:])
        got = "\n".join(f"<- {s[:600]!r}" for s in self.stdout_lines[-40:])
        return (
            f"host pid {self.pid} config {self.config_dir}\n--- sent ---\n{sent}\n"
            f"--- received ---\n{got}\n--- stderr tail ---\n{tail(self.stderr_path)}"
        )
