#!/usr/bin/env python3
"""The design floor for benchmarks: only what the design card makes unavoidable.

Usage: ``design_floor.py [--db PATH]`` (NDJSON JSON-RPC on stdin/stdout; exits on EOF).

A turn goes client -> this host's asyncio loop -> a zmq ROUTER/DEALER hop over
ipc to a second process (the worker, this script with ``--worker``) and back ->
one committed SQLite WAL row through a writer thread -> the answer. Nothing
else: no actors, no session table, no validation past what routing needs.

- ``session/new``    -> one row inserted and committed by the writer thread,
  then ``{"sessionId": "design-<n>"}`` (the new-row round trip)
- ``session/prompt`` -> the prompt goes to the worker, which splits it into
  words (as the echo agent streams it) and sends them back in one zmq message;
  the host writes them as ``session/update`` ``agent_message_chunk``
  notifications, has the writer commit one row for the turn, then answers
  ``{"sessionId", "stopReason": "end_turn", "content"}``
- anything else      -> ``{}``; notifications and responses get no reply.

Threads: the host's asyncio loop (stdio, the ROUTER via ``loop.add_reader`` on
its edge-triggered FD) and one writer thread (``sqlite3``, WAL,
``synchronous=NORMAL`` as the real store; every write queued while it commits
goes into the next transaction: group commit). The worker process runs one
blocking DEALER loop. The worker exits when its host does.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import queue
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import orjson
import zmq

__all__ = ["main"]

FRAME_LIMIT = 32 * 1024 * 1024
_NEWLINE = orjson.OPT_APPEND_NEWLINE


# --- the worker process -------------------------------------------------------------------


def run_worker(endpoint: str, host_pid: int) -> int:
    """Answer every ``[rid, prompt]`` with ``[rid, words]`` until the host is gone."""
    ctx = zmq.Context()
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.connect(endpoint)
    dealer.send_multipart([b"ready", b""])
    poller = zmq.Poller()
    poller.register(dealer, zmq.POLLIN)
    while os.getppid() == host_pid:
        if not poller.poll(1000):
            continue
        while True:
            try:
                rid, prompt = dealer.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            words = prompt.decode().split(" ")
            chunks = [word + " " for word in words[:-1]] + words[-1:]
            dealer.send_multipart([rid, orjson.dumps(chunks)])
    dealer.close()
    ctx.term()
    return 0


# --- the writer thread --------------------------------------------------------------------


class Writer:
    """One SQLite connection on its own thread; ``write`` from the loop, the callback
    runs on the loop once the row is committed."""

    def __init__(self, path: Path, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._queue: queue.SimpleQueue[tuple[str, tuple[Any, ...], Callable[[], None]] | None]
        self._queue = queue.SimpleQueue()
        self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute("CREATE TABLE IF NOT EXISTS sessions (id TEXT PRIMARY KEY, at REAL)")
        self._db.execute("CREATE TABLE IF NOT EXISTS turns (session_id TEXT, prompt TEXT,"
                         " answer TEXT, at REAL)")
        self._thread = threading.Thread(target=self._run, name="writer", daemon=True)
        self._thread.start()

    def write(self, sql: str, params: tuple[Any, ...], done: Callable[[], None]) -> None:
        self._queue.put((sql, params, done))

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(10)

    def _run(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            batch = [first]
            while True:  # group commit: whatever queued up meanwhile
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    self._commit(batch)
                    return
                batch.append(item)
            self._commit(batch)

    def _commit(self, batch: list[tuple[str, tuple[Any, ...], Callable[[], None]]]) -> None:
        self._db.execute("BEGIN IMMEDIATE")
        for sql, params, _done in batch:
            self._db.execute(sql, params)
        self._db.execute("COMMIT")
        for _sql, _params, done in batch:
            self._loop.call_soon_threadsafe(done)


# --- the host -----------------------------------------------------------------------------


class Host:
    """The asyncio side: stdio in and out, the ROUTER, the writer."""

    def __init__(self, db_path: Path, run_dir: Path) -> None:
        self.loop = asyncio.get_running_loop()
        self.writer = Writer(db_path, self.loop)
        self.ctx = zmq.Context()
        self.router = self.ctx.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self.router.setsockopt(zmq.LINGER, 0)
        endpoint = f"ipc://{run_dir}/w.sock"
        self.router.bind(endpoint)
        self.worker = subprocess.Popen(
            [sys.executable, __file__, "--worker", endpoint, str(os.getpid())])
        self.worker_id: bytes | None = None
        self.ready = asyncio.Event()
        self.pending: dict[bytes, tuple[Any, Any, str]] = {}
        self.rids = itertools.count()
        self.sessions = itertools.count(1)
        self.out: Callable[[bytes], None] = lambda data: None
        self.unanswered = 0  # requests still waiting for the worker or the writer
        self.loop.add_reader(self.router.fileno(), self._drain)

    def close(self) -> None:
        self.loop.remove_reader(self.router.fileno())
        self.worker.terminate()
        self.worker.wait(10)
        self.router.close()
        self.ctx.term()
        self.writer.close()

    def _drain(self) -> None:
        """The ROUTER FD is edge-triggered: read until zmq says nothing is left."""
        while self._readable():
            worker_id, rid, body = self.router.recv_multipart(zmq.NOBLOCK)
            if rid == b"ready":
                self.worker_id = worker_id
                self.ready.set()
                continue
            self._turn_answered(rid, orjson.loads(body))

    def _send(self, frames: list[bytes]) -> None:
        self.router.send_multipart(frames, zmq.NOBLOCK)
        if self._readable():
            self.loop.call_soon(self._drain)

    def _readable(self) -> bool:
        return bool(cast(int, self.router.getsockopt(zmq.EVENTS)) & zmq.POLLIN)

    def handle(self, line: bytes) -> None:
        """One request line (loop thread)."""
        try:
            message = orjson.loads(line)
        except orjson.JSONDecodeError:
            self._reply(None, None, {"code": -32700, "message": "Parse error"})
            return
        if not isinstance(message, dict) or "method" not in message or "id" not in message:
            return
        method, request_id = message["method"], message["id"]
        params = message.get("params")
        params = params if isinstance(params, dict) else {}
        self.unanswered += 1
        if method == "session/new":
            sid = f"design-{next(self.sessions)}"
            self.writer.write("INSERT INTO sessions VALUES (?, ?)", (sid, time.time()),
                              lambda: self._reply(request_id, {"sessionId": sid}))
        elif method == "session/prompt":
            text = params.get("prompt")
            text = text if isinstance(text, str) else "hello world"
            rid = str(next(self.rids)).encode()
            self.pending[rid] = (request_id, params.get("sessionId"), text)
            assert self.worker_id is not None
            self._send([self.worker_id, rid, text.encode()])
        else:
            self._reply(request_id, {})

    def _turn_answered(self, rid: bytes, chunks: list[str]) -> None:
        request_id, sid, text = self.pending.pop(rid)
        self.out(b"".join(orjson.dumps(
            {"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": sid,
             "update": {"sessionUpdate": "agent_message_chunk",
                        "content": {"type": "text", "text": chunk}}}}, option=_NEWLINE)
            for chunk in chunks))
        answer = "".join(chunks)
        result = {"sessionId": sid, "stopReason": "end_turn", "content": answer}
        self.writer.write("INSERT INTO turns VALUES (?, ?, ?, ?)", (sid, text, answer,
                          time.time()), lambda: self._reply(request_id, result))

    def _reply(self, request_id: Any, result: Any, error: Any = None) -> None:
        self.unanswered -= error is None
        frame: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id}
        frame.update({"error": error} if error is not None else {"result": result})
        self.out(orjson.dumps(frame, option=_NEWLINE))


async def serve_stdio(db_path: Path | None) -> None:
    with tempfile.TemporaryDirectory(prefix="zcdf-") as temp:
        host = Host(db_path or Path(temp) / "design-floor.db", Path(temp))
        await asyncio.wait_for(host.ready.wait(), 30)
        loop = host.loop
        reader = asyncio.StreamReader(limit=FRAME_LIMIT)
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
        transport, protocol = await loop.connect_write_pipe(
            asyncio.streams.FlowControlMixin, sys.stdout)
        writer = asyncio.StreamWriter(transport, protocol, reader, loop)
        host.out = writer.write
        try:
            while True:
                try:
                    line = await reader.readline()
                except ValueError:
                    continue
                if not line:
                    break
                if line.strip():
                    host.handle(line)
                await writer.drain()
            while host.unanswered:  # EOF: answer what was asked first
                await asyncio.sleep(0.01)
            await writer.drain()
        finally:
            host.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--db", type=Path, help="the SQLite file (default: a temp dir)")
    parser.add_argument("--worker", nargs=2, metavar=("ENDPOINT", "HOST_PID"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return run_worker(args.worker[0], int(args.worker[1]))
    asyncio.run(serve_stdio(args.db))
    return 0


if __name__ == "__main__":
    sys.exit(main())
