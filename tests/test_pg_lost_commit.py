"""A turn whose connection is lost under its one statement (storage.pg_pipeline's
``_write_turn_alone``): the host reads the session's turn count back on a new
connection, and counts the turn as done when the server committed it, or writes it
the usual way when it did not. Either way the turn is reported done once and stored
once.

Through the real persistence actor on the throw-away cluster of ``scripts/test``; the
host's store reaches the server through a :class:`tests.pg_cluster.Fuse`, which cuts
the connection on the turn's statement (its text is the marker): before the server
gets it, or after the server committed it and answered (the answer is dropped).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from urllib.parse import urlsplit

import psycopg
import pytest

from actors.persistence import CreateSession, WriteTurn
from tests.pg_cluster import Fuse
from tests.pg_support import stop_tracing, trace_statements
from tests.test_leases import WAIT, Host, database, hosts, session, turn

__all__ = ["database", "hosts"]  # the fixtures, shared with the lease tests

READ_BACK = "SELECT turn_count FROM sessions WHERE id = %s"


@pytest.fixture
def fuses(database: str) -> Iterator[Callable[[bytes, str], Fuse]]:
    """Makes fuses to the test's database server; closed after the hosts (requested
    after this fixture) are."""
    made: list[Fuse] = []
    port = urlsplit(database).port
    assert port is not None

    def make(marker: bytes, lose: str) -> Fuse:
        made.append(Fuse(port, marker, lose))
        return made[-1]

    yield make
    for fuse in made:
        fuse.close()


def stored(database: str, sid: str) -> tuple[int, list[tuple[int, str, str]]]:
    """The session's turn count and its messages (turn, role, text), committed, read
    past the fuse."""
    with psycopg.connect(database) as check:
        row = check.execute("SELECT turn_count FROM sessions WHERE id = %s", (sid,)).fetchone()
        assert row is not None
        messages = check.execute("SELECT turn, role, content FROM messages "
                                 "WHERE session_id = %s ORDER BY seq", (sid,)).fetchall()
    return int(row[0]), [tuple(m) for m in messages]


@pytest.mark.parametrize("lose", ["reply", "request"])
def test_a_turn_whose_connection_is_lost_under_its_statement_is_stored_once(
    database: str, fuses: Callable[[bytes, str], Fuse], hosts: list[Host], lose: str
) -> None:
    """``reply``: the server committed the turn and its answer was lost; the read-back
    finds the turn count moved and counts the turn done, writing nothing more.
    ``request``: the server never got it; the read-back finds the old count and the
    turn is written the usual way on the new connection. Either way: the turn count
    the caller is told is right, the turn is there exactly once, and the next turn
    follows it."""
    marker = f"lost-{lose}-{uuid.uuid4().hex}"
    fuse = fuses(marker.encode(), lose)
    one = Host(fuse.url(database), "one")
    hosts.append(one)
    assert one.write(CreateSession(session("s1"))) is None
    assert one.write(WriteTurn(turn("s1", "first"))) == 1  # s1 is known: one statement
    statements = trace_statements(one.store)
    assert one.write(WriteTurn(turn("s1", marker))) == 2
    stop_tracing(one.store)
    assert fuse.fired.is_set() and fuse.blown.wait(WAIT)
    first = [(1, "user", "first"), (1, "assistant", "first")]
    marked = [(2, "user", marker), (2, "assistant", marker)]
    assert stored(database, "s1") == (2, first + marked)  # there, once
    assert [s.split()[0] for s in statements[:2]] == ["WITH", "SELECT"]  # alone, then
    assert statements[1] == READ_BACK  # the turn count, on a new connection
    if lose == "reply":
        assert len(statements) == 2  # committed: nothing written again
    else:
        assert len(statements) > 2 and statements[2] == "BEGIN"  # the usual way
    assert one.write(WriteTurn(turn("s1", "next"))) == 3  # the host's state is right
    assert stored(database, "s1") == (3, [*first, *marked, (3, "user", "next"),
                                          (3, "assistant", "next")])
