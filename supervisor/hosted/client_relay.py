"""A hosted ACP agent's requests for its client (``fs/*``, ``terminal/*``, extension
methods ``_name``), relayed by the host to the client connection that holds the session.

Runs on the host's asyncio loop thread. A worker sends a
:class:`ipc.worker_wire.ClientCall`; :class:`ClientRelay` decides when it arrives,
by the connection that holds the session at that moment (``Route.peer``: the one
that created, loaded, resumed or last prompted it, so one agent process serving
sessions of several editors reaches each one's own editor, and an editor that
loads a session on the daemon takes its requests over). When that connection
advertised the capability at ``initialize`` (``clientCapabilities.fs.readTextFile``,
``fs.writeTextFile``, ``terminal``) the request goes to it, with zeroclaw's session
id, under the same rules as a permission request: ``session_timeout_secs`` to
answer, and a clear JSON-RPC error for the agent when it does not (it timed out,
it went away) or when it answers one. Otherwise the reply says "not relayed" and
the worker serves the request itself. Follow-up requests about a terminal a client
created go to that client, whoever holds the session later; when the session is
closed, deleted or evicted, the client is told to release the terminals its agent
left (:meth:`ClientRelay.session_gone`). An agent's extension
notification goes to the holder as a notification (nothing answers it).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ipc.errors import InternalError, InvalidParams
from ipc.extensions import is_extension
from ipc.jsonrpc import ConnectionLost, RemoteError
from ipc.worker_wire import ClientCall, ClientReply, EncodeError
from supervisor.hosted.relay_host import RelayHost

if TYPE_CHECKING:
    from supervisor.core.peer import Peer

__all__ = ["ClientRelay", "advertises"]

log = logging.getLogger("zeroclaw.host")

#: The ``clientCapabilities`` path each relayed method needs.
_CAPABILITY = {
    "fs/read_text_file": ("fs", "readTextFile"),
    "fs/write_text_file": ("fs", "writeTextFile"),
}
_TERMINAL = ("terminal",)


def advertises(capabilities: Any, method: str) -> bool:
    """Whether ``capabilities`` (a client's ``clientCapabilities``) offer ``method``;
    an ACP client takes ``session/update`` and any extension method (``_name``), or
    says it does not."""
    if is_extension(method) or method == "session/update":
        return True
    path = _CAPABILITY.get(method, _TERMINAL if method.startswith("terminal/") else None)
    value = capabilities
    for key in path or ():
        value = value.get(key) if isinstance(value, Mapping) else None
    return path is not None and value is True


class ClientRelay:
    """The host's relay of hosted agents' client requests (loop thread)."""

    def __init__(self, host: RelayHost) -> None:
        self.host = host
        #: Terminals clients created, by session and terminal id: where their requests go.
        self._terminals: dict[str, dict[str, Peer]] = {}

    def on_call(self, worker_id: str, call: ClientCall) -> None:
        """Relay ``call`` to the client it is for, or tell the worker to serve it."""
        peer = self._target(call)
        if call.notification:
            self._pass_on(call, peer)
            return
        if peer is None:
            self._reply(worker_id, ClientReply(call.sid, call.request_id, relayed=False))
            return
        turn = self.host.turns.get(call.sid)
        if turn is not None and turn.stream is not None:
            turn.stream.flush()  # the request follows the updates before it
        self.host.spawn(self._relay(worker_id, call, peer))

    def _pass_on(self, call: ClientCall, peer: Peer | None) -> None:
        """An extension notification: to the holder, after the updates before it;
        dropped when nobody holds the session."""
        if peer is None:
            log.debug("session %s: agent notification %s dropped (no client holds it)",
                      call.sid, call.method)
            return
        route = self.host.live.route(call.sid)
        if call.method == "session/update" and route is not None and route.hold_early(
                call.params):
            return  # the client learns the session id first
        turn = self.host.turns.get(call.sid)
        if turn is not None and turn.stream is not None:
            turn.stream.flush()
        try:
            peer.notify_client(call.sid, call.method, call.params)
        except TypeError as exc:  # orjson's encode error
            log.info("session %s: agent notification %s cannot be sent: %s", call.sid,
                     call.method, exc)

    def _target(self, call: ClientCall) -> Peer | None:
        if call.method.startswith("terminal/") and call.method != "terminal/create":
            return self._terminals.get(call.sid, {}).get(str(call.params.get("terminalId")))
        route = self.host.live.route(call.sid)
        return route.holder_offering(call.method) if route is not None else None

    async def _relay(self, worker_id: str, call: ClientCall, peer: Peer) -> None:
        timeout = self.host.settings.session_timeout_secs
        error: dict[str, Any] | None = None
        result: Any = None
        answered = False
        try:
            result = await peer.call_client(call.sid, call.method, call.params, timeout)
            answered = True
        except TimeoutError:
            error = InternalError(f"{call.method}: the client did not answer within "
                                  f"{timeout:g}s").to_error()
        except ConnectionLost:
            self._forget_terminal(call)
            error = InternalError(f"{call.method}: the client that holds session "
                                  f"{call.sid} went away").to_error()
        except RemoteError as exc:
            error = {"code": exc.code, "message": f"{call.method}: the client answered: "
                                                  f"{exc.message}"}
        except TypeError as exc:  # orjson's encode error: the request cannot be sent
            error = InvalidParams(f"{call.method}: cannot be sent to the client: "
                                  f"{exc}").to_error()
        finally:  # cancelled (the host stops): no answer
            if error is None and not answered:
                error = InternalError(f"{call.method}: no answer from the client").to_error()
            self._reply(worker_id, ClientReply(call.sid, call.request_id, relayed=True,
                                               result=result if error is None else None,
                                               error=error))
        if error is None:
            self._track_terminal(call, peer, result)

    def _track_terminal(self, call: ClientCall, peer: Peer, result: Any) -> None:
        if call.method == "terminal/create" and isinstance(result, Mapping):
            terminal_id = result.get("terminalId")
            if isinstance(terminal_id, str):
                self._terminals.setdefault(call.sid, {})[terminal_id] = peer
        elif call.method == "terminal/release":
            self._forget_terminal(call)

    def _forget_terminal(self, call: ClientCall) -> None:
        terminals = self._terminals.get(call.sid, {})
        terminals.pop(str(call.params.get("terminalId")), None)
        if not terminals:
            self._terminals.pop(call.sid, None)

    def session_gone(self, sid: str) -> None:
        """Session ``sid`` is closed, deleted or evicted: its agent session is gone with
        it, so the terminals its agent had clients create are released there (nobody
        else will) and forgotten."""
        for terminal_id, peer in self._terminals.pop(sid, {}).items():
            self.host.spawn(self._release(peer, sid, terminal_id))

    async def _release(self, peer: Peer, sid: str, terminal_id: str) -> None:
        try:
            await peer.call_client(sid, "terminal/release", {
                "sessionId": sid, "terminalId": terminal_id},
                self.host.settings.session_timeout_secs)
        except (TimeoutError, ConnectionLost, RemoteError) as exc:
            log.info("session %s: terminal %s of its client not released: %s", sid,
                     terminal_id, exc)

    def _reply(self, worker_id: str, reply: ClientReply) -> None:
        try:
            sent = self.host.pool.send(worker_id, reply)
        except EncodeError as exc:
            error = InternalError(f"the client's answer cannot be passed on: {exc}")
            sent = self.host.pool.send(worker_id, ClientReply(
                reply.sid, reply.request_id, relayed=True, error=error.to_error()))
        if not sent:
            log.info("session %s: the answer to a client request was not delivered "
                     "(its worker is gone)", reply.sid)
