"""The ``status`` session list kept encoded between calls: it must always say what
the live table and the ownership table say now, in the table's order."""

from __future__ import annotations

from typing import Any

import orjson

from supervisor.core.live import Limits, LiveTable
from supervisor.core.ownership import Owners
from supervisor.core.routes import Route
from supervisor.ops.status_book import SessionStatusBook


class _Peer:
    """A connection as the ownership table sees it (only its identity counts)."""


PEER: Any = _Peer()
OTHER: Any = _Peer()


def opened(table: LiveTable, sid: str, worker_id: str = "w1") -> Route:
    route = Route(sid, worker_id, PEER, "main", "/w", "/w", "ask")
    entry = table.begin_opening(sid)
    table.admit(entry, route)
    table.opened(entry)
    return route


def listed(book: SessionStatusBook, table: LiveTable, owners: Owners) -> list[dict[str, Any]]:
    entries = orjson.loads(book.sessions_json(table, owners))
    assert len(entries) == len(book)
    return entries


async def test_entries_are_the_routes_status_with_their_clients_in_table_order() -> None:
    table, owners, book = LiveTable(Limits(10, 60)), Owners(), SessionStatusBook()
    routes = [opened(table, sid) for sid in ("a", "b", "c")]
    owners.join("b", PEER)
    owners.join("b", OTHER)
    entries = listed(book, table, owners)
    assert [e["sessionId"] for e in entries] == ["a", "b", "c"]
    assert [e["clients"] for e in entries] == [0, 2, 0]
    assert entries == [route.status for route in routes]


async def test_nothing_changed_answers_the_same_encoding() -> None:
    table, owners, book = LiveTable(Limits(10, 60)), Owners(), SessionStatusBook()
    opened(table, "a")
    first = book.sessions_json(table, owners)
    assert book.sessions_json(table, owners) is first


async def test_a_turn_and_its_end_show_at_once() -> None:
    table, owners, book = LiveTable(Limits(10, 60)), Owners(), SessionStatusBook()
    route = opened(table, "a")
    opened(table, "b")
    listed(book, table, owners)
    route.turn_started()
    assert [e["state"] for e in listed(book, table, owners)] == ["busy", "idle"]
    route.turn_ended(1, tokens=7)
    entry = listed(book, table, owners)[0]
    assert (entry["state"], entry["turns"], entry["usage"]) == ("idle", 1, {"totalTokens": 7})
    assert entry["lastActivity"] == route.status["lastActivity"]


async def test_clients_follow_joins_and_leaves() -> None:
    table, owners, book = LiveTable(Limits(10, 60)), Owners(), SessionStatusBook()
    opened(table, "a")
    listed(book, table, owners)
    owners.join("a", PEER)
    assert listed(book, table, owners)[0]["clients"] == 1
    owners.leave_all(PEER)
    assert listed(book, table, owners)[0]["clients"] == 0


async def test_sessions_that_go_and_come_back_follow_the_table() -> None:
    table, owners, book = LiveTable(Limits(2, 60)), Owners(), SessionStatusBook()
    opened(table, "a")
    opened(table, "b")
    listed(book, table, owners)
    table.touch("a")  # b is the least recently used: the next open evicts it
    opened(table, "c")
    assert [e["sessionId"] for e in listed(book, table, owners)] == ["a", "c"]
    eviction = table.evict("a")
    assert eviction is not None
    again = opened(table, "b", "w2")
    assert [e["sessionId"] for e in listed(book, table, owners)] == ["c", "b"]
    again.turn_started()  # the new route of b reports its changes too
    assert listed(book, table, owners)[1]["state"] == "busy"


async def test_another_ownership_table_is_read_afresh() -> None:
    table, owners, book = LiveTable(Limits(10, 60)), Owners(), SessionStatusBook()
    opened(table, "a")
    listed(book, table, owners)
    others = Owners()
    others.join("a", PEER)
    assert listed(book, table, others)[0]["clients"] == 1
