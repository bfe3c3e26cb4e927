"""The worker's Outbox: messages from actor threads to the IO thread."""

from __future__ import annotations

import asyncio
import os
import select
import threading
import time
from pathlib import Path
from typing import ClassVar

import pytest
import zmq

from actors.worker.agents.base import Agent, TurnContext
from actors.worker.main import Outbox, WorkerProcess
from actors.worker.session import (
    PermissionBoard,
    RunTurn,
    SessionActor,
    SessionConfig,
    SessionState,
)
from ipc.events import MessageChunk, ThoughtChunk, events_from_wire
from ipc.worker_wire import (
    OpenSession,
    SessionClosed,
    TurnEnded,
    TurnEvent,
    TurnFailed,
    WireError,
    chunk_frame_prefix,
    decode,
    decode_all,
    encode,
    encode_chunk,
    encode_chunk_run,
    split_envelopes,
)

WAIT = 10.0


def test_a_burst_wakes_the_io_thread_once_and_keeps_order() -> None:
    outbox = Outbox()
    try:
        for n in range(5):
            outbox.put(SessionClosed(sid=f"s{n}"))
        assert select.select([outbox.fd], [], [], 0)[0] == [outbox.fd]
        assert os.eventfd_read(outbox.fd) == 1  # one signal for the whole burst
        os.eventfd_write(outbox.fd, 1)  # put it back for take_all
        frames = outbox.take_all()
        assert [decode(f) for f in frames] == [SessionClosed(sid=f"s{n}") for n in range(5)]
        assert select.select([outbox.fd], [], [], 0)[0] == []  # nothing left to wake for
        outbox.put(SessionClosed(sid="later"))
        assert select.select([outbox.fd], [], [], 0)[0] == [outbox.fd]  # signalled again
        assert [decode(f) for f in outbox.take_all()] == [SessionClosed(sid="later")]
    finally:
        outbox.close()


def test_puts_from_many_threads_all_arrive() -> None:
    outbox = Outbox()
    try:
        def produce(k: int) -> None:
            for n in range(200):
                outbox.put(SessionClosed(sid=f"{k}-{n}"))

        threads = [threading.Thread(target=produce, args=(k,)) for k in range(4)]
        for thread in threads:
            thread.start()
        received: list[str] = []
        while len(received) < 800:
            assert select.select([outbox.fd], [], [], 10)[0], "lost a wake-up"
            received += [decode(f).sid for f in outbox.take_all()]  # type: ignore[union-attr]
        for thread in threads:
            thread.join(10)
        assert sorted(received) == sorted(f"{k}-{n}" for k in range(4) for n in range(200))
        for k in range(4):  # each thread's messages stay in order
            mine = [s for s in received if s.startswith(f"{k}-")]
            assert mine == [f"{k}-{n}" for n in range(200)]
    finally:
        outbox.close()


def test_put_after_close_is_dropped() -> None:
    outbox = Outbox()
    outbox.close()
    outbox.put(SessionClosed(sid="late"))  # must not raise


def _woken(outbox: Outbox) -> bool:
    return select.select([outbox.fd], [], [], 0)[0] == [outbox.fd]


def test_events_of_a_starting_turn_wait_for_its_end_and_leave_together() -> None:
    outbox = Outbox()
    try:
        assert outbox.take_all(tick=True) == [] and outbox.ticking  # a turn was handed off
        for word in ("hello ", "world"):
            outbox.put(TurnEvent(sid="s", turn_id="t1", event={"type": "message", "text": word}))
        assert not _woken(outbox)  # the IO thread looks again within a tick anyway
        outbox.put(TurnEnded(sid="s", turn_id="t1", record={}))
        assert _woken(outbox)  # the turn's end wakes it, once
        frames = [decode(f) for f in outbox.take_all()]
        assert [type(m) for m in frames] == [TurnEvent, TurnEvent, TurnEnded]
        assert not outbox.ticking and not _woken(outbox)
    finally:
        outbox.close()


def test_a_streaming_turn_ticks_until_its_stream_pauses() -> None:
    outbox = Outbox()
    try:
        outbox.take_all(tick=True)
        event = TurnEvent(sid="s", turn_id="t1", event={"type": "message", "text": "w"})
        outbox.put(event)
        assert len(outbox.take_all()) == 1 and outbox.ticking  # taken at a tick: go on ticking
        assert outbox.take_all() == [] and not outbox.ticking  # a tick found nothing: stop
        outbox.put(event)
        assert _woken(outbox)  # not ticking: the next event wakes the IO thread at once
        assert len(outbox.take_all()) == 1 and not outbox.ticking
        outbox.put(SessionClosed(sid="s"))
        assert _woken(outbox)
    finally:
        outbox.close()


def test_a_turn_end_sent_by_its_own_thread_takes_the_events_before_it() -> None:
    outbox = Outbox()
    try:
        outbox.take_all(tick=True)
        outbox.put(TurnEvent(sid="s", turn_id="t1", event={"type": "message", "text": "w"}))
        size, frames = outbox.put_and_take(TurnEnded(sid="s", turn_id="t1", record={}))
        assert [type(decode(f)) for f in frames] == [TurnEvent, TurnEnded]
        assert size == len(frames[-1]) and not _woken(outbox)  # the IO thread sleeps on
        assert outbox.take_all() == [] and not outbox.ticking  # its tick finds nothing
    finally:
        outbox.close()


class _WaitingAgent(Agent):
    """Says "early" at once, then waits (as on a model) before "late" and the end."""

    provider: ClassVar[str] = "waiting"

    def __init__(self) -> None:
        super().__init__({})
        self.go_on = threading.Event()
        self.may_end = threading.Event()

    def run_turn(self, prompt: str, ctx: TurnContext) -> None:
        ctx.emit(MessageChunk("early"))
        self.go_on.wait(WAIT)
        ctx.emit(MessageChunk("late"))
        self.may_end.wait(WAIT)


def _wait_woken(outbox: Outbox, seconds: float) -> bool:
    return select.select([outbox.fd], [], [], seconds)[0] == [outbox.fd]


def test_a_turns_event_after_a_quiet_spell_wakes_the_ticking_io_thread(tmp_path: Path) -> None:
    """An event that comes after the turn waited (a model's first delta) goes at once,
    not at the IO thread's next tick; one right at the turn's start does not wake it."""
    outbox, agent = Outbox(), _WaitingAgent()
    message = OpenSession(sid="s", agent={"provider": "echo"}, workspace_dir=str(tmp_path),
                          cwd=str(tmp_path), mode="full", forbidden_paths=[],
                          permission_timeout=WAIT, history=[])
    state = SessionState("s", "full")
    actor = SessionActor.start(config=SessionConfig.from_open(message), state=state,
                               agent=agent, send=outbox.put, permissions=PermissionBoard(),
                               wake=outbox.wake, send_event_frame=outbox.put_event_frame)
    try:
        assert outbox.take_all(tick=True) == [] and outbox.ticking  # a turn was handed off
        cancel = state.begin_turn("t1")
        assert cancel is not None
        actor.tell(RunTurn("t1", "go", cancel))
        assert not _wait_woken(outbox, 0.05)  # "early" waits for the tick (or the end)
        assert len(outbox.take_all(tick=True)) == 1 and outbox.ticking  # taken at a tick
        time.sleep(0.002)  # the turn waits: quiet
        agent.go_on.set()
        assert _wait_woken(outbox, WAIT / 4)  # "late" wakes the IO thread, though it ticks
        taken = [decode(f) for f in outbox.take_all()]
        assert [m.event["text"] for m in taken if isinstance(m, TurnEvent)] == ["late"]
    finally:
        agent.go_on.set()
        agent.may_end.set()
        actor.stop()
        outbox.close()


def test_a_chunk_encoded_straight_to_its_frame_is_the_frame_of_its_turn_event() -> None:
    """The streamed chunks' way past the TurnEvent dataclass makes the same bytes (the
    stream window counts them) and the host decodes the same message."""
    for sid, turn_id, kind, text in [("s", "t1", "message", "hello "),
                                     ('s"\\', "t\n2", "thought", 'é\n"\u2028{}\x00')]:
        frame = encode_chunk(chunk_frame_prefix(sid, turn_id, kind), text)
        message = TurnEvent(sid=sid, turn_id=turn_id, event={"k": kind, "text": text})
        assert frame == encode(message)
        assert decode(frame) == message


def test_a_run_of_chunks_is_one_frame_read_back_as_one_event_per_chunk() -> None:
    """A hosted agent's burst goes to the host as one frame per run of one kind's
    chunks; the host gets every chunk back as it was (boundaries, escapes)."""
    texts = ["a", 'é\n"\u2028', "", "x " * 3]
    for kind, chunk in (("message", MessageChunk), ("thought", ThoughtChunk)):
        frame = encode_chunk_run(chunk_frame_prefix("s", "t1", kind, run=True), texts)
        message = decode(frame)
        assert isinstance(message, TurnEvent) and (message.sid, message.turn_id) == ("s", "t1")
        assert events_from_wire(message.event) == [chunk(text) for text in texts]
    assert events_from_wire({"k": "message", "text": "one"}) == [MessageChunk("one")]
    for bad in ({"k": "message", "texts": "no list"}, {"k": "message", "texts": [1]},
                {"k": "message", "texts": [], "extra": 1}):
        with pytest.raises(TypeError):
            events_from_wire(bad)
    with pytest.raises(KeyError):
        events_from_wire({"k": "tool_call", "texts": ["a"]})


class _SayingAgent(Agent):
    """Says each of its texts, then ends the turn."""

    provider: ClassVar[str] = "saying"

    def __init__(self, *texts: str) -> None:
        super().__init__({})
        self.texts = texts

    def run_turn(self, prompt: str, ctx: TurnContext) -> None:
        for text in self.texts:
            ctx.emit(MessageChunk(text))


def test_a_chunk_that_cannot_be_encoded_fails_its_turn(tmp_path: Path) -> None:
    outbox = Outbox()
    message = OpenSession(sid="s", agent={"provider": "echo"}, workspace_dir=str(tmp_path),
                          cwd=str(tmp_path), mode="full", forbidden_paths=[],
                          permission_timeout=WAIT, history=[])
    state = SessionState("s", "full")
    actor = SessionActor.start(config=SessionConfig.from_open(message), state=state,
                               agent=_SayingAgent("fine ", "lone \ud800"), send=outbox.put,
                               permissions=PermissionBoard(), wake=outbox.wake,
                               send_event_frame=outbox.put_event_frame)
    try:
        cancel = state.begin_turn("t1")
        assert cancel is not None
        actor.tell(RunTurn("t1", "go", cancel))
        taken: list[object] = []
        while not any(isinstance(m, TurnFailed) for m in taken):
            assert _wait_woken(outbox, WAIT)
            taken += [decode(f) for f in outbox.take_all()]
        assert [m.event["text"] for m in taken if isinstance(m, TurnEvent)] == ["fine "]
        failed = taken[-1]
        assert isinstance(failed, TurnFailed) and "cannot be streamed" in failed.message
    finally:
        actor.stop()
        outbox.close()


def test_a_burst_decodes_as_its_envelopes_one_by_one() -> None:
    """One parse for a frame's envelopes gives what decode gives each; a malformed one
    (even one that would parse inside a JSON array) is an error in its place only."""
    good = [encode(TurnEvent(sid="s", turn_id="t1", event={"k": "message", "text": w}))
            for w in ("a ", "b")] + [encode(TurnEnded(sid="s", turn_id="t1", record={}))]
    assert decode_all(good) == [decode(e) for e in good]
    for bad in ([b"[1", b'2]'], [b"{}", b'{"t":"nope"}'], [b"1,2"], [b'{"t":"event"}']):
        burst = [good[0], *bad, good[2]]
        decoded = decode_all(burst)
        assert decoded[0] == decode(good[0]) and decoded[-1] == decode(good[2])
        assert all(isinstance(m, WireError) for m in decoded[1:-1]), decoded


def test_frames_sent_now_from_a_loop_leave_together_once_its_round_is_over(
        tmp_path: Path) -> None:
    """On a thread running an asyncio loop (the model I/O loop), the deltas that one
    round of callbacks sends go to the host as one zmq message after the round, without
    waking the IO thread; off a loop, each goes at once."""
    endpoint = f"ipc://{tmp_path}/w.sock"
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.bind(endpoint)
    worker = WorkerProcess(endpoint=endpoint, identity="w1", host_pid=os.getpid(),
                           heartbeat=5.0)
    prefix = chunk_frame_prefix("s", "t1", "message")
    frames = [encode_chunk(prefix, f"d{n} ") for n in range(5)]
    try:
        async def one_round() -> list[list[bytes]]:
            loop = asyncio.get_running_loop()
            for frame in frames[:3]:
                loop.call_soon(worker.send_frame_now, frame)  # three reads of one round
            await asyncio.sleep(0)  # the round runs, then its sender
            await asyncio.sleep(0)
            return [router.recv_multipart() for _ in range(int(router.poll(WAIT * 1000)))]

        [[identity, sent]] = asyncio.run(one_round())
        assert identity == b"w1"
        assert split_envelopes(sent) == frames[:3] and not _woken(worker.outbox)
        for frame in frames[3:]:
            assert worker.send_frame_now(frame) == len(frame)
            assert router.poll(WAIT * 1000)
            assert split_envelopes(router.recv_multipart()[1]) == [frame]
    finally:
        worker._teardown()
        router.close(0)
        ctx.term()
