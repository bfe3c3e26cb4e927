#!/usr/bin/env python3
"""The streaming model API of ``scripts/bench_model``: OpenAI Chat Completions over HTTP/1.1.

Usage: ``bench_model_server.py`` — listens on 127.0.0.1 (a free port), prints
``port <n>`` on stdout once listening, serves until stdin closes.

``POST .../chat/completions`` answers with a streamed reply (``text/event-stream``,
chunked) shaped like OpenAI's: a role chunk, text deltas, a finish chunk, a usage chunk,
``data: [DONE]``. What it streams is read from the last user message of the request:

- ``first <n> <gap_ms>``: ``n`` text deltas, ``gap_ms`` apart. The first delta's text
  starts with ``@<t> `` where ``t`` is ``time.monotonic()`` taken just before the write
  that carries the response's first byte (the headers and the first delta go out in
  one write). Clients on this machine subtract it from their own ``time.monotonic()``
  when they have that delta: the same clock, so "server's first byte to client's first
  chunk" is measured alike by every client.
- ``paced <n> <ttft_ms> <gap_ms>``: like a real model: the headers at once, the first
  delta ``ttft_ms`` later, then one every ``gap_ms`` (on a fixed schedule, so a late
  write does not shift the rest). Every delta's text is ``@<t> ``, ``t`` being
  ``time.monotonic()`` just before the write that carries it: a client's delay for each
  delta is its own clock minus ``t``, whatever the server's own lateness.
- ``stream <n>``: ``n`` deltas of ``"x "``, written as fast as the connection takes
  them: each event its own HTTP chunk (as servers that flush per token send them),
  pre-encoded and written :data:`BATCH_EVENTS` chunks at a time.

HTTP is parsed by h11 (the library under httpcore/httpx); asyncio on one thread.
Connections are kept alive between requests.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any

import h11

__all__ = ["openai_event"]

_CHUNK_BASE = {
    "id": "chatcmpl-B9MHDbslfkBeAs8l4bebGdFOJ6PeG", "object": "chat.completion.chunk",
    "created": 1741570283, "model": "gpt-bench", "system_fingerprint": "fp_06737a9306",
    "service_tier": "default",
}
BATCH_EVENTS = 256  # events per write when streaming as fast as possible


def openai_event(delta: dict[str, Any] | None = None, finish: str | None = None,
                 usage: tuple[int, int] | None = None) -> bytes:
    """One ``data:`` event of a streamed Chat Completion, as real servers write it."""
    chunk: dict[str, Any] = dict(_CHUNK_BASE)
    chunk["choices"] = [] if usage else [
        {"index": 0, "delta": delta or {}, "logprobs": None, "finish_reason": finish}]
    chunk["usage"] = None if usage is None else {
        "prompt_tokens": usage[0], "completion_tokens": usage[1],
        "total_tokens": usage[0] + usage[1]}
    return b"data: " + json.dumps(chunk, separators=(",", ":")).encode() + b"\n\n"


_ROLE = openai_event({"role": "assistant", "content": "", "refusal": None})
_X = openai_event({"content": "x "})
_X_CHUNK = b"%x\r\n%s\r\n" % (len(_X), _X)  # one event as one HTTP/1.1 chunk
_HEAD = h11.Response(status_code=200, headers=[
    ("content-type", "text/event-stream"), ("transfer-encoding", "chunked"),
    ("cache-control", "no-cache")])


def _ending(count: int) -> bytes:
    return (openai_event({}, finish="stop") + openai_event(usage=(20, count))
            + b"data: [DONE]\n\n")


def _last_user_text(body: bytes) -> str:
    try:
        messages = json.loads(body)["messages"]
        return str(next(m["content"] for m in reversed(messages) if m["role"] == "user"))
    except (ValueError, KeyError, TypeError, StopIteration):
        return ""


class _Connection:
    """One client connection: requests one after another (keep-alive)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.h11 = h11.Connection(h11.SERVER)

    def _send(self, *events: h11.Event) -> bytes:
        return b"".join(self.h11.send(event) or b"" for event in events)

    async def _next_event(self) -> h11.Event | type[h11.NEED_DATA] | type[h11.PAUSED]:
        while True:
            event = self.h11.next_event()
            if event is not h11.NEED_DATA:
                return event
            data = await self.reader.read(65536)
            self.h11.receive_data(data)
            if not data and self.h11.their_state is not h11.DONE:
                return h11.NEED_DATA

    async def serve(self) -> None:
        while True:
            event = await self._next_event()
            if not isinstance(event, h11.Request):
                return
            body = b""
            while isinstance(data := await self._next_event(), h11.Data):
                body += data.data
            await self._answer(_last_user_text(body).split())
            if self.h11.our_state is not h11.DONE:
                return
            self.h11.start_next_cycle()

    async def _answer(self, words: list[str]) -> None:
        if len(words) == 3 and words[0] == "first":
            await self._first(int(words[1]), float(words[2]) / 1000)
        elif len(words) == 4 and words[0] == "paced":
            await self._paced(int(words[1]), float(words[2]) / 1000, float(words[3]) / 1000)
        else:
            count = int(words[1]) if len(words) == 2 and words[1].isdigit() else 1
            await self._flood(count)

    async def _first(self, count: int, gap: float) -> None:
        stamp = time.monotonic()
        first = openai_event({"content": f"@{stamp:.6f} "})
        self.writer.write(self._send(_HEAD, h11.Data(_ROLE + first)))
        for _ in range(count - 1):
            await asyncio.sleep(gap)
            self.writer.write(self._send(h11.Data(_X)))
        self.writer.write(self._send(h11.Data(_ending(count)), h11.EndOfMessage()))
        await self.writer.drain()

    async def _paced(self, count: int, first: float, gap: float) -> None:
        self.writer.write(self._send(_HEAD, h11.Data(_ROLE)))
        start = time.monotonic() + first
        for index in range(count):
            await asyncio.sleep(max(0.0, start + index * gap - time.monotonic()))
            stamp = time.monotonic()
            self.writer.write(self._send(h11.Data(openai_event({"content": f"@{stamp:.6f} "}))))
            await self.writer.drain()
        self.writer.write(self._send(h11.Data(_ending(count)), h11.EndOfMessage()))
        await self.writer.drain()

    async def _flood(self, count: int) -> None:
        self.writer.write(self._send(_HEAD, h11.Data(_ROLE)))
        left = count
        while left:
            batch = min(left, BATCH_EVENTS)
            self.writer.write(_X_CHUNK * batch)  # h11 would frame them the same way
            left -= batch
            await self.writer.drain()
        self.writer.write(self._send(h11.Data(_ending(count)), h11.EndOfMessage()))
        await self.writer.drain()


async def _handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        await _Connection(reader, writer).serve()
    except (ConnectionError, h11.ProtocolError, asyncio.CancelledError):
        pass  # a client that went, or a kept-alive connection at shutdown
    finally:
        writer.close()


async def main() -> None:
    server = await asyncio.start_server(_handle, "127.0.0.1", 0, backlog=512)
    port = server.sockets[0].getsockname()[1]
    print(f"port {port}", flush=True)
    loop = asyncio.get_running_loop()
    stdin_closed = loop.run_in_executor(None, sys.stdin.buffer.read)
    async with server:
        await stdin_closed


if __name__ == "__main__":
    asyncio.run(main())
