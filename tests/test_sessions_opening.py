"""Sessions' rule that one open of a session runs at a time, and that closing waits
for it: a waiter whose request is cancelled must not break the rule for later ones.

The host is a bare stand-in and the open is gated, so the interleaving is exact
(a real host reaches it only by chance, when a client's connection breaks while
its close waits on a slow restore).
"""

from __future__ import annotations

import asyncio
import types
from typing import Any

import pytest

from ipc.errors import SessionNotFound
from supervisor.sessions import Sessions


async def test_a_cancelled_close_leaves_the_open_and_later_closes_working() -> None:
    host: Any = types.SimpleNamespace(settings=None, routes={},
                                      turns=types.SimpleNamespace(running={}))
    sessions = Sessions(host)
    gate = asyncio.Event()

    async def gated_open(peer: Any, info: Any, *, history: bool) -> str:
        await gate.wait()
        return "route"

    sessions._admit_and_open = gated_open  # type: ignore[method-assign]
    opener = asyncio.create_task(sessions._open(None, types.SimpleNamespace(id="S"),  # type: ignore[arg-type]
                                                history=True))
    await asyncio.sleep(0)
    closer = asyncio.create_task(sessions.close("S"))
    await asyncio.sleep(0)
    closer.cancel()  # its client went away while it waited for the open
    await asyncio.gather(closer, return_exceptions=True)
    gate.set()
    assert await opener == "route"  # the open finished normally
    assert sessions._opening == {}
    with pytest.raises(SessionNotFound):  # no route in the stand-in: "not active"
        await sessions.close("S")
