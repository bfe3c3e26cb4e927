"""A PostgreSQL cluster of one test's own, to stop and start under a running
host (the shared cluster of ``scripts/test`` must stay up for the other tests), and a
relay to cut a host off from it.

Made as ``scripts/pg_test_cluster`` makes the shared one: Debian's ``initdb`` and
``pg_ctl`` (found under ``/usr/lib/postgresql/*/bin``; ``scripts/test`` installs them),
run as the ``postgres`` user when the tests run as root, trust logins on loopback, a
free port, no fsync, and a role that logs in with a password made at run time.
:meth:`PrivateCluster.stop` is ``pg_ctl stop -m immediate`` (a crash, as a dead server
looks to a client); :meth:`start` brings it back on the same port (a commit is in the
WAL before it is answered: no committed turn is lost by the crash).

:class:`Partition` is a TCP relay to a server that a test can :meth:`~Partition.cut`:
from then on nothing passes either way and nothing is closed (as when a network drops
every packet), until :meth:`~Partition.heal`. :class:`Fuse` is a relay that cuts one
connection once, on the first request whose bytes hold a marker: before the server
gets it, or after the server has answered it whole (the answer is then dropped).
"""

from __future__ import annotations

import glob
import os
import secrets
import select
import shutil
import socket
import struct
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import psycopg
import pytest

from tests.pg_support import pg_server_url

__all__ = ["Fuse", "Partition", "PrivateCluster", "private_cluster"]

TIMEOUT = 60


def _pg_bin() -> Path:
    for directory in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True):
        if os.access(Path(directory) / "initdb", os.X_OK):
            return Path(directory)
    pg_server_url()  # skips or fails as the other PostgreSQL tests do
    pytest.fail("scripts/test started a cluster but no initdb is under /usr/lib/postgresql")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class PrivateCluster:
    """One throw-away server: its URL (database ``postgres``, superuser ``zeroclaw``)."""

    def __init__(self, directory: Path) -> None:
        self.bin = _pg_bin()
        self.dir = directory
        self.data = directory / "data"
        self.port = _free_port()
        self.url = f"postgresql://zeroclaw@127.0.0.1:{self.port}/postgres"
        self._as: list[str] = []
        self._made_role = False
        if os.geteuid() == 0:
            self._as = ["runuser", "-u", "postgres", "--"]
            shutil.chown(directory, "postgres")
        self._run("initdb", "-D", str(self.data), "-U", "zeroclaw", "--auth=trust",
                  "--encoding=UTF8", "--locale=C.UTF-8", "--no-sync")
        hba = self.data / "pg_hba.conf"
        hba.write_text("local all all trust\n"
                       "host all zc_login 127.0.0.1/32 scram-sha-256\n"
                       "host all all 127.0.0.1/32 trust\n")
        self.password = secrets.token_urlsafe(16)
        #: The password role's URL (its password is :attr:`password`).
        self.login_url = f"postgresql://zc_login@127.0.0.1:{self.port}/zc_login"

    def _run(self, tool: str, *args: str) -> None:
        subprocess.run([*self._as, str(self.bin / tool), *args], check=True,
                       capture_output=True, timeout=TIMEOUT)

    def start(self) -> None:
        self._run("pg_ctl", "start", "-D", str(self.data), "-w", "-t", str(TIMEOUT), "-s",
                  "-l", str(self.dir / "server.log"), "-o",
                  f"-c listen_addresses=127.0.0.1 -c port={self.port} "
                  f"-c unix_socket_directories={self.dir} -c fsync=off "
                  "-c full_page_writes=off")
        if not self._made_role:
            with psycopg.connect(self.url, autocommit=True) as admin:
                admin.execute(f"CREATE ROLE zc_login LOGIN PASSWORD '{self.password}'")
                admin.execute("CREATE DATABASE zc_login OWNER zc_login")
            self._made_role = True

    def stop(self) -> None:
        """A crash: every connection is cut, nothing is shut down cleanly."""
        self._run("pg_ctl", "stop", "-D", str(self.data), "-m", "immediate", "-s")

    def close(self) -> None:
        if (self.data / "postmaster.pid").exists():
            subprocess.run([*self._as, str(self.bin / "pg_ctl"), "stop", "-D",
                            str(self.data), "-m", "immediate", "-s"],
                           capture_output=True, timeout=TIMEOUT, check=False)
        shutil.rmtree(self.dir, ignore_errors=True)


@contextmanager
def private_cluster() -> Iterator[PrivateCluster]:
    """A started :class:`PrivateCluster`, stopped and removed afterwards."""
    cluster = PrivateCluster(Path(tempfile.mkdtemp(prefix="zc-pg-own-")))
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.close()


class _Relay:
    """A relay on a loopback port of its own to ``port`` (the server's): :attr:`port` is
    what a host is given. Each accepted connection gets one to the server, handed to
    :meth:`_relay` (its threads); the accepting thread is started by :meth:`_start`."""

    def __init__(self, port: int) -> None:
        self._upstream = port
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        self._closing = threading.Event()
        self._sockets: list[socket.socket] = []

    def _start(self) -> None:
        threading.Thread(target=self._accept, daemon=True).start()

    def url(self, server_url: str) -> str:
        return server_url.replace(f":{self._upstream}/", f":{self.port}/")

    def _accept(self) -> None:
        while not self._closing.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(("127.0.0.1", self._upstream))
            except OSError:  # the server is down: so is the relayed connection
                client.close()
                continue
            self._sockets += [client, server]
            self._relay(client, server)

    def _relay(self, client: socket.socket, server: socket.socket) -> None:
        raise NotImplementedError


class Partition(_Relay):
    """A relay that can be cut (nothing passes, nothing is closed) and healed. One
    thread per direction of each connection."""

    def __init__(self, port: int) -> None:
        super().__init__(port)
        self._open = threading.Event()  # set: bytes pass
        self._open.set()
        self._start()

    def cut(self) -> None:
        self._open.clear()

    def heal(self) -> None:
        self._open.set()

    def _relay(self, client: socket.socket, server: socket.socket) -> None:
        for source, sink in ((client, server), (server, client)):
            threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        while not self._closing.is_set():
            if not self._open.wait(0.05):
                continue  # cut: what arrives stays unread, nothing goes on
            try:
                ready, _, _ = select.select([source], [], [], 0.05)
                if not ready or not self._open.is_set():
                    continue
                data = source.recv(65536)
                if not data:
                    sink.shutdown(socket.SHUT_WR)
                    return
                sink.sendall(data)
            except OSError:
                return

    def close(self) -> None:
        self._closing.set()
        self._open.set()
        self._listener.close()
        for sock in self._sockets:
            with suppress(OSError):
                sock.close()


class Fuse(_Relay):
    """A relay that blows once:
    on the first bytes a client sends that hold ``marker`` (a query's parameters go
    raw into the protocol's Bind message). ``lose="request"``: those bytes never reach
    the server, and both sockets of that connection are closed. ``lose="reply"``: they
    are sent on, the server's answer is read until its ReadyForQuery (``Z``, length 5:
    the implicit transaction has ended, committed), dropped, and both sockets are
    closed. Every other connection, and that one until then, passes bytes both ways.
    :attr:`blown` is set once the sockets are closed. One thread per direction of each
    connection."""

    def __init__(self, port: int, marker: bytes, lose: str) -> None:
        assert lose in ("request", "reply")
        super().__init__(port)
        self._marker = marker
        self._lose = lose
        self._lock = threading.Lock()
        self._armed: tuple[socket.socket, socket.socket] | None = None  # its answer is read
        self.fired = threading.Event()  # the marked request was seen
        self.blown = threading.Event()  # its connection was closed
        self._start()

    def _relay(self, client: socket.socket, server: socket.socket) -> None:
        threading.Thread(target=self._requests, args=(client, server), daemon=True).start()
        threading.Thread(target=self._answers, args=(server, client), daemon=True).start()

    def _requests(self, client: socket.socket, server: socket.socket) -> None:
        """Client to server; the marked request blows the fuse."""
        tail = b""  # a marker split between two reads is found too
        while (data := _received(client)) is not None:
            with self._lock:
                marked = not self.fired.is_set() and self._marker in tail + data
                if marked:
                    self.fired.set()
                    if self._lose == "reply":
                        self._armed = (client, server)
            if marked and self._lose == "request":
                self._blow(client, server)
                return
            if not _sent(server, data):
                return
            tail = data[-len(self._marker):]
        _end(server)

    def _answers(self, server: socket.socket, client: socket.socket) -> None:
        """Server to client; once armed, the answer is read to its end and dropped."""
        answer = b""
        while (data := _received(server)) is not None:
            with self._lock:
                armed = self._armed == (client, server)
            if not armed:
                if not _sent(client, data):
                    return
                continue
            answer += data
            if _ready_for_query(answer):
                self._blow(client, server)
                return
        _end(client)

    def _blow(self, *sockets: socket.socket) -> None:
        for sock in sockets:
            with suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        self.blown.set()

    def close(self) -> None:
        self._closing.set()
        self._listener.close()
        for sock in self._sockets:
            with suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            with suppress(OSError):
                sock.close()


def _received(sock: socket.socket) -> bytes | None:
    """The next bytes from ``sock``; None at its end (or once it is closed)."""
    try:
        data = sock.recv(65536)
    except OSError:
        return None
    return data or None


def _sent(sock: socket.socket, data: bytes) -> bool:
    try:
        sock.sendall(data)
    except OSError:
        return False
    return True


def _end(sock: socket.socket) -> None:
    with suppress(OSError):
        sock.shutdown(socket.SHUT_WR)


def _ready_for_query(answer: bytes) -> bool:
    """Whether ``answer`` (a server's messages from a message's start) holds a whole
    ReadyForQuery: type ``Z``, length 5 (itself and the transaction status byte)."""
    at = 0
    while at + 5 <= len(answer):
        kind = answer[at:at + 1]
        (length,) = struct.unpack("!I", answer[at + 1:at + 5])
        if kind == b"Z" and length == 5 and at + 6 <= len(answer):
            return True
        at += 1 + length
    return False
