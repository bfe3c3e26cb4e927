"""``zeroclaw acp --attach``: stdio bridged byte for byte to the daemon's ``acp.sock``.

Every editor that spawns ``zeroclaw acp --attach`` shares one host: sessions
outlive the editor, show in ``zeroclaw status`` and load from any editor. When no
daemon answers, an ``--ephemeral`` one is started first, logging to
``<data_dir>/daemon.log``; it exits a second after its last client leaves. It is
started by a double fork, so it is nobody's child: editors that end an agent by
killing its process tree (acpx does) do not take the shared daemon down with it.

Two plain threads move the bytes (no event loop): the main thread copies the
socket to stdout, a helper thread copies stdin to the socket and half-closes it
at EOF, so the daemon can finish in-flight answers before it closes its side.
Both also read the line structure (never changing a byte) to know which of the
editor's requests are still unanswered.

Ending: the editor closed stdin and every request was answered → exit 0. A
connection that ends before the daemon sent a single byte (an ephemeral daemon
stopping just as we connected) is dialled again, starting a daemon if needed, and
what the editor sent so far is replayed on it. A daemon that goes away after it
answered something cannot be replayed: each unanswered request gets -32603, the
cause goes to stderr and the exit status is 1.

With ``--session`` / ``--session-label`` (and ``--require-existing``,
``--reset-session``) the editor's ``session/new`` requests gain the ``_meta`` that
names the session, and with ``--provenance`` its ``initialize`` asks for that mode
(:mod:`supervisor.cli.attach_naming`); every other byte is copied as it is.

The connection is a :class:`Channel`: here a Unix socket (:class:`SocketChannel`);
:mod:`supervisor.cli.attach_ws` supplies one over a WebSocket to a remote gateway
(``--attach ws://…``), and the bridge, its replay and its ending rules are the same.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import re
import select
import socket
import struct
import sys
import termios
import threading
import time
from collections.abc import Callable, Hashable
from pathlib import Path
from typing import Any, Protocol

import orjson

from ipc.errors import InternalError
from ipc.session_names import SessionNaming
from supervisor.cli.attach_naming import RequestRewriter
from supervisor.config import Settings

__all__ = ["AttachRefused", "Channel", "EditorOutput", "LineSplitter", "SocketChannel",
           "run_attach"]

log = logging.getLogger("zeroclaw.attach")

DAEMON_START_SECS = 15.0
REDIALS = 3  # connections that end unanswered, dialled again before giving up
_RESTART_SECS = 0.5  # at most one daemon start per this, while an old one exits
_CHUNK = 256 * 1024
LOST = InternalError("the zeroclaw daemon went away before answering").to_error()
HEAD_BYTES = 256
# How the daemon's answers begin (orjson keeps the Endpoint's key order): the id of
# an answer too long to parse whole is read from its first bytes.
_ANSWER_HEAD = re.compile(
    rb'\{"jsonrpc":"2\.0","id":("(?:[^"\\]|\\.)*"|-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?|null),'
    rb'"(?:result|error)"')


class Channel(Protocol):
    """One connection to the host, as the bridge uses it.

    ``send`` and ``end_input`` run on the stdin thread (under the link's send lock),
    ``recv`` on the main thread; ``input_settled`` and ``close`` on either.
    """

    def send(self, data: bytes) -> None:
        """The editor's bytes, as read (any chunking); raises OSError when broken."""

    def end_input(self) -> None:
        """The editor closed stdin; answers to its requests may still come."""

    def input_settled(self) -> None:
        """The editor's input ended and every one of its requests was answered."""

    def recv(self) -> bytes:
        """The next bytes for the editor (whole lines or not); b"" at the end."""

    def close(self) -> None: ...

    def ending(self) -> str:
        """How the host ended the connection, for the error message ("" if unknown)."""


class Dialing(Protocol):
    """Opens channels to one host; ``where`` and ``hint`` name it in messages."""

    where: str
    hint: str

    def dial(self) -> Channel | None: ...


class AttachRefused(Exception):
    """The host refused us for good (a bad token, a bad address): dialling again
    cannot help. Its text is for the user and never holds the token."""


class EditorOutput:
    """Stdout, written whole frame by whole frame from either thread."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._lock = threading.Lock()

    def write(self, data: bytes) -> None:
        with self._lock:
            _write_all(self._fd, data)


class SocketChannel:
    """The daemon's ``acp.sock``: bytes both ways, EOF by a half-close."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def end_input(self) -> None:
        self.sock.shutdown(socket.SHUT_WR)  # EOF for the daemon; answers still come

    def input_settled(self) -> None:
        """Nothing to do: the daemon closes once it answered (it saw our EOF)."""

    def recv(self) -> bytes:
        return self.sock.recv(_CHUNK)

    def close(self) -> None:
        self.sock.close()

    def ending(self) -> str:
        return ""


def run_attach(settings: Settings, url: str | None = None, token_file: str | None = None,
               ca_file: str | None = None, naming: SessionNaming | None = None,
               provenance: str = "off") -> int:
    """``zeroclaw acp --attach [URL]``: the exit code. No URL: the local daemon's
    ``acp.sock``; a ``ws://`` or ``wss://`` URL: a remote gateway's ``/acp``.
    ``naming``: ``--session KEY`` and its kin, given to each ``session/new``;
    ``provenance``: ``--provenance``, asked for at ``initialize``."""
    output = EditorOutput(sys.stdout.fileno())
    try:
        dialer = _dialer(settings, output, url, token_file, ca_file)
        channel = dialer.dial()
        if channel is None:
            log.error("no zeroclaw host answers at %s%s", dialer.where, dialer.hint)
            return 1
        link = Link(channel)
        naming = naming or SessionNaming()
        rewriter = (RequestRewriter(naming, settings.frame_limit, provenance)
                    if naming.named or provenance != "off" else None)
        unanswered = _bridge(link, dialer, settings.frame_limit, output, rewriter)
    except AttachRefused as refusal:
        log.error("zeroclaw acp --attach: %s", refusal)
        return 1
    if unanswered is None:
        return 0
    ending = link.channel.ending()
    log.error("the zeroclaw host at %s closed the connection%s (%d request(s) unanswered%s)",
              dialer.where, f" ({ending})" if ending else "", unanswered, dialer.hint)
    return 1


def _dialer(settings: Settings, output: EditorOutput, url: str | None,
            token_file: str | None, ca_file: str | None) -> Dialing:
    if url is None:
        from supervisor.servers.daemon import acp_socket_path

        if token_file is not None or ca_file is not None:
            log.warning("--attach without a URL: --token-file and --ca-file are ignored")
        return Dialer(settings, acp_socket_path(settings))
    from supervisor.cli.attach_ws import GatewayDialer

    return GatewayDialer.from_options(url, token_file, ca_file, settings.frame_limit, output)


class Dialer:
    """Connects to ``acp.sock``, starting an ephemeral daemon when none answers.

    A daemon it started that exits at once (an old one still held the lock while
    stopping) is started again, at most every half second, until the deadline.
    """

    def __init__(self, settings: Settings, path: Path) -> None:
        self.settings = settings
        self.path = path
        self.log_path = settings.data_dir / "daemon.log"
        self.where = str(path)
        self.hint = f"; see {self.log_path}"
        self._daemon_pid: int | None = None
        self._started_at = 0.0

    def dial(self, timeout: float = DAEMON_START_SECS) -> SocketChannel | None:
        deadline = time.monotonic() + timeout
        while True:
            sock = _connect(self.path)
            if sock is not None:
                return SocketChannel(sock)
            now = time.monotonic()
            if now >= deadline:
                return None
            if self._needs_start(now):
                try:
                    self._start_daemon()
                except OSError as exc:
                    log.error("could not start a zeroclaw daemon: %s", exc)
                    return None
            time.sleep(0.02)  # the daemon is starting: a bounded poll on its socket

    def _needs_start(self, now: float) -> bool:
        if self._daemon_pid is None:
            return True
        return not _running(self._daemon_pid) and now - self._started_at >= _RESTART_SECS

    def _start_daemon(self) -> None:
        """Start ``zeroclaw daemon --ephemeral`` detached (see the module doc)."""
        settings = self.settings
        settings.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        argv = [sys.executable, "-P", "-m", "supervisor.cli.main", "daemon", "--ephemeral",
                "--config-dir", str(settings.config_dir)]
        self._daemon_pid = _spawn_detached(argv, self.log_path)
        self._started_at = time.monotonic()
        log.info("started an ephemeral zeroclaw daemon, pid %d (log: %s)", self._daemon_pid,
                 self.log_path)


def _spawn_detached(argv: list[str], log_path: Path) -> int:
    """Run ``argv`` in a new session as a grandchild whose parent has already exited
    (stdin and stdout /dev/null, stderr appended to ``log_path``); its pid."""
    log_fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
    read_fd, write_fd = os.pipe()
    child = os.fork()
    if child == 0:  # the middle process: start the daemon, report its pid, exit
        code = 1
        try:
            os.setsid()
            daemon = os.fork()
            if daemon == 0:
                _exec_daemon(argv, log_fd)
            os.write(write_fd, str(daemon).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write_fd)
    os.close(log_fd)
    os.waitpid(child, 0)
    with os.fdopen(read_fd, "rb") as reader:
        reported = reader.read()
    if not reported.isdigit():
        raise OSError("could not start the zeroclaw daemon")
    return int(reported)


def _exec_daemon(argv: list[str], log_fd: int) -> None:
    """In the forked daemon process: wire its stdio and become ``argv`` (never returns).

    Only 0-2 pass to the daemon: a descriptor the editor let us inherit (a pipe, say)
    must not be held open by a daemon that outlives us.
    """
    try:
        null_fd = os.open(os.devnull, os.O_RDWR)
        os.dup2(null_fd, 0)
        os.dup2(null_fd, 1)
        os.dup2(log_fd, 2)
        os.closerange(3, os.sysconf("SC_OPEN_MAX"))
        os.execv(argv[0], argv)
    except OSError as exc:
        os.write(2, f"zeroclaw acp --attach: cannot run {argv[0]}: {exc}\n".encode())
    finally:
        os._exit(127)


def _running(pid: int) -> bool:
    """``pid`` exists and is not a zombie (a reaper may be slow to collect it)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):
        return False


def _connect(path: Path) -> socket.socket | None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(str(path))
    except OSError:
        sock.close()
        return None
    return sock


class Link:
    """The host connection (a :class:`Channel`), shared by both threads.

    Until the host's first byte arrives, what the editor sent is kept so that
    :meth:`replace` can replay it on a new connection. Also tracks the editor's
    unanswered requests by id, and tells the channel when the editor's input ended
    and all of them were answered.
    """

    def __init__(self, channel: Channel) -> None:
        self.channel = channel
        self._send_lock = threading.Lock()  # the stdin thread sends; replace swaps
        self._unconfirmed: bytearray | None = bytearray()
        self._ids: dict[Hashable, Any] = {}
        self._ids_lock = threading.Lock()
        self.input_ended = False  # the editor closed stdin (set by the stdin thread)
        # Held while a chunk of the editor's input is read and handled, so that the
        # main thread can take the rest of the input in itself once the daemon is gone.
        self.input_lock = threading.Lock()

    def send(self, data: bytes) -> None:
        """Stdin thread: forward ``data`` (a dead connection is noticed by the reader)."""
        with self._send_lock:
            kept = self._unconfirmed
            if kept is not None:
                kept += data
            with contextlib.suppress(OSError):
                self.channel.send(data)

    def end_input(self) -> None:
        with self._send_lock:
            with self._ids_lock:
                self.input_ended = True
            with contextlib.suppress(OSError):
                self.channel.end_input()
        self._settle()

    def _settle(self) -> None:
        """Tell the channel when the input ended and nothing is left unanswered (both
        threads check after their change, under the ids lock: one of them sees both)."""
        with self._ids_lock:
            settled = self.input_ended and not self._ids
        if settled:
            with contextlib.suppress(OSError):
                self.channel.input_settled()

    @property
    def confirmed(self) -> bool:
        return self._unconfirmed is None

    def confirm(self) -> None:
        """Main thread: the daemon answered; nothing will be replayed any more."""
        self._unconfirmed = None  # no lock: a send racing with this keeps a dead copy

    def replace(self, channel: Channel) -> None:
        """Main thread: continue on ``channel``, replaying what the editor sent so far."""
        with self._send_lock:
            self.channel.close()
            self.channel = channel
            with contextlib.suppress(OSError):
                channel.send(bytes(self._unconfirmed or b""))
                if self.input_ended:
                    channel.end_input()
        self._settle()

    def sent(self, line: bytes) -> None:
        frame = _frame(line)
        if frame is not None and isinstance(frame.get("method"), str) and "id" in frame:
            with self._ids_lock:
                self._ids[_id_key(frame["id"])] = frame["id"]

    def received(self, line: bytes) -> None:
        if b'"id"' not in line:
            return  # a notification: most of the traffic, not parsed
        frame = _frame(line)
        if frame is not None and "method" not in frame and "id" in frame:
            self._answered(frame["id"])

    def received_long(self, head: bytes) -> None:
        """An answer longer than the frame limit: its id, read from its first bytes."""
        match = _ANSWER_HEAD.match(head)
        if match is not None:
            self._answered(orjson.loads(match.group(1)))

    def _answered(self, request_id: Any) -> None:
        with self._ids_lock:
            self._ids.pop(_id_key(request_id), None)
        if self.input_ended:
            self._settle()

    def unanswered(self) -> list[Any]:
        with self._ids_lock:
            return list(self._ids.values())


def _frame(line: bytes) -> dict[str, Any] | None:
    try:
        frame = orjson.loads(line)
    except orjson.JSONDecodeError:
        return None
    return frame if isinstance(frame, dict) else None


def _id_key(value: Any) -> Hashable:
    return (type(value).__name__, value if isinstance(value, (str, int)) else repr(value))


class LineSplitter:
    """Feeds each complete line of a byte stream to ``on_line``; keeps the partial tail.

    A line longer than ``limit`` is not kept (memory stays bounded and the copy
    linear): it is skipped up to its newline, and ``on_skipped`` gets its first
    :data:`HEAD_BYTES` bytes (enough to find the id of a long answer).
    """

    def __init__(self, on_line: Callable[[bytes], None], limit: int,
                 on_skipped: Callable[[bytes], None] | None = None) -> None:
        self._on_line = on_line
        self._on_skipped = on_skipped
        self._limit = limit
        self._tail = bytearray()
        self._head = b""  # the start of the line being skipped
        self._skipping = False

    @property
    def mid_line(self) -> bool:
        """The stream so far ends inside a line (no newline after its last bytes)."""
        return bool(self._tail) or self._skipping

    def feed(self, data: bytes) -> None:
        start = 0
        while (end := data.find(b"\n", start)) >= 0:
            if not self._skipping and len(self._tail) + end - start > self._limit:
                self._head = bytes((self._tail + data[start:start + HEAD_BYTES])[:HEAD_BYTES])
                self._skipping = True  # over the limit, though it came whole
            if not self._skipping:
                self._tail += data[start:end]
                if self._tail.strip():
                    self._on_line(bytes(self._tail))
            elif self._on_skipped is not None:
                self._on_skipped(self._head)
            self._tail.clear()
            self._skipping = False
            start = end + 1
        if not self._skipping:
            self._tail += data[start:]
            if len(self._tail) > self._limit:
                self._head = bytes(self._tail[:HEAD_BYTES])
                self._tail.clear()
                self._skipping = True


def _bridge(link: Link, dialer: Dialing, frame_limit: int, output: EditorOutput,
            rewriter: RequestRewriter | None = None) -> int | None:
    """Copy both ways until the host closes; None when that was the normal end,
    else how many requests were left unanswered (each answered -32603 here)."""
    stdin_fd = sys.stdin.fileno()
    requests = LineSplitter(link.sent, frame_limit)
    threading.Thread(target=_copy_in, args=(stdin_fd, link, requests, rewriter),
                     daemon=True).start()
    replies = LineSplitter(link.received, frame_limit, link.received_long)
    for _ in range(REDIALS + 1):
        with contextlib.suppress(OSError):
            while data := link.channel.recv():
                link.confirm()
                output.write(data)
                replies.feed(data)
        if link.confirmed or (link.input_ended and not link.unanswered()):
            break
        log.info("the host closed the connection before answering: dialling again")
        try:
            channel = dialer.dial()
        except AttachRefused as refusal:
            log.error("zeroclaw acp --attach: %s", refusal)
            channel = None
        if channel is None:
            break
        link.replace(channel)
    link.channel.close()
    _take_written_input(stdin_fd, link, requests)
    pending = link.unanswered()
    if link.input_ended and not pending:
        return None
    with contextlib.suppress(OSError):
        if pending and replies.mid_line:
            output.write(b"\n")  # end the host's cut-off line: frames stay whole
        for request_id in pending:
            output.write(orjson.dumps(
                {"jsonrpc": "2.0", "id": request_id, "error": LOST}) + b"\n")
    return len(pending)


def _copy_in(stdin_fd: int, link: Link, requests: LineSplitter,
             rewriter: RequestRewriter | None = None) -> None:
    """Stdin thread: copy the editor's input to the daemon until EOF (through
    ``rewriter`` when the command line names a session).

    Each chunk is read and handled under ``link.input_lock`` (the wait for input is
    outside it), so :func:`_take_written_input` sees every byte either handled or
    still unread.
    """
    with contextlib.suppress(OSError, ValueError):
        while True:
            select.select([stdin_fd], [], [])
            with link.input_lock:
                data = os.read(stdin_fd, _CHUNK)
                if not data:
                    break
                if rewriter is not None:
                    data = rewriter.feed(data)
                requests.feed(data)
                link.send(data)
    if rewriter is not None and (tail := rewriter.flush()):
        with link.input_lock:
            requests.feed(tail)
            link.send(tail)
    link.end_input()


def _take_written_input(stdin_fd: int, link: Link, requests: LineSplitter) -> None:
    """Main thread, the daemon gone: note the requests the editor already wrote that
    the stdin thread has not read yet, so that each of them is answered too."""
    with link.input_lock, contextlib.suppress(OSError):
        while _unread_bytes(stdin_fd) > 0:
            data = os.read(stdin_fd, _CHUNK)
            if not data:
                break
            requests.feed(data)


def _unread_bytes(fd: int) -> int:
    """Bytes waiting to be read on ``fd`` (a pipe, socket or terminal), or 0."""
    try:
        raw = fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0")
    except OSError:
        return 0
    return int(struct.unpack("i", raw)[0])


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
