"""The worker's Outbox: messages from actor threads to the IO thread."""

from __future__ import annotations

import os
import select
import threading

from actors.worker.main import Outbox
from ipc.worker_wire import SessionClosed, TurnEnded, TurnEvent, decode


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
