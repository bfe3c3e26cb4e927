"""A real ACP client (the official ``acp`` SDK) driving a real ``zeroclaw acp``.

:class:`RecordingClient` is the client side of the connection: it records every
``session/update`` and answers ``session/request_permission`` by a policy the
test sets. :class:`SdkHost` wraps the SDK connection plus a log of every raw
frame (for fields the SDK's models drop, such as ``workspaceDir`` or the prompt
result's ``content``, and for failure reports). Everything here runs on the
test's asyncio event loop.
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, cast

import psutil
from acp import Client, RequestError, spawn_agent_process, text_block
from acp.client.connection import ClientSideConnection
from acp.connection import StreamEvent
from acp.schema import (
    AllowedOutcome,
    ClientCapabilities,
    CreateTerminalResponse,
    DeniedOutcome,
    Implementation,
    InitializeResponse,
    KillTerminalResponse,
    PermissionOption,
    PromptResponse,
    ReadTextFileResponse,
    ReleaseTerminalResponse,
    RequestPermissionResponse,
    TerminalOutputResponse,
    ToolCallUpdate,
    WaitForTerminalExitResponse,
    WriteTextFileResponse,
)

from .procs import descendants, host_argv, host_env, reap_leaks, tail

__all__ = [
    "PermissionAsk",
    "PermissionPolicy",
    "PromptOutcome",
    "RecordingClient",
    "SdkHost",
    "expect_error",
    "spawn_sdk_host",
    "update_text",
]

PermissionPolicy = Literal["allow_once", "allow_always", "reject_once", "reject_always",
                           "cancelled", "never"]
STREAM_LIMIT = 64 * 1024 * 1024
EXIT_GRACE_SECS = 10.0
LEAK_GRACE_SECS = 15.0


@dataclass(frozen=True)
class PermissionAsk:
    """One ``session/request_permission`` the host sent us."""

    session_id: str
    tool_call: ToolCallUpdate
    options: list[PermissionOption]


def update_text(update: Any) -> str:
    """The text of a chunk update (``content: {type: text, text}``), else ``""``."""
    content = getattr(update, "content", None)
    text = getattr(content, "text", None)
    return text if isinstance(text, str) else ""


class RecordingClient:
    """Client half of the connection: records updates, answers permissions."""

    def __init__(self) -> None:
        self.updates: list[tuple[str, Any]] = []
        self.permission_asks: list[PermissionAsk] = []
        self.permission_policy: PermissionPolicy = "allow_once"
        self.choose_option_named: str | None = None  # else the first of the policy's kind
        self.permission_gate = asyncio.Event()  # cleared: answers wait until it is set
        self.permission_gate.set()
        self.client_requests: list[tuple[str, dict[str, Any]]] = []  # fs/*, terminal/*
        self.client_notifications: list[tuple[str, dict[str, Any]]] = []  # _name ones
        self.client_gate = asyncio.Event()  # cleared: those answers wait until it is set
        self.client_gate.set()
        self._changed = asyncio.Event()

    def _touch(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
        self.updates.append((session_id, update))
        self._touch()

    async def request_permission(
        self, session_id: str, tool_call: ToolCallUpdate, options: list[PermissionOption],
        **kwargs: Any,
    ) -> RequestPermissionResponse:
        self.permission_asks.append(PermissionAsk(session_id, tool_call, options))
        self._touch()
        await self.permission_gate.wait()
        policy = self.permission_policy
        if policy == "never":
            await asyncio.Event().wait()  # the host's own timeout must deny the tool
        if policy == "cancelled":
            return RequestPermissionResponse(outcome=DeniedOutcome(outcome="cancelled"))
        chosen = next(o for o in options if o.kind == policy and (
            self.choose_option_named in (None, o.name)))
        return RequestPermissionResponse(
            outcome=AllowedOutcome(outcome="selected", option_id=chosen.option_id)
        )

    # -- fs/* and terminal/* (only asked when initialize advertised them) -----------

    async def _client_request(self, method: str, **params: Any) -> None:
        """Record one ``fs/*`` or ``terminal/*`` request; wait while the gate is shut."""
        self.client_requests.append((method, params))
        self._touch()
        await self.client_gate.wait()

    async def read_text_file(self, session_id: str, path: str, line: int | None = None,
                             limit: int | None = None, **kwargs: Any) -> ReadTextFileResponse:
        await self._client_request("fs/read_text_file", session_id=session_id, path=path)
        return ReadTextFileResponse(content=f"the client's copy of {path}")

    async def write_text_file(self, session_id: str, path: str, content: str,
                              **kwargs: Any) -> WriteTextFileResponse:
        await self._client_request("fs/write_text_file", session_id=session_id, path=path,
                                   content=content)
        return WriteTextFileResponse()

    async def create_terminal(self, session_id: str, command: str, args: Any = None,
                              env: Any = None, cwd: str | None = None,
                              output_byte_limit: int | None = None,
                              **kwargs: Any) -> CreateTerminalResponse:
        await self._client_request("terminal/create", session_id=session_id, command=command)
        return CreateTerminalResponse(terminal_id=f"client-term-{len(self.client_requests)}")

    async def wait_for_terminal_exit(self, session_id: str, terminal_id: str,
                                     **kwargs: Any) -> WaitForTerminalExitResponse:
        await self._client_request("terminal/wait_for_exit", session_id=session_id,
                                   terminal_id=terminal_id)
        return WaitForTerminalExitResponse(exit_code=7)

    async def terminal_output(self, session_id: str, terminal_id: str,
                              **kwargs: Any) -> TerminalOutputResponse:
        await self._client_request("terminal/output", session_id=session_id,
                                   terminal_id=terminal_id)
        return TerminalOutputResponse(output="the client's terminal", truncated=False)

    async def release_terminal(self, session_id: str, terminal_id: str,
                               **kwargs: Any) -> ReleaseTerminalResponse:
        await self._client_request("terminal/release", session_id=session_id,
                                   terminal_id=terminal_id)
        return ReleaseTerminalResponse()

    async def kill_terminal(self, session_id: str, terminal_id: str,
                            **kwargs: Any) -> KillTerminalResponse:
        await self._client_request("terminal/kill", session_id=session_id,
                                   terminal_id=terminal_id)
        return KillTerminalResponse()

    async def ext_method(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        """An extension request (the SDK drops its leading ``_``)."""
        await self._client_request(f"_{method}", **params)
        return {"answeredBy": "the client", "method": method}

    async def ext_notification(self, method: str, params: dict[str, Any]) -> None:
        """An extension notification (the SDK drops its leading ``_``)."""
        self.client_notifications.append((f"_{method}", params))
        self._touch()

    # -- queries -------------------------------------------------------------

    def mark(self) -> int:
        """An index into :attr:`updates`; pass it as ``start`` to see only later ones."""
        return len(self.updates)

    def of(self, session_id: str, kind: str | None = None, start: int = 0) -> list[Any]:
        """Updates of one session (optionally one ``sessionUpdate`` kind) since ``start``."""
        return [
            u for sid, u in self.updates[start:]
            if sid == session_id and (kind is None or u.session_update == kind)
        ]

    def text(self, session_id: str, kind: str = "agent_message_chunk", start: int = 0) -> str:
        return "".join(update_text(u) for u in self.of(session_id, kind, start))

    async def wait_until(
        self, predicate: Callable[[], bool], what: str, timeout: float = 10.0
    ) -> None:
        """Wait (without polling) until ``predicate()`` holds after some recorded event."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not predicate():
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
            event = self._changed
            with suppress(TimeoutError):
                await asyncio.wait_for(event.wait(), remaining)

    async def wait_text(self, session_id: str, needle: str, timeout: float = 10.0,
                        start: int = 0) -> None:
        await self.wait_until(
            lambda: needle in self.text(session_id, start=start),
            f"agent text {needle!r} in session {session_id}", timeout,
        )


@dataclass
class PromptOutcome:
    """A prompt's result: the SDK's typed view plus the raw result dict."""

    response: PromptResponse
    raw: dict[str, Any]

    @property
    def stop_reason(self) -> str:
        return str(self.response.stop_reason)

    @property
    def content(self) -> Any:
        return self.raw.get("content")


@dataclass
class SdkHost:
    """One running ``zeroclaw acp`` and the SDK connection to it."""

    conn: ClientSideConnection
    process: asyncio.subprocess.Process
    client: RecordingClient
    config_dir: Path
    stderr_path: Path
    wire: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    children_snapshot: list[psutil.Process] = field(default_factory=list)
    killed: bool = False
    problems: list[str] = field(default_factory=list)

    @property
    def pid(self) -> int:
        return self.process.pid

    async def raw(self, method: str, params: Any) -> Any:
        """A request the SDK has no method for, through the SDK's own JSON-RPC connection."""
        return await self.conn._conn.send_request(method, params)

    async def initialize(self, capabilities: ClientCapabilities | None = None
                         ) -> InitializeResponse:
        return await self.conn.initialize(
            protocol_version=1,
            client_capabilities=capabilities or ClientCapabilities(),
            client_info=Implementation(name="zeroclaw-e2e", title="zeroclaw e2e", version="1.0"),
        )

    async def new_session(self, cwd: Path) -> str:
        return (await self.conn.new_session(cwd=str(cwd))).session_id

    async def prompt(self, session_id: str, text: str | list[Any]) -> PromptOutcome:
        """``session/prompt`` through the SDK; ``text`` is one text block or a list of blocks."""
        blocks = [text_block(text)] if isinstance(text, str) else text
        response = await self.conn.prompt(session_id=session_id, prompt=blocks)
        return PromptOutcome(response, self.last_result("session/prompt", session_id))

    def last_result(self, method: str, session_id: str) -> dict[str, Any]:
        """The raw result of the latest ``method`` request about ``session_id``."""
        for direction, frame in reversed(self.wire):
            params = frame.get("params") or {}
            if direction == "outgoing" and frame.get("method") == method and (
                params.get("sessionId") == session_id
            ):
                for d2, answer in self.wire:
                    if d2 == "incoming" and "method" not in answer and (
                        answer.get("id") == frame["id"]
                    ):
                        return cast(dict[str, Any], answer.get("result") or {})
                break
        raise AssertionError(f"no {method} result for {session_id} on the wire")

    def kill9(self) -> None:
        """SIGKILL the host; its workers must notice and exit on their own."""
        self.children_snapshot = descendants(self.pid)
        self.killed = True
        self.process.send_signal(signal.SIGKILL)

    def diagnostics(self) -> str:
        frames = [f"{'->' if d == 'outgoing' else '<-'} {_short(m)}" for d, m in self.wire[-80:]]
        return (
            f"host pid {self.pid} config {self.config_dir}\n--- last frames ---\n"
            + "\n".join(frames)
            + f"\n--- stderr tail ---\n{tail(self.stderr_path)}"
        )


class _StdoutJunkCounter(logging.Handler):
    """Counts lines the SDK could not parse: stdout must carry only JSON-RPC frames."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().startswith("Error parsing JSON-RPC message"):
            self.count += 1


def _short(message: dict[str, Any], limit: int = 600) -> str:
    text = json.dumps(message, ensure_ascii=False)
    return text if len(text) <= limit else text[:limit] + f"...(+{len(text) - limit} chars)"


async def expect_error(awaitable: Any, code: int) -> RequestError:
    """Await ``awaitable`` and assert it fails with JSON-RPC error ``code``."""
    try:
        result = await awaitable
    except RequestError as exc:
        assert exc.code == code, f"expected error {code}, got {exc.code}: {exc} {exc.data}"
        return exc
    raise AssertionError(f"expected error {code}, got result {result!r}")


@asynccontextmanager
async def spawn_sdk_host(
    config_dir: Path, stderr_path: Path, *extra_args: str,
    env: dict[str, str] | None = None,
    on_start: Callable[[SdkHost], None] | None = None,
) -> AsyncIterator[SdkHost]:
    """Start ``zeroclaw acp`` under the SDK; on exit check it ends on EOF and leaks nothing."""
    argv = host_argv(config_dir, *extra_args)
    client = RecordingClient()
    wire: list[tuple[str, dict[str, Any]]] = []

    def observe(event: StreamEvent) -> None:
        wire.append((event.direction.value, event.message))

    junk = _StdoutJunkCounter()
    logging.getLogger().addHandler(junk)
    with stderr_path.open("ab") as stderr_file:
        stack = AsyncExitStack()
        conn, process = await stack.enter_async_context(spawn_agent_process(
            cast(Client, client), argv[0], *argv[1:], env=env or host_env(),
            transport_kwargs={"stderr": stderr_file, "limit": STREAM_LIMIT,
                              "shutdown_timeout": EXIT_GRACE_SECS},
            observers=[observe],
        ))
        host = SdkHost(conn, process, client, config_dir, stderr_path, wire)
        if on_start is not None:
            on_start(host)
        try:
            yield host
        finally:
            if not host.killed:
                host.children_snapshot = descendants(host.pid)
            await _shut_down(host, stack)
            logging.getLogger().removeHandler(junk)
        if junk.count:
            host.problems.append(f"{junk.count} non-JSON line(s) on the host's stdout")
        await _check_exit(host)


async def _shut_down(host: SdkHost, stack: AsyncExitStack) -> None:
    """EOF, then the SDK's wait/terminate/kill; bounded, because asyncio also waits for
    the pipes to close, which never happens if a leaked child inherited the host's stdout."""
    try:
        await asyncio.wait_for(stack.aclose(), 2 * EXIT_GRACE_SECS + 5)
    except TimeoutError:
        host.problems.append(
            f"host pid {host.pid}: its stdout stayed open after shutdown "
            "(a leftover child process still holds the pipe?)"
        )
        if host.process.returncode is None:
            host.process.kill()


async def _check_exit(host: SdkHost) -> None:
    code = host.process.returncode
    if not host.killed and code != 0:
        host.problems.append(
            f"host pid {host.pid} did not exit cleanly within {EXIT_GRACE_SECS:.0f}s of "
            f"stdin EOF (returncode {code})"
        )
    leaks = await asyncio.to_thread(reap_leaks, host.children_snapshot, LEAK_GRACE_SECS)
    if leaks:
        host.problems.append(f"processes left behind by host {host.pid}: {leaks}")
