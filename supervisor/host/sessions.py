"""Session operations shared by every dialect: new, prompt, cancel, close, stop,
load, resume, list, delete, set_mode, client events.

Runs on the asyncio loop thread. Each operation changes its session's entry in
the live-session table (:mod:`supervisor.core.live`: limits, busy, LRU eviction,
decided there without a thread hop), sends envelopes to the session's worker,
and writes through the PersistenceActor; a turn's result is returned only after
its transaction committed. Requests that meet on one session wait on the
entry's ``opening`` or ``closing`` future, never by polling.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import secrets
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from actors.persistence import (
    CreateSession,
    DeleteSession,
    MarkClosed,
    RecordEvent,
    Reopen,
    UpdateMeta,
    WriteMode,
)
from actors.worker.agents import agent_config_problem
from actors.worker.agents.acp_confine import (
    TENANT_ROOT_META_KEY,
    tenant_may_use,
    unconfined_refusal,
)
from ipc.acp import Blob, NewSessionRequest, PromptRequest, blob_marker, replay_updates
from ipc.errors import InternalError, InvalidParams, RpcError, SessionNotFound
from ipc.events import AgentUpdate, CurrentMode, TurnRecord, item_to_wire
from ipc.session_names import PARENT_META_KEY
from ipc.worker_wire import OpenSession, SetMode, StartTurn
from storage.models import SessionName, StoredSession
from storage.prepared_writes import title_of
from supervisor.config.config import AUTONOMY_LEVELS, AgentConfig
from supervisor.config.gateway_config import TenantConfig
from supervisor.config.protected import canonical_dir, cwd_refusal
from supervisor.core.live import Eviction, LiveSession
from supervisor.core.peer import Peer
from supervisor.core.routes import Route, RunningTurn
from supervisor.host.host import Host
from supervisor.host.session_keys import NO_NAMES, SessionKeys, SessionNames
from supervisor.host.slash_commands import agent_history, parse, run_host_command
from supervisor.host.tenant_dirs import (
    TENANT_META_KEY,
    TENANT_NAME_META_KEY,
    confine_cwd,
    tenant_root,
)

__all__ = ["Sessions", "TurnOutcome"]

log = logging.getLogger("zeroclaw.sessions")

INSTALL_ROOT = Path(__file__).resolve().parent.parent
_INSTALL_ROOT_TEXT = str(INSTALL_ROOT)


@dataclass(frozen=True, slots=True)
class TurnOutcome:
    sid: str
    stop_reason: str
    content: str
    meta: dict[str, Any] = field(default_factory=dict)  # the result's _meta.zeroclaw
    agent: str = ""  # the alias of the agent that answered
    model: str = ""  # its ``provider/model``


def no_agent_chosen(agents: Mapping[str, AgentConfig]) -> str:
    """Why ``session/new`` named no agent, with each way an editor can name one."""
    names = ", ".join(sorted(agents))
    return ("no agent chosen: several agents are configured (" + names + "); name one "
            "with [acp] default_agent in config.toml, ZEROCLAW_acp__default_agent=NAME in "
            "the editor's agent env, _meta.zeroclaw.agent on session/new, agentAlias, or "
            "?agent=NAME on the gateway's URL")


class Sessions:
    """The operations; one instance per host, used by every connection."""

    def __init__(self, host: Host) -> None:
        self.host = host
        self.settings = host.settings
        self.live = host.live
        #: The gateway's tenants by name, as last (re)loaded (``tenants/reload`` replaces it).
        self.tenants: Mapping[str, TenantConfig] = host.settings.tenants
        #: Session keys and labels (``_meta.sessionKey`` on ``session/new``).
        self.keys = SessionKeys(host)

    # --- session/new ------------------------------------------------------------------

    def resolve_agent(self, alias: str | None) -> AgentConfig:
        agents = self.settings.agents
        if alias is None:
            alias = self.settings.default_agent
        if alias is None and len(agents) == 1:
            alias = next(iter(agents))
        if alias is None:
            raise InvalidParams(no_agent_chosen(agents))
        agent = agents.get(alias)
        if agent is None:
            raise InvalidParams(f"unknown agent alias: {alias}")
        if not agent.enabled:
            raise InvalidParams(f"agent {alias} is disabled")
        problem = agent_config_problem(agent.to_wire())
        if problem is not None:
            raise InvalidParams(f"agent {alias} cannot be used: {problem}")
        return agent

    def agent_of_stored(self, info: StoredSession) -> tuple[AgentConfig, str | None]:
        """The agent a stored session runs on, and the alias it fell back from.

        Its own agent while that is configured and enabled; else (seed 000) the
        operator's ``[acp].default_agent``, else the only enabled agent: a session
        outlives its agent being disabled or removed. -32602 when none is left."""
        own = self.settings.agents.get(info.agent_alias)
        if own is not None and own.enabled:
            return own, None
        why = "disabled" if own is not None else "no longer configured"
        fallback = self._fallback_agent()
        if fallback is None:
            raise InvalidParams(f"agent {info.agent_alias} is {why}, and there is no "
                                "default agent to take over its sessions")
        log.warning("session %s: agent %s is %s; it runs on %s instead", info.id,
                    info.agent_alias, why, fallback.alias)
        return fallback, info.agent_alias

    def _fallback_agent(self) -> AgentConfig | None:
        agents = self.settings.agents
        default = agents.get(self.settings.default_agent or "")
        if default is not None and default.enabled:
            return default
        enabled = [agent for agent in agents.values() if agent.enabled]
        return enabled[0] if len(enabled) == 1 else None

    def resolve_cwd(self, cwd: str | None, agent: AgentConfig) -> str:
        """The session's canonical working directory (the agent's workspace by default);
        -32602 for one of the host's own directories (:func:`cwd_refusal`)."""
        resolved = self._canonical_cwd(cwd, agent)
        refusal = cwd_refusal(resolved, self.host.protected)
        if refusal is not None:
            raise InvalidParams(refusal)
        return resolved

    @staticmethod
    def _canonical_cwd(cwd: str | None, agent: AgentConfig) -> str:
        workspace = agent.workspace
        if cwd is None or cwd.strip() in ("", "."):
            workspace.mkdir(parents=True, exist_ok=True)
            return os.path.realpath(workspace)
        if not os.path.isabs(cwd):
            raise InvalidParams(f"cwd must be an absolute path: {cwd[:200]}")
        resolved = canonical_dir(cwd)
        if resolved is None:
            raise InvalidParams(f"cwd is not a usable directory: {cwd[:200]}")
        if resolved == _INSTALL_ROOT_TEXT:
            workspace.mkdir(parents=True, exist_ok=True)
            return os.path.realpath(workspace)
        return resolved

    async def new(self, peer: Peer, request: NewSessionRequest, *,
                  tenant: TenantConfig | None = None, names: SessionNames = NO_NAMES) -> Route:
        """Create a session; its id is ``request.session_id`` when the client chose one
        (only the daemon dialect passes it), else a fresh UUID. ``tenant``: the gateway
        tenant it belongs to, kept in its stored ``meta`` (None: the host's owner); its
        cwd must be inside the tenant's root, which is its workspace. ``names``: its key,
        label and parent session (:mod:`supervisor.host.session_keys`), stored with it."""
        agent = self.resolve_agent(request.agent_alias)
        if tenant is not None and not tenant_may_use(agent.to_wire(), self.host.sandbox):
            raise InvalidParams(unconfined_refusal(agent.alias, self.host.sandbox.reason))
        self.check_network(agent, tenant)
        meta: dict[str, Any] = {}
        if tenant is None:
            cwd = workspace = self.resolve_cwd(request.cwd, agent)
        else:
            workspace = tenant_root(self.settings.data_dir, tenant.id, tenant)
            cwd = confine_cwd(request.cwd, workspace)
            meta = {TENANT_META_KEY: tenant.id, TENANT_NAME_META_KEY: tenant.name}
        if names.parent is not None:
            meta[PARENT_META_KEY] = names.parent
        sid = request.session_id
        if sid is None:
            sid = str(uuid.uuid4())
        else:
            self.check_unused(sid)
        name = names.row(sid, tenant.id if tenant is not None else "")
        return await self._create(peer, sid, agent, (cwd, workspace), request, meta, name)

    def tenant_by_id(self, tenant_id: str) -> TenantConfig | None:
        """The configured tenant with this id (None: removed since)."""
        return next((t for t in self.tenants.values() if t.id == tenant_id), None)

    def sandbox_network(self, agent: AgentConfig, tenant: TenantConfig | None) -> bool:
        """Whether the session's commands keep the network: false when either the
        agent's or the tenant's ``sandbox_network`` says so."""
        return agent.sandbox_network and (tenant is None or tenant.sandbox_network)

    def check_network(self, agent: AgentConfig, tenant: TenantConfig | None) -> None:
        """-32602 when the session's commands must run without network and this host's
        sandbox cannot take it away (only bubblewrap gives them a network namespace)."""
        backend = self.host.sandbox
        if self.sandbox_network(agent, tenant) or backend.backend == "bwrap":
            return
        whose = (f"tenants.{tenant.name}" if tenant is not None and not tenant.sandbox_network
                 else f"agents.{agent.alias}")
        raise InvalidParams(
            f"{whose}.sandbox_network = false needs the bubblewrap sandbox (a network "
            f"namespace for the session's commands); this host's sandbox is "
            f"{backend.backend}{f' ({backend.reason})' if backend.reason else ''}, which "
            "cannot take the network away: install bubblewrap or allow the network")

    def _dirs(self, info: StoredSession, agent: AgentConfig,
              tenant: TenantConfig | None) -> tuple[str, str]:
        """The cwd and writable workspace a stored session opens with. A tenant's: its
        tenant's root as the workspace, and the stored cwd only while it is still
        inside the root (a root narrowed since, or a directory of it replaced by a
        symlink, opens at the root instead)."""
        tenant_id = str(info.meta.get(TENANT_META_KEY) or "")
        if not tenant_id:
            return info.cwd, str(agent.workspace)
        root = tenant_root(self.settings.data_dir, tenant_id, tenant)
        try:
            return confine_cwd(info.cwd, root), root
        except InvalidParams:
            log.warning("session %s: its cwd is no longer inside its tenant's root; it "
                        "opens at the root", info.id)
            return root, root

    def check_unused(self, sid: str) -> None:
        """-32602 when a client-chosen id is live, being opened (its entry), or stored."""
        if self.live.get(sid) is not None or self.host.reader.get_session(sid):
            raise InvalidParams(f"sessionId: session {sid} already exists; "
                                "use session/load or session/prompt to continue it")

    async def _create(self, peer: Peer, sid: str, agent: AgentConfig, dirs: tuple[str, str],
                      request: NewSessionRequest, meta: dict[str, Any],
                      name: SessionName | None = None) -> Route:
        if request.mcp_servers:
            log.info("session %s: %d MCP server(s) from the client (a hosted ACP agent "
                     "gets them, zeroclaw's model agents start them; echo ignores them)",
                     sid, len(request.mcp_servers))
        now = time.time()
        cwd, workspace = dirs
        info = StoredSession(
            id=sid, agent_alias=agent.alias, workspace_dir=workspace, cwd=cwd,
            mode=self.settings.autonomy_level, created_at=now, last_activity=now,
            mcp_servers=list(request.mcp_servers), meta=meta,
        )

        async def store_row() -> None:
            try:
                await self.host.persist(CreateSession(info, name))
            except RpcError:
                raise
            except Exception as exc:
                raise InternalError(str(exc)) from None  # e.g. "store write failed: ..."

        return await self._open(peer, info, history=False, commit=store_row, new=True)

    async def _open(self, peer: Peer, info: StoredSession, *, history: bool,
                    commit: Callable[[], Awaitable[Any]] | None = None,
                    new: bool = False) -> Route:
        """Open a session actor for a stored or new session (its entry is OPENING from
        the first line, no await before), then run ``commit`` (its store write).

        While OPENING, whatever else would open, prompt, close or delete the session
        waits on the entry's ``opening`` future: a session is never opened twice at
        once, and no row is deleted under a session that goes live after all. A
        failed or cancelled open frees its place and closes what it opened. ``new``: a new
        session, whose lease ``commit`` takes with its row (a stored one takes it first)."""
        agent, fallback_from = self.agent_of_stored(info)
        entry = self.live.begin_opening(info.id)
        try:
            if not new:  # a new session's lease comes with its row (CreateSession)
                await self.host.take_lease(info.id)  # another live host's: -32004
            route = await self._place_and_open(entry, peer, info, history, agent,
                                               fallback_from)
            if commit is not None:
                await commit()
        except BaseException as exc:
            placed = self.live.abandon(entry)
            if placed is not None and isinstance(exc, Exception):
                await self.host.close_on_worker(placed)
            elif placed is not None:
                self.host.drop_on_worker(placed)
            else:  # its own lease only: another host's stays
                self.host.release_lease(info.id)
            raise
        self.live.opened(entry)
        return route

    async def _place_and_open(self, entry: LiveSession, peer: Peer, info: StoredSession,
                              history: bool, agent: AgentConfig,
                              fallback_from: str | None) -> Route:
        """Everything that waits comes before the admission (as before it, the session
        takes no place under max_sessions); admission, placement and OpenSession
        then go together, with no await between them. The session goes to the least
        loaded worker once room is made: at the cap, the evicted session's (one
        worker hears of both)."""
        host = self.host
        tenant = str(info.meta.get(TENANT_META_KEY) or "") or None
        tenant_config = self.tenant_by_id(tenant) if tenant else None
        self.check_network(agent, tenant_config)  # the host's sandbox may have changed
        items = await asyncio.to_thread(host.reader.load_items, info.id) if history else []
        worker_id = await host.worker_with_room()
        # The agent's workspace is shared by all its sessions: never a tenant's root,
        # whose only writable root is its tenant's (cwd inside it).
        cwd, workspace = self._dirs(info, agent, tenant_config)
        # The message's parts first: nothing between the evictions and its send may fail.
        message = partial(
            OpenSession, sid=info.id, agent=agent.to_wire(), workspace_dir=workspace,
            cwd=cwd, mode=info.mode, forbidden_paths=list(self.settings.forbidden_paths),
            permission_timeout=self.settings.session_timeout_secs,
            history=[item_to_wire(i) for i in agent_history(items)],
            mcp_servers=list(info.mcp_servers), meta=self._open_meta(info.meta, workspace),
            confirm=False, sandbox_network=self.sandbox_network(agent, tenant_config),
        )
        evicted = self.live.make_room(tenant)
        worker_id = self.live.place(host.pool.ready_workers()) or worker_id
        route = Route(info.id, worker_id, peer, agent.alias,
                      workspace if tenant else info.workspace_dir, cwd, info.mode,
                      info.turn_count, info.token_count, fallback_from, tenant, info.title)
        route.answered = history  # a new session's id is not known to its client yet
        parent = info.meta.get(PARENT_META_KEY)
        route.parent = parent if isinstance(parent, str) else None
        evicted += self.live.admit(entry, route)  # room is made: nothing more
        self._send_open(worker_id, message, evicted)
        host.scale_workers()
        return route

    def _send_open(self, worker_id: str, message: Callable[..., OpenSession],
                   evicted: list[Eviction]) -> None:
        """Send ``message(evicted=...)`` to ``worker_id``, with the evictions of that
        worker in it (``OpenSession.evicted``); the others are closed on their own.
        Should it not go (it cannot be encoded), the evictions it carried are closed
        on their own."""
        host = self.host
        here = host.close_evicted(evicted, told=worker_id)
        try:
            host.pool.send(worker_id, message(evicted=here))
        except BaseException:
            for eviction in evicted:
                if eviction.sid in here:
                    host.drop_on_worker(eviction.route)
            raise

    @staticmethod
    def _open_meta(meta: Mapping[str, Any], workspace: str) -> dict[str, Any]:
        """The stored ``meta`` for the worker, with a tenant's root (the writable root
        of the tenant's hosted agent processes: ``workspace``, the session's)."""
        opened = dict(meta)
        if meta.get(TENANT_META_KEY):
            opened[TENANT_ROOT_META_KEY] = workspace
        return opened

    async def _forget(self, route: Route) -> None:
        self.live.drop(route)
        await self.host.close_on_worker(route)

    # --- session/prompt ------------------------------------------------------------------

    async def _held_route(self, sid: str) -> Route | None:
        """The live route of ``sid``, after an open of it under way (None: not live).
        -32000 while it is being closed or deleted: nothing may revive it then."""
        while True:
            entry = self.live.get(sid)
            if entry is None:
                return None
            if entry.closing is not None:
                raise SessionNotFound(f"Session not found: {sid} (it is being closed)")
            if entry.opening is None:
                return entry.route
            await asyncio.shield(entry.opening)  # then look again

    async def live_route(self, sid: str, peer: Peer) -> Route:
        """The live route of ``sid``, handed to ``peer``; an evicted (not closed)
        session is restored first, as a prompt would."""
        route = await self._held_route(sid)
        if route is None:  # no await from here to the entry's OPENING mark
            info = self.host.reader.get_session(sid)
            if info is None or info.closed_at is not None:
                raise SessionNotFound(f"Session not found: {sid}")
            log.info("restoring evicted session %s", sid)
            route = await self._open(peer, info, history=True)
        route.peer = peer
        return route

    async def prompt(self, peer: Peer, request: PromptRequest) -> TurnOutcome:
        """Run one turn; its record is committed before this returns.

        The turn is registered before the first ``await``, so a cancel or close
        right behind the prompt finds it. If this request is cancelled (its client
        went away), the turn is cancelled too and still persisted by the host.
        """
        turns = self.host.turns
        turn = turns.begin(request.session_id, peer)
        try:
            await self._start(turn, request)
            record, count = await turn.result  # only this waits on it: no shield needed
        except asyncio.CancelledError:
            self.withdraw(turn)
            raise
        except Exception as exc:
            log.debug("turn of %s failed: %r", turn.sid, exc)
            turns.settle(turn, error=exc if isinstance(exc, RpcError) else InternalError())
            raise
        return self.outcome(turn, record, count)

    def startable_now(self, request: PromptRequest) -> str | None:
        """The prompt's text when :meth:`start_now` can take it (loop thread): its
        session is open, idle and not closing, it has no attachments to store and is
        no slash command. None: it takes :meth:`prompt`, the general way."""
        entry = self.live.get(request.session_id)
        if (request.blobs or entry is None or entry.route is None or entry.turn is not None
                or entry.opening is not None or entry.closing is not None):
            return None
        text = request.assemble({})
        return None if parse(text) is not None else text

    def start_now(self, peer: Peer, sid: str, text: str) -> RunningTurn:
        """:meth:`prompt` of a prompt :meth:`startable_now` said yes to, with no await:
        the turn goes to the worker now; its ``result`` settles as :meth:`prompt`'s
        would (its ``on_settled`` is called then), and :meth:`outcome` makes the answer."""
        turn = self.host.turns.begin(sid, peer)  # BUSY at once: the session is open
        assert turn.route is not None
        turn.route.peer = peer
        if self.host.pool.send(turn.route.worker_id, StartTurn(sid, turn.turn_id, text)):
            turn.started = True
        else:
            self.host.turns.settle(turn, error=InternalError("session worker exited"))
        return turn

    def withdraw(self, turn: RunningTurn) -> None:
        """The prompt's client is gone before its answer: the worker ends a started
        turn (the host persists it); one not started yet fails."""
        if turn.started:
            self.host.turns.cancel(turn.sid)
        else:
            self.host.turns.settle(turn, error=InternalError("prompt withdrawn"))

    def hosts_agent(self, alias: str) -> bool:
        """Whether ``alias`` is a hosted ACP agent (which sends its own commands and
        titles: zeroclaw adds none of its own to what the client gets)."""
        agent = self.settings.agents.get(alias)
        return agent is not None and agent.provider == "acp"

    def outcome(self, turn: RunningTurn, record: TurnRecord, count: int) -> TurnOutcome:
        """The answer of a committed turn (the session's ``count``-th); a first turn of
        zeroclaw's own agents also tells the client the session's title."""
        if count == 1 and not (turn.route is not None
                               and self.hosts_agent(turn.route.agent_alias)):
            parent = turn.route.parent if turn.route is not None else None
            turn.peer.send_event(turn.sid, self.host.session_info_event(title_of(record),
                                                                        parent))
        if record.extra.get("session_meta"):
            self.host.spawn(self._store_meta(turn.sid, dict(record.extra["session_meta"])))
        meta = dict(record.extra.get("meta") or {})
        if turn.route is not None and turn.route.agent_fallback is not None:
            meta["agentFallback"] = turn.route.agent_fallback
        alias = turn.route.agent_alias if turn.route is not None else ""
        agent = self.settings.agents.get(alias)
        model = f"{agent.provider}/{agent.model}" if agent is not None else ""
        return TurnOutcome(turn.sid, record.stop_reason, record.content, meta, alias, model)

    async def _store_meta(self, sid: str, changes: dict[str, Any]) -> None:
        """Merge what the agent asked to keep into the session's stored ``meta``
        (never its tenant: an agent cannot move a session to another tenant)."""
        changes.pop(TENANT_META_KEY, None)
        for key in (TENANT_NAME_META_KEY, TENANT_ROOT_META_KEY):
            changes.pop(key, None)
        try:
            await self.host.persist(UpdateMeta(sid, changes))
        except Exception as exc:
            log.warning("session %s: meta not stored: %s", sid, exc)

    async def _start(self, turn: RunningTurn, request: PromptRequest) -> None:
        """Restore if needed, mark busy, store attachments, then hand the turn to the worker."""
        host = self.host
        route = await self._turn_route(turn)
        text = await self._materialise(route, request)
        if turn.cancel_requested:
            host.spawn(host.turns.complete_unstarted(turn, text))
            return
        command = parse(text)
        if command is not None:  # a slash command: the host answers, not the agent
            host.spawn(run_host_command(self, turn, route, text, command))
            return
        if not host.pool.send(route.worker_id, StartTurn(turn.sid, turn.turn_id, text)):
            raise InternalError("session worker exited")
        turn.started = True

    async def _turn_route(self, turn: RunningTurn) -> Route:
        """The route ``turn`` holds its session by (BUSY), restoring an evicted session.

        The turn is on the session's entry already (:meth:`TurnBook.begin`): it
        waits for an open under way, else restores the session itself; the table
        makes it BUSY as the open ends, so no eviction can come in between."""
        while turn.route is None:
            entry = self.live.get(turn.sid)
            if entry is None or entry.turn is not turn:
                raise InternalError("turn ended before it started")
            if entry.closing is not None:
                raise SessionNotFound(f"Session not found: {turn.sid} (it is being closed)")
            if entry.opening is not None:
                await asyncio.shield(entry.opening)
                continue
            info = self.host.reader.get_session(turn.sid)
            if info is None or info.closed_at is not None:
                raise SessionNotFound(f"Session not found: {turn.sid}")
            log.info("restoring evicted session %s", turn.sid)
            await self._open(turn.peer, info, history=True)
        turn.route.peer = turn.peer
        return turn.route

    async def _materialise(self, route: Route, request: PromptRequest) -> str:
        if not request.blobs:
            return request.assemble({})
        uploads = Path(route.workspace_dir) / "uploads"
        try:
            paths = await asyncio.to_thread(_write_uploads, uploads, request.blobs)
        except OSError as exc:
            raise InternalError(f"could not store an attachment: {exc.strerror}") from None
        markers = {b.index: blob_marker(b, p) for b, p in zip(request.blobs, paths, strict=True)}
        return request.assemble(markers)

    # --- cancel, close, stop -------------------------------------------------------------

    def cancel(self, sid: str) -> None:
        self.host.turns.cancel(sid)

    def cancel_peer_turns(self, peer: Peer) -> None:
        """Cancel every running turn that ``peer`` started (it went away)."""
        self.host.turns.cancel_all(peer)

    @contextlib.asynccontextmanager
    async def _closing(self, sid: str) -> AsyncIterator[LiveSession]:
        """Hold ``sid`` CLOSING (an open under way finishes first): a prompt, load or
        event sent right behind the close answers -32000. A second close or delete
        of the session waits for the first to end."""
        while (entry := self.live.get(sid)) is not None and entry.closing is not None:
            await asyncio.shield(entry.closing)
        entry = self.live.begin_closing(sid)
        try:
            if entry.opening is not None:
                await asyncio.shield(entry.opening)  # a cancelled close leaves it alone
            yield entry
        finally:
            self.live.end_closing(entry)

    def _check_not_ending(self, sid: str) -> None:
        entry = self.live.get(sid)
        if entry is not None and entry.closing is not None:
            raise SessionNotFound(f"Session not found: {sid} (it is being closed)")

    async def close(self, sid: str, *, wait_for_turn: bool = False) -> None:
        """Cancel (or, for ``session/stop``, await) the running turn, then drop the session."""
        async with self._closing(sid) as entry:
            await self._close(entry, wait_for_turn)

    async def _close(self, entry: LiveSession, wait_for_turn: bool) -> None:
        turn = entry.turn
        if turn is not None:
            if not wait_for_turn:
                self.host.turns.cancel(entry.sid)
            await turn.finished.wait()
        route = entry.route
        if route is None:
            raise SessionNotFound(f"Session not found: {entry.sid}")
        await self.host.persist(MarkClosed(entry.sid, time.time()))  # first: a refused
        await self._forget(route)  # write leaves the session as it was, live

    # --- load, resume -------------------------------------------------------------------

    async def restore(self, peer: Peer, sid: str, *, replay: bool,
                      mcp_servers: list[Any] | None = None) -> Route:
        """``session/load`` / ``session/resume``. A live session is handed to ``peer``
        as it is, not refused: an editor reopening it from its history (Zed does, on
        the connection that has it open) or another editor on a shared host picks it
        up. A turn running meanwhile goes on, streaming to whoever prompted it; the
        replay holds the turns completed so far. ``mcp_servers``: the client's list
        (None: not sent), which a session opened now uses instead of the stored one."""
        route = await self._held_route(sid)
        if route is not None:
            route.peer = peer
            self.live.touch(sid)  # just picked up: not the next LRU or idle-sweep victim
            await self.host.persist(Reopen(sid, time.time()))
        else:
            info = self.host.reader.get_session(sid)
            if info is None:
                raise SessionNotFound(f"Session not found: {sid}")
            if mcp_servers is not None:
                info = dataclasses.replace(info, mcp_servers=list(mcp_servers))
            route = await self._open(  # a refused write leaves it not live: a retry
                peer, info, history=True,  # starts again
                commit=lambda: self.host.persist(Reopen(sid, time.time())))
        if replay:
            turns = await asyncio.to_thread(self.host.reader.load_turns, sid)
            for update in replay_updates(turns):
                peer.send_event(sid, AgentUpdate(update))
        return route

    # --- list, delete, mode, events ------------------------------------------------------

    def list(self, cwd: str | None, cursor: str | None, *,
             tenant: str | None = None) -> tuple[list[StoredSession], str | None]:
        """A page of stored sessions; ``tenant``: only that gateway tenant's."""
        if cwd is not None and not os.path.isabs(cwd):
            raise InvalidParams("cwd must be an absolute path")
        if cwd is not None:
            cwd = os.path.realpath(cwd)
        try:
            return self.host.reader.list_sessions(cwd, cursor, 100, tenant=tenant)
        except ValueError as exc:
            raise InvalidParams(f"cursor: {exc}") from None

    async def delete(self, sid: str) -> None:
        async with self._closing(sid) as entry:
            if entry.route is not None:
                await self._close(entry, wait_for_turn=False)
            stored = self.host.reader.get_session(sid)
            await self.host.persist(DeleteSession(sid))
            if stored is not None:
                self.host.usage.forget_session(stored.token_count, stored.turn_count)

    async def set_mode(self, peer: Peer, sid: str, mode: str) -> None:
        if mode not in AUTONOMY_LEVELS:
            raise InvalidParams(f"modeId must be one of {', '.join(AUTONOMY_LEVELS)}")
        self._check_not_ending(sid)
        if self.live.route(sid) is None and self.host.reader.get_session(sid) is None:
            raise SessionNotFound(f"Session not found: {sid}")
        await self.host.persist(WriteMode(sid, mode))  # first: a refused write changes nothing
        route = self.live.route(sid)
        if route is not None:
            route.mode = mode
            self.host.pool.send(route.worker_id, SetMode(sid, mode))
        peer.send_event(sid, CurrentMode(mode))

    async def client_event(self, sid: str, kind: str, payload: dict[str, Any]) -> None:
        self._check_not_ending(sid)
        if self.live.route(sid) is None and self.host.reader.get_session(sid) is None:
            raise SessionNotFound(f"Session not found: {sid}")
        self.live.touch(sid)
        await self.host.persist(RecordEvent(sid, kind, payload))


def _write_uploads(uploads: Path, blobs: tuple[Blob, ...]) -> list[str]:
    """Write each blob atomically as ``<sha256>.<ext>``; never follows a symlink."""
    uploads.mkdir(parents=True, exist_ok=True)
    dir_fd = os.open(uploads, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        paths = []
        for blob in blobs:
            name = blob.file_name
            tmp = f".{name}.{secrets.token_hex(6)}.tmp"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600,
                         dir_fd=dir_fd)
            with os.fdopen(fd, "wb") as fh:
                fh.write(blob.data)
            os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
            paths.append(str(uploads / name))
        return paths
    finally:
        os.close(dir_fd)
