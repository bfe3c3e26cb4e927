#!/usr/bin/env python3
"""The hosting floor for ``scripts/bench_hosted``: only what the design card makes
unavoidable when a host relays an ACP agent.

Usage: ``hosted_floor.py [--db PATH] -- AGENT_ARGV...`` (NDJSON JSON-RPC on
stdin/stdout; exits on EOF).

The card's shape, with nothing else: the host (this process, one asyncio loop: the
client's stdio and a zmq ROUTER) hands every session to a worker process (this script
with ``--worker``) over a ROUTER/DEALER hop on ipc; the worker runs the agent on its
pipes and one pykka session actor per session; the host's pykka persistence actor
(``design_floor.CardWriter``: zeroclaw's own rows through peewee) commits the session
and each turn before they are answered.

- ``initialize``     -> answered by the host (no capabilities)
- ``session/new``    -> the worker starts the session's actor, which opens a session
  on the agent; the host commits the row and answers ``{"sessionId": "floor-<n>"}``
- ``session/prompt`` -> the session actor writes the prompt to the agent under its own
  id, with the agent's session id. The worker's loop reads the agent's stdout in
  whatever runs of lines the pipe holds, decodes each line (to tell updates from the
  answer, and keep the turn's text for the store), puts the host's session id in place
  of the agent's in each update's bytes and sends the run as one zmq message; the host
  writes it out as it is. The agent's answer goes to the host beside the turn's text;
  the host commits the turn, then answers with the agent's result.
- anything else      -> ``{}``; notifications and responses get no reply.

What this leaves out, and zeroclaw does: permission and fs/terminal requests from
the agent, cancel, limits, pacing for slow clients, the store's copy of every update.
The worker exits when its host does (it polls the host's pid once a second).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import orjson
import pykka
import zmq

sys.path.insert(0, str(Path(__file__).resolve().parent))
from design_floor import CardWriter, RouterHost, serve_host

__all__ = ["main"]

_NEWLINE = orjson.OPT_APPEND_NEWLINE
_READ_SIZE = 1 << 20


# --- the worker process -------------------------------------------------------------------


class AgentPipes:
    """The agent process and the worker's side of its pipes. ``request`` from any thread
    (under a lock); the worker's loop reads :attr:`stdout`."""

    def __init__(self, argv: list[str]) -> None:
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self._stdin = self.proc.stdin
        self.stdout = self.proc.stdout.fileno()
        os.set_blocking(self.stdout, False)
        self._lock = threading.Lock()
        self._ids = itertools.count(1)

    def request(self, method: str, params: dict[str, Any],
                waiting: dict[int, Any] | None = None, what: Any = None) -> None:
        """Write one request; ``waiting[its id] = what`` first, when given."""
        with self._lock:
            request_id = next(self._ids)
            if waiting is not None:
                waiting[request_id] = what
            self._stdin.write(orjson.dumps({"jsonrpc": "2.0", "id": request_id,
                                            "method": method, "params": params},
                                           option=_NEWLINE))
            self._stdin.flush()

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait(10)


class FloorSession(pykka.ThreadingActor):
    """One session's actor in the worker: opens the session on the agent and sends
    its prompts (the actor's thread). What each request is for is noted in
    ``waiting`` (request id -> (kind, host rid, session id)) as it is written."""

    def __init__(self, agent: AgentPipes, waiting: dict[int, Any], sid: bytes) -> None:
        super().__init__()
        self._agent, self._waiting, self._sid = agent, waiting, sid

    def open(self, rid: bytes, cwd: str) -> None:
        self._agent.request("session/new", {"cwd": cwd, "mcpServers": []}, self._waiting,
                            ("new", rid, self._sid))

    def prompt(self, rid: bytes, agent_sid: str, prompt: list[Any]) -> None:
        self._agent.request("session/prompt", {"sessionId": agent_sid, "prompt": prompt},
                            self._waiting, ("prompt", rid, self._sid))


class FloorWorker:
    """The worker's loop (its main thread): the DEALER and the agent's stdout."""

    def __init__(self, endpoint: str, host_pid: int, argv: list[str]) -> None:
        self.ctx = zmq.Context()
        self.dealer = self.ctx.socket(zmq.DEALER)
        self.dealer.setsockopt(zmq.LINGER, 0)
        self.dealer.connect(endpoint)
        self.host_pid = host_pid
        self.agent = AgentPipes(argv)
        self.waiting: dict[int, tuple[str, bytes, bytes]] = {}
        self.sessions: dict[bytes, pykka.ActorProxy[FloorSession]] = {}
        self.agent_sids: dict[bytes, str] = {}
        self.by_agent_sid: dict[bytes, bytes] = {}  # the agent's id, JSON-quoted -> ours
        self.prompts: dict[bytes, list[str]] = {}  # session -> the turn's text so far
        self.tail = b""

    def run(self) -> int:
        self.agent.request("initialize", {"protocolVersion": 1, "clientCapabilities": {}})
        self.send([b"ready", b""])
        poller = zmq.Poller()
        poller.register(self.dealer, zmq.POLLIN)
        poller.register(self.agent.stdout, zmq.POLLIN)
        while True:
            ready = dict(poller.poll(1000))
            if not ready and not _alive(self.host_pid):
                return 0
            if self.agent.stdout in ready and not self.read_agent():
                return 1
            while cast(int, self.dealer.getsockopt(zmq.EVENTS)) & zmq.POLLIN:
                self.from_host(self.dealer.recv_multipart(zmq.NOBLOCK))

    def send(self, frames: list[bytes]) -> None:
        """To the host (only this loop sends: the session actors write to the agent)."""
        self.dealer.send_multipart(frames)

    def from_host(self, frames: list[bytes]) -> None:
        kind, rid, sid, body = frames
        if kind == b"new":
            actor = FloorSession.start(self.agent, self.waiting, sid).proxy()
            self.sessions[sid] = actor
            actor.open(rid, body.decode())
        else:
            self.prompts[sid] = []
            self.sessions[sid].prompt(rid, self.agent_sids[sid], orjson.loads(body))

    def read_agent(self) -> bool:
        """What the pipe holds, line by line: the updates of each session as one message."""
        try:
            data = os.read(self.agent.stdout, _READ_SIZE)
        except BlockingIOError:
            return True
        if not data:
            return False
        lines = (self.tail + data).split(b"\n")
        self.tail = lines.pop()
        runs: dict[bytes, list[bytes]] = {}
        for line in lines:
            self.one_line(line, runs)
        for sid, run in runs.items():
            self.send([b"updates", sid, b"".join(run)])
        return True

    def one_line(self, line: bytes, runs: dict[bytes, list[bytes]]) -> None:
        message = orjson.loads(line)
        params = message.get("params")
        if message.get("method") == "session/update" and isinstance(params, dict):
            quoted = orjson.dumps(params.get("sessionId"))
            sid = self.by_agent_sid.get(quoted)
            if sid is None:
                return
            content = params.get("update", {}).get("content")
            if isinstance(content, dict) and isinstance(content.get("text"), str):
                self.prompts[sid].append(content["text"])
            runs.setdefault(sid, []).append(line.replace(quoted, b'"' + sid + b'"', 1) + b"\n")
        elif "id" in message and message["id"] in self.waiting:
            self.answered(message, runs)

    def answered(self, message: dict[str, Any], runs: dict[bytes, list[bytes]]) -> None:
        kind, rid, sid = self.waiting.pop(message["id"])
        for run_sid, run in runs.items():  # what came before the answer goes first
            self.send([b"updates", run_sid, b"".join(run)])
        runs.clear()
        result = message.get("result") or {}
        if kind == "new":
            agent_sid = str(result.get("sessionId"))
            self.agent_sids[sid] = agent_sid
            self.by_agent_sid[orjson.dumps(agent_sid)] = sid
            self.send([b"opened", rid])
        else:
            text = "".join(self.prompts.pop(sid, []))
            self.send([b"answer", rid, orjson.dumps(result), text.encode()])


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def run_worker(endpoint: str, host_pid: int, argv: list[str]) -> int:
    worker = FloorWorker(endpoint, host_pid, argv)
    try:
        return worker.run()
    finally:
        pykka.ActorRegistry.stop_all()
        worker.agent.close()


# --- the host -----------------------------------------------------------------------------


class FloorHost(RouterHost):
    """The asyncio side (the loop thread): stdio in and out, the ROUTER, the writer."""

    def __init__(self, db_path: Path, run_dir: Path, agent_argv: list[str]) -> None:
        super().__init__(CardWriter.open(db_path, asyncio.get_running_loop()), run_dir,
                         __file__, ["--", *agent_argv])
        self.worker_id = b""
        self.waiting: dict[bytes, Callable[[list[bytes]], None]] = {}

    def _drain(self) -> None:
        """The ROUTER FD is edge-triggered: read until zmq says nothing is left."""
        while cast(int, self.router.getsockopt(zmq.EVENTS)) & zmq.POLLIN:
            worker_id, kind, *rest = self.router.recv_multipart(zmq.NOBLOCK)
            if kind == b"updates":
                self.out(rest[1])
            elif kind == b"ready":
                self.worker_id = worker_id
                self.ready.set()
            else:
                self.waiting.pop(rest[0])(rest[1:])

    def _ask(self, kind: bytes, sid: str, body: bytes,
             then: Callable[[list[bytes]], None]) -> None:
        rid = str(next(self.rids)).encode()
        self.waiting[rid] = then
        self.router.send_multipart([self.worker_id, kind, rid, sid.encode(), body])
        self.loop.call_soon(self._drain)

    def handle(self, line: bytes) -> None:
        """One request line (loop thread)."""
        message = orjson.loads(line)
        if not isinstance(message, dict) or "method" not in message or "id" not in message:
            return
        method, request_id = message["method"], message["id"]
        params = message.get("params")
        params = params if isinstance(params, dict) else {}
        self.unanswered += 1
        if method == "session/new":
            self._new_session(request_id, str(params.get("cwd") or "/"))
        elif method == "session/prompt":
            sid, prompt = str(params.get("sessionId")), params.get("prompt") or []
            text = "".join(str(block.get("text", "")) for block in prompt)
            self._ask(b"prompt", sid, orjson.dumps(prompt),
                      lambda answer: self._answered(request_id, sid, text, answer))
        else:
            self._reply(request_id, {})

    def _new_session(self, request_id: Any, cwd: str) -> None:
        """The session's actor and agent session opened, its row committed: answered."""
        sid = f"floor-{next(self.sessions)}"
        waiting = [2]

        def one_done(*_args: Any) -> None:
            waiting[0] -= 1
            if not waiting[0]:
                self._reply(request_id, {"sessionId": sid})

        self._ask(b"new", sid, cwd.encode(), one_done)
        self.writer.write_session(sid, one_done)

    def _answered(self, request_id: Any, sid: str, prompt: str, answer: list[bytes]) -> None:
        result, text = orjson.loads(answer[0]), answer[1].decode()
        self.writer.write_turn(sid, prompt, text, lambda: self._reply(request_id, result))

    def _reply(self, request_id: Any, result: Any) -> None:
        self.unanswered -= 1
        self.out(orjson.dumps({"jsonrpc": "2.0", "id": request_id, "result": result},
                              option=_NEWLINE))


async def serve_stdio(db_path: Path | None, agent_argv: list[str]) -> None:
    with tempfile.TemporaryDirectory(prefix="zchf-") as temp:
        await serve_host(FloorHost(db_path or Path(temp) / "hosted-floor.db", Path(temp),
                                   agent_argv))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--db", type=Path, help="the SQLite file (default: a temp dir)")
    parser.add_argument("--worker", nargs=2, metavar=("ENDPOINT", "HOST_PID"),
                        help=argparse.SUPPRESS)
    parser.add_argument("agent", nargs="+", help="the agent's command line (after --)")
    args = parser.parse_args(argv)
    if args.worker:
        return run_worker(args.worker[0], int(args.worker[1]), args.agent)
    asyncio.run(serve_stdio(args.db, args.agent))
    return 0


if __name__ == "__main__":
    sys.exit(main())
