"""The worker's MCP I/O: one asyncio loop on its own thread, where every MCP client of
the process (the official ``mcp`` SDK, which is asyncio) runs.

Threads: the loop thread (``zeroclaw-mcp-io``, a daemon started by the first session
that has MCP servers) runs the SDK's clients, their transports and the server
processes' pipes; it also forks the stdio servers, so their launchers' parent-death
signal follows it (it lives as long as the worker). Session actor threads only hand
coroutines over (:meth:`McpIo.submit`, thread-safe) and wait on the futures with a
timeout.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

__all__ = ["McpIo", "mcp_io"]

T = TypeVar("T")


class McpIo:
    """The loop thread (created by :func:`mcp_io`)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, name="zeroclaw-mcp-io",
                         daemon=True).start()

    def submit(self, coroutine: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Run ``coroutine`` on the loop (any thread); cancelling the future cancels it."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop)

    def call_soon(self, callback: Any, *args: Any) -> None:
        """``callback(*args)`` on the loop thread (any thread; it must not block)."""
        self.loop.call_soon_threadsafe(callback, *args)


_lock = threading.Lock()
_io: McpIo | None = None


def mcp_io() -> McpIo:
    """The process's MCP loop (any thread), started on first use."""
    global _io
    with _lock:
        if _io is None:
            _io = McpIo()
        return _io
