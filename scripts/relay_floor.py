#!/usr/bin/env python3
"""The relay floor of ``scripts/bench_capacity``: only the work a streaming host cannot avoid.

Usage: ``relay_floor.py SOCKET BASE_URL`` — serves ACP over NDJSON on the Unix socket
``SOCKET`` until stdin closes, printing ``listening`` once it does.

For each connection: ``initialize`` and ``session/new`` are answered at once (no store,
no workers, no configuration); ``session/prompt`` posts the prompt to
``BASE_URL/chat/completions`` with the same HTTP client as zeroclaw's own agent
(aiohttp, one session per process, keep-alive), reads the Server-Sent Events, and writes
each text delta as one ACP ``session/update`` line to its client as soon as it is parsed,
then answers the prompt ``end_turn``. One asyncio loop on one thread; nothing is
recorded. A client's writes are drained like zeroclaw's (the reply waits while the
client is more than a socket buffer behind).
"""

from __future__ import annotations

import asyncio
import itertools
import sys
from typing import Any

import aiohttp
import orjson

_ids = itertools.count(1)
_LINE = orjson.OPT_APPEND_NEWLINE


def _update(sid: str, text: str) -> bytes:
    return orjson.dumps({"jsonrpc": "2.0", "method": "session/update", "params": {
        "sessionId": sid, "update": {"sessionUpdate": "agent_message_chunk",
                                     "content": {"type": "text", "text": text}}}}, option=_LINE)


def _answer(request_id: Any, result: Any) -> bytes:
    return orjson.dumps({"jsonrpc": "2.0", "id": request_id, "result": result}, option=_LINE)


def _prompt_text(params: dict[str, Any]) -> str:
    return "".join(block.get("text", "") for block in params.get("prompt", ())
                   if isinstance(block, dict))


async def _relay(http: aiohttp.ClientSession, url: str, sid: str, text: str,
                 writer: asyncio.StreamWriter) -> None:
    body = {"model": "floor", "stream": True, "messages": [{"role": "user", "content": text}]}
    async with http.post(url, json=body) as response:
        async for line in response.content:
            if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                continue
            choices = orjson.loads(line[6:]).get("choices") or ()
            delta = choices[0].get("delta", {}).get("content") if choices else None
            if delta:
                writer.write(_update(sid, delta))
                await writer.drain()


async def _serve(http: aiohttp.ClientSession, url: str, reader: asyncio.StreamReader,
                 writer: asyncio.StreamWriter) -> None:
    sid = f"floor-{next(_ids)}"
    while line := await reader.readline():
        frame = orjson.loads(line)
        method, request_id = frame.get("method"), frame.get("id")
        if method == "initialize":
            writer.write(_answer(request_id, {"protocolVersion": 1, "agentCapabilities": {}}))
        elif method == "session/new":
            writer.write(_answer(request_id, {"sessionId": sid}))
        elif method == "session/prompt":
            await _relay(http, url, sid, _prompt_text(frame.get("params", {})), writer)
            writer.write(_answer(request_id, {"stopReason": "end_turn"}))
        elif request_id is not None:
            writer.write(_answer(request_id, None))
        await writer.drain()


async def main(socket_path: str, base_url: str) -> None:
    url = base_url.rstrip("/") + "/chat/completions"
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as http:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                await _serve(http, url, reader, writer)
            except (ConnectionError, aiohttp.ClientError):
                pass
            finally:
                writer.close()

        server = await asyncio.start_unix_server(handle, socket_path, backlog=1024)
        print("listening", flush=True)
        stdin_closed = asyncio.get_running_loop().run_in_executor(None, sys.stdin.buffer.read)
        async with server:
            await stdin_closed


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
