"""Which client connections a live session belongs to: one table for every transport.

Runs on the asyncio loop thread only. A daemon serves ``daemon.sock`` (RPC
dialect) and ``acp.sock`` (ACP dialect) from one host, so ownership has to be one
table there too: a connection that did not create, load or adopt a session gets
-32003 for cancelling, closing or prompting it, whichever socket either side uses.

The clients of a session are the connections that created it, loaded or resumed
it (an editor picking up a shared session joins its clients) or adopted it (a
prompt to a session nobody holds). A connection that goes away leaves every
session it held; a session nobody holds is open to the next connection.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ipc.errors import SessionNotOwned

if TYPE_CHECKING:
    from supervisor.routes import Peer

__all__ = ["Owners"]


class Owners:
    """Session id → the connections (peers) that hold it, in the order they joined."""

    def __init__(self) -> None:
        self._clients: dict[str, list[Peer]] = {}

    def join(self, sid: str, peer: Peer) -> None:
        """``peer`` holds ``sid`` from now on (created, loaded, resumed or adopted it)."""
        clients = self._clients.setdefault(sid, [])
        if peer not in clients:
            clients.append(peer)

    def check(self, sid: str, peer: Peer, *, adopt: bool = False) -> None:
        """Raise -32003 when other connections hold ``sid`` and ``peer`` does not.

        ``adopt``: a session nobody holds becomes ``peer``'s (a prompt adopts it).
        """
        clients = self._clients.get(sid)
        if not clients:
            if adopt:
                self._clients[sid] = [peer]
            return
        if peer not in clients:
            raise SessionNotOwned(f"Session {sid} is owned by another connection")

    def holds(self, sid: str, peer: Peer) -> bool:
        return peer in self._clients.get(sid, ())

    def leave(self, sid: str, peer: Peer) -> None:
        clients = self._clients.get(sid)
        if clients is not None and peer in clients:
            clients.remove(peer)
            if not clients:
                del self._clients[sid]

    def forget(self, sid: str) -> None:
        """The session is closed or deleted: nobody holds it any more."""
        self._clients.pop(sid, None)

    def leave_all(self, peer: Peer) -> list[str]:
        """``peer`` went away: it leaves every session; the ids it held."""
        held = self.sessions_of(peer)
        for sid in held:
            self.leave(sid, peer)
        return held

    def sessions_of(self, peer: Peer) -> list[str]:
        return [sid for sid, clients in self._clients.items() if peer in clients]

    def count(self, sid: str) -> int:
        """How many connections hold ``sid`` (the ``clients`` of ``status``)."""
        return len(self._clients.get(sid, ()))
