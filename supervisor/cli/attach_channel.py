"""What the ``--attach`` bridge (:mod:`supervisor.cli.attach`) and each kind of connection
(a Unix socket there, a WebSocket in :mod:`supervisor.cli.attach_ws`) share: the
:class:`Channel` and :class:`Dialing` they offer the bridge, the refusal that ends it,
the editor's stdout and the splitting of a byte stream into its lines.

Threads: as in :mod:`supervisor.cli.attach` (stdin thread sends, main thread receives).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Protocol

__all__ = ["HEAD_BYTES", "AttachRefused", "Channel", "Dialing", "EditorOutput", "LineSplitter"]

HEAD_BYTES = 256


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


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
