"""The pace of one running turn's stream of session updates to its client.

Runs on the asyncio loop thread. The worker streams a turn's events within a
window of :data:`ipc.worker_wire.STREAM_WINDOW_BYTES` (their encoded size) and
waits when it is used up; the host grants the bytes back
(:class:`ipc.worker_wire.Credit`) as it passes the events on to the client.

While the client's connection is behind (:class:`ipc.transports.WriteFlow`),
the events wait here instead of in the socket buffer, consecutive message or
thought chunks merged into one update; they go out, and their credit back to
the worker, once the connection has drained. So a slow client slows its own
turn's agent, every other session keeps its pace, and what waits here is at
most one window (plus the event that filled it) per running turn.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, cast

from ipc.events import Event, MessageChunk, ThoughtChunk
from ipc.transports import held_writes, holding_writes
from ipc.worker_wire import STREAM_WINDOW_BYTES

if TYPE_CHECKING:
    from ipc.transports import WriteFlow
    from supervisor.core.peer import Peer

__all__ = ["CREDIT_BATCH", "TurnStream"]

log = logging.getLogger("zeroclaw.pacing")

CREDIT_BATCH = STREAM_WINDOW_BYTES // 4
"""Bytes passed on before they are granted back while the client keeps up: a
turn shorter than this costs no credit message at all."""

_MERGED = (MessageChunk, ThoughtChunk)


@dataclass(slots=True)
class _Merged:
    """Consecutive text chunks of one kind, waiting as one update."""

    kind: type[MessageChunk] | type[ThoughtChunk]
    parts: list[str] = field(default_factory=list)

    def event(self) -> Event:
        return self.kind("".join(self.parts))


class BatchingPeer(Protocol):
    """A peer that can encode an update to its line and send lines together (ACP on a
    stream connection: ``byte_stream`` true)."""

    def event_frame(self, sid: str, event: Event) -> bytes: ...
    def send_frames(self, frames: bytes) -> None: ...


class TurnStream:
    """One running turn's updates on their way to its client (loop thread).

    ``grant(nbytes)`` returns stream credit to the worker; ``on_unsendable(reason)``
    is called when an update cannot be encoded for the client (the turn must fail).
    """

    def __init__(self, sid: str, peer: Peer, grant: Callable[[int], None],
                 on_unsendable: Callable[[str], None]) -> None:
        self.sid = sid
        self._peer = peer
        self._flow: WriteFlow | None = getattr(peer, "flow", None)  # fixed per connection
        self._batching: BatchingPeer | None = (
            cast("BatchingPeer", peer) if getattr(peer, "byte_stream", False) else None)
        self._grant = grant
        self._on_unsendable = on_unsendable
        self._waiting: list[Event | _Merged] = []
        self._owed = 0
        self._watching = False
        self._closed = False

    @property
    def waiting(self) -> int:
        """Updates held back (merged chunks count once)."""
        return len(self._waiting)

    def deliver(self, event: Event, nbytes: int) -> None:
        """One event from the worker, ``nbytes`` of its stream window."""
        self.deliver_all((event,), nbytes)

    def deliver_all(self, events: Sequence[Event], nbytes: int) -> None:
        """Events that came from the worker together, ``nbytes`` of its stream window:
        each goes out now while the client keeps up, else waits (merged) for it."""
        self._owed += nbytes
        flow = self._flow
        if self._batching is not None and not self._waiting and holding_writes():
            rest = self._send_together(self._batching, events)
            if rest is None:
                self._settle_credit()  # the turn fails: the rest is dropped
                return
            events = rest
        for event in events:
            if self._waiting or (flow is not None and flow.behind):
                self._hold(event)
            elif not self._send(event):
                self._settle_credit()  # the turn fails: the rest is dropped
                return
        if self._waiting:
            if flow is not None and not self._watching:
                self._watching = True
                flow.when_drained(self._drained)
        elif self._owed >= CREDIT_BATCH:
            self._settle_credit()

    def _send_together(self, peer: BatchingPeer,
                       events: Sequence[Event]) -> Sequence[Event] | None:
        """Send ``events`` as :meth:`deliver_all` would, one by one while the client
        keeps up, but encoded to their lines and sent as one (inside ``held_writes``,
        where each line sent counts in full towards :attr:`WriteFlow.behind`, so the
        same ones go). Returns those that must wait; None when one cannot be encoded
        (those before it are sent, the turn fails)."""
        room = self._flow.room if self._flow is not None else None
        frames: list[bytes] = []
        rest: Sequence[Event] = ()
        for index, event in enumerate(events):
            if room is not None and room < 0:
                rest = events[index:]
                break
            try:
                frame = peer.event_frame(self.sid, event)
            except TypeError as exc:  # orjson.JSONEncodeError: nested too deep, bad values
                self._send_frames(peer, frames)
                self._unsendable(exc)
                return None
            frames.append(frame)
            if room is not None:
                room -= len(frame)
        self._send_frames(peer, frames)
        return rest

    @staticmethod
    def _send_frames(peer: BatchingPeer, frames: list[bytes]) -> None:
        if frames:
            peer.send_frames(frames[0] if len(frames) == 1 else b"".join(frames))

    def flush(self, *, grant: bool = True) -> None:
        """Send everything held back now (the turn ends, or a request must follow
        its updates), and grant its credit; at the turn's end nothing is granted
        (the worker's window ended with its turn: a credit would be one more
        message per turn, for nothing)."""
        waiting, self._waiting = self._waiting, []
        with held_writes():  # one write for all of them
            for item in waiting:
                self._send(item.event() if isinstance(item, _Merged) else item)
        if grant:
            self._settle_credit()

    def close(self) -> None:
        """The turn is over: drop what is held (call :meth:`flush` first to keep it)."""
        self._closed = True
        self._waiting.clear()

    def _hold(self, event: Event) -> None:
        last = self._waiting[-1] if self._waiting else None
        if isinstance(event, _MERGED):
            if not (isinstance(last, _Merged) and last.kind is type(event)):
                last = _Merged(type(event))
                self._waiting.append(last)
            last.parts.append(event.text)
        else:
            self._waiting.append(event)

    def _drained(self) -> None:
        self._watching = False
        if self._closed or not self._waiting:
            return
        flow = self._flow
        if flow is not None and flow.behind:  # another stream filled it up again
            self._watching = True
            flow.when_drained(self._drained)
            return
        self.flush()

    def _settle_credit(self) -> None:
        owed, self._owed = self._owed, 0
        if owed:
            self._grant(owed)

    def _send(self, event: Event) -> bool:
        """Write ``event`` to the client; False when it cannot be encoded (the turn fails)."""
        try:
            self._peer.send_event(self.sid, event)
        except TypeError as exc:  # orjson.JSONEncodeError: nested too deep, bad values
            self._unsendable(exc)
            return False
        return True

    def _unsendable(self, exc: TypeError) -> None:
        reason = f"a session update cannot be encoded: {exc}"
        log.warning("session %s: %s", self.sid, reason)
        self._on_unsendable(reason)
