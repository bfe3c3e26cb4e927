"""Terminals zeroclaw runs itself for a hosted ACP agent (``terminal/*``) when the
client that holds the session offers none (:mod:`actors.worker.agents.acp_relay`).

A terminal is the agent's command run as the ``shell`` tool runs one
(:mod:`actors.worker.tools.shell`): a clean environment (plus the variables the request
names), confined by the session's sandbox (:mod:`actors.worker.tools.sandbox`), as a
process tree of its own (:mod:`actors.worker.process_tree`), refused in a ``read_only``
session and when it names a forbidden path. What zeroclaw keeps is bounded: at most
:data:`MAX_TERMINALS` unreleased terminals per session, and the latest
:data:`MAX_OUTPUT_BYTES` of each one's output (less when the request's
``outputByteLimit`` says so; older output is dropped from the start, as ACP asks).
Everything a session's terminals started is killed when the terminal exits, is killed
or released, and when the session's agent session ends or its agent process stops
(:meth:`Terminals.close_all`).

Threads: requests come on the agent process's loop thread (async methods);
one reader thread per terminal copies its output and reaps it;
:meth:`Terminals.close_all` may run on any thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import secrets
import selectors
import shlex
import signal
import subprocess
import threading
from collections.abc import Callable, Mapping
from typing import Any

from actors.worker import process_tree
from actors.worker.tools.base import ToolError
from actors.worker.tools.paths import PathDenied, PathPolicy
from actors.worker.tools.sandbox import confined
from actors.worker.tools.shell import ShellTool, command_environment
from ipc.errors import InternalError, InvalidParams

__all__ = ["MAX_OUTPUT_BYTES", "MAX_TERMINALS", "Terminals"]

MAX_TERMINALS = 8
MAX_OUTPUT_BYTES = 1024 * 1024
_READ_SIZE = 65536
_POLL_SECS = 0.05


class _Terminal:
    """One running (or finished) command and what it printed."""

    def __init__(self, proc: subprocess.Popen[bytes], limit: int, cleanup: contextlib.ExitStack,
                 exited: asyncio.Future[dict[str, Any]]) -> None:
        self.proc = proc
        self.limit = limit
        self.exit_status: dict[str, Any] | None = None
        self._output = bytearray()
        self._truncated = False
        self._lock = threading.Lock()
        self._reaping = threading.Lock()  # a reaped pid may name another process: no kill
        self._cleanup = cleanup
        self._exited = exited
        self._loop = exited.get_loop()
        threading.Thread(target=self._read, daemon=True, name=f"terminal-{proc.pid}").start()

    def output(self) -> dict[str, Any]:
        """The ``terminal/output`` answer (any thread)."""
        with self._lock:
            data, truncated = bytes(self._output), self._truncated
        answer: dict[str, Any] = {"output": data.decode("utf-8", errors="replace"),
                                  "truncated": truncated}
        if self.exit_status is not None:
            answer["exitStatus"] = self.exit_status
        return answer

    async def wait_for_exit(self) -> dict[str, Any]:
        return await asyncio.shield(self._exited)

    def kill(self) -> None:
        """End the command and all it started (blocks up to half a second; any thread)."""
        with self._reaping:
            if self.exit_status is None:
                process_tree.end(self.proc)

    def _read(self) -> None:
        """Reader thread: copy output until the command exits and its pipe is drained,
        then end what it left running, reap it, and settle :meth:`wait_for_exit`."""
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        with selectors.DefaultSelector() as selector:
            selector.register(fd, selectors.EVENT_READ)
            while True:
                exited = process_tree.has_exited(self.proc)
                if selector.select(0 if exited else _POLL_SECS):
                    chunk = os.read(fd, _READ_SIZE)
                    if not chunk:
                        break
                    self._keep(chunk)
                elif exited:
                    break  # background children may hold the pipe open
        with self._reaping:
            process_tree.end(self.proc)
            self.proc.stdout.close()
            code = self.proc.wait()
            self.exit_status = {"exitCode": code if code >= 0 else None,
                                "signal": signal.Signals(-code).name if code < 0 else None}
        self._cleanup.close()
        with contextlib.suppress(RuntimeError):  # the agent's loop is already closed
            self._loop.call_soon_threadsafe(_settle, self._exited, self.exit_status)

    def _keep(self, chunk: bytes) -> None:
        with self._lock:
            self._output += chunk
            excess = len(self._output) - self.limit
            if excess > 0:
                while excess < len(self._output) and self._output[excess] & 0xC0 == 0x80:
                    excess += 1  # never start inside a UTF-8 character
                del self._output[:excess]
                self._truncated = True


def _settle(future: asyncio.Future[dict[str, Any]], status: dict[str, Any]) -> None:
    if not future.done():
        future.set_result(status)


class Terminals:
    """The terminals zeroclaw runs for one hosted agent session."""

    def __init__(self, paths: PathPolicy, mode: Callable[[], str]) -> None:
        self._paths = paths
        self._mode = mode
        self._lock = threading.Lock()
        self._live: dict[str, _Terminal] = {}
        self._closed = False

    def has(self, terminal_id: Any) -> bool:
        return isinstance(terminal_id, str) and terminal_id in self._live

    async def create(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """``terminal/create`` (loop thread): start the command, answer its id."""
        if self._mode() == "read_only":
            raise InvalidParams("terminal/create refused: the session's autonomy is read_only")
        command_line, cwd, env, limit = self._request(params)
        with self._lock:
            if len(self._live) >= MAX_TERMINALS:
                raise InternalError(f"terminal/create refused: {MAX_TERMINALS} terminals are "
                                    "open in this session; release one first")
        exited: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        terminal = await asyncio.to_thread(self._start, command_line, cwd, env, limit, exited)
        terminal_id = f"zc-term-{secrets.token_hex(8)}"
        with self._lock:
            refusal = ("the session has ended" if self._closed else
                       "too many terminals started at once" if len(self._live) >= MAX_TERMINALS
                       else None)
            if refusal is None:
                self._live[terminal_id] = terminal
        if refusal is not None:
            await asyncio.to_thread(terminal.kill)
            raise InternalError(f"terminal/create refused: {refusal}")
        return {"terminalId": terminal_id}

    async def serve(self, method: str, params: Mapping[str, Any]) -> dict[str, Any]:
        """``terminal/output``, ``wait_for_exit``, ``kill`` or ``release`` of one of
        ours (loop thread)."""
        terminal_id = params.get("terminalId")
        terminal = self._live.get(terminal_id) if isinstance(terminal_id, str) else None
        if terminal is None:
            raise InvalidParams(f"terminalId: no such terminal {str(terminal_id)[:80]}")
        if method == "terminal/output":
            return terminal.output()
        if method == "terminal/wait_for_exit":
            return await terminal.wait_for_exit()
        if method == "terminal/release":
            with self._lock:
                self._live.pop(str(terminal_id), None)
        await asyncio.to_thread(terminal.kill)  # kill, release
        return {}

    def close_all(self) -> None:
        """Kill every terminal and refuse new ones: the session's agent session ended
        (any thread)."""
        with self._lock:
            self._closed = True
            terminals, self._live = list(self._live.values()), {}
        for terminal in terminals:
            terminal.kill()

    def _request(self, params: Mapping[str, Any]) -> tuple[str, PathPolicy, dict[str, str], int]:
        """The command line, the policy rooted at its cwd, its environment and output cap."""
        command, args = params.get("command"), params.get("args") or []
        if not isinstance(command, str) or not command.strip():
            raise InvalidParams("command: must be a non-empty string")
        if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
            raise InvalidParams("args: must be an array of strings")
        command_line = shlex.join([command, *args]) if args else command
        extra: dict[str, str] = {}
        for item in params.get("env") or []:
            if isinstance(item, Mapping) and isinstance(item.get("name"), str) \
                    and isinstance(item.get("value"), str):
                extra[item["name"]] = item["value"]
        limit = params.get("outputByteLimit")
        if isinstance(limit, bool) or not isinstance(limit, int) or limit <= 0:
            limit = MAX_OUTPUT_BYTES
        try:
            self._paths.check_command(command_line)
            cwd = params.get("cwd")
            paths = self._paths if cwd is None else dataclasses.replace(
                self._paths, cwd=self._paths.resolve(str(cwd)))
        except PathDenied as exc:
            raise InvalidParams(f"terminal/create refused: {exc}") from None
        if not paths.cwd.is_dir():
            raise InvalidParams(f"cwd: not a directory: {paths.cwd}")
        return command_line, paths, command_environment(extra), min(limit, MAX_OUTPUT_BYTES)

    @staticmethod
    def _start(command_line: str, paths: PathPolicy, env: dict[str, str], limit: int,
               exited: asyncio.Future[dict[str, Any]]) -> _Terminal:
        """Start the confined command (a worker thread of the loop)."""
        try:
            sandbox = ShellTool().confinement(paths)
        except ToolError as exc:
            raise InternalError(f"terminal/create refused: {exc}") from None
        cleanup = contextlib.ExitStack()
        try:
            confinement = cleanup.enter_context(confined(sandbox, paths, command_line))
            proc = process_tree.start(
                confinement.argv, cwd=paths.cwd, env={**env, **confinement.env},
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            )
        except PathDenied as exc:
            cleanup.close()
            raise InvalidParams(f"terminal/create refused: {exc}") from None
        except OSError as exc:
            cleanup.close()
            raise InternalError(f"terminal/create failed: {exc.strerror or exc}") from None
        return _Terminal(proc, limit, cleanup, exited)
