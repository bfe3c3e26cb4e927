"""The ACP v1 server: binds the ACP dialect (:mod:`ipc.acp`) to the host's session
operations, for stdio (``zeroclaw acp``) and the daemon's ``acp.sock``.

Everything here runs on the asyncio loop thread. On a daemon's shared host the
connections hold sessions through the host's one ownership table
(:mod:`supervisor.ownership`): prompting, cancelling, closing, stopping, deleting
or setting the mode of a session other connections hold answers -32003, while
``session/load``/``resume`` joins its holders (editors share sessions that way).
``initialize`` is answered inline
from a handshake prepared at start, without touching the actors, so the first
answer does not wait for the store, the actors or the worker pool; those start
right after it, in the background, and other methods wait for them.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from ipc import acp_handshake
from ipc.errors import InvalidParams, SessionNotFound
from ipc.jsonrpc import ConnectionLost, Endpoint, RemoteError
from supervisor.host_handle import HostHandle

if TYPE_CHECKING:
    from ipc import acp
    from ipc.events import Event
    from ipc.transports import WriteFlow
    from ipc.worker_wire import PermissionAsk
    from supervisor.config import Settings
    from supervisor.sessions import Sessions

__all__ = ["AcpServer", "probe_store"]


class _LazyModule:
    """A module imported on first use: keeps ``ipc.acp`` off the way to ``initialize``."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> Any:
        import importlib

        module = importlib.import_module(self._name)
        self.__dict__.update(vars(module))  # later lookups never come back here
        return getattr(module, attr)


if not TYPE_CHECKING:
    acp = _LazyModule("ipc.acp")

log = logging.getLogger("zeroclaw.acp")


_SQLITE_HEADER = b"SQLite format 3\x00"


def probe_store(path: os.PathLike[str]) -> bool:
    """Cheap check (no SQLite import) that the store can be created, written and read.

    An existing file must be empty or start with the SQLite header; the host opens
    the store for real right after ``initialize`` and, should that still fail,
    refuses load/list/resume rather than pretending (see :meth:`AcpServer.stored`).
    """
    try:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            header = os.read(fd, len(_SQLITE_HEADER))
        finally:
            os.close(fd)
    except OSError:
        return False
    return header in (b"", _SQLITE_HEADER)


class AcpPeer:
    """One ACP client connection, as the host sees it."""

    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint = endpoint
        self.name = endpoint.name

    @property
    def flow(self) -> WriteFlow | None:
        flow: WriteFlow | None = self.endpoint.state.get("flow")
        return flow

    def send_event(self, sid: str, event: Event) -> None:
        self.endpoint.notify("session/update", acp.encode_event(sid, event))

    async def ask_permission(self, sid: str, ask: PermissionAsk, timeout: float) -> str | None:
        params = acp.permission_params(sid, ask.tool_call_id, ask.title, ask.kind, ask.raw_input)
        try:
            result = await self.endpoint.request(
                "session/request_permission", params, timeout=timeout
            )
        except TimeoutError:
            log.info("permission request for %s timed out: denied", ask.tool_name)
            return None
        except (ConnectionLost, RemoteError) as exc:
            log.info("permission request for %s failed (%s): denied", ask.tool_name,
                     type(exc).__name__)
            return None
        return acp.selected_option(result)


    async def ask_user(
        self, sid: str, message: str, schema: dict[str, Any], timeout: float
    ) -> dict[str, Any] | None:
        """ACP v1 has no question request for agents: the agent gets no answer."""
        log.info("session %s: the agent asked the user a question; ACP cannot ask it", sid)
        return None


class AcpServer:
    """Handler table and lifecycle shared by every ACP connection of one host."""

    def __init__(self, settings: Settings, version: str, host: HostHandle | None = None) -> None:
        """``host``: a daemon's shared host; without one the server has its own (embedded)."""
        self.settings = settings
        self.owns_host = host is None
        self.host = host if host is not None else HostHandle(settings)
        self.persistent = probe_store(settings.store_path)
        self.handshake = acp_handshake.initialize_result(
            version=version, persistent=self.persistent, default_model=settings.default_model,
            max_sessions=settings.max_sessions, timeout=settings.session_timeout_secs,
        )
        self.methods: dict[str, Callable[[Any, Endpoint], Any]] = {
            "initialize": self.initialize,
            "session/new": self.new_session,
            "session/prompt": self.prompt,
            "session/cancel": self.cancel,
            "session/close": self.close,
            "session/stop": self.stop,
            "session/set_mode": self.set_mode,
            "session/update": self.client_event,
            "session/event": self.client_event,
            "status": self.status,
        }
        if self.persistent:
            self.methods.update({
                "session/load": self.load,
                "session/resume": self.resume,
                "session/list": self.list,
                "session/delete": self.delete,
            })

    def make_endpoint(self, send: Callable[[bytes], None], name: str = "acp") -> Endpoint:
        endpoint = Endpoint(send, self.methods, name=name)
        peer = AcpPeer(endpoint)
        endpoint.state["peer"] = peer
        endpoint.on_eof.append(lambda: self._peer_gone(peer))
        return endpoint

    def _peer_gone(self, peer: AcpPeer) -> None:
        """The client's input ended: its running turns are cancelled (and persisted),
        and it holds no session any more."""
        self.host.owners.leave_all(peer)
        sessions = self.host.started()
        if sessions is not None:
            sessions.cancel_peer_turns(peer)

    # --- lifecycle ----------------------------------------------------------------

    async def sessions(self) -> Sessions:
        return await self.host.sessions()

    async def stored(self) -> Sessions:
        """The sessions, for methods that need the store to outlive this process."""
        sessions = await self.sessions()
        if not sessions.host.store.persistent:
            raise SessionNotFound("the session store is not available (sessions are in memory)")
        return sessions

    async def shutdown(self) -> None:
        """Stop the host this server owns (a daemon stops its shared host itself)."""
        sessions = await self.host.settled() if self.owns_host else None
        if sessions is not None:
            await sessions.host.stop()

    # --- handlers -------------------------------------------------------------------

    def _held(self, params: Any, endpoint: Endpoint) -> str:
        """The request's session id, when no other connection holds it (else -32003)."""
        sid = acp.session_id(params)
        self.host.owners.check(sid, endpoint.state["peer"])
        return sid

    def initialize(self, params: Any, endpoint: Endpoint) -> dict[str, Any]:
        if not isinstance(params, Mapping):
            raise InvalidParams("params must be an object")
        endpoint.state["client"] = params.get("clientCapabilities") or {}
        asyncio.get_running_loop().call_soon(self.host.start)
        return self.handshake

    async def new_session(self, params: Any, endpoint: Endpoint) -> dict[str, Any]:
        request = acp.new_session_request(params)
        sessions = await self.sessions()
        peer = endpoint.state["peer"]
        route = await sessions.new(peer, request)
        self.host.owners.join(route.sid, peer)  # a no-op if the client left meanwhile
        return {
            "sessionId": route.sid,
            "workspaceDir": route.workspace_dir,
            "modes": acp_handshake.modes_state(route.mode),
        }

    async def prompt(self, params: Any, endpoint: Endpoint) -> dict[str, Any]:
        request = acp.prompt_request(params)
        peer = endpoint.state["peer"]
        with self.host.owners.adopting(request.session_id, peer):
            outcome = await (await self.sessions()).prompt(peer, request)
        return {"sessionId": outcome.sid, "stopReason": outcome.stop_reason,
                "content": outcome.content}

    async def cancel(self, params: Any, endpoint: Endpoint) -> dict[str, Any]:
        sid = self._held(params, endpoint)
        sessions = await self.sessions()
        sessions.cancel(sid)
        return {}

    async def close(self, params: Any, endpoint: Endpoint) -> dict[str, Any]:
        sid = self._held(params, endpoint)
        await self.host.owners.ending(sid, (await self.sessions()).close(sid))
        return {}

    async def stop(self, params: Any, endpoint: Endpoint) -> dict[str, Any]:
        sid = self._held(params, endpoint)
        await self.host.owners.ending(sid, (await self.sessions()).close(sid, wait_for_turn=True))
        return {"sessionId": sid, "stopped": True}

    async def _restore(self, params: Any, endpoint: Endpoint, replay: bool) -> dict[str, Any]:
        sid = acp.session_id(params)
        if isinstance(params, Mapping):
            acp.optional_str(params, "cwd")
        sessions = await self.stored()
        peer = endpoint.state["peer"]
        route = await sessions.restore(peer, sid, replay=replay)
        self.host.owners.join(sid, peer)  # a no-op if the client left meanwhile
        return {"modes": acp_handshake.modes_state(route.mode)}

    async def load(self, params: Any, endpoint: Endpoint) -> dict[str, Any]:
        return await self._restore(params, endpoint, replay=True)

    async def resume(self, params: Any, endpoint: Endpoint) -> dict[str, Any]:
        return await self._restore(params, endpoint, replay=False)

    async def list(self, params: Any, endpoint: Endpoint) -> dict[str, Any]:
        if not isinstance(params, Mapping):
            raise InvalidParams("params must be an object")
        cwd = acp.optional_str(params, "cwd")
        cursor = acp.optional_str(params, "cursor")
        sessions = await self.stored()
        rows, next_cursor = sessions.list(cwd, cursor)
        result: dict[str, Any] = {"sessions": [_listed(row) for row in rows]}
        if next_cursor:
            result["nextCursor"] = next_cursor
        return result

    async def delete(self, params: Any, endpoint: Endpoint) -> dict[str, Any]:
        sid = self._held(params, endpoint)
        await self.host.owners.ending(sid, (await self.sessions()).delete(sid))
        return {}

    async def set_mode(self, params: Any, endpoint: Endpoint) -> dict[str, Any]:
        sid = self._held(params, endpoint)
        mode = acp.optional_str(params, "modeId", "mode_id")
        if mode is None:
            raise InvalidParams("missing modeId")
        await (await self.sessions()).set_mode(endpoint.state["peer"], sid, mode)
        return {}

    async def client_event(self, params: Any, endpoint: Endpoint) -> dict[str, Any]:
        sid = acp.session_id(params)
        kind = acp.optional_str(params, "type")
        update = params.get("update")
        if kind is None and isinstance(update, Mapping):
            kind = str(update.get("sessionUpdate") or "event")
        await (await self.sessions()).client_event(sid, kind or "event", dict(params))
        return {"sessionId": sid, "type": kind or "event", "status": "processed"}

    async def status(self, params: Any, endpoint: Endpoint) -> dict[str, Any]:
        from supervisor.status import host_status

        return host_status(await self.sessions(), self.host.owners)


def _listed(row: Any) -> dict[str, Any]:
    from ipc.events import iso_utc  # imported once, with the first list; not at start

    entry: dict[str, Any] = {
        "sessionId": row.id,
        "cwd": row.cwd,
        "updatedAt": iso_utc(row.last_activity),
    }
    if row.title:
        entry["title"] = row.title
    return entry
