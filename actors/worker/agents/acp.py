"""The ``acp`` provider: an external ACP agent (a vendor's adapter, any ACP agent) hosted
inside zeroclaw.

Config (``[agents.<alias>]``): ``command`` (argv array, no shell; ``argv[0]`` an
absolute path or a name on PATH), ``env`` (a table added to a clean environment),
``per_session`` (one process per session instead of one per worker, alias and gateway
tenant),
``sandbox`` and ``allow_unconfined_tenants`` (how its process is confined:
:mod:`actors.worker.agents.acp_confine`),
``agent_start_timeout_secs`` (default 30: for ``initialize`` and ``session/new``),
``cancel_grace_secs`` (default 5: how long a cancelled turn may take to end in the
agent before the turn ends ``cancelled`` and the agent process is restarted),
``stderr_log_level`` (``debug``, ``info`` (default) or ``warning``: the level at which
the agent's stderr lines are logged).

Each zeroclaw session gets its own session in the agent (``session/new`` with the
session's cwd and the client's ``mcpServers``). A session that had an agent session
before (stored as ``acpAgentSessionId``, or the one of a crashed process) gets it
back through the agent's own ``session/resume`` or ``session/load`` where the agent
advertises them (the agent's replay is dropped: the client did not ask for it);
otherwise a fresh agent session, and the next prompt result says
``contextRestored: false``. A turn forwards the prompt as a
text block, relays the agent's ``session/update``s as zeroclaw events (so they
are recorded and replayed like any turn), relays its permission requests to the
client under the session's autonomy mode, forwards ``session/cancel``, and
relays ``fs/read_text_file`` / ``fs/write_text_file`` and ``terminal/*`` to the
client that holds the session when it advertised them, else serves them itself
(:mod:`actors.worker.agents.acp_relay`): files under the session's path policy, commands
in zeroclaw's sandboxed terminals.

Threads: :class:`AcpAgent` runs on its session's actor thread; the agent's
requests are served on its process's loop thread (:mod:`actors.worker.agents.acp_client`,
:mod:`actors.worker.agents.acp_process`); a turn is pumped by :mod:`actors.worker.agents.acp_turn`.
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import re
import shutil
import threading
from collections.abc import Mapping
from typing import Any, ClassVar

from actors.worker.agents.acp_client import HANDLERS, NOTIFICATIONS, between_turns, on_updates
from actors.worker.agents.acp_confine import AgentJail, jail_for, setting_problem
from actors.worker.agents.acp_process import AgentProcess, LaunchSpec, SessionLink, clean_env
from actors.worker.agents.acp_turn import AcpTurn
from actors.worker.agents.base import Agent, AgentFailure, SessionSetup, TurnContext, TurnResult
from actors.worker.tools import ShellTool
from ipc.errors import clip
from ipc.worker_wire import AgentProcessEntry

__all__ = [
    "CLIENT_CAPABILITIES",
    "AcpAgent",
    "agent_processes",
    "command_problem",
    "stop_agent_processes",
]

log = logging.getLogger("zeroclaw.agent")

DEFAULT_START_TIMEOUT = 30.0
DEFAULT_CANCEL_GRACE = 5.0  # after session/cancel, how long the agent has to end the turn
#: The values of ``stderr_log_level`` and the level each logs the agent's stderr lines at.
STDERR_LOG_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING}
#: What zeroclaw offers an agent: files and terminals, the client's when the client that
#: holds the session offers them, else zeroclaw's own (see :mod:`actors.worker.agents.acp_relay`).
CLIENT_CAPABILITIES: dict[str, Any] = {
    "fs": {"readTextFile": True, "writeTextFile": True}, "terminal": True,
}


def client_capabilities() -> dict[str, Any]:
    """:data:`CLIENT_CAPABILITIES`, less ``terminal`` when zeroclaw could not run one
    itself (no sandbox, and unconfined commands are not allowed): a terminal the
    client may not offer is not promised."""
    if ShellTool().unavailable() is None:
        return CLIENT_CAPABILITIES
    return {**CLIENT_CAPABILITIES, "terminal": False}


# --- config --------------------------------------------------------------------

_VARIABLE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def command_problem(config: Mapping[str, Any]) -> str | None:
    """Why this ``acp`` agent config cannot start (no secret is quoted), or None."""
    command = config.get("command")
    if (not isinstance(command, list) or not command
            or not all(isinstance(arg, str) for arg in command) or not command[0]):
        return "command must be a non-empty array of strings (argv, no shell)"
    env = config.get("env", {})
    if not isinstance(env, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in env.items()
    ):
        return "env must be a table of string values"
    passed = config.get("pass_env", [])
    if not isinstance(passed, list) or not all(
        isinstance(name, str) and _VARIABLE_NAME.fullmatch(name) for name in passed
    ):
        return "pass_env must be an array of environment variable names"
    if not isinstance(config.get("pass_network_env", True), bool):
        return "pass_network_env must be true or false"
    for key, default in (("agent_start_timeout_secs", DEFAULT_START_TIMEOUT),
                         ("cancel_grace_secs", DEFAULT_CANCEL_GRACE)):
        value = config.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
            return f"{key} must be a positive number"
    if config.get("stderr_log_level", "info") not in STDERR_LOG_LEVELS:
        return f"stderr_log_level must be one of {', '.join(STDERR_LOG_LEVELS)}"
    sandboxing = setting_problem(config)
    if sandboxing is not None:
        return sandboxing
    if _executable(command[0], dict(env)) is None:
        return f"executable {command[0]!r} not found (not an absolute path or a name on PATH)"
    return None


def _executable(name: str, env: dict[str, str]) -> str | None:
    """``name`` as an absolute executable path (PATH of the agent's environment), or None."""
    if os.sep in name:
        usable = os.path.isabs(name) and os.path.isfile(name) and os.access(name, os.X_OK)
        return name if usable else None
    return shutil.which(name, path=clean_env(env).get("PATH", os.defpath))


def _launch_spec(config: Mapping[str, Any], jail: AgentJail | None = None) -> LaunchSpec:
    alias = str(config.get("alias", "acp"))
    problem = command_problem(config)
    if problem is not None:
        raise AgentFailure(f"agent {alias} cannot be used: {problem}")
    env = {name: os.environ[name] for name in config.get("pass_env") or ()
           if name in os.environ}
    env.update(config.get("env") or {})
    argv = list(config["command"])
    argv[0] = _executable(argv[0], env) or argv[0]
    cwd = str(jail.policy.cwd) if jail is not None else str(config.get("workspace")
                                                            or os.getcwd())
    return LaunchSpec(
        alias=alias, argv=tuple(argv), cwd=cwd,
        env=clean_env(env, network=config.get("pass_network_env", True) is not False),
        start_timeout=float(config.get("agent_start_timeout_secs", DEFAULT_START_TIMEOUT)),
        jail=jail,
        stderr_level=STDERR_LOG_LEVELS[str(config.get("stderr_log_level", "info"))],
    )


# --- the worker's agent processes ----------------------------------------------------


class _Processes:
    """The worker's running agents by key (alias, alias@tenant, or alias/session). Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._starting: dict[str, threading.Lock] = {}
        self._running: dict[str, AgentProcess] = {}
        self._restarts: dict[str, int] = {}  # keys started before, and how often again

    def acquire(self, key: str, spec: LaunchSpec) -> AgentProcess:
        """The live process for ``key``, started (and initialized) if needed."""
        with self._lock:
            starting = self._starting.setdefault(key, threading.Lock())
        with starting:
            process = self._running.get(key)
            if process is not None and process.alive:
                return process
            if process is not None:
                process.stop()  # it exited: end its loop thread too
            with self._lock:
                restarts = self._restarts.get(key)
                self._restarts[key] = 0 if restarts is None else restarts + 1
            process = AgentProcess(spec, HANDLERS, NOTIFICATIONS, on_updates)
            process.start(client_capabilities())
            log.info("agent %s initialized: %s", spec.alias, _summary(process.initialize_result))
            with self._lock:
                self._running[key] = process
            return process

    def discard(self, key: str, process: AgentProcess, *, final: bool = False) -> None:
        """Stop ``process`` and forget it: a hung agent (the next :meth:`acquire` of
        ``key`` counts a restart), or with ``final`` a per-session agent whose session
        ended."""
        with self._lock:
            if self._running.get(key) is process:
                del self._running[key]
            if final:
                self._restarts.pop(key, None)
        process.stop()

    def entries(self) -> list[AgentProcessEntry]:
        """The running agents, for the worker's heartbeat (any thread)."""
        with self._lock:
            running = list(self._running.items())
            restarts = dict(self._restarts)
        return [AgentProcessEntry(alias=p.alias, pid=p.pid or 0, sessions=len(p.links),
                                  restarts=restarts.get(key, 0),
                                  confinement=p.spec.confinement)
                for key, p in running if p.alive and p.pid is not None]

    def stop_all(self) -> None:
        with self._lock:
            running, self._running = list(self._running.values()), {}
        for process in running:
            process.begin_stop()
        for process in running:
            process.stop()


_PROCESSES = _Processes()


def stop_agent_processes() -> None:
    """End every agent process of this worker (its IO thread, at exit)."""
    _PROCESSES.stop_all()


def agent_processes() -> list[AgentProcessEntry]:
    """This worker's running agent processes (its IO thread, for the heartbeat)."""
    return _PROCESSES.entries()


def _offers(result: Mapping[str, Any], capability: str) -> bool:
    """Whether the agent's ``initialize`` result offers ``sessionCapabilities.<name>``."""
    caps = result.get("agentCapabilities")
    sessions = caps.get("sessionCapabilities") if isinstance(caps, Mapping) else None
    return isinstance(sessions, Mapping) and sessions.get(capability) is not None


def _restore_method(result: Mapping[str, Any]) -> str | None:
    """How the agent reopens one of its sessions: ``session/resume`` (no replay) over
    ``session/load``, or None when it advertises neither."""
    if _offers(result, "resume"):
        return "session/resume"
    caps = result.get("agentCapabilities")
    if isinstance(caps, Mapping) and caps.get("loadSession") is True:
        return "session/load"
    return None


def _modes_of(result: Any) -> dict[str, Any] | None:
    """The agent's ``modes`` in a session answer, when it is a usable SessionModeState."""
    modes = result.get("modes") if isinstance(result, Mapping) else None
    if not isinstance(modes, Mapping) or not isinstance(modes.get("currentModeId"), str):
        return None
    available = modes.get("availableModes")
    if not isinstance(available, list) or not available:
        return None
    return {"currentModeId": modes["currentModeId"], "availableModes": [
        dict(mode) for mode in available if isinstance(mode, Mapping)
        and isinstance(mode.get("id"), str) and isinstance(mode.get("name"), str)]}


def _settle_from(answer: concurrent.futures.Future[Any],
                 done: concurrent.futures.Future[Any]) -> None:
    if done.cancelled():
        answer.set_exception(AgentFailure("the request was withdrawn"))
    elif done.exception() is not None:
        answer.set_exception(done.exception())
    else:
        answer.set_result(done.result())


def _summary(result: Mapping[str, Any]) -> str:
    caps = result.get("agentCapabilities")
    methods = [m.get("id") for m in result.get("authMethods") or [] if isinstance(m, Mapping)]
    return f"agentCapabilities={caps!r} authMethods={methods!r}"


# --- the agent ------------------------------------------------------------------------


class AcpAgent(Agent):
    """One zeroclaw session's view of a hosted ACP agent (its actor thread)."""

    provider: ClassVar[str] = "acp"
    reports_open: ClassVar[bool] = True

    @classmethod
    def config_problem(cls, config: Mapping[str, Any], env: Mapping[str, str]) -> str | None:
        return command_problem(config)

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__(config)
        self.alias = str(config.get("alias", "acp"))
        self.cancel_grace = float(config.get("cancel_grace_secs", DEFAULT_CANCEL_GRACE))
        self._setup: SessionSetup | None = None
        self._process: AgentProcess | None = None
        self._link: SessionLink | None = None
        self._key = self._base_key = self.alias
        self._start_error: str | None = None
        self._agent_sessions = 0
        self._context_lost = False
        self._new_agent_session = False  # its id is not stored yet
        self._restorable: str | None = None  # the agent session to reopen, if the agent can
        self._opened: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._modes: dict[str, Any] | None = None  # the agent's own, when it offers modes

    def open(self, setup: SessionSetup) -> None:
        """Start the agent (if this worker has none yet) and its session, ahead of a turn."""
        self._setup = setup
        stored = setup.meta.get("acpAgentSessionId")
        self._restorable = stored if isinstance(stored, str) and stored else None
        tenant = setup.meta.get("tenant")  # a process never serves two gateway tenants
        if isinstance(tenant, str) and tenant:
            self._base_key = self._key = f"{self.alias}@{tenant}"
        if self.config.get("per_session") is True:
            self._key = f"{self.alias}/{setup.sid}"
        try:
            self._connect()
        except AgentFailure as exc:
            log.warning("session %s: %s", setup.sid, exc)
            self._start_error = str(exc)  # the first prompt says so; the next tries again
        finally:
            self._opened.set_result(None)

    def own_modes(self) -> dict[str, Any] | None:
        """The agent's own modes for this session (from its ``session/new``, ``load`` or
        ``resume`` answer, and its ``current_mode_update`` since), None when it
        offers none."""
        return self._modes

    def _mode_switched(self, mode_id: str) -> None:
        """The agent says this session is in its mode ``mode_id`` now (the agent
        process's loop thread): the host hears of it, so later session answers say so.
        A mode it never offered is ignored."""
        modes, setup = self._modes, self._setup
        if modes is None or mode_id not in {mode["id"] for mode in modes["availableModes"]}:
            return
        self._modes = {**modes, "currentModeId": mode_id}  # replaced whole: read elsewhere
        if setup is not None and setup.modes_changed is not None:
            setup.modes_changed()

    def forward(self, method: str, params: dict[str, Any]) -> concurrent.futures.Future[Any]:
        """Forward a client's request to the agent, for this session (the worker's IO
        thread; it does not wait: an early request goes out once the session's agent
        session is there)."""
        answer: concurrent.futures.Future[Any] = concurrent.futures.Future()

        def forward(_opened: object) -> None:
            process, link = self._process, self._link
            if process is None or link is None or not process.alive:
                answer.set_exception(AgentFailure(f"agent {self.alias} is not running"))
                return
            sent = process.call(method, {**params, "sessionId": link.agent_session_id})
            sent.add_done_callback(lambda done: _settle_from(answer, done))

        self._opened.add_done_callback(forward)
        return answer

    def notify(self, method: str, params: dict[str, Any]) -> None:
        """Pass a client's notification on to the agent, for this session (the worker's
        IO thread; it does not wait: an early one goes out once the agent session is
        there; dropped when the agent is not running)."""

        def send(_opened: object) -> None:
            process, link = self._process, self._link
            if process is not None and link is not None and process.alive:
                process.notify(method, {**params, "sessionId": link.agent_session_id})

        self._opened.add_done_callback(send)

    def close(self) -> None:
        """Drop this session's agent session (``session/close`` where the agent offers
        it), and a per-session agent process."""
        process = self._process
        if process is not None and self.config.get("per_session") is True:
            _PROCESSES.discard(self._key, process, final=True)  # its session ends with it
        else:
            self._drop_link()

    def _drop_link(self) -> None:
        process, link = self._process, self._link
        if process is None or link is None:
            return
        process.links.pop(link.agent_session_id, None)
        link.terminals.close_all()
        if process.alive and _offers(process.initialize_result, "close"):
            process.call("session/close", {"sessionId": link.agent_session_id})

    @property
    def agent_session_id(self) -> str | None:
        return self._link.agent_session_id if self._link is not None else None

    def run_turn(self, prompt: str, ctx: TurnContext) -> TurnResult | None:
        if self._start_error is not None:
            error, self._start_error = self._start_error, None
            raise AgentFailure(error)
        if self._link is None or self._process is None or not self._process.alive:
            self._connect()
        meta: dict[str, Any] = {}
        if self._context_lost:
            self._context_lost = False
            meta["contextRestored"] = False
        stored: dict[str, Any] = {}
        if self._new_agent_session:
            self._new_agent_session = False
            stored["acpAgentSessionId"] = self.agent_session_id
        assert self._process is not None and self._link is not None
        turn = AcpTurn(self._process, self._link, ctx, self._setup_mode, self.cancel_grace)
        stop_reason = turn.run(prompt)
        if turn.ignored_cancel:  # it may never answer again: the next turn gets a new one
            log.warning("agent %s did not end a cancelled turn within %gs; restarting it",
                        self.alias, self.cancel_grace)
            _PROCESSES.discard(self._key, self._process)
        return TurnResult(stop_reason=stop_reason, meta=meta, session_meta=stored)

    def _setup_mode(self) -> str:
        return self._setup.mode() if self._setup is not None else "supervised"

    def _connect(self) -> None:
        """This session's agent session (starting the process if needed): the earlier
        one reopened where the agent can, else a fresh one; AgentFailure if neither."""
        setup = self._setup
        if setup is None:
            raise AgentFailure(f"agent {self.alias}: the session is not open")
        if self._link is not None:
            self._restorable = self._link.agent_session_id
        self._drop_link()
        self._process = self._link = None
        jail = jail_for(self.config, setup)  # a tenant's session without a sandbox: refused
        if self.config.get("per_session") is not True:
            self._key = self._base_key + jail.key  # other writable roots: another process
        process = _PROCESSES.acquire(self._key, _launch_spec(self.config, jail))
        agent_sid = self._reopen(process, setup)
        replayed = agent_sid is not None and (
            _restore_method(process.initialize_result) == "session/load")
        if agent_sid is None:
            agent_sid = self._new_session(process, setup)
            self._new_agent_session = True
            if setup.has_history or self._agent_sessions:
                self._context_lost = True
                log.warning("session %s: agent %s has a fresh session %s; the context of the "
                            "earlier turns was not restored", setup.sid, self.alias, agent_sid)
        link = SessionLink(agent_sid, setup.paths, setup.mode, setup.sid, setup.client,
                           self._mode_switched, replayed=replayed)
        added, early = process.add_link(link)
        if not added:  # it is another's
            raise AgentFailure(
                f"agent {self.alias} gave this session the session id {clip(agent_sid)!r}, "
                "which another session of it holds (an agent that serves one session "
                "per process needs per_session = true)")
        self._process, self._link = process, link
        self._agent_sessions += 1
        if self._new_agent_session and early:  # sent right after session/new: the
            between_turns(process, link, early)  # client's (a reopened one's replay is not)

    def _reopen(self, process: AgentProcess, setup: SessionSetup) -> str | None:
        """The earlier agent session through the agent's resume or load, or None. Its
        replay has no open turn to go to, so it is dropped (:mod:`acp_client`)."""
        method = _restore_method(process.initialize_result)
        agent_sid, self._restorable = self._restorable, None
        if agent_sid is None or method is None:
            return None
        try:
            result = process.call_and_wait(method, {
                "sessionId": agent_sid, "cwd": str(setup.paths.cwd),
                "mcpServers": list(setup.mcp_servers),
            })
            self._modes = _modes_of(result)
        except AgentFailure as exc:
            log.warning("session %s: %s; starting a fresh agent session", setup.sid, exc)
            return None
        log.info("session %s: agent %s session %s reopened (%s)", setup.sid, self.alias,
                 agent_sid, method)
        return agent_sid

    def _new_session(self, process: AgentProcess, setup: SessionSetup) -> str:
        try:
            result = process.call_and_wait("session/new", {
                "cwd": str(setup.paths.cwd), "mcpServers": list(setup.mcp_servers),
            })
        except AgentFailure:
            if process.alive:  # it answers nobody: a fresh one for the next try
                _PROCESSES.discard(self._key, process)
            raise
        agent_sid = result.get("sessionId") if isinstance(result, Mapping) else None
        if not isinstance(agent_sid, str) or not agent_sid:
            raise AgentFailure(f"agent {self.alias} answered session/new without a sessionId")
        self._modes = _modes_of(result)
        log.info("session %s: agent %s session %s (modes: %r)", setup.sid, self.alias,
                 agent_sid, self._modes)
        return agent_sid
