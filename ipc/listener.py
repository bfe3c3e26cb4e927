"""Accepting connections on a listening socket without tripping over the open-file limit.

asyncio's own server, out of file descriptors, logs a traceback for every failed
``accept`` and retries in a storm of timers (a CPU spin and a log flood). Here
each :class:`Listener` runs one plain accept loop, and the loops of a process
share one :class:`OpenFileGuard`: when ``accept`` fails for want of descriptors
(EMFILE, ENFILE, ...), or a connection just accepted took the last one outside
a small reserve, accepting pauses, the reserve is handed back to the rest of
the process (its workers and store still need descriptors),
one warning is logged per :data:`LIMIT_LOG_INTERVAL`, and accepting resumes
once the reserve can be taken again: after a connection closes, or on a slow
retry timer. Clients arriving meanwhile wait in the listen backlog.

:class:`Listener` serves each connection as asyncio streams; an
:class:`AdoptingListener` hands each accepted socket to a library's own server
(the gateway's WebSocket server), so that its connections count against the
same guard.

Threading: everything here runs on the asyncio loop thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import resource
import socket
import time
from collections.abc import Awaitable, Callable
from typing import Final, TypeAlias

__all__ = [
    "LIMIT_LOG_INTERVAL",
    "AdoptingListener",
    "ConnectionHandler",
    "Listener",
    "OpenFileGuard",
    "SocketAdopter",
    "raise_open_file_limit",
]

log = logging.getLogger("zeroclaw.ipc.listener")

ConnectionHandler: TypeAlias = Callable[
    [asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]
]

SocketAdopter: TypeAlias = Callable[[socket.socket, Callable[[], None]], Awaitable[None]]
"""``adopt(conn, on_closed)``: set up a connection on an accepted socket, and call
``on_closed()`` once when it has closed (its descriptor is free again)."""

LIMIT_LOG_INTERVAL: Final = 60.0
"""Seconds between two warnings that the open-file limit stops accepting."""

_RETRY_SECS: Final = 1.0
_SPARE_FDS: Final = 16
_BACKLOG: Final = 100
_OUT_OF_DESCRIPTORS: Final = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
_CLIENT_GAVE_UP: Final = frozenset({errno.ECONNABORTED, errno.EPROTO, errno.EINTR, errno.EAGAIN})


def raise_open_file_limit() -> tuple[int, int]:
    """Raise the soft ``RLIMIT_NOFILE`` to the hard one (main thread, at start);
    the ``(soft, hard)`` now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError) as error:
            log.warning("cannot raise the open-file limit from %d to %d: %s", soft, hard, error)
            return soft, hard
        log.info("raised the open-file limit from %d to %d", soft, hard)
        soft = hard
    return soft, hard


class OpenFileGuard:
    """Pauses every accept loop of the process while it is out of descriptors (loop thread)."""

    def __init__(self, *, spare: int = _SPARE_FDS,
                 log_interval: float = LIMIT_LOG_INTERVAL) -> None:
        self._spare_count = spare
        self._log_interval = log_interval
        self._spares: list[int] = []
        self._open = asyncio.Event()
        self._retry: asyncio.TimerHandle | None = None
        self._warned_at: float | None = None
        self._take_spares()
        self._open.set()

    async def room(self) -> None:
        """Return when accepting is allowed."""
        await self._open.wait()

    def exhausted(self, error: OSError) -> None:
        """``accept`` failed for want of descriptors: pause, free the reserve, warn (rarely)."""
        if not self._open.is_set():
            return
        self._open.clear()
        self._free_spares()
        now = time.monotonic()
        if self._warned_at is None or now - self._warned_at >= self._log_interval:
            self._warned_at = now
            soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
            log.warning("out of file descriptors (%s; open-file limit %d): not accepting new "
                        "connections until some close (logged at most every %g s)",
                        errno.errorcode.get(error.errno or 0, error), soft, self._log_interval)
        self._schedule_retry()

    def accepted(self) -> None:
        """A connection was accepted: if it took the last descriptor outside the
        reserve, pause now, so that the rest of the process is never left without."""
        if not self._spares:
            return
        try:
            os.close(os.dup(self._spares[0]))
        except OSError as error:
            self.exhausted(error)

    def released(self) -> None:
        """A connection closed: resume if the reserve can be taken again."""
        if not self._open.is_set():
            self._try_resume()

    def close(self) -> None:
        """Cancel the retry timer and give the reserve back (the loops are stopping)."""
        if self._retry is not None:
            self._retry.cancel()
            self._retry = None
        self._free_spares()

    def _schedule_retry(self) -> None:
        if self._retry is None:
            self._retry = asyncio.get_running_loop().call_later(_RETRY_SECS, self._on_retry)

    def _on_retry(self) -> None:
        self._retry = None
        if not self._open.is_set():
            self._try_resume()
            if not self._open.is_set():
                self._schedule_retry()

    def _try_resume(self) -> None:
        if self._take_spares():
            log.debug("descriptors free again: accepting connections")
            self._open.set()

    def _take_spares(self) -> bool:
        """Hold the reserve; False (holding nothing) when it cannot be had in full."""
        try:
            while len(self._spares) < self._spare_count:
                self._spares.append(os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC))
        except OSError:
            self._free_spares()
            return False
        return True

    def _free_spares(self) -> None:
        spares, self._spares = self._spares, []
        for fd in spares:
            os.close(fd)


class _AcceptLoop:
    """One accept loop on a bound, listening socket, paused by ``guard``."""

    def __init__(self, sock: socket.socket, *, guard: OpenFileGuard) -> None:
        self._sock = sock
        self._name = sock.getsockname()
        self._guard = guard
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._sock.setblocking(False)
        self._sock.listen(_BACKLOG)
        self._task = asyncio.get_running_loop().create_task(self._accept_loop())

    def stop(self) -> None:
        """Stop accepting now; the listening socket stays open (its owner closes it)."""
        if self._task is not None:
            self._task.cancel()
            self._task = None

    def close(self) -> None:
        """Stop accepting now and close the listening socket (queued clients are refused)."""
        self.stop()
        self._sock.close()

    async def _accept_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._guard.room()
            try:
                conn, _ = await loop.sock_accept(self._sock)
            except OSError as error:
                if error.errno in _OUT_OF_DESCRIPTORS:
                    self._guard.exhausted(error)
                elif error.errno in _CLIENT_GAVE_UP:
                    log.debug("accept failed: %s", error)
                else:  # the listening socket itself is unusable: retrying would spin
                    log.error("stopped accepting on %s: %s", self._name, error)
                    return
                continue
            self._guard.accepted()
            await self._start_connection(loop, conn)

    async def _start_connection(self, loop: asyncio.AbstractEventLoop,
                                conn: socket.socket) -> None:
        raise NotImplementedError


class Listener(_AcceptLoop):
    """Each connection runs ``on_connect(reader, writer)`` in its own task, as
    :func:`asyncio.start_server` does."""

    def __init__(self, sock: socket.socket, on_connect: ConnectionHandler, *, limit: int,
                 guard: OpenFileGuard) -> None:
        super().__init__(sock, guard=guard)
        self._on_connect = on_connect
        self._limit = limit

    async def _start_connection(self, loop: asyncio.AbstractEventLoop,
                                conn: socket.socket) -> None:
        reader = asyncio.StreamReader(limit=self._limit)
        protocol = asyncio.StreamReaderProtocol(reader, self._serve)
        try:
            await loop.connect_accepted_socket(lambda: protocol, conn)
        except OSError as error:
            log.info("could not set up an accepted connection: %s", error)
            with contextlib.suppress(OSError):
                conn.close()
            self._guard.released()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await self._on_connect(reader, writer)
        finally:  # once the transport has closed its socket (already scheduled)
            asyncio.get_running_loop().call_soon(self._guard.released)


class AdoptingListener(_AcceptLoop):
    """Each accepted socket goes to ``adopt(conn, on_closed)`` (:data:`SocketAdopter`),
    in a task of its own: a slow set-up (a TLS handshake) never holds up accepting."""

    def __init__(self, sock: socket.socket, adopt: SocketAdopter, *,
                 guard: OpenFileGuard) -> None:
        super().__init__(sock, guard=guard)
        self._adopt = adopt
        self._adopting: set[asyncio.Task[None]] = set()

    async def _start_connection(self, loop: asyncio.AbstractEventLoop,
                                conn: socket.socket) -> None:
        task = loop.create_task(self._adopt_one(loop, conn))
        self._adopting.add(task)
        task.add_done_callback(self._adopting.discard)

    async def _adopt_one(self, loop: asyncio.AbstractEventLoop, conn: socket.socket) -> None:
        released = False

        def on_closed() -> None:
            nonlocal released
            if not released:
                released = True
                loop.call_soon(self._guard.released)

        try:
            await self._adopt(conn, on_closed)
        except (OSError, TimeoutError) as error:
            log.info("could not set up an accepted connection: %s", error)
            with contextlib.suppress(OSError):
                conn.close()
            on_closed()
