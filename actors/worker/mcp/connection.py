"""One MCP server of one session, through the official ``mcp`` SDK's client.

Threads: the session actor's thread calls :meth:`McpConnection.start`,
:meth:`~McpConnection.wait_ready`, :meth:`~McpConnection.call` and
:meth:`~McpConnection.stop`; each hands a coroutine to the worker's MCP loop
(:mod:`actors.worker.mcp.io`) with ``asyncio.run_coroutine_threadsafe`` and waits
on its future with a timeout. On the loop thread one *holder* task per server
enters the SDK's transport and ``ClientSession`` (anyio contexts must be left by
the task that entered them), initializes, lists the tools, then waits until it is
told to stop; tool calls run as tasks of their own on the same loop.

A stdio server's launcher is watched on the loop thread (a pidfd reader): when it
exits while the session is idle, the connection turns ``exited`` at once, its holder
leaves the SDK's contexts, and ``on_change`` (the session's status report to the
host) is called on the loop thread, so ``status`` is true without waiting for a turn.

A stdio server's process is started by the SDK (``stdio_client``) with the command
line :mod:`actors.worker.mcp.launch` built (the process-tree launcher around the
session's sandbox around the server's command); its stderr goes to a file of its
own, whose last lines explain a start that failed or a server that died.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import os
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import IO, Any

from actors.worker import process_tree
from actors.worker.cancel import call_on_cancel
from actors.worker.mcp.io import McpIo
from actors.worker.mcp.launch import Launch
from actors.worker.mcp.specs import McpServerSpec

__all__ = ["ListedTool", "McpCallFailed", "McpConnection"]

log = logging.getLogger("zeroclaw.mcp")

STDERR_TAIL_CHARS = 800
_POLL_SECS = 0.05
#: How long a failed call waits for a server whose pipe closed to be seen gone.
EXIT_SETTLE_SECS = 3.0
_CONNECTION_CLOSED = -32000  # the SDK's code for a connection that ended


class McpCallFailed(Exception):
    """A call that got no result; the message says why (for the model and the client)."""


@dataclass(frozen=True, slots=True)
class ListedTool:
    """A tool as the server lists it: its own name, description, input schema, and its
    ``readOnlyHint`` annotation (a hint shown to the model, never authority)."""

    name: str
    description: str
    input_schema: dict[str, Any]
    read_only_hint: bool | None = None


class McpConnection:
    """One server's client. ``state``: ``starting``, ``running``, ``failed`` (it did not
    start: ``problem`` says why), ``exited`` (it died), ``stopped``."""

    def __init__(self, spec: McpServerSpec, launch: Launch | None, io: McpIo, *,
                 start_timeout: float, call_timeout: float,
                 on_change: Callable[[], None] | None = None) -> None:
        self.spec = spec
        #: Called (on the loop thread, or the thread that saw it) when the server died.
        self.on_change = on_change
        self.launch = launch
        self.io = io
        self.start_timeout = start_timeout
        self.call_timeout = call_timeout
        self.state = "starting"
        self.problem = ""
        self.pid: int | None = None  # the server's command (its launcher's child)
        self.launcher_pid: int | None = None
        self.tools: tuple[ListedTool, ...] = ()
        self._session: Any = None
        self._stop: asyncio.Event | None = None
        self._ready: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._holder: concurrent.futures.Future[None] | None = None
        self._stderr: IO[str] | None = None
        self._pidfd: int | None = None  # the launcher's, watched on the loop thread
        self._lock = threading.Lock()

    @property
    def label(self) -> str:
        return f"MCP server {self.spec.name!r}"

    # --- the session actor's thread ---------------------------------------------------

    def start(self) -> None:
        """Start the holder task (does not wait)."""
        self._holder = self.io.submit(self._hold())

    def wait_ready(self) -> None:
        """Wait (bounded) until the server answered ``initialize`` and ``tools/list``;
        ``state`` and ``problem`` tell how that went."""
        try:
            self._ready.result(timeout=self.start_timeout + 1.0)
        except concurrent.futures.TimeoutError:
            self._fail(f"{self.label} did not start within {self.start_timeout:g} s")
            self.stop()
        except Exception as exc:  # the holder set it: state and problem are set
            if not self.problem:
                self._fail(f"{self.label} could not start: {exc}")

    def call(self, tool: str, arguments: dict[str, Any], cancelled: threading.Event) -> Any:
        """``tools/call``; the SDK's ``CallToolResult``. :class:`McpCallFailed` when the
        server is not running, dies, times out, or the turn is cancelled."""
        session = self._session
        if self.state != "running" or session is None:
            raise McpCallFailed(self.problem or f"{self.label} is {self.state}")
        future = self.io.submit(session.call_tool(tool, arguments))
        unhook = call_on_cancel(cancelled, lambda: _withdraw(future))
        try:
            return self._wait(future, cancelled)
        finally:
            if unhook is not None:
                unhook()

    def _wait(self, future: concurrent.futures.Future[Any], cancelled: threading.Event) -> Any:
        deadline = self.call_timeout
        waited = 0.0
        while True:
            try:
                return future.result(timeout=_POLL_SECS)
            except concurrent.futures.TimeoutError:
                waited += _POLL_SECS
            except concurrent.futures.CancelledError:
                raise McpCallFailed(f"cancelled: the call to {self.label} was withdrawn") from None
            except Exception as exc:
                raise McpCallFailed(self._call_problem(exc)) from None
            if cancelled.is_set():
                future.cancel()
                raise McpCallFailed(f"cancelled: the call to {self.label} was withdrawn")
            if waited >= deadline:
                future.cancel()
                raise McpCallFailed(f"{self.label} did not answer within {deadline:g} s "
                                    "(mcp_call_timeout_secs)")
            if not self._alive():
                future.cancel()
                raise McpCallFailed(self._died())

    def _call_problem(self, exc: Exception) -> str:
        """Why a call failed: the server died (its launcher ends within a moment of its
        pipe closing), or what it answered."""
        closed = getattr(exc, "code", None) == _CONNECTION_CLOSED
        deadline = time.monotonic() + (EXIT_SETTLE_SECS if closed else 0.0)
        while self._alive() and time.monotonic() < deadline:
            time.sleep(0.01)
        if not self._alive():
            return self._died()
        return f"{self.label} failed the call: {getattr(exc, 'message', None) or exc}"

    def stop(self, wait: float = 6.0) -> None:
        """:meth:`request_stop`, then :meth:`wait_stopped`."""
        self.request_stop()
        self.wait_stopped(wait)

    def request_stop(self) -> None:
        """Tell the holder to leave its contexts (the SDK closes the server's stdin, then
        ends its process tree); does not wait."""
        with self._lock:
            if self.state in ("starting", "running"):
                self.state = "stopped"
        stop = self._stop
        if stop is not None:
            self.io.call_soon(stop.set)
        elif self._holder is not None:  # not yet entered: cancel it
            self._holder.cancel()

    def wait_stopped(self, wait: float = 6.0) -> None:
        """Wait (bounded) for the holder to finish; kill what is left of the tree."""
        holder = self._holder
        if holder is not None:
            with contextlib.suppress(Exception, concurrent.futures.CancelledError):
                holder.result(timeout=wait)
        self._end_leftovers()

    def status(self) -> dict[str, Any]:
        """``{name, transport, state, pid?, tools, problem?}`` for ``status``."""
        entry: dict[str, Any] = {"name": self.spec.name, "transport": self.spec.transport,
                                 "state": self.state if self.state != "running" or self._alive()
                                 else "exited", "tools": len(self.tools)}
        if self.pid is not None:
            entry["pid"] = self.pid
        if self.problem:
            entry["problem"] = self.problem
        return entry

    @property
    def exited(self) -> bool:
        """The server died (seen by the watcher, a call, or now); any thread."""
        if self.state == "running" and not self._alive():
            self._died()
        return self.state == "exited"

    # --- either thread ----------------------------------------------------------------

    def _alive(self) -> bool:
        if self.spec.transport != "stdio":
            return self.state == "running"
        pid = self.launcher_pid
        return pid is not None and not process_tree.is_zombie(pid)

    def _died(self) -> str:
        with self._lock:
            changed = self.state == "running"
            if changed:
                self.state = "exited"
                self.problem = f"{self.label} exited{self._stderr_tail()}"
            problem = self.problem or f"{self.label} exited"
        if changed:
            log.warning("%s", problem)
            self._changed()
        return problem

    def _changed(self) -> None:
        callback = self.on_change
        if callback is not None:
            try:
                callback()
            except Exception:  # a status report is not worth a dead watcher
                log.exception("%s: the state change could not be reported", self.label)

    def _fail(self, problem: str) -> None:
        with self._lock:
            self.state, self.problem = "failed", problem
        log.warning("%s", problem)

    def _stderr_tail(self) -> str:
        stream = self._stderr
        if stream is None or stream.closed:
            return ""
        try:
            size = os.fstat(stream.fileno()).st_size
            with open(os.dup(stream.fileno()), encoding="utf-8", errors="replace",
                      closefd=True) as copy:
                copy.seek(max(0, size - STDERR_TAIL_CHARS))
                tail = copy.read().strip()
        except (OSError, ValueError):
            return ""
        return f"; its stderr ends: {tail}" if tail else ""

    def _end_leftovers(self) -> None:
        """What a killed launcher left behind (it should leave nothing)."""
        pid = self.launcher_pid
        if pid is not None and not process_tree.is_zombie(pid):
            process_tree.kill_tree(pid)
        if self._stderr is not None:
            with contextlib.suppress(OSError):
                self._stderr.close()
        if self.launch is not None:
            self.launch.cleanup()

    # --- the loop thread --------------------------------------------------------------

    async def _hold(self) -> None:
        """Enter, initialize, list; wait for stop; leave (the holder task)."""
        import anyio

        self._stop = asyncio.Event()
        try:
            async with contextlib.AsyncExitStack() as stack:
                session = await self._open(stack)  # its task groups: outside the timeout
                with anyio.fail_after(self.start_timeout):
                    await session.initialize()
                    self.tools = await _list_tools(session)
                if self.spec.transport == "stdio":
                    self._find_pids()  # it answered: its command runs by now
                    self._watch_exit()
                self._session = session
                with self._lock:
                    if self.state == "starting":
                        self.state = "running"
                self._ready.set_result(None)
                log.info("%s: running (pid %s), %d tool(s)", self.label, self.pid,
                         len(self.tools))
                await self._stop.wait()
        except BaseException as exc:
            if not self._ready.done():
                self._fail(self._start_problem(exc))
                self._ready.set_exception(McpCallFailed(self.problem))
            if not isinstance(exc, Exception):
                raise
        finally:
            self._session = None
            self._unwatch_exit()
            if self.state == "running":  # the connection ended by itself: the server went
                self._died()

    def _watch_exit(self) -> None:
        """Watch the launcher's pidfd (loop thread): it exits with the server."""
        pid = self.launcher_pid
        if pid is None:
            return
        try:
            self._pidfd = os.pidfd_open(pid)
        except OSError:  # gone already: the status check and the next call see it
            return
        asyncio.get_running_loop().add_reader(self._pidfd, self._on_exit)

    def _unwatch_exit(self) -> None:
        fd, self._pidfd = self._pidfd, None
        if fd is not None:
            asyncio.get_running_loop().remove_reader(fd)
            os.close(fd)

    def _on_exit(self) -> None:
        """The launcher exited (loop thread): the server is gone; leave its contexts."""
        self._unwatch_exit()
        self._died()
        if self._stop is not None:
            self._stop.set()

    def _start_problem(self, exc: BaseException) -> str:
        if _timed_out(exc):
            why = f"no answer within {self.start_timeout:g} s (mcp_start_timeout_secs)"
        else:
            why = _describe(exc)
        return f"{self.label} could not start: {why}{self._stderr_tail()}"

    async def _open(self, stack: contextlib.AsyncExitStack) -> Any:
        from mcp.client.session import ClientSession
        from mcp_types import Implementation

        streams = await stack.enter_async_context(self._transport())
        info = Implementation(name="zeroclaw", version="1")
        return await stack.enter_async_context(
            ClientSession(streams[0], streams[1], client_info=info))

    def _transport(self) -> contextlib.AbstractAsyncContextManager[Any]:
        if self.spec.transport == "http":
            return _http_transport(self.spec)
        if self.spec.transport == "sse":
            from mcp.client.sse import sse_client

            return sse_client(self.spec.url, headers=dict(self.spec.headers))
        return self._stdio()

    @contextlib.asynccontextmanager
    async def _stdio(self) -> AsyncIterator[Any]:
        from mcp.client.stdio import StdioServerParameters, stdio_client

        launch = self.launch
        assert launch is not None
        self._stderr = tempfile.TemporaryFile(  # noqa: SIM115 (closed by _end_leftovers)
            "w+", encoding="utf-8", errors="replace")
        params = StdioServerParameters(command=launch.argv[0], args=list(launch.argv[1:]),
                                       env=dict(launch.env), cwd=launch.cwd)
        async with stdio_client(params, errlog=self._stderr) as streams:
            yield streams

    def _find_pids(self) -> None:
        """The launcher (the worker's child whose child writes to our stderr file) and
        the server's command (that child)."""
        assert self._stderr is not None
        mine = os.fstat(self._stderr.fileno())
        for launcher in process_tree.children():
            for child in process_tree.children(launcher):
                with contextlib.suppress(OSError):
                    fd = os.stat(f"/proc/{child}/fd/2")
                    if (fd.st_ino, fd.st_dev) == (mine.st_ino, mine.st_dev):
                        self.launcher_pid, self.pid = launcher, child
                        return


def _http_transport(spec: McpServerSpec) -> contextlib.AbstractAsyncContextManager[Any]:
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client

    client = create_mcp_http_client(headers=dict(spec.headers))
    return streamable_http_client(spec.url, http_client=client)


async def _list_tools(session: Any) -> tuple[ListedTool, ...]:
    """Every page of ``tools/list``."""
    from mcp_types import PaginatedRequestParams

    found: list[ListedTool] = []
    cursor: str | None = None
    for _ in range(100):
        params = PaginatedRequestParams(cursor=cursor) if cursor else None
        result = await session.list_tools(params=params)
        for tool in result.tools:
            hint = tool.annotations.read_only_hint if tool.annotations else None
            found.append(ListedTool(tool.name, tool.description or "",
                                    dict(tool.input_schema or {"type": "object"}), hint))
        cursor = result.next_cursor
        if not cursor:
            break
    return tuple(found)


def _timed_out(exc: BaseException) -> bool:
    """Whether ``exc`` (or one of an exception group's) is a timeout."""
    inner = getattr(exc, "exceptions", None)
    if inner:
        return any(_timed_out(e) for e in inner)
    return isinstance(exc, TimeoutError)


def _withdraw(future: concurrent.futures.Future[Any]) -> None:
    """Cancel a call (the IO thread, on the turn's cancel): the task on the loop ends."""
    future.cancel()


def _describe(exc: BaseException) -> str:
    """An exception (an anyio group of them too) as one line."""
    inner = getattr(exc, "exceptions", None)
    if inner:
        return "; ".join(_describe(e) for e in inner)
    text = str(exc) or type(exc).__name__
    return text if len(text) < 300 else text[:300] + "…"
