"""The batched turn path: a worker's envelopes in one frame, one PersistBatch per read
of worker messages, a group's replies to the loop in one callback, client frames held
and written together."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pykka

from actors.bridge import loop_callback, reply_all
from actors.persistence import (
    CreateSession,
    PersistBatch,
    PersistenceActor,
    PersistRequest,
    WriteMode,
    WriteTurn,
)
from ipc.transports import held_writes
from ipc.worker_wire import (
    LARGE_FRAME_BYTES,
    TurnEnded,
    TurnEvent,
    decode,
    decode_all,
    encode,
    join_envelopes,
    split_envelopes,
)
from storage import Store
from tests.test_group_commit import Reply, actor, session, store, turn
from tests.test_transports import handlers, start_pair

__all__ = ["actor", "store"]  # the fixtures, shared with the group-commit tests


def test_envelopes_joined_in_one_frame_split_back_even_with_newlines_in_their_text() -> None:
    messages: list[TurnEvent | TurnEnded] = [
        TurnEvent("s", "t1", {"k": "message", "text": "line\nnext\r\n"}),
        TurnEnded("s", "t1", {"content": "a\nb"}),
    ]
    frames = [encode(m) for m in messages]
    assert all(b"\n" not in frame for frame in frames)
    joined = join_envelopes(frames)
    assert split_envelopes(joined) == frames
    assert [decode(f) for f in split_envelopes(joined)] == messages
    assert join_envelopes(frames[:1]) == frames[0] and split_envelopes(frames[0]) == frames[:1]


def test_a_large_frame_is_read_in_place_as_views_of_its_envelopes() -> None:
    answer = "line\n" * (LARGE_FRAME_BYTES // 4)
    messages: list[TurnEvent | TurnEnded] = [
        TurnEvent("s", "t1", {"k": "message", "text": "last"}),
        TurnEnded("s", "t1", {"content": answer}),
        TurnEvent("s", "t2", {"k": "message", "text": "next"}),
    ]
    joined = join_envelopes([encode(m) for m in messages])
    for frame in (joined, memoryview(joined)):  # bytes, or a zmq message's buffer
        envelopes = split_envelopes(frame)
        assert all(isinstance(e, memoryview) and e.obj is joined for e in envelopes)
        assert [bytes(e) for e in envelopes] == [encode(m) for m in messages]
        assert decode_all(envelopes) == messages


def test_a_persist_batch_keeps_order_and_group_commits_its_turns(
    actor: pykka.ActorRef[PersistenceActor], store: Store
) -> None:
    replies = [Reply(store), Reply(store, "s1"), Reply(store, "s1"), Reply(store)]
    actor.tell(PersistBatch((
        PersistRequest(CreateSession(session("s1")), replies[0]),
        PersistRequest(WriteTurn(turn("s1", 0)), replies[1]),
        PersistRequest(WriteTurn(turn("s1", 1)), replies[2]),
        PersistRequest(WriteMode("s1", "full"), replies[3]),  # writes the group first
    )))
    for reply in replies:
        assert reply.wait().error is None
    assert [replies[1].value, replies[2].value, replies[3].value] == [1, 2, True]
    assert replies[1].turns_on_disk == 2  # answered after the group's one commit


class _RecordingLoop:
    def __init__(self) -> None:
        self.posted: list[tuple[Any, ...]] = []

    def call_soon_threadsafe(self, callback: Any, *args: Any) -> None:
        self.posted.append((callback, *args))


def test_replies_bound_for_one_loop_go_there_as_one_callback_in_order() -> None:
    loop = _RecordingLoop()
    seen: list[tuple[BaseException | None, Any]] = []
    other: list[Any] = []
    failure = ValueError("no")
    reply_all([
        (loop_callback(loop, lambda e, v: seen.append((e, v))), None, 1),  # type: ignore[arg-type]
        (lambda e, v: other.append(v), None, "direct"),
        (loop_callback(loop, lambda e, v: seen.append((e, v))), failure, None),  # type: ignore[arg-type]
    ])
    assert other == ["direct"] and seen == []
    assert len(loop.posted) == 1  # one wake-up of the loop for the group
    callback, *args = loop.posted[0]
    callback(*args)
    assert seen == [(None, 1), (failure, None)]


async def test_frames_held_during_a_read_of_worker_messages_go_out_in_one_write() -> None:
    server, reader, writer = await start_pair(handlers())
    endpoint = server.endpoints[0]
    transport = endpoint._send.__self__._writer.transport  # type: ignore[attr-defined]
    writes: list[bytes] = []
    write = transport.write

    def counting(data: Any) -> None:
        writes.append(bytes(data))
        write(data)

    transport.write = counting
    with held_writes():
        for n in range(3):
            endpoint.notify("note", {"n": n})
        assert writes == []
    endpoint.notify("note", {"n": 3})  # outside a read: at once
    assert [w.count(b"\n") for w in writes] == [3, 1]
    for n in range(4):
        assert orjson.loads(await reader.readline())["params"] == {"n": n}
    writer.close()
    await asyncio.wait_for(server.task, 10)
