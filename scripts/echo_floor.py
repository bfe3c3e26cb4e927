#!/usr/bin/env python3
"""The speed floor for benchmarks: an NDJSON JSON-RPC server that does no work.

Usage: ``echo_floor.py`` (stdio), ``echo_floor.py --unix PATH`` (Unix socket) or
``echo_floor.py --tcp PORT`` (TCP on 127.0.0.1).

Every request line is answered at once from the asyncio loop thread, with the
same shapes the ACP host returns, so a benchmark client can drive both alike:

- ``session/new``    -> ``{"sessionId": "floor-<n>"}`` (open until ``session/close``)
- ``status``         -> ``{"activeSessions": n, "sessions": [...]}``: an entry of
  the daemon's shape and size per open session, kept encoded between calls (what
  moving the daemon's answer costs, and nothing else)
- ``session/prompt`` -> the prompt echoed back word by word as ``session/update``
  ``agent_message_chunk`` notifications (as the echo agent streams it), then
  ``{"sessionId": ..., "stopReason": "end_turn", "content": <the prompt>}``
- anything else      -> ``{}``

Notifications and responses get no reply; an unparsable line gets -32700.
stdio mode exits on EOF; socket mode runs until SIGINT/SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import os
import signal
import sys
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import orjson

__all__ = ["answer_line", "main", "serve_stdio", "serve_tcp", "serve_unix"]

FRAME_LIMIT = 32 * 1024 * 1024
_session_numbers = itertools.count(1)
_open_sessions: dict[str, None] = {}  # in the order they were opened
_status_sessions: dict[str, Any] = {"version": 0, "listed": -1, "json": b"[]"}


def _status_entry(session_id: str) -> bytes:
    """A session as the daemon's ``status`` lists one (same keys, same sizes)."""
    return orjson.dumps({
        "sessionId": session_id.rjust(36, "0"), "agentAlias": "default", "state": "idle",
        "clients": 1, "lastActivity": 1796319020.6498363, "turns": 0,
        "usage": {"totalTokens": 0}, "cwd": "/tmp/zclfloor00/agents/default/workspace",
        "title": None})


def _status() -> dict[str, Any]:
    """The open sessions, encoded again only after one opened or closed."""
    cache = _status_sessions
    if cache["listed"] != cache["version"]:
        cache["json"] = b"[" + b",".join(map(_status_entry, _open_sessions)) + b"]"
        cache["listed"] = cache["version"]
    return {"activeSessions": len(_open_sessions), "sessions": orjson.Fragment(cache["json"])}


def _result_for(method: object, params: object) -> dict[str, Any]:
    if method == "session/new":
        new_id = f"floor-{next(_session_numbers)}"
        _open_sessions[new_id] = None
        _status_sessions["version"] += 1
        return {"sessionId": new_id}
    if method == "session/close" and isinstance(params, dict):
        if _open_sessions.pop(params.get("sessionId"), 0) is None:  # type: ignore[arg-type]
            _status_sessions["version"] += 1
        return {}
    if method == "status":
        return _status()
    if method == "session/prompt":
        session_id = params.get("sessionId") if isinstance(params, dict) else None
        text = params.get("prompt") if isinstance(params, dict) else None
        text = text if isinstance(text, str) else "hello world"
        return {"sessionId": session_id, "stopReason": "end_turn", "content": text}
    return {}


def _echo_chunks(session_id: Any, text: str) -> bytes:
    """The prompt's words as ``agent_message_chunk`` notifications, one frame each."""
    words = text.split(" ")
    frames = []
    for index, word in enumerate(words):
        chunk = word if index == len(words) - 1 else word + " "
        update = {
            "sessionUpdate": "agent_message_chunk",
            "content": {"type": "text", "text": chunk},
        }
        frames.append(
            orjson.dumps(
                {
                    "jsonrpc": "2.0",
                    "method": "session/update",
                    "params": {"sessionId": session_id, "update": update},
                },
                option=orjson.OPT_APPEND_NEWLINE,
            )
        )
    return b"".join(frames)


def answer_line(line: bytes) -> bytes | None:
    """The reply frame for one input line, or None when it needs no reply."""
    line = line.strip()
    if not line:
        return None
    try:
        message = orjson.loads(line)
    except orjson.JSONDecodeError:
        error = {"code": -32700, "message": "Parse error"}
        return orjson.dumps(
            {"jsonrpc": "2.0", "id": None, "error": error}, option=orjson.OPT_APPEND_NEWLINE
        )
    if not isinstance(message, dict) or "method" not in message or "id" not in message:
        return None
    result = _result_for(message["method"], message.get("params"))
    reply = orjson.dumps(
        {"jsonrpc": "2.0", "id": message["id"], "result": result},
        option=orjson.OPT_APPEND_NEWLINE,
    )
    if message["method"] == "session/prompt":
        return _echo_chunks(result["sessionId"], result["content"]) + reply
    return reply


async def _echo(reader: asyncio.StreamReader, write: Any, drain: Any) -> None:
    while True:
        try:
            line = await reader.readline()
        except ValueError:  # a frame over the limit: drop it, keep serving
            continue
        if not line:
            return
        reply = answer_line(line)
        if reply is not None:
            write(reply)
            await drain()


async def serve_stdio() -> None:
    """Serve stdin/stdout until EOF."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=FRAME_LIMIT)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    try:
        transport, protocol = await loop.connect_write_pipe(
            asyncio.streams.FlowControlMixin, sys.stdout
        )
    except ValueError:  # stdout is a regular file: plain blocking writes
        out = sys.stdout.buffer

        async def flush() -> None:
            out.flush()

        await _echo(reader, out.write, flush)
        return
    writer = asyncio.StreamWriter(transport, protocol, reader, loop)
    await _echo(reader, writer.write, writer.drain)
    with contextlib.suppress(ConnectionError):
        await writer.drain()


async def _handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(ConnectionError):
        await _echo(reader, writer.write, writer.drain)
    writer.close()


async def serve_until_stopped(server: AbstractAsyncContextManager[object]) -> None:
    """Run ``server`` until SIGINT or SIGTERM."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signal_number in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signal_number, stop.set)
    async with server:
        await stop.wait()


async def serve_unix(path: Path) -> None:
    """Serve a Unix socket at ``path`` (mode 0600) until SIGINT/SIGTERM."""
    path.unlink(missing_ok=True)
    server = await asyncio.start_unix_server(_handle, path=str(path), limit=FRAME_LIMIT)
    os.chmod(path, 0o600)
    try:
        await serve_until_stopped(server)
    finally:
        path.unlink(missing_ok=True)


async def serve_tcp(port: int) -> None:
    """Serve TCP on 127.0.0.1:``port`` until SIGINT/SIGTERM."""
    await serve_until_stopped(
        await asyncio.start_server(_handle, "127.0.0.1", port, limit=FRAME_LIMIT))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--unix", type=Path, metavar="PATH", help="listen on a Unix socket")
    parser.add_argument("--tcp", type=int, metavar="PORT", help="listen on 127.0.0.1:PORT")
    args = parser.parse_args(argv)
    if args.unix is not None:
        asyncio.run(serve_unix(args.unix))
    elif args.tcp is not None:
        asyncio.run(serve_tcp(args.tcp))
    else:
        asyncio.run(serve_stdio())
    return 0


if __name__ == "__main__":
    sys.exit(main())
