"""The worker process's model I/O: one asyncio loop on its own thread, where every
model agent of the process sends its requests and reads its streamed replies.

The requests go through one aiohttp ``ClientSession`` (a connection pool without a
limit, kept-alive connections reused across turns and sessions): aiohttp parses
HTTP in C (llhttp), so a body that a server flushes one small chunk per token costs
about a microsecond per chunk, where a pure-Python HTTP stack costs several.

The session actors' threads only hand coroutines over (:meth:`ModelIo.submit`,
thread-safe); the first model request of the process starts the loop
(:func:`model_io`), so a worker without model agents never imports aiohttp. The
loop thread is a daemon; the session is closed when the process exits.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import threading
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    import aiohttp

__all__ = ["ModelIo", "env_proxy", "model_io"]

T = TypeVar("T")
CLOSE_SECS = 2.0


class ModelIo:
    """The loop thread and the session on it (created by :func:`model_io`)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, name="zeroclaw-model-io",
                         daemon=True).start()
        self.session: aiohttp.ClientSession = self.submit(_open_session()).result()
        atexit.register(self.close)

    def close(self) -> None:
        """At the process's exit (its main thread): close the session's connections
        (aiohttp would log an unclosed session otherwise), then stop the loop."""
        with contextlib.suppress(Exception):
            self.submit(self.session.close()).result(CLOSE_SECS)
        self.loop.call_soon_threadsafe(self.loop.stop)

    def call_later(self, delay: float, callback: Callable[[], None]) -> Callable[[], None]:
        """Run ``callback`` on the loop in ``delay`` seconds (any thread; it must not
        block); returns what calls it off (any thread). No thread is started for it."""
        handles: list[asyncio.TimerHandle] = []
        self.loop.call_soon_threadsafe(
            lambda: handles.append(self.loop.call_later(delay, callback)))

        def call_off() -> None:
            self.loop.call_soon_threadsafe(lambda: handles[0].cancel() if handles else None)

        return call_off

    def submit(self, coroutine: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Run ``coroutine`` on the loop (any thread); cancelling the future cancels it."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop)


async def _open_session() -> aiohttp.ClientSession:
    """The loop thread: the process's one session. Cookies are not kept (agents with
    different keys share it); proxies come from the environment per agent
    (:func:`env_proxy`), not per request."""
    import aiohttp

    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                 cookie_jar=aiohttp.DummyCookieJar(), trust_env=False)


def env_proxy(url: str) -> str | None:
    """The proxy the environment names for ``url`` (``HTTPS_PROXY`` or ``ALL_PROXY``,
    unless ``NO_PROXY`` covers the host), as httpx and curl read them; None for none."""
    import urllib.parse
    import urllib.request

    parts = urllib.parse.urlsplit(url)
    proxies = urllib.request.getproxies()
    proxy = proxies.get(parts.scheme) or proxies.get("all")
    if not proxy or urllib.request.proxy_bypass(parts.hostname or ""):
        return None
    return proxy


_lock = threading.Lock()
_io: ModelIo | None = None


def model_io() -> ModelIo:
    """The process's model I/O (any thread), started on first use."""
    global _io
    with _lock:
        if _io is None:
            _io = ModelIo()
        return _io
