"""The debug client's protocol side: an ACP server as a child process, one session.

:class:`ServerConnection` starts the server (``zeroclaw acp``, ``--attach URL``, or
any ACP agent command), speaks NDJSON JSON-RPC on its stdin/stdout through
:class:`ipc.jsonrpc.Endpoint`, hands every received message to ``on_message`` (the
``--json`` transcript), ``session/update`` notifications to ``on_update`` and
``session/request_permission`` requests to ``on_permission``; anything else the
server asks (``fs/*``, ``terminal/*``: not advertised) gets -32601.
:class:`ClientSession` is the client's one session: initialize, new, prompt,
cancel, set_mode, load, list. Everything runs on the asyncio loop thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import subprocess
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from ipc.framing import DEFAULT_FRAME_LIMIT, OVERSIZED, FrameReader
from ipc.jsonrpc import ConnectionLost, Endpoint, RemoteError
from ipc.version import __version__

__all__ = ["CANCELLED", "ClientSession", "ConnectionLost", "RemoteError", "ServerConnection",
           "ServerStartError", "selected"]

log = logging.getLogger("zeroclaw.acp_client")

CANCELLED: dict[str, Any] = {"outcome": {"outcome": "cancelled"}}
STOP_TIMEOUT = 5.0  # seconds a server gets to exit after its stdin closed
PermissionHandler = Callable[[Mapping[str, Any]], Awaitable[dict[str, Any]]]


def selected(option_id: str) -> dict[str, Any]:
    """A ``session/request_permission`` result choosing ``option_id``."""
    return {"outcome": {"outcome": "selected", "optionId": option_id}}


class ServerStartError(Exception):
    """The server command could not be started (not found, not executable)."""


@dataclass
class Handlers:
    """What the connection calls for the server's messages (loop thread)."""

    on_update: Callable[[Mapping[str, Any]], None]
    on_permission: PermissionHandler
    on_message: Callable[[Any], None] = lambda message: None
    on_stderr: Callable[[str], None] | None = None  # None: the server's stderr is ours


@dataclass
class ServerConnection:
    """One server process and the JSON-RPC endpoint on its stdio."""

    argv: list[str]
    handlers: Handlers
    cwd: Path | None = None
    process: asyncio.subprocess.Process | None = None
    endpoint: Endpoint | None = None
    ended: asyncio.Event = field(default_factory=asyncio.Event)
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)

    async def start(self) -> None:
        """Start the server; :class:`ServerStartError` when it cannot run at all."""
        stderr = subprocess.PIPE if self.handlers.on_stderr is not None else None
        try:
            self.process = await asyncio.create_subprocess_exec(
                *self.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr,
                cwd=self.cwd, limit=DEFAULT_FRAME_LIMIT + 1)
        except OSError as exc:
            raise ServerStartError(f"cannot start {self.argv[0]}: {exc}") from exc
        methods = {"session/request_permission": self._permission}
        self.endpoint = Endpoint(self._send, methods, require_initialize=False,
                                 name="acp-client", outbound_prefix="client-",
                                 notifications={"session/update": self._update})
        self._tasks.append(asyncio.create_task(self._read_stdout()))
        if stderr is not None:
            self._tasks.append(asyncio.create_task(self._read_stderr()))

    def _send(self, frame: bytes) -> None:
        stdin = self.process.stdin if self.process is not None else None
        if stdin is not None and not stdin.is_closing():
            stdin.write(frame)

    def _update(self, params: Any, endpoint: Endpoint) -> None:
        if isinstance(params, Mapping):
            self.handlers.on_update(params)

    async def _permission(self, params: Any, endpoint: Endpoint) -> dict[str, Any]:
        if not isinstance(params, Mapping):
            return CANCELLED
        return await self.handlers.on_permission(params)

    async def _read_stdout(self) -> None:
        """The reader task: every frame to ``on_message`` then the endpoint, until EOF."""
        assert self.process is not None and self.process.stdout is not None
        assert self.endpoint is not None
        frames = FrameReader(self.process.stdout, DEFAULT_FRAME_LIMIT)
        try:
            while (frame := await frames.read()) is not None:
                if frame is OVERSIZED:
                    continue
                with contextlib.suppress(orjson.JSONDecodeError):
                    self.handlers.on_message(orjson.loads(frame))
                self.endpoint.receive(frame)
        except (ConnectionError, OSError) as exc:
            log.info("server output broke: %s", exc)
        finally:
            self.endpoint.receive_eof()
            self.ended.set()

    async def _read_stderr(self) -> None:
        """The stderr task: the server's log lines to ``on_stderr``."""
        assert self.process is not None and self.process.stderr is not None
        assert self.handlers.on_stderr is not None
        with contextlib.suppress(ConnectionError, OSError, ValueError):
            async for line in self.process.stderr:
                self.handlers.on_stderr(line.decode("utf-8", "replace").rstrip("\r\n"))

    async def request(self, method: str, params: Any, timeout: float | None = None) -> Any:
        """A request's result; :class:`RemoteError`, :class:`ConnectionLost`, TimeoutError."""
        if self.endpoint is None:
            raise ConnectionLost("not started")
        return await self.endpoint.request(method, params, timeout=timeout)

    def notify(self, method: str, params: Any) -> None:
        if self.endpoint is not None:
            self.endpoint.notify(method, params)

    async def stop(self) -> int | None:
        """Close the server's stdin (``zeroclaw acp`` exits on EOF), wait a bounded
        time, then kill it; its exit status."""
        process = self.process
        if process is None:
            return None
        if process.stdin is not None and not process.stdin.is_closing():
            process.stdin.close()
        try:
            await asyncio.wait_for(process.wait(), STOP_TIMEOUT)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()
        if self.endpoint is not None:
            self.endpoint.close()
        for task in self._tasks:
            task.cancel()
        return process.returncode


@dataclass
class ClientSession:
    """The client's session on one server: its id, modes and what the server offers."""

    connection: ServerConnection
    cwd: Path
    session_id: str | None = None
    agent: dict[str, Any] = field(default_factory=dict)
    modes: dict[str, Any] = field(default_factory=dict)

    async def initialize(self, timeout: float) -> dict[str, Any]:
        """``initialize`` (no fs, no terminal offered); the server's answer."""
        result = await self.connection.request("initialize", {
            "protocolVersion": 1,
            "clientCapabilities": {"fs": {"readTextFile": False, "writeTextFile": False},
                                   "terminal": False},
            "clientInfo": {"name": "zeroclaw-acp-client", "version": __version__},
        }, timeout=timeout)
        self.agent = result if isinstance(result, dict) else {}
        return self.agent

    async def new(self) -> str:
        """``session/new`` in :attr:`cwd`; the new session's id."""
        result = await self.connection.request(
            "session/new", {"cwd": str(self.cwd), "mcpServers": []})
        self.session_id = str(result["sessionId"])
        self.modes = result.get("modes") or {}
        return self.session_id

    async def prompt(self, text: str) -> str:
        """``session/prompt`` with ``text``; the turn's ``stopReason``."""
        result = await self.connection.request("session/prompt", {
            "sessionId": self.session_id, "prompt": [{"type": "text", "text": text}]})
        return str(result.get("stopReason", "?")) if isinstance(result, dict) else "?"

    def cancel(self) -> None:
        """``session/cancel`` (a notification: the running prompt ends ``cancelled``)."""
        self.connection.notify("session/cancel", {"sessionId": self.session_id})

    async def set_mode(self, mode_id: str) -> None:
        await self.connection.request("session/set_mode",
                                      {"sessionId": self.session_id, "modeId": mode_id})
        self.modes = {**self.modes, "currentModeId": mode_id}

    async def load(self, session_id: str) -> None:
        """``session/load``: the server replays the session's updates, then answers."""
        result = await self.connection.request("session/load", {
            "sessionId": session_id, "cwd": str(self.cwd), "mcpServers": []})
        self.session_id = session_id
        modes = result.get("modes") if isinstance(result, dict) else None
        self.modes = modes or {}

    async def list(self) -> list[dict[str, Any]]:
        """``session/list`` (the first page)."""
        result = await self.connection.request("session/list", {})
        sessions = result.get("sessions") if isinstance(result, dict) else None
        return [s for s in sessions or [] if isinstance(s, dict)]
