"""Sessions' rule that one open of a session runs at a time, and that closing waits
for it: a waiter whose request is cancelled must not break the rule for later ones.

The host is a bare stand-in around a real live-session table and the open is
gated, so the interleaving is exact (a real host reaches it only by chance, when a
client's connection breaks while its close waits on a slow restore).
"""

from __future__ import annotations

import asyncio
import types
from functools import partial
from typing import Any

import pytest

from ipc.worker_wire import EncodeError, OpenSession
from supervisor.core.live import Eviction, Limits, LiveTable, SessionState
from supervisor.core.routes import Route
from supervisor.host.host import Host
from supervisor.host.sessions import Sessions


async def test_a_cancelled_close_leaves_the_open_and_later_closes_working() -> None:
    live = LiveTable(Limits(max_sessions=4, session_timeout_secs=60))
    writes: list[str] = []
    closed: list[Route] = []

    def persist(write: Any) -> asyncio.Future[None]:
        writes.append(type(write).__name__)
        done = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done

    async def close_on_worker(route: Route) -> None:
        closed.append(route)

    async def take_lease(sid: str) -> None:  # a store of one host's: no lease
        return None

    host: Any = types.SimpleNamespace(settings=types.SimpleNamespace(tenants={}), live=live,
                                      persist=persist, close_on_worker=close_on_worker,
                                      close_evicted=lambda evicted: None,
                                      take_lease=take_lease, release_lease=lambda sid: None)
    sessions = Sessions(host)
    gate = asyncio.Event()

    async def gated_open(entry: Any, *args: Any) -> Route:
        await gate.wait()
        route = Route("S", "w1", args[0], "main", "/w", "/w", "ask")
        live.admit(entry, route)
        return route

    sessions.agent_of_stored = lambda info: (None, None)  # type: ignore[method-assign,assignment,return-value]
    sessions._place_and_open = gated_open  # type: ignore[method-assign]
    opener = asyncio.create_task(sessions._open(None, types.SimpleNamespace(id="S"),  # type: ignore[arg-type]
                                                history=True))
    await asyncio.sleep(0)
    closer = asyncio.create_task(sessions.close("S"))
    await asyncio.sleep(0)
    assert live.get("S").state is SessionState.CLOSING  # type: ignore[union-attr]
    closer.cancel()  # its client went away while it waited for the open
    await asyncio.gather(closer, return_exceptions=True)
    assert live.get("S").state is SessionState.OPENING  # type: ignore[union-attr]
    gate.set()
    route = await opener  # the open finished normally
    assert live.route("S") is route and live.get("S").state is SessionState.IDLE  # type: ignore[union-attr]
    await sessions.close("S")  # a later close works
    assert writes == ["MarkClosed"] and closed == [route]
    assert live.get("S") is None


def test_an_open_carries_its_workers_evictions_and_closes_them_if_it_cannot_go() -> None:
    """The evicted sessions of the worker an open goes to ride in its OpenSession; the
    others are closed on their own, and so are the riders when it cannot be sent."""
    sent: list[tuple[str, OpenSession]] = []
    dropped: list[str] = []

    def send(worker_id: str, message: OpenSession) -> bool:
        if message.sid == "bad":
            raise EncodeError("OpenSession cannot be encoded")
        sent.append((worker_id, message))
        return True

    host: Any = types.SimpleNamespace(
        settings=types.SimpleNamespace(tenants={}), live=None,
        pool=types.SimpleNamespace(send=send),
        client_relay=types.SimpleNamespace(session_gone=lambda sid: None),
        drop_on_worker=lambda route: dropped.append(route.sid), release_lease=lambda sid: None)
    host.close_evicted = types.MethodType(Host.close_evicted, host)
    sessions = Sessions(host)
    evicted = [Eviction(sid, Route(sid, worker_id, None, "main", "/w", "/w", "ask"))
               for sid, worker_id in (("a", "w1"), ("b", "w2"), ("c", "w1"))]
    opening = partial(OpenSession, sid="new", agent={}, workspace_dir="/w", cwd="/w",
                      mode="ask", forbidden_paths=[], permission_timeout=1.0, confirm=False)
    sessions._send_open("w1", opening, evicted)
    assert sent == [("w1", opening(evicted=["a", "c"]))] and dropped == ["b"]
    dropped.clear()
    with pytest.raises(EncodeError):
        sessions._send_open("w1", partial(opening, sid="bad"), evicted)
    assert dropped == ["b", "a", "c"]
