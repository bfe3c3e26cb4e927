#!/usr/bin/env python3
"""The design floor for benchmarks: only what the design card makes unavoidable.

Usage: ``design_floor.py [--db PATH] [--card [--max-sessions N]]`` (NDJSON JSON-RPC on
stdin/stdout; exits on EOF).

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

``--card`` adds the two parts the design card names for every session and turn, and
nothing else: in the worker, one pykka session actor per session, started by
``session/new`` (a round trip to the worker, beside the row's commit; the answer
waits for both) and, past ``--max-sessions`` live actors, the least recently used
one stopped as that session/new starts its own (the card's "up to maxSessions"),
runs the session's turns and sends each answer on the DEALER
itself (under a lock, as zeroclaw's session threads do);
on the host, the writer is a pykka persistence actor writing zeroclaw's own rows
(the session row; per turn its two message rows and the session's counters)
through peewee and :class:`storage.prepared_writes.PreparedWrites`. The gap from
the plain floor to this one is what those parts cost; from this one to zeroclaw,
what zeroclaw's own code costs.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import queue
import select
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
import pykka
import zmq

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # zeroclaw's store (--card)

__all__ = ["main"]

FRAME_LIMIT = 32 * 1024 * 1024
_NEWLINE = orjson.OPT_APPEND_NEWLINE


# --- the worker process -------------------------------------------------------------------


def echo_chunks(prompt: bytes) -> list[str]:
    """The prompt's words, as the echo agent streams them."""
    words = prompt.decode().split(" ")
    return [word + " " for word in words[:-1]] + words[-1:]


def run_worker(endpoint: str, host_pid: int, card: bool, max_sessions: int) -> int:
    """Answer every ``[rid, sid, prompt]`` with ``[rid, words]`` until the host is gone
    (``card``: each session's prompts go through that session's actor)."""
    ctx = zmq.Context()
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.connect(endpoint)
    dealer.send_multipart([b"ready", b""])
    if card:
        CardWorker(dealer, host_pid, max_sessions).run()
    else:
        poller = zmq.Poller()
        poller.register(dealer, zmq.POLLIN)
        while os.getppid() == host_pid:
            if not poller.poll(1000):
                continue
            while True:
                try:
                    rid, _sid, prompt = dealer.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                dealer.send_multipart([rid, orjson.dumps(echo_chunks(prompt))])
    dealer.close()
    ctx.term()
    return 0


class SessionActor(pykka.ThreadingActor):
    """One session's turns, on the actor's own thread: the answer goes out on the
    DEALER under the worker's lock; the IO thread is woken only if input is waiting
    (this send may have taken the FD's edge)."""

    def __init__(self, worker: CardWorker) -> None:
        super().__init__()
        self.worker = worker

    def on_receive(self, message: Any) -> None:
        rid, prompt = message
        worker = self.worker
        with worker.lock:
            worker.dealer.send_multipart([rid, orjson.dumps(echo_chunks(prompt))], zmq.NOBLOCK)
            pending = worker.has_input()
        if pending:
            os.write(worker.wake_w, b"x")


class CardWorker:
    """The worker's IO thread in ``--card`` mode: polls the DEALER's FD (and a wake
    pipe), reads under the lock, tells each prompt to its session's actor."""

    def __init__(self, dealer: zmq.Socket[bytes], host_pid: int, max_sessions: int) -> None:
        self.dealer = dealer
        self.host_pid = host_pid
        self.lock = threading.Lock()
        self.wake_r, self.wake_w = os.pipe()
        self.max_sessions = max_sessions
        self.actors: dict[bytes, pykka.ActorRef[SessionActor]] = {}  # oldest use first

    def has_input(self) -> bool:
        return bool(cast(int, self.dealer.getsockopt(zmq.EVENTS)) & zmq.POLLIN)

    def run(self) -> None:
        poller = select.poll()
        poller.register(cast(int, self.dealer.getsockopt(zmq.FD)), select.POLLIN)
        poller.register(self.wake_r, select.POLLIN)
        try:
            while os.getppid() == self.host_pid:
                for fd, _events in poller.poll(1000):
                    if fd == self.wake_r:
                        os.read(self.wake_r, 4096)
                self._receive_all()
        finally:
            pykka.ActorRegistry.stop_all()

    def _receive_all(self) -> None:
        """``[rid, sid]`` starts the session's actor and answers; ``[rid, sid, prompt]``
        goes to that actor."""
        with self.lock:
            while True:
                try:
                    rid, sid, *prompt = self.dealer.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    return
                if not prompt:
                    self._start_actor(sid)
                    self.dealer.send_multipart([rid, b"[]"], zmq.NOBLOCK)
                    continue
                actor = self.actors.pop(sid, None) or self._start_actor(sid)
                self.actors[sid] = actor  # now the most recently used
                actor.tell((rid, prompt[0]))

    def _start_actor(self, sid: bytes) -> pykka.ActorRef[SessionActor]:
        """Start ``sid``'s actor; past the cap, stop the least recently used one."""
        if len(self.actors) >= self.max_sessions:
            oldest = next(iter(self.actors))
            self.actors.pop(oldest).stop(block=False)
        actor = self.actors[sid] = SessionActor.start(self)
        return actor


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

    def write_session(self, sid: str, done: Callable[[], None]) -> None:
        self._queue.put(("INSERT INTO sessions VALUES (?, ?)", (sid, time.time()), done))

    def write_turn(self, sid: str, prompt: str, answer: str, done: Callable[[], None]) -> None:
        self._queue.put(("INSERT INTO turns VALUES (?, ?, ?, ?)",
                         (sid, prompt, answer, time.time()), done))

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


class CardWriter(pykka.ThreadingActor):
    """``--card``: a pykka persistence actor writing zeroclaw's own rows through
    peewee (:class:`storage.prepared_writes.PreparedWrites`). Writes that arrive
    while the inbox is not empty are held and committed together (group commit);
    each callback then runs on the loop. Everything but the constructor runs on the
    actor's thread; ``write_*`` and ``close`` are called from the loop."""

    def __init__(self, path: Path, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__()
        from storage import open_store
        from storage.prepared_writes import PreparedWrites

        self._loop = loop
        self._store = open_store(path)
        self._prepared = PreparedWrites(self._store.writer)
        self._held: list[tuple[tuple[str, ...], Callable[[], None]]] = []

    @classmethod
    def open(cls, path: Path, loop: asyncio.AbstractEventLoop) -> CardWriterRef:
        return CardWriterRef(cls.start(path, loop))

    def on_receive(self, message: Any) -> None:
        self._held.append(message)
        if self.actor_inbox.empty():
            held, self._held = self._held, []
            db = self._store.writer
            db.begin()
            for row, _done in held:
                if len(row) == 1:
                    self.insert_session(*row)
                else:
                    self.insert_turn(*row)
            db.commit()
            self._prepared.commit_staged()
            for _write, done in held:
                self._loop.call_soon_threadsafe(done)

    def on_stop(self) -> None:
        self._store.close()

    def insert_session(self, sid: str) -> None:
        from storage.models import StoredSession

        now = time.time()
        self._prepared.insert_session(StoredSession(
            id=sid, agent_alias="echo", workspace_dir="/", cwd="/", mode="default",
            created_at=now, last_activity=now))

    def insert_turn(self, sid: str, prompt: str, answer: str) -> None:
        from ipc.events import TextItem, TurnRecord

        now = time.time()
        self._prepared.write_turn(TurnRecord(
            session_id=sid, items=(TextItem("user", prompt), TextItem("assistant", answer)),
            stop_reason="end_turn", content=answer, started_at=now, finished_at=now))


class CardWriterRef:
    """The loop's handle on a :class:`CardWriter` (the writes are told, not asked)."""

    def __init__(self, ref: pykka.ActorRef[CardWriter]) -> None:
        self._ref = ref

    def write_session(self, sid: str, done: Callable[[], None]) -> None:
        self._ref.tell(((sid,), done))

    def write_turn(self, sid: str, prompt: str, answer: str, done: Callable[[], None]) -> None:
        self._ref.tell(((sid, prompt, answer), done))

    def close(self) -> None:
        self._ref.stop(timeout=10)


# --- the host -----------------------------------------------------------------------------


class RouterHost:
    """What the hosts of both floors share (the loop thread): the writer, a ROUTER bound
    in ``run_dir``, the worker process (``script --worker ENDPOINT HOST_PID`` and
    ``worker_args``) whose messages :meth:`_drain` reads, and what
    :func:`serve_host` uses (``ready``, ``out``, ``unanswered``, ``handle``)."""

    def __init__(self, writer: Writer | CardWriterRef, run_dir: Path, script: str,
                 worker_args: list[str]) -> None:
        self.loop = asyncio.get_running_loop()
        self.writer = writer
        self.ctx = zmq.Context()
        self.router = self.ctx.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self.router.setsockopt(zmq.LINGER, 0)
        endpoint = f"ipc://{run_dir}/w.sock"
        self.router.bind(endpoint)
        self.worker = subprocess.Popen(
            [sys.executable, script, "--worker", endpoint, str(os.getpid()), *worker_args])
        self.ready = asyncio.Event()
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
        raise NotImplementedError


class Host(RouterHost):
    """The asyncio side: stdio in and out, the ROUTER, the writer."""

    def __init__(self, db_path: Path, run_dir: Path, card: bool, max_sessions: int) -> None:
        loop = asyncio.get_running_loop()
        super().__init__(CardWriter.open(db_path, loop) if card else Writer(db_path, loop),
                         run_dir, __file__,
                         ["--card", "--max-sessions", str(max_sessions)] if card else [])
        self.card = card
        self.worker_id: bytes | None = None
        self.pending: dict[bytes, tuple[Any, Any, str]] = {}
        self.opening: dict[bytes, Callable[[], None]] = {}  # --card: actors being started

    def _drain(self) -> None:
        """The ROUTER FD is edge-triggered: read until zmq says nothing is left."""
        while self._readable():
            worker_id, rid, body = self.router.recv_multipart(zmq.NOBLOCK)
            if rid == b"ready":
                self.worker_id = worker_id
                self.ready.set()
                continue
            opened = self.opening.pop(rid, None)
            if opened is not None:
                opened()
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
            self._new_session(request_id)
        elif method == "session/prompt":
            text = params.get("prompt")
            text = text if isinstance(text, str) else "hello world"
            rid = str(next(self.rids)).encode()
            session_id = params.get("sessionId")
            self.pending[rid] = (request_id, session_id, text)
            assert self.worker_id is not None
            self._send([self.worker_id, rid, str(session_id).encode(), text.encode()])
        else:
            self._reply(request_id, {})

    def _new_session(self, request_id: Any) -> None:
        """Commit the session's row (``--card``: and start its actor in the worker, at
        the same time); answer once everything asked for is done."""
        sid = f"design-{next(self.sessions)}"
        waiting = [2 if self.card else 1]

        def one_done() -> None:
            waiting[0] -= 1
            if not waiting[0]:
                self._reply(request_id, {"sessionId": sid})

        if self.card:
            rid = str(next(self.rids)).encode()
            self.opening[rid] = one_done
            assert self.worker_id is not None
            self._send([self.worker_id, rid, sid.encode()])
        self.writer.write_session(sid, one_done)

    def _turn_answered(self, rid: bytes, chunks: list[str]) -> None:
        request_id, sid, text = self.pending.pop(rid)
        self.out(b"".join(orjson.dumps(
            {"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": sid,
             "update": {"sessionUpdate": "agent_message_chunk",
                        "content": {"type": "text", "text": chunk}}}}, option=_NEWLINE)
            for chunk in chunks))
        answer = "".join(chunks)
        result = {"sessionId": sid, "stopReason": "end_turn", "content": answer}
        self.writer.write_turn(sid, text, answer, lambda: self._reply(request_id, result))

    def _reply(self, request_id: Any, result: Any, error: Any = None) -> None:
        self.unanswered -= error is None
        frame: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id}
        frame.update({"error": error} if error is not None else {"result": result})
        self.out(orjson.dumps(frame, option=_NEWLINE))


async def serve_stdio(db_path: Path | None, card: bool, max_sessions: int) -> None:
    with tempfile.TemporaryDirectory(prefix="zcdf-") as temp:
        await serve_host(Host(db_path or Path(temp) / "design-floor.db", Path(temp), card,
                              max_sessions))


async def serve_host(host: Any) -> None:
    """Serve ``host`` on this process's stdin and stdout until EOF (the loop thread):
    each request line to ``host.handle``, its ``out`` writing to stdout; at EOF, what
    it still owes (``unanswered``) is answered first, then it is closed. Shared with
    ``hosted_floor.py``."""
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
    parser.add_argument("--card", action="store_true",
                        help="add a pykka session actor per session and zeroclaw's store")
    parser.add_argument("--max-sessions", type=int, default=128, metavar="N",
                        help="--card: live session actors at most (default 128)")
    args = parser.parse_args(argv)
    if args.worker:
        return run_worker(args.worker[0], int(args.worker[1]), args.card, args.max_sessions)
    asyncio.run(serve_stdio(args.db, args.card, args.max_sessions))
    return 0


if __name__ == "__main__":
    sys.exit(main())
