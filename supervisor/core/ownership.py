"""Which client connections a live session belongs to: one table for every transport.

Runs on the asyncio loop thread only. A daemon serves ``daemon.sock`` (RPC
dialect) and ``acp.sock`` (ACP dialect) from one host, so ownership has to be one
table there too: a connection that did not create, load or adopt a session gets
-32003 for cancelling, closing or prompting it, whichever socket either side uses.

The clients of a session are the connections that created it, loaded or resumed
it (an editor picking up a shared session joins its clients) or adopted it (a
prompt to a session nobody holds). A connection that goes away leaves every
session it held, and cannot join one afterwards (a ``session/new`` still running
when its client left must not leave a holder nobody can remove); a session nobody
holds is open to the next connection.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Awaitable, Callable, Iterator
from typing import TYPE_CHECKING

from ipc.errors import SessionNotFound, SessionNotOwned

if TYPE_CHECKING:
    from supervisor.core.peer import Peer

__all__ = ["Owners"]


class Owners:
    """Session id → the connections (peers) that hold it, in the order they joined."""

    def __init__(self) -> None:
        self._clients: dict[str, list[Peer]] = {}
        self._departed: weakref.WeakSet[Peer] = weakref.WeakSet()
        #: Told the session id whenever its clients change (:mod:`supervisor.ops.status_book`).
        self.on_change: Callable[[str], None] | None = None

    def join(self, sid: str, peer: Peer) -> None:
        """``peer`` holds ``sid`` from now on (created, loaded, resumed or adopted it);
        a no-op for a connection that already went away."""
        if peer in self._departed:
            return
        clients = self._clients.setdefault(sid, [])
        if peer not in clients:
            clients.append(peer)
            self._changed(sid)

    def check(self, sid: str, peer: Peer, *, adopt: bool = False) -> None:
        """Raise -32003 when other connections hold ``sid`` and ``peer`` does not.

        ``adopt``: a session nobody holds becomes ``peer``'s (a prompt adopts it).
        """
        clients = self._clients.get(sid)
        if not clients:
            if adopt:
                self.join(sid, peer)
            return
        if peer not in clients:
            raise SessionNotOwned(f"Session {sid} is owned by another connection")

    @contextlib.contextmanager
    def adopting(self, sid: str, peer: Peer) -> Iterator[None]:
        """:meth:`check` with adoption around a prompt: when the session turns out not
        to exist (-32000), a ``peer`` that adopted it here does not keep its id (one
        that held it before keeps holding it)."""
        adopted = not self._clients.get(sid)
        self.check(sid, peer, adopt=True)
        try:
            yield
        except SessionNotFound:
            if adopted:
                self.leave(sid, peer)
            raise

    def leave(self, sid: str, peer: Peer) -> None:
        clients = self._clients.get(sid)
        if clients is not None and peer in clients:
            clients.remove(peer)
            if not clients:
                del self._clients[sid]
            self._changed(sid)

    def _changed(self, sid: str) -> None:
        if self.on_change is not None:
            self.on_change(sid)

    async def ending(self, sid: str, operation: Awaitable[None]) -> None:
        """Await a close, stop or delete of ``sid``; whoever held it when it began lets
        go (a connection that joined meanwhile, by a load, keeps its hold)."""
        holders = list(self._clients.get(sid, ()))
        await operation
        for peer in holders:
            self.leave(sid, peer)

    def leave_all(self, peer: Peer) -> None:
        """``peer`` went away: it leaves every session, for good."""
        self._departed.add(peer)
        for sid in self.sessions_of(peer):
            self.leave(sid, peer)

    def sessions_of(self, peer: Peer) -> list[str]:
        return [sid for sid, clients in self._clients.items() if peer in clients]

    def count(self, sid: str) -> int:
        """How many connections hold ``sid`` (the ``clients`` of ``status``)."""
        return len(self._clients.get(sid, ()))
