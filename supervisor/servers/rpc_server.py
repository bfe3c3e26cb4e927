"""The daemon RPC server: binds the dialect of :mod:`ipc.rpc` (SPEC §4) to the host's
session operations (:mod:`supervisor.sessions`), for every ``daemon.sock`` connection.

Everything here runs on the asyncio loop thread. Each connection gets a
:class:`DaemonPeer`. Ownership is the host's one table (:mod:`supervisor.ownership`,
shared with ``acp.sock``): another connection's ``session/cancel``, ``close``,
``prompt`` or ``approve`` is refused with -32003. A session whose connections all
went away is unowned and the next connection that prompts it adopts it.

Prompts are queued per session (:mod:`supervisor.prompt_queue`, depth 32, then
-32002): a ``session/prompt`` while a turn runs waits its turn, and prompts run in
arrival order. ``session/cancel`` cancels the running turn only; the queued
prompts behind it still run. A connection that goes away has its queued prompts
dropped (and its running turns cancelled); ``session/close`` drops the session's
queued prompts (they answer -32000). The ACP dialect keeps its immediate -32002.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from ipc import rpc
from ipc.acp import prompt_request, session_id
from ipc.errors import (
    InternalError,
    InvalidParams,
    SessionNotFound,
)
from ipc.jsonrpc import ConnectionLost, Endpoint, RemoteError
from supervisor.prompt_queue import PromptQueues, Ticket
from supervisor.servers.rpc_names import (
    OWNER,
    label_param,
    listed_names,
    named_answer,
    open_named,
    rpc_naming,
)
from supervisor.status import host_status

if TYPE_CHECKING:
    from ipc.acp import PromptRequest
    from ipc.events import Event
    from ipc.transports import WriteFlow
    from ipc.worker_wire import PermissionAsk
    from supervisor.ownership import Owners
    from supervisor.sessions import Sessions

__all__ = ["DaemonPeer", "RpcServer"]

log = logging.getLogger("zeroclaw.rpc")


class DaemonPeer:
    """One ``daemon.sock`` connection as the host sees it (a :class:`supervisor.routes.Peer`).

    Approvals: the request is announced as an ``approval_request`` update and waits
    for ``session/approve`` on this connection; no answer in time, a cancelled turn
    or a closed connection denies the tool call. Questions to the user
    (:meth:`ask_user`) are ``elicitation/create`` requests, sent only when the
    client's ``initialize`` advertised ``clientCapabilities.elicitation``.
    """

    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint = endpoint
        self.name = endpoint.name
        self.gone = False  # its input ended: queued prompts must not start
        self._approvals: dict[str, tuple[str, asyncio.Future[str | None]]] = {}
        self._request_ids = itertools.count()

    @property
    def flow(self) -> WriteFlow | None:
        flow: WriteFlow | None = self.endpoint.state.get("flow")
        return flow

    def send_event(self, sid: str, event: Event) -> None:
        params = rpc.encode_event(sid, event)
        if params is not None:
            self.endpoint.notify("session/update", params)

    async def ask_permission(self, sid: str, ask: PermissionAsk, timeout: float) -> str | None:
        if self.endpoint.closed:
            return None
        request_id = f"apr-{next(self._request_ids)}"
        future: asyncio.Future[str | None] = asyncio.get_running_loop().create_future()
        self._approvals[request_id] = (sid, future)
        self.endpoint.notify("session/update", rpc.approval_request(
            sid, request_id, ask.tool_name, ask.title, timeout))
        try:
            async with asyncio.timeout(timeout):
                return await future
        except TimeoutError:
            log.info("%s: approval %s for %s timed out: denied", self.name, request_id,
                     ask.tool_name)
            return None
        finally:
            self._approvals.pop(request_id, None)

    @property
    def elicits(self) -> bool:
        """The client advertised ``clientCapabilities.elicitation`` (an object or true)."""
        caps = self.endpoint.state.get("client") or {}
        advertised = caps.get("elicitation")
        return advertised is True or isinstance(advertised, dict)

    async def ask_user(self, sid: str, message: str, schema: dict[str, Any],
                       timeout: float) -> dict[str, Any] | None:
        """Ask the user a form question (``elicitation/create``); the ``{action,
        content}`` answer, or None when the client does not elicit, went away, did
        not answer within ``timeout`` seconds, or answered an error or nonsense."""
        if not self.elicits or self.gone or self.endpoint.closed:
            return None
        params = rpc.elicitation_request(sid, message, schema)
        try:
            result = await self.endpoint.request("elicitation/create", params, timeout=timeout)
        except TimeoutError:
            log.info("%s: elicitation for %s timed out", self.name, sid)
            return None
        except (ConnectionLost, RemoteError) as exc:
            log.info("%s: elicitation for %s failed: %s", self.name, sid, exc)
            return None
        reply = rpc.elicitation_reply(result)
        if reply is None:
            log.warning("%s: invalid elicitation answer for %s ignored", self.name, sid)
        return reply

    def offers(self, method: str) -> bool:
        """The RPC dialect has no ``fs/*`` or ``terminal/*``: zeroclaw serves them."""
        return False

    async def call_client(self, sid: str, method: str, params: dict[str, Any],
                          timeout: float) -> Any:
        raise ConnectionLost(f"{self.name}: {method} cannot be sent in the RPC dialect")

    def notify_client(self, sid: str, method: str, params: dict[str, Any]) -> None:
        """Never called: :meth:`offers` nothing, so nothing is passed on to it."""

    def answer(self, approval: rpc.Approval) -> bool:
        """Settle a pending approval of this connection; False if there is none."""
        pending = self._approvals.get(approval.request_id)
        if pending is None or pending[0] != approval.session_id or pending[1].done():
            return False
        pending[1].set_result(approval.decision)
        return True

    def withdraw_all(self) -> None:
        """The connection is gone: every pending approval is denied."""
        for _, future in self._approvals.values():
            if not future.done():
                future.set_result(None)


class RpcServer:
    """Handler table shared by every ``daemon.sock`` connection of one host."""

    def __init__(self, version: str, sessions: Callable[[], Awaitable[Sessions]],
                 owners: Owners) -> None:
        """``owners``: the host's ownership table, shared with the ACP socket."""
        self.version = version
        self._sessions = sessions
        self._handshake = rpc.initialize_result(version, os.getpid())
        self.owners = owners
        self.queues = PromptQueues()
        self._connections = itertools.count(1)
        self._tasks: set[asyncio.Task[None]] = set()
        self.methods: dict[str, Callable[[Any, Endpoint], Any]] = {
            "initialize": self.initialize,
            "status": self.status,
            "session/new": self.new_session,
            "session/prompt": self.prompt,
            "session/cancel": self.cancel,
            "session/close": self.close,
            "session/approve": self.approve,
            "session/list": self.list,
            "session/load": self.load,
            "session/set_label": self.set_label,
        }

    def make_endpoint(self, send: Callable[[bytes], None], name: str = "") -> Endpoint:
        endpoint = Endpoint(send, self.methods, name=name or f"rpc#{next(self._connections)}")
        peer = DaemonPeer(endpoint)
        endpoint.state["peer"] = peer
        endpoint.on_eof.append(lambda: self._peer_gone(peer))
        return endpoint

    def _peer_gone(self, peer: DaemonPeer) -> None:
        """Input ended: deny its approvals, drop its queued prompts, cancel its turns
        (persisted), drop ownership."""
        peer.gone = True
        peer.withdraw_all()
        dropped = self.queues.drop(InternalError("prompt dropped: the client went away"),
                                   owner=peer)
        if dropped:
            log.info("%s: went away; %d queued prompt(s) dropped", peer.name, dropped)
        self.owners.leave_all(peer)
        task = asyncio.ensure_future(self._cancel_turns_of(peer))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _cancel_turns_of(self, peer: DaemonPeer) -> None:
        try:
            sessions = await self._sessions()
        except Exception:
            return
        sessions.cancel_peer_turns(peer)

    def drop_queued(self, reason: str) -> int:
        """Fail every queued prompt (the daemon is stopping); how many there were."""
        return self.queues.drop(InternalError(f"prompt dropped: {reason}"))

    # --- handlers -------------------------------------------------------------------

    def initialize(self, params: Any, endpoint: Endpoint) -> dict[str, Any]:
        rpc.protocol_version(params)
        caps = params.get("clientCapabilities") if isinstance(params, dict) else None
        endpoint.state["client"] = caps if isinstance(caps, dict) else {}
        return self._handshake

    async def status(self, params: Any, endpoint: Endpoint) -> dict[str, Any]:
        return host_status(await self._sessions(), self.owners, encoded_sessions=True)

    async def new_session(self, params: Any, endpoint: Endpoint) -> dict[str, Any]:
        """A new session, or the one its ``sessionKey`` / ``sessionLabel`` names
        (:mod:`supervisor.servers.rpc_names`)."""
        request = rpc.new_session_request(params)
        naming = rpc_naming(params)
        peer: DaemonPeer = endpoint.state["peer"]
        sessions = await self._sessions()
        agent = sessions.resolve_agent(request.request.agent_alias)
        if request.request.session_id is not None:
            sessions.check_unused(request.request.session_id)  # before evicting siblings
        if not request.keep_siblings:
            await self._evict_siblings(sessions, peer, agent.alias)
        names: dict[str, Any] = {}
        if naming.named:
            opened = await open_named(sessions, peer, request.request, naming)
            route, names = opened.route, named_answer(opened)
        else:
            route = await sessions.new(peer, request.request)
        if peer.gone:
            log.info("%s: went away while creating %s", endpoint.name, route.sid)
        self.owners.join(route.sid, peer)  # a no-op if the client left meanwhile
        return {"sessionId": route.sid, "agentAlias": route.agent_alias,
                "workspaceDir": route.workspace_dir, **names}

    async def list(self, params: Any, endpoint: Endpoint) -> dict[str, Any]:
        """Stored sessions, newest activity first: ``{sessions, nextCursor?}`` (as ACP's)."""
        cwd, cursor = rpc.list_params(params)
        sessions = await self._sessions()
        rows, next_cursor = sessions.list(cwd, cursor)
        names = sessions.host.reader.names_of([row.id for row in rows])
        result: dict[str, Any] = {"sessions": [
            listed_names(rpc.listed_session(row), row, names.get(row.id)) for row in rows]}
        if next_cursor:
            result["nextCursor"] = next_cursor
        return result

    async def load(self, params: Any, endpoint: Endpoint) -> dict[str, Any]:
        """Replay the stored turns as flat ``session/update`` notifications, then hold the
        session (as ``session/load`` on ``acp.sock``: a live idle session is joined)."""
        sid = session_id(params)
        peer: DaemonPeer = endpoint.state["peer"]
        route = await (await self._sessions()).restore(peer, sid, replay=True)
        self.owners.join(sid, peer)  # a no-op if the client left meanwhile
        return {"sessionId": sid, "agentAlias": route.agent_alias,
                "workspaceDir": route.workspace_dir, "mode": route.mode}

    async def _evict_siblings(self, sessions: Sessions, peer: DaemonPeer, alias: str) -> None:
        """Drop this connection's idle live sessions of ``alias`` (kept in the store);
        not those other connections hold too (an editor that loaded one uses it)."""
        for sid in self.owners.sessions_of(peer):
            route = sessions.host.live.route(sid)
            if route is not None and route.agent_alias == alias and self.owners.count(sid) == 1:
                await sessions.host.evict(sid)

    async def prompt(self, params: Any, endpoint: Endpoint) -> dict[str, Any]:
        """Queue the prompt behind its session's running one (see the module doc)."""
        request = prompt_request(params)
        peer: DaemonPeer = endpoint.state["peer"]
        sid = request.session_id
        with self.owners.adopting(sid, peer):
            ticket = self.queues.enter(sid, peer)  # before any await: arrival order
            try:
                return await self._run_queued(ticket, request, peer)
            finally:
                self.queues.leave(ticket)

    async def _run_queued(self, ticket: Ticket, request: PromptRequest,
                          peer: DaemonPeer) -> dict[str, Any]:
        await ticket.ready
        sid = ticket.sid
        sessions = await self._sessions()
        while (running := sessions.host.turns.get(sid)) is not None:
            await running.finished.wait()  # a turn started on another transport (acp.sock)
        if peer.gone:
            raise InternalError("prompt dropped: the client went away")
        try:
            outcome = await sessions.prompt(peer, request)
        except InternalError as exc:
            peer.endpoint.notify("session/update", rpc.turn_complete(sid, None, exc.message))
            raise
        peer.endpoint.notify("session/update",
                             rpc.turn_complete(sid, outcome.stop_reason, outcome.content))
        return {"sessionId": outcome.sid, "stopReason": outcome.stop_reason,
                "content": outcome.content}

    async def cancel(self, params: Any, endpoint: Endpoint) -> dict[str, Any]:
        """Cancel the running turn only: prompts queued behind it still run."""
        sid = session_id(params)
        self.owners.check(sid, endpoint.state["peer"])
        (await self._sessions()).cancel(sid)
        return {}

    async def close(self, params: Any, endpoint: Endpoint) -> dict[str, Any]:
        sid = session_id(params)
        peer: DaemonPeer = endpoint.state["peer"]
        self.owners.check(sid, peer)
        self.queues.drop(SessionNotFound(f"Session closed: {sid}"), sid=sid)
        await self.owners.ending(sid, (await self._sessions()).close(sid))
        return {}

    async def set_label(self, params: Any, endpoint: Endpoint) -> dict[str, Any]:
        """Label a session (:mod:`supervisor.servers.rpc_names`); -32003 for another
        connection's."""
        sid = session_id(params)
        self.owners.check(sid, endpoint.state["peer"])
        label = label_param(params)
        await (await self._sessions()).keys.set_label(sid, OWNER, label)
        return {"sessionId": sid, "sessionLabel": label}

    def approve(self, params: Any, endpoint: Endpoint) -> dict[str, Any]:
        approval = rpc.approve_request(params)
        peer: DaemonPeer = endpoint.state["peer"]
        if peer.answer(approval):
            return {}
        self.owners.check(approval.session_id, peer)
        raise InvalidParams(f"requestId: no pending approval request {approval.request_id[:80]}")
