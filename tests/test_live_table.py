"""The live-session table's decisions, without processes: admission at max_sessions
with LRU eviction, busy, placement, the idle sweep, worker death, and the states that
order concurrent requests on one session (open, turn, close)."""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from typing import Any

import pytest

from ipc.errors import InvalidParams, SessionBusy, SessionLimitReached, SessionNotFound
from supervisor.core.live import (
    Limits,
    LiveSession,
    LiveTable,
    SessionState,
    choose_worker,
    least_recently_used_idle,
    stale_sessions,
    workers_wanted,
)
from supervisor.core.routes import Route, RunningTurn

PEER: Any = object()


def route(sid: str, worker_id: str = "w1") -> Route:
    return Route(sid, worker_id, PEER, "main", "/w", "/w", "ask")


def admit(table: LiveTable, sid: str, worker_id: str = "w1") -> tuple[LiveSession, list[Any]]:
    entry = table.begin_opening(sid)
    return entry, table.admit(entry, route(sid, worker_id))


def opened(table: LiveTable, sid: str, worker_id: str = "w1") -> LiveSession:
    """Admit ``sid`` and open it on ``worker_id`` (evictions are the caller's to check)."""
    entry, _ = admit(table, sid, worker_id)
    table.opened(entry)
    return entry


def new_turn(sid: str) -> RunningTurn:
    return RunningTurn(sid, f"t-{sid}", PEER, asyncio.get_running_loop().create_future())


def table_of(max_sessions: int = 2, timeout: float = 60.0, per_worker: int = 0) -> LiveTable:
    return LiveTable(Limits(max_sessions, timeout, per_worker))


async def test_admission_places_on_the_least_loaded_worker() -> None:
    table = table_of()
    opened(table, "a", table.place(["w1", "w2"]) or "")
    assert table.place(["w1", "w2"]) == "w2"
    entry, evicted = admit(table, "b", "w2")
    assert evicted == [] and entry.state is SessionState.OPENING
    assert table.place(["w1", "w2"]) in ("w1", "w2") and table.workers_in_use() == 2


async def test_lru_idle_session_is_evicted_at_the_cap() -> None:
    table = table_of()
    opened(table, "a")
    time.sleep(0.001)
    b_route = opened(table, "b").route
    table.touch("a")  # b is now the least recently used
    _, evicted = admit(table, "c")
    assert [(e.sid, e.route) for e in evicted] == [("b", b_route)]
    assert table.get("b") is None and table.route("b") is None


async def test_limit_reached_only_when_every_session_is_busy() -> None:
    table = table_of()
    opened(table, "a")
    opened(table, "b")
    turn_a = new_turn("a")
    table.attach_turn(turn_a)
    table.attach_turn(new_turn("b"))
    entry = table.begin_opening("c")
    with pytest.raises(SessionLimitReached, match=r"\(2\)"):
        table.admit(entry, route("c"))
    table.detach_turn(turn_a)
    evicted = table.admit(entry, route("c"))
    assert [e.sid for e in evicted] == ["a"]


async def test_busy_and_duplicate() -> None:
    table = table_of()
    opened(table, "a")
    turn = new_turn("a")
    assert table.attach_turn(turn).state is SessionState.BUSY
    assert turn.route is table.route("a") and turn.route is not None
    assert turn.route.status["state"] == "busy"
    with pytest.raises(SessionBusy):
        table.attach_turn(new_turn("a"))
    with pytest.raises(InvalidParams, match="session/close"):
        table.begin_opening("a")
    assert table.evict("a") is None  # busy: not evicted


async def test_room_made_at_the_cap_is_on_the_evicted_sessions_worker() -> None:
    """At the cap, the least loaded worker once room is made is the evicted session's:
    one worker hears of both (admission then evicts nothing more)."""
    table = table_of(max_sessions=4)
    for sid, worker_id in (("a", "w1"), ("b", "w2"), ("c", "w1"), ("d", "w2")):
        opened(table, sid, worker_id)
        time.sleep(0.001)
    table.touch("a")  # b (on w2) is now the least recently used
    assert table.place(["w1", "w2"]) == "w1"  # a tie: the first
    evicted = table.make_room()
    assert [e.sid for e in evicted] == ["b"] and table.make_room() == []
    assert table.place(["w1", "w2"]) == "w2"
    entry = table.begin_opening("e")
    assert table.admit(entry, route("e", "w2")) == []
    assert sorted(table.by_worker["w2"]) == ["d", "e"]


async def test_an_opening_session_takes_a_place_only_once_placed() -> None:
    table = table_of(max_sessions=1)
    entry = table.begin_opening("a")  # reading its history, waiting for a worker
    with pytest.raises(InvalidParams):  # never opened twice at once
        table.begin_opening("a")
    opened(table, "b")  # it takes no place yet
    assert table.admit(entry, route("a"))[0].sid == "b"  # placed: b, idle, makes room
    assert entry.state is SessionState.OPENING  # its row is being written
    other = table.begin_opening("c")  # while it is written it is evictable, as IDLE is
    assert [e.sid for e in table.admit(other, route("c"))] == ["a"]
    assert table.abandon(entry) is None and table.get("a") is None  # its open ends
    assert table.abandon(other) is not None and table.get("c") is None  # place freed
    assert entry.opening is None and other.opening is None


async def test_a_prompt_waiting_for_an_open_is_busy_as_the_open_ends() -> None:
    table = table_of(max_sessions=1)
    entry = table.begin_opening("a")
    waiter = entry.opening
    turn = new_turn("a")
    table.attach_turn(turn)
    assert turn.route is None and entry.state is SessionState.OPENING
    table.admit(entry, route("a"))
    with pytest.raises(SessionLimitReached):  # the waiting turn holds it already
        table.admit(table.begin_opening("b"), route("b"))
    table.opened(entry)
    assert waiter is not None and waiter.done()
    assert entry.state is SessionState.BUSY and turn.route is entry.route
    assert turn.route is not None and turn.route.status["state"] == "busy"


async def test_closing_refuses_turns_and_opens_until_it_ends() -> None:
    table = table_of()
    opened(table, "a")
    entry = table.begin_closing("a")
    assert entry.state is SessionState.CLOSING
    with pytest.raises(SessionNotFound, match="being closed"):
        table.attach_turn(new_turn("a"))
    with pytest.raises(SessionNotFound, match="being closed"):
        table.begin_opening("a")
    assert table.evict("a") is None
    assert entry.route is not None and table.drop(entry.route)
    closing = entry.closing
    table.end_closing(entry)
    assert closing is not None and closing.done()
    assert table.get("a") is None


async def test_a_session_not_live_can_be_held_closing_without_a_place() -> None:
    table = table_of(max_sessions=1)
    entry = table.begin_closing("stored")  # a delete of a session only in the store
    assert entry.route is None and not entry.holds_place
    opened(table, "a")  # it takes no place under max_sessions
    table.end_closing(entry)
    assert table.get("stored") is None


async def test_sweep_evicts_only_idle_sessions_past_the_timeout() -> None:
    table = table_of(timeout=0.05)
    opened(table, "a")
    opened(table, "b")
    table.attach_turn(new_turn("b"))
    assert table.sweep() == []
    await asyncio.sleep(0.1)
    assert [e.sid for e in table.sweep()] == ["a"]
    assert table.get("a") is None
    assert table.get("b") is not None and table.get("b").state is SessionState.BUSY  # type: ignore[union-attr]


async def test_worker_exit_drops_its_sessions_and_keeps_their_turns() -> None:
    table = table_of(max_sessions=3)
    a = opened(table, "a", "w1")
    opened(table, "b", "w2")
    turn = new_turn("a")
    table.attach_turn(turn)
    route = a.route
    dropped = table.worker_exited("w1")
    assert [(e.sid, r) for e, r in dropped] == [("a", route)]
    assert a.state is SessionState.DETACHED and a.turn is turn  # until the turn settles
    assert table.workers_in_use() == 1
    table.detach_turn(turn)
    assert table.get("a") is None
    assert table.route("b") is not None


async def test_a_worker_with_room_is_awaited_not_polled() -> None:
    table = table_of(max_sessions=4, per_worker=1)
    opened(table, "a", "w1")
    assert table.place(["w1"]) is None  # w1 is full
    room = asyncio.ensure_future(table.room(5))
    await asyncio.sleep(0)
    assert not room.done()
    table.pulse()  # e.g. a worker became ready
    await asyncio.wait_for(room, 1)
    assert table.place(["w1", "w2"]) == "w2"


def test_the_decisions_as_plain_functions() -> None:
    def entry(sid: str, used: float, *, busy: bool = False) -> LiveSession:
        live = LiveSession(sid, last_used=used,
                           route=Route(sid, "w1", PEER, "main", "/w", "/w", "ask"))
        if busy:
            live.turn = object()  # type: ignore[assignment]
        return live

    entries = [entry("a", 3.0), entry("b", 1.0, busy=True), entry("c", 2.0)]
    victim = least_recently_used_idle(entries)
    assert victim is not None and victim.sid == "c"
    assert [e.sid for e in stale_sessions(entries, 2.5)] == ["c"]
    assert least_recently_used_idle(entries[1:2]) is None
    assert choose_worker(["w1", "w2"], {"w1": 2, "w2": 1}.__getitem__, 0) == "w2"
    assert choose_worker(["w1"], {"w1": 1}.__getitem__, 1) is None
    assert workers_wanted(in_use=1, unplaced=1, sessions_per_worker=1) == 3
    assert workers_wanted(in_use=0, unplaced=0, sessions_per_worker=0) == 2


async def test_the_tables_lru_victim_is_the_plain_functions(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The table finds the LRU idle session in its order of use, not by a scan: after
    any sequence of opens, uses, turns, evictions, closes and worker deaths it is the
    one :func:`least_recently_used_idle` picks from all entries."""
    clock = iter(range(1, 1_000_000))
    monkeypatch.setattr("supervisor.core.live.time.monotonic", lambda: float(next(clock)))
    rng = random.Random(7)
    table = table_of(max_sessions=6)
    turns: dict[str, RunningTurn] = {}
    closing: list[LiveSession] = []
    for _ in range(600):
        sid, worker_id = f"s{rng.randrange(10)}", rng.choice(["w1", "w2"])
        entry, step = table.get(sid), rng.randrange(7)
        with contextlib.suppress(InvalidParams, SessionBusy, SessionLimitReached,
                                 SessionNotFound):
            if step == 0:
                opened(table, sid, worker_id)
            elif step == 1:
                table.touch(sid)
            elif step == 2 and sid not in turns:
                turns[sid] = new_turn(sid)
                table.attach_turn(turns[sid])
            elif step == 3 and sid in turns:
                table.detach_turn(turns.pop(sid))
            elif step == 4:
                table.evict(sid)
            elif step == 5 and entry is not None and entry.closing is None:
                closing.append(table.begin_closing(sid))
            elif step == 6 and closing:
                table.end_closing(closing.pop(rng.randrange(len(closing))))
            elif rng.random() < 0.05:
                table.worker_exited(worker_id)
        expected = least_recently_used_idle(table.entries.values())
        assert table._least_recently_used_idle() is expected


def tenant_route(sid: str, tenant: str) -> Route:
    return Route(sid, "w1", PEER, "main", "/w", "/w", "ask", tenant=tenant)


def opened_for(table: LiveTable, sid: str, tenant: str) -> LiveSession:
    entry = table.begin_opening(sid)
    table.admit(entry, tenant_route(sid, tenant))
    table.opened(entry)
    time.sleep(0.001)
    return entry


async def test_a_tenant_at_its_cap_evicts_its_own_least_recently_used_idle_session() -> None:
    table = table_of(max_sessions=10)
    table.tenant_caps = {"alice": 2}
    opened_for(table, "bob-1", "bob")  # used longest ago, but not alice's
    opened_for(table, "a1", "alice")
    opened_for(table, "a2", "alice")
    table.touch("a1")  # a2 is now alice's least recently used
    assert table.tenant_has_room("alice", 2)  # idle sessions to evict
    entry = table.begin_opening("a3")
    evicted = table.admit(entry, tenant_route("a3", "alice"))
    assert [e.sid for e in evicted] == ["a2"]
    assert table.route("bob-1") is not None and table.route("a1") is not None
    table.opened(entry)
    for sid in ("a1", "a3"):  # both of alice's busy: nothing of hers to evict
        table.attach_turn(new_turn(sid))
    assert not table.tenant_has_room("alice", 2)
    blocked = table.begin_opening("a4")
    with pytest.raises(SessionLimitReached, match=r"\(2\)"):
        table.admit(blocked, tenant_route("a4", "alice"))
    assert table.route("bob-1") is not None  # nothing evicted by the refusal
    table.abandon(blocked)
    opened_for(table, "bob-2", "bob")  # bob has no cap of his own


async def test_the_tenant_cap_and_the_host_cap_together() -> None:
    table = table_of(max_sessions=3)
    table.tenant_caps = {"alice": 2}
    opened_for(table, "a1", "alice")
    opened_for(table, "b1", "bob")
    opened_for(table, "a2", "alice")
    evicted = table.make_room("alice")  # alice at her cap, the host at its: one evicted
    assert [e.sid for e in evicted] == ["a1"] and table.make_room("alice") == []
    table.attach_turn(new_turn("a2"))
    table.attach_turn(new_turn("b1"))
    opened_for(table, "c1", "carol")  # the host's last place
    table.attach_turn(new_turn("c1"))
    with pytest.raises(SessionLimitReached, match=r"\(3\)"):  # the host's cap now
        table.make_room("alice")
    assert len(table.routes()) == 3
