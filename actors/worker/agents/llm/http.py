"""Streaming a model API request over HTTP: retries, Server-Sent Events, prompt cancel.

:class:`ModelHttp` posts a JSON body and yields the SSE ``data:`` payloads parsed as
JSON, in batches: the events that one network read completed. Until the first
payload has arrived, a connection error, a 429 or a 5xx is retried with backoff
(``Retry-After`` honoured); after it, a broken stream fails the turn
(:class:`~actors.worker.agents.base.AgentFailure`) because the client has already seen
part of the reply.

The request is sent and its body read on the process's model I/O loop
(:mod:`~actors.worker.agents.llm.model_io`, aiohttp), which splits the body into
events and hands each read's events to the session actor's thread through a queue
(:class:`_Pump`; one hand-over per read, not per line: a fast stream costs a thread
wake-up per network read); the turn's cancel puts a sentinel in that queue
(:class:`~actors.worker.cancel.TurnCancel`), so a waiting actor thread never wakes
for nothing, yet sees a cancel at once in every phase (connect, waiting for
headers, a stalled stream); it then cancels the exchange on the loop, which
closes its connection at once and so tells the server. While more than
:data:`QUEUED_LIMIT` bytes of events wait in that queue (the actor's thread waits
for its client: see :class:`~actors.worker.session.StreamWindow`), the loop stops
reading the body: aiohttp's buffer fills, then the socket's, and TCP back-pressure
reaches the model server, so a client that reads slower than the model streams
costs the worker a bounded queue, never the whole reply. aiohttp is imported when
the first request is made, so starting a host or a worker does not pay for it.

Error messages never contain the API key (:func:`redact`).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import queue
import random
import re
import threading
import time
from collections.abc import Callable, Generator, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson

from actors.worker.agents.base import AgentFailure
from actors.worker.agents.llm.config import ModelSettings
from actors.worker.agents.llm.model_io import ModelIo, env_proxy, model_io
from actors.worker.cancel import call_on_cancel

if TYPE_CHECKING:
    import ssl

    import aiohttp

__all__ = ["POLL_SECS", "QUEUED_LIMIT", "ModelHttp", "SseDecoder", "StreamEnd", "model_failure",
           "redact"]

logger = logging.getLogger("zeroclaw.model")

POLL_SECS = 0.02
RETRY_STATUSES = frozenset({408, 409, 429, 500, 502, 503, 504, 529})
MAX_RETRY_WAIT_SECS = 60.0
ERROR_BODY_LIMIT = 4096
DRAIN_SECS = 1.0
QUEUED_LIMIT = 1024 * 1024
"""Bytes of event data queued for the actor's thread past which the body is not read
until that thread has taken half of them."""


def redact(text: str, secret: str | None) -> str:
    """``text`` with ``secret`` (the API key) replaced by ``***``."""
    return text.replace(secret, "***") if secret else text


def model_failure(settings: ModelSettings, message: str) -> AgentFailure:
    """A failure the client sees, naming the API and model; the key is redacted."""
    text = f"model API {settings.base_url} ({settings.model}): {message}"
    return AgentFailure(redact(text, settings.api_key))


@dataclass(slots=True)
class StreamEnd:
    """How a stream ended, filled in by :meth:`ModelHttp.stream`: ``done`` once the
    body said so (``data: [DONE]``)."""

    done: bool = False


@dataclass(frozen=True, slots=True)
class _Status:
    """An error status before the body: code, Retry-After seconds if any, body text."""

    code: int
    retry_after: float | None
    body: str


class _Retry(Exception):
    """This attempt failed in a way worth another try; the message says how."""

    def __init__(self, message: str, wait: float | None = None) -> None:
        super().__init__(message)
        self.wait = wait


class _Broken(Exception):
    """The response body broke off; the message says how."""


@dataclass(slots=True)
class _Opened:
    """A response whose first events arrived: ``first`` is their data (empty: the body
    ended without any), ``batches`` the events still to read, a list per read."""

    pump: _Pump
    batches: Iterator[list[bytes]]
    first: list[bytes]


@dataclass(frozen=True, slots=True)
class _Request:
    """What one attempt sends, and how (built on the actor's thread)."""

    url: str
    headers: dict[str, str]
    content: bytes
    timeout: aiohttp.ClientTimeout
    proxy: str | None
    tls: ssl.SSLContext | bool  # True: plain HTTP, no TLS context needed


class _Pump:
    """Sends one request and reads its body on the process's model I/O loop (see the
    module doc).

    Queue items: ``("status", _Status)``, ``("open", None)``, ``("events", list[bytes])``
    (the data of the events one read completed), ``("end", None)``, ``("error",
    Exception)``; with a direct consumer also ``("done", None)`` (it saw ``[DONE]``)
    and ``("failed", AgentFailure)``.

    **Direct delivery** (:meth:`offer_direct`): once the taking thread has had the
    first events, it may hand the pump a consumer that the loop thread then calls
    with each read's events itself, under :attr:`_lock`, instead of queueing them, so
    a paced stream wakes no second thread per delta. The taking thread arms it only
    while nothing waits in the queue (order is kept), and it ends for good the first
    time the consumer says so (the stream window is used up: the taking thread takes
    the rest from the queue, waiting for its client) or at :meth:`abort`, which waits
    for a consumer call under way.
    """

    def __init__(self, io: ModelIo, request: _Request) -> None:
        self._queue: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        self._held: tuple[str, Any] | None = None  # taken from the queue, not yet returned
        self._unhook: Callable[[], None] | None = None  # set by the first wait
        self._loop = io.loop
        self._queued_bytes = 0  # event bytes ever queued (written by the loop only)
        self._taken_bytes = 0  # event bytes ever taken (written by the taking thread only)
        self._room: asyncio.Event | None = None  # the loop waits on it while paused
        self._paused = False  # the loop stopped reading the body (queue over the limit)
        self._lock = threading.Lock()  # held by whoever calls the direct consumer
        self._direct: Callable[[list[bytes]], bool] | None = None  # armed (loop thread calls)
        self._offered: Callable[[list[bytes]], bool] | None = None  # to arm when idle
        self._exchange = io.submit(self._run(io.session, request))

    async def _run(self, session: aiohttp.ClientSession, request: _Request) -> None:
        """The loop thread: the whole exchange; every outcome ends up in the queue (a
        cancel ends it without one: nobody reads the queue after :meth:`abort`)."""
        try:
            response = await session.post(
                request.url, headers=request.headers, data=request.content,
                timeout=request.timeout, proxy=request.proxy, ssl=request.tls,
                allow_redirects=False)
        except Exception as exc:
            self._queue.put(("error", exc))
            return
        try:
            outcome = await self._read(response)
        except BaseException as exc:
            response.close()  # unread: the server sees the connection end
            if not isinstance(exc, Exception):
                raise
            outcome = ("error", exc)
        else:
            response.release()  # read to its end: the connection is reused
        self._queue.put(outcome)

    async def _read(self, response: aiohttp.ClientResponse) -> tuple[str, Any]:
        """The loop thread: queue the status or the events; the last item to queue."""
        if response.status >= 400:
            body = (await response.read())[:ERROR_BODY_LIMIT].decode("utf-8", "replace")
            retry = _retry_after(response.headers.get("retry-after"))
            return ("status", _Status(response.status, retry, body))
        self._queue.put(("open", None))
        events = SseDecoder()
        async for chunk in response.content.iter_any():  # all that has arrived
            batch = events.feed(chunk)
            if batch and not self._deliver(batch):
                self._queued_bytes += sum(map(len, batch))
                if self._queued_bytes - self._taken_bytes > QUEUED_LIMIT:
                    await self._wait_for_room()
        batch = events.end()
        if batch:
            self._deliver(batch)
        return ("end", None)

    def _deliver(self, batch: list[bytes]) -> bool:
        """The loop thread: give ``batch`` to the direct consumer (True) or queue it."""
        with self._lock:
            consume = self._direct
            if consume is None:
                self._queue.put(("events", batch))
                return False
            if not consume(batch):
                self._direct = None
            return True

    def put(self, item: tuple[str, Any]) -> None:
        """Queue ``item`` for the taking thread (the direct consumer's outcomes)."""
        self._queue.put(item)

    def offer_direct(self, consume: Callable[[list[bytes]], bool]) -> None:
        """The taking thread: let the loop thread call ``consume(events)`` for each read
        from the next time this thread waits with nothing queued (see the class doc).
        ``consume`` runs under the pump's lock and returns whether it may go on."""
        self._offered = consume

    def _arm_direct(self) -> None:
        """The taking thread, about to wait: arm the offered consumer if nothing is queued."""
        with self._lock:
            if self._held is None and self._queue.empty():
                self._direct, self._offered = self._offered, None

    async def _wait_for_room(self) -> None:
        """The loop thread: stop reading the body until the taking thread has brought
        the queue down to half of :data:`QUEUED_LIMIT` (it wakes this wait,
        :meth:`_took`); a cancel of the exchange ends the wait too."""
        room = self._room
        if room is None:
            room = self._room = asyncio.Event()
        room.clear()
        self._paused = True
        while self._queued_bytes - self._taken_bytes > QUEUED_LIMIT // 2:
            await room.wait()
            room.clear()
        self._paused = False

    def _took(self, events: list[bytes]) -> None:
        """The taking thread: ``events`` left the queue; wake the loop if it waits for
        room and there is enough now."""
        self._taken_bytes += sum(map(len, events))
        if self._paused and self._queued_bytes - self._taken_bytes <= QUEUED_LIMIT // 2:
            room = self._room
            if room is not None:
                self._loop.call_soon_threadsafe(room.set)

    def next(self, cancelled: threading.Event) -> tuple[str, Any] | None:
        """The next item; None once ``cancelled`` is set (the cancel wakes this wait).

        Events are merged with every event item already queued behind them (what
        arrived while the caller was busy), so a caller that falls behind a fast
        stream catches up in one step rather than one per network read."""
        item = self._held
        self._held = None
        if item is None:
            if self._offered is not None:
                self._arm_direct()
            item = self._get(cancelled, None)
        if item is None or item[0] != "events":
            return item
        events: list[bytes] = item[1]
        while True:
            try:
                later = self._queue.get_nowait()
            except queue.Empty:
                break
            if later[0] != "events":
                self._held = later
                break
            events.extend(later[1])  # the loop made a new list for each item
        self._took(events)
        return ("events", events)

    def _get(self, cancelled: threading.Event, timeout: float | None) -> tuple[str, Any] | None:
        """The next item, or None when ``cancelled`` is set or ``timeout`` passed. A
        :class:`~actors.worker.cancel.TurnCancel` wakes the wait by putting
        :data:`_CANCELLED` in the queue; a plain Event is looked at every
        :data:`POLL_SECS`."""
        if self._unhook is None:
            self._unhook = call_on_cancel(cancelled, self._wake_cancelled) or _poll_cancel
        deadline = None if timeout is None else time.monotonic() + timeout
        while not cancelled.is_set():
            wait = None if deadline is None else deadline - time.monotonic()
            if self._unhook is _poll_cancel:
                wait = POLL_SECS if wait is None else min(wait, POLL_SECS)
            if wait is not None and wait <= 0:
                return None
            try:
                item = self._queue.get(timeout=wait)
            except queue.Empty:
                continue
            return None if item is _CANCELLED else item
        return None

    def _wake_cancelled(self) -> None:
        """The turn was cancelled (the canceller's thread): end the wait in :meth:`_get`."""
        self._queue.put(_CANCELLED)

    def abort(self) -> None:
        """Stop the exchange (any thread): the loop cancels it at once, which closes
        its connection (the server sees it end) wherever it is: connecting, waiting
        for the response, reading the body. The direct consumer is never called again
        once this returns (a call under way is waited for)."""
        self._offered = None
        with self._lock:
            self._direct = None
        self._exchange.cancel()
        if self._unhook is not None:
            self._unhook()

    def drain(self, cancelled: threading.Event) -> None:
        """After the last event: let the loop read the body's end (briefly), so the
        connection can be reused."""
        if self._held is not None:  # the body's end came with the last events
            return
        deadline = time.monotonic() + DRAIN_SECS
        while (item := self._get(cancelled, deadline - time.monotonic())) is not None:
            if item[0] != "events":
                return
            self._took(item[1])


_CANCELLED: tuple[str, Any] = ("cancelled", None)
"""Put in a :class:`_Pump`'s queue by the turn's cancel: the wait ends at once."""


def _poll_cancel() -> None:
    """Stands for "no cancel hook": the cancel flag is polled (a plain Event)."""


def _retry_after(value: str | None) -> float | None:
    """``Retry-After`` as seconds: a number, or an HTTP date."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    import email.utils  # rare (most servers send seconds); not on every host's start-up

    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


class SseDecoder:
    """Server-Sent Events from a body as it arrives: :meth:`feed` returns the ``data``
    of each event the bytes completed (multi-line data joined with newlines), still
    UTF-8 (a line break byte is never part of a multi-byte character, and orjson
    parses bytes). Lines end at CRLF, LF or CR, also when a CRLF is cut between two
    reads; ``event:``, ``id:`` and comment lines are skipped (the payloads say what
    they are)."""

    def __init__(self) -> None:
        self._partial = b""  # an unfinished line
        self._data: list[bytes] = []  # the data lines of the event being read

    def feed(self, chunk: bytes) -> list[bytes]:
        chunk = self._partial + chunk
        if chunk.endswith(b"\r"):  # maybe half of a CRLF: wait for the next read
            chunk, self._partial = chunk[:-1], b"\r"
        else:
            self._partial = b""
        lines = _LINE_END.split(chunk) if b"\r" in chunk else chunk.split(b"\n")
        self._partial = lines.pop() + self._partial
        return self._events(lines)

    def end(self) -> list[bytes]:
        """The body ended: its last line and event, even without a blank line after."""
        partial, self._partial = self._partial.rstrip(b"\r"), b""
        return self._events([partial, b""])

    def _events(self, lines: list[bytes]) -> list[bytes]:
        events = []
        data = self._data
        for line in lines:
            if not line:
                if data:
                    events.append(b"\n".join(data))
                    data.clear()
            elif line.startswith(b"data:"):
                value = line[5:]
                data.append(value[1:] if value.startswith(b" ") else value)
        return events


_LINE_END = re.compile(rb"\r\n|\r|\n")


def _provider_message(body: str) -> str:
    """The provider's own error message from a JSON error body, else the body's start."""
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body.strip()[:300]
    error = parsed.get("error") if isinstance(parsed, dict) else None
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        return str(error["message"])[:300]
    if isinstance(error, str):
        return error[:300]
    return body.strip()[:300]


class ModelHttp:
    """One agent's HTTP client. Created on the worker's IO thread, used on the actor's."""

    def __init__(self, settings: ModelSettings) -> None:
        self.settings = settings
        self._proxies: dict[str, str | None] = {}  # per URL: the environment's proxy

    def _request(self, url: str, headers: Mapping[str, str], content: bytes) -> _Request:
        import aiohttp  # here, not at import: a worker without model agents never loads it

        if url not in self._proxies:
            self._proxies[url] = env_proxy(url)
        timeout = self.settings.request_timeout_secs
        return _Request(url, dict(headers), content,
                        aiohttp.ClientTimeout(total=None, sock_connect=min(10.0, timeout),
                                              sock_read=timeout),
                        self._proxies[url], _tls_context() if url.startswith("https:") else True)

    def stream(self, url: str, headers: Mapping[str, str], body: dict[str, Any],
               cancelled: threading.Event, end: StreamEnd | None = None,
               take: Callable[[list[dict[str, Any]]], bool] | None = None,
               ) -> Generator[list[dict[str, Any]], None, None]:
        """The response's SSE payloads as dicts, a list per network read (what arrived
        together); stops early when ``cancelled``; ``end`` says how it ended.

        With ``take``, the payloads after the first read's may instead be given to
        ``take`` on the model I/O loop thread as they arrive (:meth:`_Pump.offer_direct`;
        never while the caller handles a yielded list): it returns whether it may go
        on so (False: the rest is yielded); an AgentFailure it raises is raised here."""
        opened = self._connect(url, headers, body, cancelled)
        if opened is None:
            return
        try:
            yield from self._payloads(opened, cancelled, end or StreamEnd(), take)
        finally:
            opened.pump.abort()

    def _connect(self, url: str, headers: Mapping[str, str], body: dict[str, Any],
                 cancelled: threading.Event) -> _Opened | None:
        """A stream whose first event has arrived, after retries; None when cancelled."""
        request = self._request(url, headers, orjson.dumps(body))
        io = model_io()
        attempts = self.settings.max_retries + 1
        for attempt in range(attempts):
            pump = _Pump(io, request)
            try:
                opened = self._open(pump, cancelled)
            except _Retry as retry:
                pump.abort()
                if attempt + 1 >= attempts:
                    raise self._failure(f"{retry} (gave up after {attempts} attempts)") from None
                wait = retry.wait if retry.wait is not None else _backoff(attempt)
                if wait > MAX_RETRY_WAIT_SECS:
                    raise self._failure(f"{retry}; asked to retry after {wait:.0f} s") from None
                logger.info("model %s: %s; retrying in %.1f s", self.settings.alias, retry, wait)
                if cancelled.wait(wait):
                    return None
                continue
            if opened is None:
                pump.abort()
            return opened
        return None

    def _open(self, pump: _Pump, cancelled: threading.Event) -> _Opened | None:
        """The response up to its first event; None if cancelled; :class:`_Retry` or
        AgentFailure when it failed."""
        item = pump.next(cancelled)
        if item is None:
            return None
        kind, value = item
        if kind == "status":
            message = f"HTTP {value.code}: {_provider_message(value.body)}"
            if value.code in RETRY_STATUSES:
                raise _Retry(message, value.retry_after)
            raise self._failure(message)
        if kind != "open":
            if _is_local_mistake(value):
                raise self._failure(self._describe(value))
            raise _Retry(self._describe(value))
        batches = self._batches(pump, cancelled)
        try:
            first = next(batches, [])
        except _Broken as exc:
            raise _Retry(f"the stream broke before its first event: {exc}") from None
        return _Opened(pump, batches, first)

    def _payloads(self, opened: _Opened, cancelled: threading.Event, end: StreamEnd,
                  take: Callable[[list[dict[str, Any]]], bool] | None,
                  ) -> Iterator[list[dict[str, Any]]]:
        try:
            for batch in itertools.chain([opened.first], opened.batches):
                payloads, done = self._parse(batch)
                end.done = done
                if payloads:
                    yield payloads
                if done:
                    opened.pump.drain(cancelled)
                    return
                if take is not None:  # from the next wait on: the loop thread takes them
                    opened.pump.offer_direct(self._direct_consumer(opened.pump, end, take))
                    take = None
        except _Broken as exc:
            raise self._failure(f"the stream broke: {exc}") from None

    def _direct_consumer(self, pump: _Pump, end: StreamEnd,
                         take: Callable[[list[dict[str, Any]]], bool],
                         ) -> Callable[[list[bytes]], bool]:
        """What the loop thread calls with each read's events (see :meth:`stream`): its
        outcomes other than "go on" reach the taking thread through the pump's queue."""

        def consume(batch: list[bytes]) -> bool:
            try:
                payloads, done = self._parse(batch)
                room = take(payloads) if payloads else True
            except AgentFailure as exc:
                pump.put(("failed", exc))
                return False
            if done:
                end.done = True
                pump.put(("done", None))
                return False
            return room

        return consume

    def _parse(self, batch: list[bytes]) -> tuple[list[dict[str, Any]], bool]:
        """The JSON objects among ``batch``'s events, and whether ``[DONE]`` came."""
        payloads: list[dict[str, Any]] = []
        for data in batch:
            if data.strip() == b"[DONE]":
                return payloads, True
            try:
                payload = orjson.loads(data)
            except orjson.JSONDecodeError:
                start = data[:200].decode("utf-8", "replace")
                raise self._failure(f"the stream sent invalid JSON: {start!r}") from None
            if isinstance(payload, dict):
                payloads.append(payload)
        return payloads, False

    def _batches(self, pump: _Pump, cancelled: threading.Event) -> Iterator[list[bytes]]:
        while (item := pump.next(cancelled)) is not None:
            kind, value = item
            if kind == "events":
                yield value
            elif kind == "end":
                return
            elif kind == "done":  # the direct consumer saw [DONE]
                pump.drain(cancelled)
                return
            elif kind == "failed":
                raise value
            else:
                raise _Broken(self._describe(value))

    def _describe(self, exc: Exception) -> str:
        text = str(exc) or type(exc).__name__
        return f"{type(exc).__name__}: {text}" if text != type(exc).__name__ else text

    def _failure(self, message: str) -> AgentFailure:
        return model_failure(self.settings, message)


_tls_lock = threading.Lock()
_tls: ssl.SSLContext | None = None


def _tls_context() -> ssl.SSLContext:
    """The process's one TLS context (any thread), trusting what httpx and requests
    trust: ``SSL_CERT_FILE`` or ``SSL_CERT_DIR`` when set, else certifi's bundle.
    Loading a bundle costs ~50 ms of CPU, too much to pay for every request."""
    global _tls
    with _tls_lock:
        if _tls is None:
            import os
            import ssl

            if os.environ.get("SSL_CERT_FILE"):
                _tls = ssl.create_default_context(cafile=os.environ["SSL_CERT_FILE"])
            elif os.environ.get("SSL_CERT_DIR"):
                _tls = ssl.create_default_context(capath=os.environ["SSL_CERT_DIR"])
            else:
                import certifi

                _tls = ssl.create_default_context(cafile=certifi.where())
        return _tls


def _is_local_mistake(exc: Exception) -> bool:
    """An error no retry can fix: a bad URL or header value in the config (aiohttp
    says so with a ValueError, its InvalidURL included, or a URL that is not HTTP)."""
    import aiohttp

    return isinstance(exc, ValueError | aiohttp.NonHttpUrlClientError)


def _backoff(attempt: int) -> float:
    """0.5 s, 1 s, 2 s, … (at most 8 s), plus up to 25 % jitter."""
    base: float = min(8.0, 0.5 * 2**attempt)
    return base * (1 + random.random() / 4)
