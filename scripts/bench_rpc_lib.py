"""NDJSON JSON-RPC clients for ``scripts/bench`` and ``scripts/load``.

- :class:`RpcPeer`: asyncio, many requests in flight, over a child process's
  stdin/stdout or a Unix socket connection. It runs on the caller's event loop
  thread: one reader task per peer resolves the futures of the requests.
- :class:`NdjsonClient`: blocking, one request at a time on a Unix socket. It
  runs on the calling thread (``scripts/load`` gives each client its own).

A server's request to the client is declined (a ``session/request_permission``
is answered ``cancelled``, anything else -32601); notifications are counted by
:class:`RpcPeer` and handed to :meth:`NdjsonClient.on_notification`.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

__all__ = ["NdjsonClient", "RpcFailure", "RpcPeer", "percentile", "wait_listening"]

FRAME_LIMIT = 32 * 1024 * 1024
REQUEST_TIMEOUT = 60.0


class RpcFailure(Exception):
    """A request that failed: an error response, a timeout, or a dead server."""


def percentile(samples: list[float], fraction: float) -> float:
    """The sample at ``fraction`` (0..1) of the sorted samples; NaN when there are none."""
    if not samples:
        return float("nan")
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def wait_listening(proc: subprocess.Popen[bytes], path: Path, what: str,
                   details: Callable[[], str] = str, timeout: float = 30.0) -> None:
    """Wait until a connection to ``path`` succeeds; RuntimeError naming ``what`` (plus
    ``details()``, e.g. its stderr) when ``proc`` exits first or the time runs out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited {proc.returncode}\n{details()}")
        with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX) as probe:
            probe.connect(str(path))
            return
        time.sleep(0.02)
    raise RuntimeError(f"{what} not listening after {timeout} s\n{details()}")


@dataclass
class RpcPeer:
    """A server spoken to with NDJSON JSON-RPC: a child's stdio or a Unix socket."""

    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    process: asyncio.subprocess.Process | None = None  # None: a socket connection
    stderr_path: Path | None = None
    notifications: int = 0
    unparsable: int = 0
    _pending: dict[int, asyncio.Future[Any]] = field(default_factory=dict)
    _ids: itertools.count[int] = field(default_factory=itertools.count)
    _reader_task: asyncio.Task[None] | None = None

    @classmethod
    async def spawn(cls, argv: list[str], workdir: Path, env: dict[str, str] | None) -> RpcPeer:
        """Start ``argv`` in ``workdir`` (its stderr in a file there) and speak over its stdio."""
        stderr_path = workdir / "server-stderr.log"
        with stderr_path.open("wb") as stderr_file:
            process = await asyncio.create_subprocess_exec(
                *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                stderr=stderr_file, env=env, cwd=workdir, limit=FRAME_LIMIT,
            )
        assert process.stdout is not None and process.stdin is not None
        return cls(process.stdout, process.stdin, process, stderr_path)._started()

    @classmethod
    async def connect(cls, path: Path) -> RpcPeer:
        """A new connection to the Unix socket at ``path``."""
        reader, writer = await asyncio.open_unix_connection(str(path), limit=FRAME_LIMIT)
        return cls(reader, writer)._started()

    def _started(self) -> RpcPeer:
        self._reader_task = asyncio.create_task(self._read_frames())
        return self

    async def request(self, method: str, params: dict[str, Any]) -> Any:
        """Send one request and return its result; raise RpcFailure otherwise."""
        request_id = next(self._ids)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = future
        frame = {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}
        try:
            await self._send(frame)
            return await asyncio.wait_for(future, REQUEST_TIMEOUT)
        except TimeoutError:
            raise RpcFailure(f"{method}: no answer in {REQUEST_TIMEOUT:.0f} s") from None
        finally:
            self._pending.pop(request_id, None)

    async def close(self, timeout: float = 10.0) -> None:
        """Close our side (EOF on a child's stdin); a child that lingers gets SIGKILL."""
        if not self.writer.is_closing():
            self.writer.close()
        if self.process is not None:
            try:
                await asyncio.wait_for(self.process.wait(), timeout)
            except TimeoutError:
                self.process.kill()
                await self.process.wait()
        else:
            with contextlib.suppress(ConnectionError):
                await self.writer.wait_closed()
        if self._reader_task is not None:
            self._reader_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader_task

    def stderr_tail(self, lines: int = 5) -> str:
        """The last lines the child wrote to stderr ("" for a socket connection)."""
        if self.stderr_path is None:
            return ""
        text = self.stderr_path.read_text(encoding="utf-8", errors="replace")
        return "\n".join(text.splitlines()[-lines:])

    async def _send(self, frame: dict[str, Any]) -> None:
        if self.writer.is_closing():
            raise RpcFailure("the connection to the server is closed")
        self.writer.write(orjson.dumps(frame, option=orjson.OPT_APPEND_NEWLINE))
        try:
            await self.writer.drain()
        except ConnectionError as error:
            raise RpcFailure(f"server went away: {error}") from None

    async def _read_frames(self) -> None:
        with contextlib.suppress(ConnectionError):
            while line := await self.reader.readline():
                if not line.strip():
                    continue
                try:
                    frame = orjson.loads(line)
                except orjson.JSONDecodeError:
                    self.unparsable += 1
                    continue
                if isinstance(frame, dict):
                    await self._on_frame(frame)
        if self.process is not None:
            self._fail_pending(f"server exited (code {await self.process.wait()})")
        else:
            self._fail_pending("server closed the connection")

    async def _on_frame(self, frame: dict[str, Any]) -> None:
        if "method" in frame:
            if "id" in frame:  # the server asks us something: decline politely
                await self._answer_server_request(frame)
            else:
                self.notifications += 1
            return
        future = self._pending.get(frame.get("id", -1))
        if future is None or future.done():
            return
        if "error" in frame:
            future.set_exception(RpcFailure(f"error {frame['error']}"))
        else:
            future.set_result(frame.get("result"))

    async def _answer_server_request(self, frame: dict[str, Any]) -> None:
        reply: dict[str, Any] = {"jsonrpc": "2.0", "id": frame["id"]}
        if frame["method"] == "session/request_permission":
            reply["result"] = {"outcome": {"outcome": "cancelled"}}
        else:
            reply["error"] = {"code": -32601, "message": f"Method not found: {frame['method']}"}
        with contextlib.suppress(RpcFailure):
            await self._send(reply)

    def _fail_pending(self, reason: str) -> None:
        for future in self._pending.values():
            if not future.done():
                future.set_exception(RpcFailure(reason))


class NdjsonClient:
    """A blocking JSON-RPC client on a Unix socket; notifications go to
    :meth:`on_notification` (skipped here; subclasses may record them)."""

    def __init__(self, path: Path, timeout: float = REQUEST_TIMEOUT) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        self.sock.connect(str(path))
        self._buffer = bytearray()
        self._next_id = 0

    def close(self) -> None:
        self.sock.close()

    def request(self, method: str, params: Any = None) -> Any:
        """The result; an error answer raises ``RuntimeError``."""
        reply = self.call(method, params)
        if "error" in reply:
            raise RuntimeError(f"{method}: {reply['error']}")
        return reply.get("result")

    def call(self, method: str, params: Any = None) -> dict[str, Any]:
        """The whole response frame (``result`` or ``error``)."""
        self._next_id += 1
        frame: dict[str, Any] = {"jsonrpc": "2.0", "id": self._next_id, "method": method}
        if params is not None:
            frame["params"] = params
        self.sock.sendall(orjson.dumps(frame) + b"\n")
        while True:
            reply = orjson.loads(self._read_line())
            if "method" in reply:
                self.on_notification(reply)
            elif reply.get("id") == self._next_id:
                return dict(reply)

    def call_unparsed(self, method: str, params: Any = None) -> bytes:
        """Send a request and return the next line as it came, for a connection that
        gets nothing but answers (the time to the answer, without decoding it)."""
        self._next_id += 1
        frame: dict[str, Any] = {"jsonrpc": "2.0", "id": self._next_id, "method": method}
        if params is not None:
            frame["params"] = params
        self.sock.sendall(orjson.dumps(frame) + b"\n")
        return self._read_line()

    def on_notification(self, frame: dict[str, Any]) -> None:
        """A frame with a method that came while waiting for an answer."""

    def _read_line(self) -> bytes:
        """The next line; a long one (``status`` with thousands of sessions) costs its
        length once, not once per chunk."""
        buffer, searched = self._buffer, 0
        while True:
            newline = buffer.find(b"\n", searched)
            if newline >= 0:
                line = bytes(buffer[:newline])
                del buffer[:newline + 1]
                return line
            searched = len(buffer)
            chunk = self.sock.recv(1 << 20)
            if not chunk:
                raise ConnectionError("server closed the connection")
            buffer += chunk
