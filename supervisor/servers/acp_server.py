"""The ACP v1 server: binds the ACP dialect (:mod:`ipc.acp`) to the host's session
operations, for stdio (``zeroclaw acp``) and the daemon's ``acp.sock``.

Everything here runs on the asyncio loop thread. On a daemon's shared host the
connections hold sessions through the host's one ownership table
(:mod:`supervisor.ownership`): prompting, cancelling, closing, stopping, deleting
or setting the mode of a session other connections hold answers -32003, while
``session/load``/``resume`` joins its holders (editors share sessions that way).
A gateway connection also carries its tenant's scope (``state["scope"]``,
:mod:`supervisor.tenants`): it sees and touches only its tenant's sessions.
``initialize`` is answered inline
from a handshake prepared at start, without touching the actors, so the first
answer does not wait for the store, the actors or the worker pool; those start
right after it, in the background, and other methods wait for them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING, Any

from actors.worker.sandbox import detect as detect_sandbox
from ipc import acp_handshake
from ipc.errors import InternalError, InvalidParams, MethodNotFound, SessionNotFound
from ipc.events import AgentUpdate
from ipc.extensions import ExtensionMethods
from ipc.jsonrpc import ConnectionLost, Endpoint, RemoteError, notification_frame
from ipc.later import LaterAnswer
from ipc.session_names import (
    PARENT_META_KEY,
    SessionNaming,
    check_name,
    listing_meta,
    naming_of,
)
from ipc.transports import BYTE_STREAM
from supervisor import __version__
from supervisor.agent_modes import may_be_agent_mode, session_modes, set_agent_mode
from supervisor.host_handle import HostHandle
from supervisor.servers.provenance import ProvenanceMode, connection_mode, with_receipt

if TYPE_CHECKING:
    from ipc import acp
    from ipc.events import Event
    from ipc.transports import WriteFlow
    from ipc.worker_wire import PermissionAsk
    from supervisor.config import Settings
    from supervisor.routes import Route, RunningTurn
    from supervisor.session_keys import SessionNames
    from supervisor.sessions import Sessions, TurnOutcome
    from supervisor.tenants import TenantScope

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


#: SQLite's "the database file is locked" codes: another connection writes now,
#: which the host's writer waits out (its busy timeout); the store itself is fine.
_SQLITE_BUSY_CODES = frozenset({5, 6})  # SQLITE_BUSY, SQLITE_LOCKED


def probe_store(path: os.PathLike[str]) -> bool:
    """Whether the host's open of the store (:func:`storage.store.open_store`) will
    find it usable, answered before ``initialize`` without the host's imports.

    It does what SQLite does when the host opens it: the file is opened (created
    when missing, mode 0600), its schema read (a file that is not a database, or
    whose header or schema is corrupt, fails here, as it fails the host) and its
    write lock taken and let go (``BEGIN IMMEDIATE``, ``ROLLBACK``; a read-only
    file fails here); and a scratch file beside it must take a page (a full disk
    or a file size limit fails here; an empty transaction writes nothing). A
    write lock held by another process counts as usable (the host's writer waits
    for it). Should the host's open still fail (the disk filled meanwhile), the
    methods that need the store are refused rather than pretended
    (:meth:`AcpServer._needing_store`), and a later ``initialize`` says so.
    """
    import sqlite3  # the host imports it right after initialize anyway

    try:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        os.close(os.open(path, os.O_RDWR | os.O_CREAT, 0o600))
        _write_scratch(f"{os.fspath(path)}.probe")
        connection = sqlite3.connect(path, timeout=0, isolation_level=None)
        try:
            connection.execute("SELECT count(*) FROM sqlite_master").fetchone()
            connection.execute("BEGIN IMMEDIATE")
            connection.execute("ROLLBACK")
        finally:
            connection.close()
    except sqlite3.Error as exc:
        return getattr(exc, "sqlite_errorcode", 0) & 0xFF in _SQLITE_BUSY_CODES
    except OSError:
        return False
    return True


def _write_scratch(scratch: str) -> None:
    """Write a page to ``scratch`` and remove it; OSError when the disk refuses."""
    fd = os.open(scratch, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, bytes(4096))
    finally:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(scratch)


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
        self.endpoint.send_frame(self.event_frame(sid, event))

    @property
    def byte_stream(self) -> bool:
        """Whether lines may be sent together (:meth:`send_frames`): a stream connection."""
        return bool(self.endpoint.state.get(BYTE_STREAM))

    def event_frame(self, sid: str, event: Event) -> bytes:
        """The ``session/update`` line of ``event`` (raising ``TypeError`` for one that
        cannot be encoded; empty once the endpoint is closed, where nothing is sent):
        :meth:`send_event` sends one, :meth:`send_frames` several together."""
        frame = acp.chunk_update_frame(sid, event)
        if frame is not None:
            return frame
        if self.endpoint.closed:
            return b""
        return notification_frame("session/update", acp.encode_event(sid, event))

    def send_frames(self, frames: bytes) -> None:
        """Send lines made by :meth:`event_frame`, in one go (:attr:`byte_stream` only)."""
        self.endpoint.send_frame(frames)

    async def ask_permission(self, sid: str, ask: PermissionAsk, timeout: float) -> str | None:
        """The option the client chose: a hosted agent's request goes out as the agent
        made it and its ``optionId`` comes back as chosen; zeroclaw's own requests
        answer an option kind (``allow_once``...). None: cancelled, timed out, gone."""
        params = self._permission_params(sid, ask)
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
        if ask.request is not None:
            return acp.agent_option_chosen(ask.request, result)
        return acp.selected_option(result)

    @staticmethod
    def _permission_params(sid: str, ask: PermissionAsk) -> dict[str, Any]:
        if ask.request is not None:
            return acp.agent_permission_params(sid, ask.request)
        try:
            from ipc.events import content_from_wire  # off the way to initialize

            preview = tuple(content_from_wire(item) for item in ask.content)
        except (KeyError, TypeError):
            preview = ()
        return acp.permission_params(sid, ask.tool_call_id, ask.title, ask.kind, ask.raw_input,
                                     preview, ask.tool_name)

    def offers(self, method: str) -> bool:
        from supervisor.client_relay import advertises  # off the way to initialize

        return advertises(self.endpoint.state.get("client"), method)

    async def call_client(self, sid: str, method: str, params: dict[str, Any],
                          timeout: float) -> Any:
        return await self.endpoint.request(method, params, timeout=timeout)

    def notify_client(self, sid: str, method: str, params: dict[str, Any]) -> None:
        self.endpoint.notify(method, params)

    async def ask_user(
        self, sid: str, message: str, schema: dict[str, Any], timeout: float
    ) -> dict[str, Any] | None:
        """A question with choices goes out as ``session/request_permission`` with the
        choices as options; ACP v1 has no free-text question, so other forms get None."""
        form = acp.question_choices(schema)
        if form is None:
            log.info("session %s: a question without choices cannot be asked over ACP", sid)
            return None
        field, choices = form
        import secrets  # off the way to initialize

        params = acp.question_params(sid, f"ask-{secrets.token_hex(8)}", message, choices)
        try:
            result = await self.endpoint.request(
                "session/request_permission", params, timeout=timeout)
        except TimeoutError:
            log.info("session %s: question timed out", sid)
            return None
        except (ConnectionLost, RemoteError) as exc:
            log.info("session %s: question failed (%s)", sid, type(exc).__name__)
            return None
        return acp.question_answer(result, field, choices)


class AcpServer:
    """Handler table and lifecycle shared by every ACP connection of one host."""

    def __init__(self, settings: Settings, version: str, host: HostHandle | None = None,
                 default_naming: SessionNaming | None = None, provenance: bool = False,
                 receipt: bool = False) -> None:
        """``host``: a daemon's shared host; without one the server has its own (embedded).
        ``default_naming``: ``zeroclaw acp --session KEY`` (or ``--session-label``), for
        each ``session/new`` that names no session of its own."""
        self.settings = settings
        self.default_naming = default_naming or SessionNaming()
        #: ``zeroclaw acp --provenance meta``: host, agent and model on each prompt result.
        #: ``--provenance meta+receipt``: each prompt ends with a source receipt. A
        #: connection may ask for its own mode at ``initialize`` (``--attach``).
        self.provenance = ProvenanceMode(provenance, receipt)
        self.version = version
        self.owns_host = host is None
        self.host = host if host is not None else HostHandle(settings)
        # A PostgreSQL store is the host's to open (no file to probe); it fails the start.
        self._advertise(settings.store_url is not None or probe_store(settings.store_path))
        self.methods: dict[str, Callable[..., Any]] = ExtensionMethods({
            "initialize": self.initialize,
            "session/new": self.new_session,
            "session/prompt": self.prompt,
            "session/cancel": self.cancel,
            "session/stop": self.stop,
            "session/set_mode": self.set_mode,
            "session/update": self.client_event,
            "session/event": self.client_event,
            "status": self.status,
            SET_INFO_METHOD: self.set_info,
        }, self.extension)
        #: Extension notifications go on as notifications, not as the requests above.
        self.notifications = ExtensionMethods({}, self.extension_notice)
        for method, handler in (("session/load", self.load), ("session/resume", self.resume),
                                ("session/list", self.list), ("session/close", self.close),
                                ("session/delete", self.delete)):
            self.methods[method] = self._needing_store(handler)

    def _advertise(self, persistent: bool) -> None:
        """Prepare the ``initialize`` answer: with a store, or in-memory sessions only."""
        self.persistent = persistent
        settings = self.settings
        self.handshake = acp_handshake.initialize_result(
            version=self.version, persistent=persistent, default_model=settings.default_model,
            max_sessions=settings.max_sessions, timeout=settings.session_timeout_secs,
            sandbox=detect_sandbox(settings.sandbox).to_wire(),
        )

    def make_endpoint(self, send: Callable[[bytes], None], name: str = "acp") -> Endpoint:
        endpoint = Endpoint(send, self.methods, name=name, notifications=self.notifications)
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
        started = self.host.started()  # the way of every request once the host is up
        return started if started is not None else await self.host.sessions()

    def _needing_store(
        self, handler: Callable[[Any, Endpoint], Any]
    ) -> Callable[[Any, Endpoint], Any]:
        """``handler`` for a method whose capability is advertised only with a store
        (SPEC §3): without one it answers -32000, as for an unknown session (seed 000)."""

        async def guarded(params: Any, endpoint: Endpoint) -> Any:
            sessions = await self.sessions()
            if not sessions.host.store.persistent:
                raise SessionNotFound(
                    "Session not found: the session store is not available "
                    "(sessions are kept in memory only)")
            return await handler(params, endpoint)

        return guarded

    async def shutdown(self) -> None:
        """Stop the host this server owns (a daemon stops its shared host itself)."""
        sessions = await self.host.settled() if self.owns_host else None
        if sessions is not None:
            await sessions.host.stop()

    # --- handlers -------------------------------------------------------------------

    async def _visible(self, params: Any, endpoint: Endpoint) -> str:
        """The request's session id; on a tenant's connection (the gateway) -32000 for a
        session that is not the tenant's, checked before anything else can answer."""
        sid = acp.session_id(params)
        scope: TenantScope | None = endpoint.state.get("scope")
        if scope is not None:
            scope.check(await self.sessions(), sid)
        return sid

    async def _held(self, params: Any, endpoint: Endpoint) -> str:
        """The request's session id, when no other connection holds it (else -32003)."""
        sid = await self._visible(params, endpoint)
        self.host.owners.check(sid, endpoint.state["peer"])
        return sid

    def initialize(self, params: Any, endpoint: Endpoint) -> dict[str, Any]:
        if not isinstance(params, Mapping):
            raise InvalidParams("params must be an object")
        acp_handshake.check_protocol_version(params.get("protocolVersion"))
        endpoint.state["client"] = params.get("clientCapabilities") or {}
        endpoint.state["provenance"] = connection_mode(params) or self.provenance
        asyncio.get_running_loop().call_soon(self.host.start)
        started = self.host.started()
        if started is not None and started.host.store.persistent != self.persistent:
            self._advertise(started.host.store.persistent)  # what the host opened wins
        return self.handshake

    async def new_session(self, params: Any, endpoint: Endpoint) -> dict[str, Any]:
        request = acp.new_session_request(params)
        naming = self._naming(params)
        sessions = await self.sessions()
        peer = endpoint.state["peer"]
        scope: TenantScope | None = endpoint.state.get("scope")
        if naming.named:
            return await self._named_session(sessions, request, naming, endpoint)
        if scope is None:
            route = await sessions.new(peer, request)
        else:
            route = await scope.new_session(sessions, peer, request)
        return await self._new_answer(sessions, route, endpoint)

    def _naming(self, params: Any) -> SessionNaming:
        """The request's key and label, ``zeroclaw acp --session``'s filling in; the
        command line's ``--reset-session`` applies to its first use only."""
        naming = naming_of(params).over(self.default_naming)
        if self.default_naming.reset and naming.named:
            self.default_naming = replace(self.default_naming, reset=False)
        return naming

    async def _new_answer(self, sessions: Sessions, route: Route, endpoint: Endpoint,
                          meta: dict[str, Any] | None = None) -> dict[str, Any]:
        peer = endpoint.state["peer"]
        self.host.owners.join(route.sid, peer)  # a no-op if the client left meanwhile
        modes = await session_modes(sessions, route)
        _after_answer(peer, route, sessions.hosts_agent(route.agent_alias))
        answer = {"sessionId": route.sid, "workspaceDir": route.workspace_dir, "modes": modes}
        if meta:
            answer["_meta"] = meta
        return answer

    async def _named_session(self, sessions: Sessions, request: acp.NewSessionRequest,
                             naming: SessionNaming, endpoint: Endpoint) -> dict[str, Any]:
        """``session/new`` with a key or label: the session it names, resumed and its
        transcript replayed right after the answer (as ``session/load`` would, the
        client knowing the id by then), or created with those names."""
        peer = endpoint.state["peer"]
        scope: TenantScope | None = endpoint.state.get("scope")
        replayed: list[dict[str, Any]] = []

        async def create(names: SessionNames) -> Route:
            if scope is None:
                return await sessions.new(peer, request, names=names)
            return await scope.new_session(sessions, peer, request, names)

        async def resume(sid: str) -> Route:
            if scope is not None:
                scope.check_capacity(sessions, sid)
            route = await sessions.restore(peer, sid, replay=False)
            turns = await asyncio.to_thread(sessions.host.reader.load_turns, sid)
            replayed.extend(acp.replay_updates(turns))
            return route

        opened = await sessions.keys.open(naming, scope.id if scope else "", create=create,
                                          resume=resume)
        if replayed:
            asyncio.get_running_loop().call_soon(_replay, peer, opened.route.sid, replayed)
        return await self._new_answer(sessions, opened.route, endpoint, opened.answer_meta())

    def prompt(self, params: Any, endpoint: Endpoint) -> LaterAnswer | Awaitable[dict[str, Any]]:
        """The common prompt (an open idle session, no tenant, no attachment, no slash
        command, no earlier request of the connection still to start) starts now and
        is answered by a plain call once its turn settles (:class:`ipc.later.LaterAnswer`:
        no task per prompt); any other takes :meth:`_prompt`. Both give the same answers."""
        request = acp.prompt_request(params)
        sessions = self.host.started()
        mode: ProvenanceMode = endpoint.state.get("provenance", self.provenance)
        if mode.receipt and sessions is not None:
            request = with_receipt(sessions, request, mode.origin_host)
        text = (sessions.startable_now(request) if sessions is not None and endpoint.in_order_now
                and endpoint.state.get("scope") is None else None)
        if sessions is None or text is None:
            return self._prompt(request, params, endpoint, receipted=sessions is not None)
        peer = endpoint.state["peer"]
        self.host.owners.check(request.session_id, peer, adopt=True)
        turn = sessions.start_now(peer, request.session_id, text)
        answer = LaterAnswer(lambda: sessions.withdraw(turn))
        turn.on_settled = partial(_answer_turn, sessions, turn, answer, mode.meta)
        if turn.finished.is_set():  # it could not start
            _answer_turn(sessions, turn, answer, mode.meta)
        return answer

    async def _prompt(self, request: acp.PromptRequest, params: Any, endpoint: Endpoint,
                      receipted: bool = False) -> dict[str, Any]:
        peer = endpoint.state["peer"]
        await self._visible(params, endpoint)
        sessions = await self.sessions()
        mode: ProvenanceMode = endpoint.state.get("provenance", self.provenance)
        if mode.receipt and not receipted:
            request = with_receipt(sessions, request, mode.origin_host)
        with self.host.owners.adopting(request.session_id, peer):
            outcome = await sessions.prompt(peer, request)
        return _prompt_result(outcome, mode.meta)

    async def cancel(self, params: Any, endpoint: Endpoint) -> dict[str, Any]:
        sid = await self._held(params, endpoint)
        sessions = await self.sessions()
        sessions.cancel(sid)
        return {}

    async def close(self, params: Any, endpoint: Endpoint) -> dict[str, Any]:
        sid = await self._held(params, endpoint)
        await self.host.owners.ending(sid, (await self.sessions()).close(sid))
        return {}

    async def stop(self, params: Any, endpoint: Endpoint) -> dict[str, Any]:
        sid = await self._held(params, endpoint)
        await self.host.owners.ending(sid, (await self.sessions()).close(sid, wait_for_turn=True))
        return {"sessionId": sid, "stopped": True}

    async def _restore(self, params: Any, endpoint: Endpoint, replay: bool) -> dict[str, Any]:
        sid = await self._visible(params, endpoint)
        cwd = acp.optional_str(params, "cwd") if isinstance(params, Mapping) else None
        sessions = await self.sessions()
        peer = endpoint.state["peer"]
        scope: TenantScope | None = endpoint.state.get("scope")
        if scope is not None:
            scope.check_cwd(sessions, cwd)
            scope.check_capacity(sessions, sid)
        route = await sessions.restore(peer, sid, replay=replay, mcp_servers=_mcp_servers(params))
        self.host.owners.join(sid, peer)  # a no-op if the client left meanwhile
        modes = await session_modes(sessions, route)
        _after_answer(peer, route, sessions.hosts_agent(route.agent_alias))
        return _with_agent_fallback({"modes": modes}, route.agent_fallback)

    async def load(self, params: Any, endpoint: Endpoint) -> dict[str, Any]:
        return await self._restore(params, endpoint, replay=True)

    async def resume(self, params: Any, endpoint: Endpoint) -> dict[str, Any]:
        return await self._restore(params, endpoint, replay=False)

    async def list(self, params: Any, endpoint: Endpoint) -> dict[str, Any]:
        if not isinstance(params, Mapping):
            raise InvalidParams("params must be an object")
        cwd = acp.optional_str(params, "cwd")
        cursor = acp.optional_str(params, "cursor")
        sessions = await self.sessions()
        scope: TenantScope | None = endpoint.state.get("scope")
        rows, next_cursor = sessions.list(cwd, cursor, tenant=scope.id if scope else None)
        names = sessions.host.reader.names_of([row.id for row in rows])
        result: dict[str, Any] = {"sessions": [_listed(row, names.get(row.id)) for row in rows]}
        if next_cursor:
            result["nextCursor"] = next_cursor
        return result

    async def delete(self, params: Any, endpoint: Endpoint) -> dict[str, Any]:
        sid = await self._held(params, endpoint)
        await self.host.owners.ending(sid, (await self.sessions()).delete(sid))
        return {}

    async def set_mode(self, params: Any, endpoint: Endpoint) -> dict[str, Any]:
        sid = await self._held(params, endpoint)
        mode = acp.optional_str(params, "modeId", "mode_id")
        if mode is None:
            raise InvalidParams("missing modeId")
        sessions, peer = await self.sessions(), endpoint.state["peer"]
        route = sessions.host.live.route(sid)
        if route is None and may_be_agent_mode(sessions, sid, mode):
            with self.host.owners.adopting(sid, peer):  # reopened, as a prompt would
                route = await sessions.live_route(sid, peer)
        if route is None or not await set_agent_mode(sessions, route, mode):
            await sessions.set_mode(peer, sid, mode)  # zeroclaw's autonomy level
        return {}

    async def client_event(self, params: Any, endpoint: Endpoint) -> dict[str, Any]:
        sid = await self._visible(params, endpoint)
        kind = acp.optional_str(params, "type")
        update = params.get("update")
        if kind is None and isinstance(update, Mapping):
            kind = str(update.get("sessionUpdate") or "event")
        await (await self.sessions()).client_event(sid, kind or "event", dict(params))
        return {"sessionId": sid, "type": kind or "event", "status": "processed"}

    async def set_info(self, params: Any, endpoint: Endpoint) -> dict[str, Any]:
        """``_zeroclaw/session_info_update``: set a session's label from the request's
        ``_meta.sessionLabel`` (null: remove it). ACP's ``session_info_update`` is an
        agent-to-client notification, so a client sets it through this extension; the
        client then gets that notification with the label in its ``_meta``."""
        sid = await self._held(params, endpoint)
        meta = params.get("_meta")
        if not isinstance(meta, Mapping) or "sessionLabel" not in meta:
            raise InvalidParams("_meta.sessionLabel is required (null removes the label)")
        label = check_name(meta["sessionLabel"], "_meta.sessionLabel")
        sessions = await self.sessions()
        scope: TenantScope | None = endpoint.state.get("scope")
        await sessions.keys.set_label(sid, scope.id if scope else "", label)
        update = {"sessionUpdate": "session_info_update", "_meta": {"sessionLabel": label}}
        endpoint.state["peer"].send_event(sid, AgentUpdate(update))
        return {"sessionId": sid, "_meta": {"sessionLabel": label}}

    async def extension(self, method: str, params: Any, endpoint: Endpoint) -> Any:
        """A ``_``-prefixed request: forwarded to the hosted agent of the session it
        names (:mod:`supervisor.agent_calls`); it adopts a session nobody holds, as a
        prompt does."""
        return await self._to_agent(method, params, endpoint, notification=False)

    async def extension_notice(self, method: str, params: Any, endpoint: Endpoint) -> None:
        """A ``_``-prefixed notification: passed on to the session's hosted agent as a
        notification, like a request otherwise (nothing answers it)."""
        await self._to_agent(method, params, endpoint, notification=True)

    async def _to_agent(self, method: str, params: Any, endpoint: Endpoint, *,
                        notification: bool) -> Any:
        """An extension that names no session is one this host does not have: -32601,
        as ACP says of an unknown extension method (a session's agent may know it)."""
        if not isinstance(params, Mapping) or not (params.get("sessionId")
                                                   or params.get("session_id")):
            raise MethodNotFound(f"Method not found: {method}")
        sid = await self._visible(params, endpoint)
        peer = endpoint.state["peer"]
        with self.host.owners.adopting(sid, peer):
            sessions = await self.sessions()
            route = await sessions.live_route(sid, peer)
            calls = sessions.host.agent_calls
            if notification:
                calls.notify(route, method, dict(params))
                return None
            return await calls.call(route, method, dict(params))

    async def status(self, params: Any, endpoint: Endpoint) -> dict[str, Any]:
        from supervisor.status import host_status

        sessions = await self.sessions()
        status = host_status(sessions, self.host.owners)
        scope: TenantScope | None = endpoint.state.get("scope")
        return status if scope is None else scope.status_view(status, sessions)


#: The extension method a client sets a session's label with.
SET_INFO_METHOD = "_zeroclaw/session_info_update"


def _listed(row: Any, name: Any) -> dict[str, Any]:
    """A ``session/list`` entry, its key, label and parent in ``_meta``."""
    entry = acp.session_entry(row)
    parent = row.meta.get(PARENT_META_KEY)
    meta = listing_meta(name.key if name else None, name.label if name else None,
                        name.current if name else True,
                        parent if isinstance(parent, str) else None)
    if meta:
        entry["_meta"] = meta
    return entry


def _replay(peer: AcpPeer, sid: str, updates: list[dict[str, Any]]) -> None:
    """Send a resumed session's transcript to the client that asked for it by name."""
    for update in updates:
        peer.send_event(sid, AgentUpdate(update))


def _prompt_result(outcome: TurnOutcome, provenance: bool = False) -> dict[str, Any]:
    """The ``session/prompt`` result of a turn's outcome; ``provenance`` (``zeroclaw acp
    --provenance meta``): ``_meta.provenance`` names the host, agent and model."""
    result: dict[str, Any] = {"sessionId": outcome.sid, "stopReason": outcome.stop_reason,
                              "content": outcome.content}
    meta: dict[str, Any] = {}
    if outcome.meta:
        meta["zeroclaw"] = outcome.meta
    if provenance:
        meta["provenance"] = {"host": f"zeroclaw/{__version__}", "agent": outcome.agent,
                              "model": outcome.model}
    if meta:
        result["_meta"] = meta
    return result


def _answer_turn(sessions: Sessions, turn: RunningTurn, answer: LaterAnswer,
                 provenance: bool) -> None:
    """Answer a prompt started by :meth:`Sessions.start_now` now that its turn has
    settled (loop thread): its result, or the error its turn ended with."""
    turn.on_settled = None
    if turn.result.cancelled():  # nothing cancels it on this way; be safe all the same
        answer.fail(InternalError("turn ended without a result"))
        return
    try:
        record, count = turn.result.result()
        answer.give(_prompt_result(sessions.outcome(turn, record, count), provenance))
    except Exception as exc:
        answer.fail(exc)


def _with_agent_fallback(
    result: dict[str, Any], fallback: dict[str, str] | None
) -> dict[str, Any]:
    """``_meta.zeroclaw.agentFallback: {from, to}`` on a load, resume or prompt result of a
    session whose own agent was disabled or removed (it runs on ``to`` instead)."""
    if fallback is not None:
        result["_meta"] = {"zeroclaw": {"agentFallback": fallback}}
    return result


def _after_answer(peer: AcpPeer, route: Route, hosted: bool) -> None:
    """Right after the answer being made (the endpoint writes a handler's result as soon
    as it returns, before any callback scheduled now runs, so the client knows the
    session id first): zeroclaw's ``available_commands_update`` — not for a hosted
    agent, whose own commands reach the client as it sent them — then the updates
    the agent sent since its session opened."""
    asyncio.get_running_loop().call_soon(_answered, peer, route, hosted)


def _answered(peer: AcpPeer, route: Route, hosted: bool) -> None:
    from supervisor.slash_commands import available_commands  # off the way to initialize

    if not hosted:
        peer.send_event(route.sid, available_commands())
    route.answered = True
    early, route.early_updates = route.early_updates, []
    for params in early:
        try:
            peer.notify_client(route.sid, "session/update", params)
        except TypeError as exc:  # orjson's encode error
            log.info("session %s: an agent update cannot be sent: %s", route.sid, exc)


def _mcp_servers(params: Any) -> list[Any] | None:
    """The ``mcpServers`` of a ``session/load`` or ``session/resume`` (None: not sent)."""
    servers = params.get("mcpServers") if isinstance(params, Mapping) else None
    if servers is not None and not isinstance(servers, list):
        raise InvalidParams("mcpServers must be an array")
    return servers
