"""Pacing: a turn's updates wait, merged, while the client's connection is behind
(TurnStream), and a connection knows when it is behind, drained or stalled (WriteFlow)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Callable

import orjson
import pytest

from ipc import acp
from ipc.events import (
    Event,
    MessageChunk,
    PlanEntry,
    PlanUpdate,
    ThoughtChunk,
    UsageUpdate,
    UserChunk,
)
from ipc.transports import WriteFlow, held_writes
from supervisor.core.pacing import CREDIT_BATCH, TurnStream
from supervisor.servers.acp_server import AcpPeer
from tests.test_transports import handlers, start_pair


class FakeFlow:
    def __init__(self) -> None:
        self.behind = False
        self.waiting: list[Callable[[], None]] = []

    def when_drained(self, callback: Callable[[], None]) -> None:
        self.waiting.append(callback)

    def drain(self) -> None:
        self.behind = False
        callbacks, self.waiting = self.waiting, []
        for callback in callbacks:
            callback()


class FakePeer:
    name = "fake"

    def __init__(self) -> None:
        self.flow = FakeFlow()
        self.sent: list[Event] = []

    def send_event(self, sid: str, event: Event) -> None:
        orjson.dumps(getattr(event, "text", None) or [])  # raises as the real peers do
        self.sent.append(event)


def stream(peer: FakePeer) -> tuple[TurnStream, list[int], list[str]]:
    granted: list[int] = []
    failures: list[str] = []
    return TurnStream("s", peer, granted.append, failures.append), granted, failures  # type: ignore[arg-type]


def test_updates_go_straight_out_while_the_client_keeps_up_with_credit_in_batches() -> None:
    peer = FakePeer()
    turn, granted, _ = stream(peer)
    for n in range(5):
        turn.deliver(MessageChunk(f"w{n} "), 100)
    assert [e.text for e in peer.sent] == [f"w{n} " for n in range(5)]  # type: ignore[union-attr]
    assert granted == []  # under one batch: no credit message at all
    turn.deliver(MessageChunk("big"), CREDIT_BATCH)
    assert granted == [CREDIT_BATCH + 500]


def test_while_behind_chunks_merge_and_go_out_with_their_credit_once_drained() -> None:
    peer = FakePeer()
    turn, granted, _ = stream(peer)
    peer.flow.behind = True
    plan = PlanUpdate((PlanEntry("a", "medium", "pending"),))
    for event in (MessageChunk("a "), MessageChunk("b "), ThoughtChunk("hm "), ThoughtChunk("ok"),
                  plan, MessageChunk("c "), MessageChunk("d")):
        turn.deliver(event, 10)
    assert peer.sent == [] and granted == [] and turn.waiting == 4
    assert len(peer.flow.waiting) == 1  # one drain watch, not one per event
    peer.flow.drain()
    assert peer.sent == [MessageChunk("a b "), ThoughtChunk("hm ok"), plan, MessageChunk("c d")]
    assert granted == [70]


def test_the_end_of_a_turn_flushes_what_waits() -> None:
    peer = FakePeer()
    turn, granted, _ = stream(peer)
    peer.flow.behind = True
    turn.deliver(MessageChunk("x"), 10)
    turn.flush()
    turn.close()
    assert peer.sent == [MessageChunk("x")] and granted == [10]
    peer.flow.drain()  # a late drain sends nothing twice
    assert peer.sent == [MessageChunk("x")]


def test_the_end_of_a_turn_sends_what_waits_but_grants_nothing() -> None:
    """The worker's window ended with its turn: a credit would be a wasted message."""
    peer = FakePeer()
    turn, granted, _ = stream(peer)
    turn.deliver(MessageChunk("x"), 10)
    turn.flush(grant=False)
    assert peer.sent == [MessageChunk("x")] and granted == []


def test_an_update_that_cannot_be_encoded_for_the_client_is_reported() -> None:
    peer = FakePeer()
    turn, _, failures = stream(peer)
    turn.deliver(MessageChunk("lone \ud800 surrogate"), 10)
    assert peer.sent == [] and len(failures) == 1 and "cannot be encoded" in failures[0]




async def test_write_flow_calls_back_once_drained_and_cuts_a_peer_that_takes_nothing() -> None:
    """Over a real socketpair: behind past the pace mark, drained once the peer reads,
    and a stall reported once it takes no byte for the limit."""
    ours, theirs = socket.socketpair()
    theirs.setblocking(False)
    _, writer = await asyncio.open_connection(sock=ours)
    stalls: list[str] = []
    flow = WriteFlow(writer, 0.4, stalls.append)
    try:
        chunk = b"x" * 65536
        while not flow.behind:
            writer.write(chunk)
            flow.wrote(len(chunk))
        drained = asyncio.get_running_loop().create_future()
        flow.when_drained(lambda: drained.set_result(True))
        await asyncio.sleep(0.2)
        assert not drained.done() and stalls == []
        async with asyncio.timeout(10):
            while not drained.done():  # the peer reads: the buffer goes down
                with contextlib.suppress(BlockingIOError):
                    theirs.recv(1 << 20)
                await asyncio.sleep(0.001)
        while not flow.behind:
            writer.write(chunk)
            flow.wrote(len(chunk))
        async with asyncio.timeout(10):
            while not stalls:  # now it reads nothing
                await asyncio.sleep(0.05)
        assert "took no bytes for 0.4 s" in stalls[0]
    finally:
        flow.close()
        writer.transport.abort()
        theirs.close()


def test_a_chunks_notification_line_is_that_of_its_encoded_update() -> None:
    """The streamed chunks' notification, made from a cached prefix around the text,
    is the line the generic encoding makes; other events keep the generic way, and
    a text that cannot be encoded raises the TypeError TurnStream fails the turn on."""
    for sid, event in [("s1", MessageChunk("hi ")), ('s"\\', ThoughtChunk('é\n"\u2028'))]:
        params = acp.encode_event(sid, event)
        line = orjson.dumps({"jsonrpc": "2.0", "method": "session/update", "params": params},
                            option=orjson.OPT_APPEND_NEWLINE)
        assert acp.chunk_update_frame(sid, event) == line
    assert acp.chunk_update_frame("s1", UserChunk("x")) is None
    with pytest.raises(TypeError):
        acp.chunk_update_frame("s1", MessageChunk("lone \ud800"))


class _OneByOne:
    """An ACP peer that is no ``byte_stream``: its stream sends each update by itself."""

    def __init__(self, peer: AcpPeer) -> None:
        self.name = peer.name
        self.flow = peer.flow
        self.send_event = peer.send_event


async def _stream_bytes(events: list[Event], *, together: bool) -> tuple[bytes, list[str], int]:
    """What one connection's client gets of ``events`` delivered in one read of worker
    messages, then the turn's end (the updates' bytes, the failures, the waiting count)."""
    server, _reader, writer = await start_pair(handlers())
    endpoint = server.endpoints[0]
    transport = endpoint._send.__self__._writer.transport  # type: ignore[attr-defined]
    writes: list[bytes] = []
    write = transport.write
    transport.write = lambda data: (writes.append(bytes(data)), write(data))[1]
    acp_peer = AcpPeer(endpoint)
    assert acp_peer.byte_stream  # a stream connection: lines may go together
    peer = acp_peer if together else _OneByOne(acp_peer)
    failures: list[str] = []
    turn = TurnStream("s1", peer, lambda n: None, failures.append)  # type: ignore[arg-type]
    with held_writes():
        turn.deliver_all(events, 100)
    waiting = turn.waiting
    turn.flush(grant=False)
    writer.close()
    await asyncio.wait_for(server.task, 10)
    return b"".join(writes), failures, waiting


@pytest.mark.parametrize("events", [
    [MessageChunk("hello "), ThoughtChunk("hm"), PlanUpdate((PlanEntry("a", "high", "pending"),)),
     UsageUpdate(used=10, size=100), MessageChunk("world")],
    [MessageChunk("x" * 100_000) for _ in range(4)] + [ThoughtChunk("t"), MessageChunk("end")],
    [MessageChunk("ok "), MessageChunk("\ud800"), MessageChunk("never")],
], ids=["mixed", "behind-midway", "unencodable"])
async def test_updates_sent_together_are_the_bytes_sent_one_by_one(events: list[Event]) -> None:
    """Inside a read of worker messages an ACP stream encodes a run of updates and
    sends them as one (``send_frames``): the client gets the same bytes, the same
    ones wait (merged) once the connection is behind, the same failure stops it."""
    together = await _stream_bytes(events, together=True)
    one_by_one = await _stream_bytes(events, together=False)
    assert together == one_by_one
    assert together[0].count(b"\n") >= 1
