"""``zeroclaw acp client --json``: the transcript mode for scripts.

No prompt UI: the prompts come from ``--prompt`` (in order) or stdin lines (read by a
daemon thread, handed to the loop). Every message the server sends is printed on
stdout as one JSON line, as it came; notes (auto-approvals, rejections) go to
stderr, and so does the server's own stderr. A permission request the auto-approval
rule does not answer is rejected (``reject_once``) unless ``--approve-all``.
Everything else runs on the asyncio loop of the main thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import threading
from collections.abc import AsyncIterator, Mapping
from typing import Any

import orjson

from supervisor.cli.acp_client import (
    CANCELLED,
    ClientSession,
    ConnectionLost,
    Handlers,
    RemoteError,
    ServerConnection,
    ServerStartError,
    selected,
)
from supervisor.cli.acp_client_options import EXIT_PROMPT_ERROR, EXIT_SERVER, ClientOptions
from supervisor.cli.acp_client_policy import auto_approval, option_of_kind

__all__ = ["run_json"]

INITIALIZE_TIMEOUT = 60.0


def run_json(options: ClientOptions) -> int:
    """Run every prompt; 0, 1 (a prompt's JSON-RPC error) or 3 (the server failed)."""
    try:
        return asyncio.run(_transcript(options))
    except KeyboardInterrupt:
        return 130


def _note(text: str) -> None:
    print(f"zeroclaw acp client: {text}", file=sys.stderr, flush=True)


def _print_message(message: Any) -> None:
    """One received message as one line on stdout (the loop thread)."""
    sys.stdout.buffer.write(orjson.dumps(message, option=orjson.OPT_APPEND_NEWLINE))
    sys.stdout.buffer.flush()


def _permission_answerer(options: ClientOptions) -> Any:
    async def answer(params: Mapping[str, Any]) -> dict[str, Any]:
        """The loop thread: the policy first, then --approve-all or a rejection."""
        if options.auto_approve:
            verdict = auto_approval(params, options.cwd)
            if verdict.option_id is not None:
                _note(f"auto-approved {verdict.reason}")
                return selected(verdict.option_id)
        kinds = ("allow_once", "allow_always") if options.approve_all else (
            "reject_once", "reject_always")
        option = option_of_kind(params, *kinds)
        _note(f"permission answered {option or 'cancelled'}")
        return CANCELLED if option is None else selected(option)
    return answer


async def _transcript(options: ClientOptions) -> int:
    handlers = Handlers(on_update=lambda update: None,
                        on_permission=_permission_answerer(options),
                        on_message=_print_message)
    connection = ServerConnection(options.server, handlers)
    try:
        await connection.start()
    except ServerStartError as exc:
        _note(str(exc))
        return EXIT_SERVER
    try:
        return await _run_prompts(options, ClientSession(connection, options.cwd))
    finally:
        await connection.stop()


async def _run_prompts(options: ClientOptions, session: ClientSession) -> int:
    try:
        await session.initialize(INITIALIZE_TIMEOUT)
        await session.new()
    except (RemoteError, ConnectionLost, TimeoutError, KeyError, TypeError) as exc:
        _note(f"the server could not open a session: {exc or type(exc).__name__}")
        return EXIT_SERVER
    code = 0
    async for text in _prompts(options):
        try:
            await session.prompt(text)
        except RemoteError as exc:
            _note(f"prompt failed: {exc}")
            code = EXIT_PROMPT_ERROR
        except ConnectionLost:
            _note("the server exited before the prompt ended")
            return EXIT_SERVER
    return code


async def _prompts(options: ClientOptions) -> AsyncIterator[str]:
    """``--prompt`` texts, else stdin's non-blank lines until EOF."""
    if options.prompts:
        for text in options.prompts:
            yield text
        return
    loop = asyncio.get_running_loop()
    lines: asyncio.Queue[str | None] = asyncio.Queue()

    def read_stdin() -> None:
        """A daemon thread: stdin's lines to the loop, None at EOF."""
        with contextlib.suppress(RuntimeError):  # the loop closed: nobody is reading
            for line in sys.stdin:
                loop.call_soon_threadsafe(lines.put_nowait, line.rstrip("\r\n"))
            loop.call_soon_threadsafe(lines.put_nowait, None)

    threading.Thread(target=read_stdin, name="acp-client-stdin", daemon=True).start()
    while (line := await lines.get()) is not None:
        if line.strip():
            yield line
