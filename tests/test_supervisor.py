"""SupervisorActor decisions: limits, LRU eviction, busy, placement, sweeps."""

from __future__ import annotations

import asyncio
import time

import pytest

from actors.bridge import call
from ipc.errors import InvalidParams, SessionBusy, SessionLimitReached, SessionNotFound
from supervisor.supervisor import Limits, SupervisorActor


@pytest.fixture
def supervisor():
    ref = SupervisorActor.start(Limits(max_sessions=2, session_timeout_secs=0.2))
    yield ref
    ref.stop()


async def test_admit_places_on_least_loaded_worker(supervisor):
    first = await call(supervisor, "admit", "a", "main", ["w1", "w2"])
    second = await call(supervisor, "admit", "b", "main", ["w1", "w2"])
    assert {first.worker_id, second.worker_id} == {"w1", "w2"}
    assert first.evicted == () and second.evicted == ()


async def test_lru_idle_session_is_evicted_at_the_cap(supervisor):
    await call(supervisor, "admit", "a", "main", ["w1"])
    await call(supervisor, "admit", "b", "main", ["w1"])
    await call(supervisor, "touch", "a")  # b is now the least recently used
    third = await call(supervisor, "admit", "c", "main", ["w1"])
    assert [e.sid for e in third.evicted] == ["b"]
    assert third.evicted[0].worker_id == "w1"
    with pytest.raises(SessionNotFound):
        await call(supervisor, "begin_turn", "b")


async def test_limit_reached_only_when_every_session_is_busy(supervisor):
    await call(supervisor, "admit", "a", "main", ["w1"])
    await call(supervisor, "admit", "b", "main", ["w1"])
    await call(supervisor, "begin_turn", "a")
    await call(supervisor, "begin_turn", "b")
    with pytest.raises(SessionLimitReached, match=r"\(2\)"):
        await call(supervisor, "admit", "c", "main", ["w1"])
    assert await call(supervisor, "end_turn", "a") is True
    admitted = await call(supervisor, "admit", "c", "main", ["w1"])
    assert [e.sid for e in admitted.evicted] == ["a"]


async def test_busy_and_duplicate_and_unknown(supervisor):
    await call(supervisor, "admit", "a", "main", ["w1"])
    await call(supervisor, "begin_turn", "a")
    with pytest.raises(SessionBusy):
        await call(supervisor, "begin_turn", "a")
    with pytest.raises(InvalidParams, match="session/close"):
        await call(supervisor, "admit", "a", "main", ["w1"])
    with pytest.raises(SessionNotFound):
        await call(supervisor, "release", "nope")


async def test_sweep_evicts_only_idle_sessions_past_the_timeout(supervisor):
    await call(supervisor, "admit", "a", "main", ["w1"])
    await call(supervisor, "admit", "b", "main", ["w1"])
    await call(supervisor, "begin_turn", "b")
    deadline = time.monotonic() + 5
    evicted = []
    while not evicted and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
        evicted = await call(supervisor, "sweep")
    assert [e.sid for e in evicted] == ["a"]
    with pytest.raises(SessionNotFound):
        await call(supervisor, "begin_turn", "a")
    with pytest.raises(SessionBusy):  # still live, still running its turn
        await call(supervisor, "begin_turn", "b")


async def test_worker_exit_drops_its_sessions(supervisor):
    await call(supervisor, "admit", "a", "main", ["w1"])
    await call(supervisor, "admit", "b", "main", ["w2"])
    assert await call(supervisor, "worker_exited", "w1") == ["a"]
    with pytest.raises(SessionNotFound):
        await call(supervisor, "begin_turn", "a")
    assert await call(supervisor, "begin_turn", "b") == "w2"


async def test_one_session_per_worker_waits_for_a_worker():
    ref = SupervisorActor.start(Limits(4, 60, sessions_per_worker=1))
    try:
        assert (await call(ref, "admit", "a", "main", ["w1"])).worker_id == "w1"
        assert (await call(ref, "admit", "b", "main", ["w1"])).worker_id is None
        assert await call(ref, "workers_wanted") == 3
        assert await call(ref, "place", "b", ["w1", "w2"]) == "w2"
    finally:
        ref.stop()
