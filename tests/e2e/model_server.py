"""A local model API for the provider tests: a real HTTP server on 127.0.0.1.

It replays scripted responses in the wire formats real servers use (OpenAI's
streamed Chat Completions, Anthropic's streamed Messages: see
:mod:`tests.e2e.model_streams`) and records every request (path, headers, JSON
body, arrival time), so a test can assert what the model was sent. A scripted
reply can stop mid-stream (the connection is cut: a broken stream) or hold the
stream open until the test releases it or the client goes away (cancel). Instead of a
script, a ``responder`` can answer each request (GET too) from what it asked, for a
client whose requests come in no fixed order.

The server runs on its own threads (``ThreadingHTTPServer``); the test's thread
scripts it and reads what it recorded.
"""

from __future__ import annotations

import json
import select
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["ModelServer", "Recorded", "Reply"]

FLOOD_BATCH = 256  # chunks per write when flooding
_COMMENT = b": keep-alive\n\n"


@dataclass(frozen=True)
class Reply:
    """One scripted response.

    ``events`` are SSE frames sent one chunk each (a 200 stream); ``body`` is a whole
    non-streamed body (an error status). ``cut_after`` cuts the connection after that
    many events; ``hold_after`` holds the stream open after that many events;
    ``hold_headers`` holds before sending anything (a server that never answers).
    ``flood`` is ``(event, count)``: after the first event, ``event`` is sent ``count``
    times as fast as the connection takes it (one chunk each, many per write).
    ``comment_every`` sends an SSE comment line that often (seconds) while held.
    """

    status: int = 200
    events: tuple[bytes, ...] = ()
    body: bytes = b""
    headers: tuple[tuple[str, str], ...] = ()
    cut_after: int | None = None
    hold_after: int | None = None
    hold_headers: bool = False
    flood: tuple[bytes, int] | None = None
    comment_every: float | None = None


@dataclass(frozen=True)
class Recorded:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]
    at: float
    method: str = "POST"


_NO_REPLY = Reply(status=500, body=b'{"error":{"message":"no scripted reply"}}')


@dataclass
class _State:
    replies: deque[Reply] = field(default_factory=deque)
    requests: list[Recorded] = field(default_factory=list)
    changed: threading.Condition = field(default_factory=threading.Condition)
    release: threading.Event = field(default_factory=threading.Event)
    client_gone: threading.Event = field(default_factory=threading.Event)
    responder: Callable[[Recorded], Reply] | None = None


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def do_GET(self) -> None:
        self.do_POST()

    def do_POST(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length)
        state = self.server.state
        recorded = Recorded(self.path, {k.lower(): v for k, v in self.headers.items()},
                            json.loads(raw or b"{}"), time.monotonic(), self.command)
        with state.changed:
            state.requests.append(recorded)
            state.changed.notify_all()
            if state.responder is None:
                reply = state.replies.popleft() if state.replies else _NO_REPLY
        if state.responder is not None:
            reply = state.responder(recorded)
        if reply.hold_headers and not self._hold():
            return
        if reply.status != 200 or not reply.events:
            self._send_whole(reply)
        else:
            self._send_stream(reply)

    def _send_whole(self, reply: Reply) -> None:
        self.send_response(reply.status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(reply.body)))
        for name, value in reply.headers:
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(reply.body)

    def _send_stream(self, reply: Reply) -> None:
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()
        for n, event in enumerate(reply.events):
            if n == reply.cut_after:
                self.close_connection = True
                self.connection.shutdown(socket.SHUT_RDWR)
                return
            if n == reply.hold_after and not self._hold(reply.comment_every):
                return
            if n == 1 and reply.flood is not None:
                self._flood(*reply.flood)
            self.wfile.write(b"%x\r\n%s\r\n" % (len(event), event))
            self.wfile.flush()
        self.wfile.write(b"0\r\n\r\n")

    def _flood(self, event: bytes, count: int) -> None:
        chunk = b"%x\r\n%s\r\n" % (len(event), event)
        while count:
            batch = min(count, FLOOD_BATCH)
            self.wfile.write(chunk * batch)
            count -= batch
        self.wfile.flush()

    def _hold(self, comment_every: float | None = None) -> bool:
        """Keep the stream open until released (True) or the client leaves (False);
        an SSE comment goes out every ``comment_every`` seconds meanwhile."""
        state = self.server.state
        next_comment = time.monotonic() + (comment_every or 0)
        while not state.release.wait(0.02):
            if comment_every is not None and time.monotonic() >= next_comment:
                next_comment += comment_every
                try:
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(_COMMENT), _COMMENT))
                    self.wfile.flush()
                except OSError:
                    state.client_gone.set()
                    return False
            readable, _, _ = select.select([self.connection], [], [], 0)
            if readable and not self.connection.recv(1, socket.MSG_PEEK):
                state.client_gone.set()
                self.close_connection = True
                return False
        return True


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    state: _State


class ModelServer:
    """Start on construction; :meth:`close` after the test (the fixture does)."""

    def __init__(self, responder: Callable[[Recorded], Reply] | None = None) -> None:
        """``responder`` (run on the server's request threads) answers every request;
        without one, :meth:`script` queues the replies."""
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.state = self.state = _State(responder=responder)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def script(self, *replies: Reply) -> None:
        with self.state.changed:
            self.state.replies.extend(replies)

    @property
    def requests(self) -> list[Recorded]:
        with self.state.changed:
            return list(self.state.requests)

    def wait_requests(self, count: int, timeout: float = 10.0) -> list[Recorded]:
        with self.state.changed:
            ok = self.state.changed.wait_for(lambda: len(self.state.requests) >= count, timeout)
            assert ok, f"the model server got {len(self.state.requests)} of {count} requests"
            return list(self.state.requests)

    def close(self) -> None:
        self.state.release.set()
        self._server.shutdown()
        self._server.server_close()
