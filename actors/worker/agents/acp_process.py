"""One external ACP agent process inside a worker, shared by that worker's sessions.

Threads:
- the process's own asyncio loop thread starts the process (so the kernel's
  parent-death signal, which follows the thread that forked, lives exactly as
  long as this object), reads its NDJSON stdout a whole read at a time
  (:mod:`actors.worker.agents.acp_stdout`) into an :class:`ipc.jsonrpc.Endpoint`
  and runs that endpoint (the repo's one JSON-RPC layer): our requests to the
  agent, and the agent's notifications and requests, which it hands to
  :class:`SessionLink` objects by the agent's session id. The ``session/update``
  notifications of a read, the bulk of a streaming agent's output, go past the
  endpoint's per-message dispatch in runs, to the ``updates`` handler;
- a stderr thread copies the agent's stderr to the worker's log, prefixed with
  the agent's alias (at the level ``stderr_log_level`` says, INFO by default), and
  keeps its last lines for error messages;
- session actor threads call :meth:`AgentProcess.call`, which writes the request
  to the agent itself and gives a ``concurrent.futures.Future``, settled as soon
  as the loop reads the answer (:mod:`actors.worker.agents.acp_calls`), and
  :meth:`notify`, which writes the notification itself (so both keep the order
  they were sent in).

The process runs as a process tree of its own (:mod:`actors.worker.process_tree`),
in a clean environment: everything it starts (its MCP servers, their children, even
one that called ``setsid``) ends when it exits, when it is stopped, and when the
thread that started it (so its worker) ends.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import logging
import os
import queue
import shutil
import signal
import subprocess
import tempfile
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import orjson

from actors.worker import process_tree
from actors.worker.agents.acp_calls import AgentCalls, AgentInput
from actors.worker.agents.acp_confine import AgentJail
from actors.worker.agents.acp_stdout import Line, LinesProtocol, enlarge_pipe
from actors.worker.agents.acp_terminals import Terminals
from actors.worker.agents.base import AgentFailure, ClientChannel
from actors.worker.tools import PathPolicy
from ipc.errors import MethodNotFound, clip
from ipc.extensions import ExtensionMethods
from ipc.framing import OVERSIZED
from ipc.jsonrpc import ConnectionLost, Endpoint, RemoteError
from ipc.version import __version__

__all__ = [
    "NETWORK_ENV", "AgentProcess", "LaunchSpec", "SessionLink", "TurnInbox", "clean_env"]

log = logging.getLogger("zeroclaw.agent")

KEPT_ENV = ("PATH", "HOME", "LANG", "TERM")
NETWORK_ENV = (
    "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY",
    "http_proxy", "https_proxy", "all_proxy", "no_proxy",
    "SSL_CERT_FILE", "SSL_CERT_DIR", "NODE_EXTRA_CA_CERTS", "REQUESTS_CA_BUNDLE",
)
"""What a program needs to reach the network where the host does (a proxy, a company
CA): passed to hosted agents by default (``[agents.NAME] pass_network_env = false``
turns it off), and to the workers, which start them."""
FRAME_LIMIT = 32 * 1024 * 1024
STDERR_TAIL_LINES = 12
STOP_GRACE_SECS = 1.0
#: How long after the agent process ended its sessions hear of it when its stdout is
#: still open (a child of it holds it): what it wrote before is read by then.
EXIT_SETTLE_SECS = 1.0
#: What may wait for an agent that does not read its stdin (two of the largest
#: lines) before it is killed: the worker's memory is not the agent's to fill.
INPUT_BACKLOG_LIMIT = 2 * FRAME_LIMIT
#: While a turn streams, the agent's stdout is read again no sooner than this after
#: the last read came (the loop thread sleeps what the read's work left of it: a timer
#: would wake it no sooner than a millisecond): a read of a hundred lines or more
#: instead of one per few lines, at the cost of up to that pause before the turn's
#: answer is read.
STREAM_READ_PAUSE_SECS = 0.0004
#: The agent's requests the worker may have in hand at once (a permission request
#: waits on its client): past it, the agent's stdout is no longer read (one read more
#: at most) until half of them are answered, checked every :data:`REQUESTS_RECHECK_SECS`.
MAX_AGENT_REQUESTS = 256
REQUESTS_RECHECK_SECS = 0.01
#: ACP's error code for "authentication required" (the agent's, not zeroclaw's -32000).
AUTH_REQUIRED = -32000
_AGENT_REQUESTS = object()  # what holds the stdout for them (no session id is it)


def clean_env(extra: Mapping[str, str], base: Mapping[str, str] | None = None, *,
              network: bool = True) -> dict[str, str]:
    """The agent's environment: only :data:`KEPT_ENV` (and :data:`NETWORK_ENV` unless
    ``network`` is false) from ``base``, plus ``extra``."""
    base = os.environ if base is None else base
    kept = (*KEPT_ENV, *NETWORK_ENV) if network else KEPT_ENV
    env = {name: base[name] for name in kept if name in base}
    env.update(extra)
    return env


@dataclass(frozen=True, slots=True)
class LaunchSpec:
    """How to start one agent: ``argv[0]`` is already resolved to an absolute path;
    ``jail`` its confinement (None: unconfined, as in unit tests); ``stderr_level`` the
    log level of its stderr lines."""

    alias: str
    argv: tuple[str, ...]
    env: dict[str, str]
    cwd: str
    start_timeout: float
    jail: AgentJail | None = None
    stderr_level: int = logging.INFO

    @property
    def confinement(self) -> str:
        """The backend that confines it (``bwrap``, ``landlock``), or ``none``."""
        return self.jail.backend if self.jail is not None else "none"


class TurnInbox(Protocol):
    """The open turn of a session, as the agent process's loop thread sees it."""

    def update(self, update: Any) -> None:
        """One ``session/update`` of the agent (the loop thread)."""

    def updates(self, updates: list[Any]) -> bool:
        """The agent's consecutive ``session/update``s of one read (the loop thread);
        whether the turn streams on (the agent's output may be read a little later)."""

    def put(self, message: tuple[str, Any]) -> None:
        """A message for the turn's thread, behind the updates before it (any thread)."""

    def flush(self) -> None:
        """Relay the updates gathered so far now (the loop thread)."""


@dataclass(slots=True)
class SessionLink:
    """What the agent sends about one of its sessions goes here (from the loop thread).

    ``turn`` takes the agent's updates and requests during a turn (the turn's
    :class:`TurnInbox`; None between turns), ``inbox`` is read by the session's
    actor thread during a turn. The agent's ``fs/*`` and ``terminal/*``
    requests go to the session's client through ``client`` (zeroclaw's session
    ``sid``), or are served here under ``paths`` and ``mode``, with ``terminals``.
    ``mode_switched`` hears each ``current_mode_update`` of the agent, in a turn or not.
    ``replayed``: the session was reopened by the agent's ``session/load``, whose
    history (messages, thoughts, tool calls, plans) may trail its answer; until the
    next turn that history is not the client's (zeroclaw replays its own store).
    """

    agent_session_id: str
    paths: PathPolicy
    mode: Callable[[], str]
    sid: str = ""
    client: ClientChannel | None = None
    mode_switched: Callable[[str], None] | None = None
    inbox: queue.SimpleQueue[tuple[str, Any]] = field(default_factory=queue.SimpleQueue)
    turn: TurnInbox | None = None
    replayed: bool = False
    terminals: Terminals = field(init=False)

    def __post_init__(self) -> None:
        self.terminals = Terminals(self.paths, self.mode)


#: How many updates for a session id without a link are kept, and for how many ids.
UNCLAIMED_UPDATES = 64
UNCLAIMED_SESSIONS = 16


class AgentProcess:
    """One running agent; create, :meth:`start` (blocking), use, :meth:`stop`."""

    def __init__(self, spec: LaunchSpec, methods: Mapping[str, Callable[..., Any]],
                 notifications: Mapping[str, Callable[..., Any]] | None = None,
                 updates: Callable[[AgentProcess, list[Any]], bool] | None = None) -> None:
        """``methods``: ``handler(process, params)`` by method; ``notifications``: the
        ones for notifications that are handled otherwise than requests; ``updates``:
        ``handler(process, [params, ...])`` for runs of ``session/update``
        notifications (else they go through ``methods`` one by one), True when a
        turn streams on: the agent's stdout is then read again after
        :data:`STREAM_READ_PAUSE_SECS`, so a streaming agent's lines come in long
        reads, not a wake-up of this thread for each few."""
        self.spec = spec
        self.alias = spec.alias
        self.links: dict[str, SessionLink] = {}
        #: Updates for session ids no link holds yet (what an agent sends right after
        #: answering ``session/new``, before its link is made): see :meth:`link_or_keep`.
        self._unclaimed: dict[str, list[Any]] = {}
        self._links_lock = threading.Lock()
        self.initialize_result: dict[str, Any] = {}
        self.exited = threading.Event()
        self._exit_lock = threading.Lock()
        self._exit_told = False
        self.exit_status: int | None = None
        self._methods = methods
        self._notifications = {} if notifications is None else notifications
        self._updates = updates
        self._stderr_tail: collections.deque[str] = collections.deque(maxlen=STDERR_TAIL_LINES)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run_loop, daemon=True,
                                        name=f"acp-agent-{spec.alias}")
        self._proc: subprocess.Popen[bytes] | None = None
        self._endpoint: Endpoint | None = None
        self._stdout: LinesProtocol | None = None
        self._input: AgentInput | None = None
        self._calls = AgentCalls(f"agent {spec.alias}")
        self._stdout_task: asyncio.Task[None] | None = None
        self._requests_held = False  # its stdout is held for its requests in hand
        self._private_tmp: str | None = None
        self._pidfd: int | None = None  # the agent process's, watched by the loop
        self._command_pid: int | None = None  # the agent's own, under its launcher

    # --- lifecycle (caller's thread) --------------------------------------------

    def start(self, client_capabilities: dict[str, Any]) -> None:
        """Spawn and ``initialize``; AgentFailure (and the process stopped) if either fails."""
        self._thread.start()
        try:
            self._wait(self._start(client_capabilities), "initialize")
        except BaseException:
            self.stop()
            raise

    @property
    def alive(self) -> bool:
        """False once its stdout ended (it exited or is about to), it was stopped, or
        it exited (the end of its stdout may not be read yet: e.g. held)."""
        proc = self._proc
        return not self.exited.is_set() and (proc is None or proc.poll() is None)

    @property
    def pid(self) -> int | None:
        """The agent's own pid (under its tree's launcher), for status."""
        if self._proc is None:
            return None
        return self._command_pid or self._proc.pid

    def call(self, method: str, params: Any) -> concurrent.futures.Future[Any]:
        """Send a request (the caller's thread writes it); the future holds its result
        (RemoteError, ConnectionLost). Cancelling the future drops the answer."""
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        agent_input = self._input
        if agent_input is None or self.exited.is_set():
            future.set_exception(ConnectionLost(f"agent {self.alias} is not running"))
        else:
            self._calls.send(agent_input.write, method, params, future)
        return future

    def call_and_wait(self, method: str, params: Any) -> Any:
        """:meth:`call` bounded by the start timeout (for ``session/new``)."""
        return self._wait(self._request(method, params), method)

    def notify(self, method: str, params: Any) -> None:
        """Send a notification (the caller's thread writes it: after the requests and
        notifications it sent before); dropped once the agent is gone."""
        agent_input = self._input
        if agent_input is None or not self.alive:
            return
        try:
            frame = orjson.dumps({"jsonrpc": "2.0", "method": method, "params": params},
                                 option=orjson.OPT_APPEND_NEWLINE)
        except TypeError as exc:
            log.warning("agent %s: notification %s cannot be sent: %s", self.alias, method, exc)
            return
        agent_input.write(frame)

    def hold_reading(self, holder: object, held: bool) -> None:
        """Any thread: while some ``holder`` holds it, the agent's stdout is not read
        (it waits on its full pipe, all its sessions with it); a turn whose client
        lags far behind holds it so."""
        stdout = self._stdout
        if stdout is not None:
            with contextlib.suppress(RuntimeError):  # the loop is closed
                self._loop.call_soon_threadsafe(stdout.hold if held else stdout.release,
                                                holder)

    def begin_stop(self) -> None:
        """Ask the process and its tree to end (SIGTERM); :meth:`stop` finishes."""
        proc = self._proc
        if proc is not None and not process_tree.has_exited(proc):
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGTERM)

    def stop(self) -> None:
        """End the process and all it started (TERM, then KILL after
        :data:`STOP_GRACE_SECS`) and the loop. Idempotent."""
        proc = self._proc
        if proc is not None:
            process_tree.end(proc, STOP_GRACE_SECS)
        self.exited.set()
        if self._private_tmp is not None:
            shutil.rmtree(self._private_tmp, ignore_errors=True)
        for link in list(self.links.values()):
            link.terminals.close_all()
        if self._thread.is_alive():
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(STOP_GRACE_SECS)
        self._tell_exited()  # the loop may have stopped before it could
        if self._input is not None:
            self._input.close()
        if proc is not None and proc.stdin is not None:
            with contextlib.suppress(OSError):
                proc.stdin.close()

    def failure_text(self, doing: str) -> str:
        """Why the agent is gone: exit status and the last lines of its stderr."""
        if self._proc is not None and self.exit_status is None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(STOP_GRACE_SECS)
        status = self._proc.returncode if self._proc is not None else None
        if status is None:
            how = "closed its output"
        elif status < 0:
            how = f"was killed by signal {-status}"
        else:
            how = f"exited with status {status}"
        return self._with_stderr(f"agent {self.alias} {how} {doing}")

    def _with_stderr(self, text: str, none: str = "") -> str:
        """``text`` and the agent's last stderr lines (``none`` added when there are none)."""
        tail = "\n".join(self._stderr_tail)
        return f"{text}; last stderr lines:\n{tail}" if tail else text + none

    def _timeout_text(self, what: str, timeout: float) -> str:
        """Why ``what`` was not answered, as far as zeroclaw can tell: the names (never
        the values) of the variables the agent got, and its last stderr lines (an
        ``npx`` that cannot reach its registry says so there)."""
        names = ", ".join(sorted(self.spec.env)) or "none"
        return self._with_stderr(
            f"agent {self.alias} did not answer {what} within {timeout:g}s; its environment "
            f"had {names} (the agent's own variables come from env, pass_env and "
            "pass_network_env)", "; no stderr output")

    def refusal(self, what: str, error: RemoteError) -> str:
        """Why the agent refused ``what``; for ACP's "authentication required" also how
        to log in (zeroclaw relays no ``authenticate``: see docs/agents.md)."""
        text = f"agent {self.alias} refused {what}: {error}"
        if error.code != AUTH_REQUIRED:
            return text
        offered = [clip(str(method.get("name") or method.get("id")))
                   for method in self.initialize_result.get("authMethods") or ()
                   if isinstance(method, Mapping)]
        hint = f" (it offers: {', '.join(offered)})" if offered else ""
        return (f"{text}; log in with the agent's own command as the user zeroclaw runs "
                f"as{hint}, or give it an API key through pass_env or env")

    def _wait(self, coroutine: Any, what: str) -> Any:
        future = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
        timeout = self.spec.start_timeout
        try:
            return future.result(timeout)
        except TimeoutError:
            future.cancel()
            raise AgentFailure(self._timeout_text(what, timeout)) from None
        except RemoteError as exc:
            raise AgentFailure(self.refusal(what, exc)) from None
        except (ConnectionLost, OSError):
            raise AgentFailure(self.failure_text(f"before answering {what}")) from None

    # --- the loop thread --------------------------------------------------------

    def _run_loop(self) -> None:
        """The loop thread: serve until :meth:`stop`, then end its tasks and close it."""
        loop = self._loop
        asyncio.set_event_loop(loop)
        try:
            loop.run_forever()
        finally:
            self._calls.cancel_all()
            tasks = asyncio.all_tasks(loop)
            for task in tasks:
                task.cancel()
            loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_default_executor())
            loop.close()
            self._close_pidfd()

    async def _start(self, client_capabilities: dict[str, Any]) -> None:
        loop = asyncio.get_running_loop()
        proc = self._proc = self._spawn()
        assert proc.stdout is not None and proc.stdin is not None and proc.stderr is not None
        agent_input = self._input = AgentInput(loop, proc.stdin.fileno(),
                                               INPUT_BACKLOG_LIMIT, self._input_stuck)
        self._endpoint = Endpoint(agent_input.write, self._bound(self._methods),
                                  require_initialize=False, name=f"agent {self.alias}",
                                  notifications=self._bound(self._notifications))
        stdout = self._stdout = LinesProtocol(FRAME_LIMIT, self._receive,
                                              enlarge_pipe(proc.stdout.fileno()))
        await loop.connect_read_pipe(lambda: stdout, proc.stdout)
        threading.Thread(target=self._copy_stderr, args=(proc.stderr,), daemon=True,
                         name=f"acp-agent-{self.alias}-stderr").start()
        self._stdout_task = loop.create_task(self._watch_stdout(stdout))
        self._watch_exit(proc)
        result = await self._endpoint.request("initialize", {
            "protocolVersion": 1, "clientCapabilities": client_capabilities,
            "clientInfo": {"name": "zeroclaw", "title": "ZeroClaw", "version": __version__},
        })
        self.initialize_result = result if isinstance(result, dict) else {}
        self._command_pid = process_tree.command_pid(proc)

    def _spawn(self) -> subprocess.Popen[bytes]:
        spec = self.spec
        os.makedirs(spec.cwd, exist_ok=True)
        command, env = list(spec.argv), dict(spec.env)
        if spec.jail is not None:
            if spec.jail.backend == "landlock":  # bubblewrap gives it a fresh /tmp
                self._private_tmp = tempfile.mkdtemp(prefix=f"zeroclaw-agent-{spec.alias}-")
            confined = spec.jail.command(command, Path(self._private_tmp or "/tmp"))
            command = confined.argv
            env.update(confined.env)
            if spec.jail.home is not None:
                env["HOME"] = str(spec.jail.home)
        proc = process_tree.start(command, grace=STOP_GRACE_SECS, stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  cwd=spec.cwd, env=env, close_fds=True)
        log.info("agent %s started (pid %d, sandbox %s)", self.alias, proc.pid,
                 spec.confinement)
        return proc

    def _input_stuck(self, waiting: int) -> None:
        """The agent left ``waiting`` bytes of its input unread (the writer's thread):
        it is killed, and ends as if it had exited."""
        log.warning("agent %s stopped reading its input (%d bytes waiting); killing it",
                    self.alias, waiting)
        proc = self._proc
        if proc is not None and not process_tree.has_exited(proc):
            process_tree.kill_tree(proc.pid)

    def _bound(self, table: Mapping[str, Callable[..., Any]]) -> dict[str, Callable[..., Any]]:
        """``table``'s handlers bound to this process; an extension method (``_name``)
        is looked up in ``table`` when it has a fallback for them (an ExtensionMethods)."""
        def bind(handler: Callable[..., Any]) -> Callable[[Any, Endpoint], Any]:
            return lambda params, _endpoint: handler(self, params)

        def extension(name: str, params: Any, _endpoint: Endpoint) -> Any:
            handler = table.get(name)
            if handler is None:
                raise MethodNotFound(f"Method not found: {name}")
            return handler(self, params)

        bound = {name: bind(handler) for name, handler in table.items()}
        return ExtensionMethods(bound, extension)

    async def _request(self, method: str, params: Any) -> Any:
        if self._endpoint is None:
            raise ConnectionLost(f"agent {self.alias} is not running")
        return await self._endpoint.request(method, params)

    def _receive(self, lines: list[Line]) -> None:
        """The lines of one read of the agent's stdout, in order (the loop thread): its
        well-formed ``session/update`` notifications, decoded once (orjson beats any
        match of a chunk line's bytes in Python), in runs to the ``updates`` handler;
        the answers to :meth:`call` to their futures; any other JSON line to the
        endpoint (which answers what it cannot parse); an oversized or non-JSON line is logged and
        dropped. A read that ends with the updates of a turn that streams on is
        followed by a pause (:data:`STREAM_READ_PAUSE_SECS`): not one that ends with
        a turn's answer."""
        endpoint = self._endpoint
        assert endpoint is not None
        run: list[Any] = []
        streaming = False
        for line in lines:
            if line is OVERSIZED:
                log.warning("agent %s: dropped an oversized line on stdout", self.alias)
                continue
            if line[:1] not in (b"{", b"["):
                if line.strip():  # blank lines are skipped
                    log.warning("agent %s: ignored a non-JSON line on stdout: %.120r",
                                self.alias, line)
                continue
            message = _object_of(line)
            params = self._update_params(message)
            if params is not None:
                run.append(params)
                continue
            if run:
                self._hand_updates(run)
                run = []
            streaming = False  # a turn's answer, a request: no stream to wait for
            if message is None or not self._calls.answer(message):
                endpoint.receive(line)
        if run:
            streaming = self._hand_updates(run)
        if streaming and self._stdout is not None:
            self._stdout.pause_for(STREAM_READ_PAUSE_SECS)
        if endpoint.running_handlers >= MAX_AGENT_REQUESTS and not self._requests_held:
            self._hold_for_requests(True)

    def link_or_keep(self, agent_sid: str, updates: list[Any]) -> SessionLink | None:
        """The link of ``agent_sid``; when there is none yet, ``updates`` are kept for the
        link that :meth:`add_link` makes next (bounded) and None is returned. Any thread."""
        with self._links_lock:
            link = self.links.get(agent_sid)
            if link is None:
                kept = self._unclaimed.get(agent_sid)
                if kept is None and len(self._unclaimed) < UNCLAIMED_SESSIONS:
                    kept = self._unclaimed[agent_sid] = []
                if kept is not None:
                    kept.extend(updates[: UNCLAIMED_UPDATES - len(kept)])
            return link

    def add_link(self, link: SessionLink) -> tuple[bool, list[Any]]:
        """Register ``link`` for its agent session id: whether it is now the one there
        (False: another link holds that id), and the updates kept for it meanwhile
        (:meth:`link_or_keep`). Any thread."""
        with self._links_lock:
            added = self.links.setdefault(link.agent_session_id, link) is link
            return added, self._unclaimed.pop(link.agent_session_id, []) if added else []

    def _hold_for_requests(self, held: bool) -> None:
        """Hold the agent's stdout while it has too many requests in hand (the loop
        thread), until half of them are answered or the endpoint closed."""
        stdout, endpoint = self._stdout, self._endpoint
        assert stdout is not None and endpoint is not None
        if not held or endpoint.closed or endpoint.running_handlers < MAX_AGENT_REQUESTS // 2:
            self._requests_held = False
            stdout.release(_AGENT_REQUESTS)
        else:
            if not self._requests_held:
                log.warning("agent %s has %d requests unanswered; reading it no further "
                            "until half are", self.alias, endpoint.running_handlers)
            self._requests_held = True
            stdout.hold(_AGENT_REQUESTS)
            asyncio.get_running_loop().call_later(REQUESTS_RECHECK_SECS,
                                                  self._hold_for_requests, True)

    def _update_params(self, message: dict[str, Any] | None) -> dict[str, Any] | None:
        """The params of ``message`` when it is a valid ``session/update`` notification
        with object params, and this process takes them in runs; else None."""
        if message is None or self._updates is None:
            return None
        if (message.get("method") != "session/update" or "id" in message
                or message.get("jsonrpc") != "2.0"):
            return None
        params = message.get("params")
        return params if type(params) is dict else None

    def _hand_updates(self, run: list[dict[str, Any]]) -> bool:
        """``run`` to the updates handler; whether a turn streams on."""
        assert self._updates is not None and self._endpoint is not None
        if self._endpoint.closed:
            return False
        try:
            return self._updates(self, run)
        except Exception:
            log.exception("agent %s: session/update handler crashed", self.alias)
            return False

    async def _watch_stdout(self, stdout: LinesProtocol) -> None:
        """Once the agent's stdout ended: its turns and sessions hear of it."""
        assert self._endpoint is not None
        endpoint = self._endpoint
        try:
            await stdout.ended
        except (OSError, ValueError) as exc:
            log.warning("agent %s: stdout failed: %s", self.alias, exc)
        for link in list(self.links.values()):  # a turn that sees it exited has it all
            turn = link.turn
            if turn is not None:
                turn.flush()
        self.exited.set()  # first: no new turn may pick this process from now on
        self._calls.fail_all()
        endpoint.receive_eof()
        assert self._proc is not None
        self.exit_status = await asyncio.to_thread(_wait_or_kill, self._proc)
        endpoint.close()
        log.warning("agent %s (pid %s) ended with status %s", self.alias, self.pid,
                    self.exit_status)
        links = self._tell_exited()
        for link in links:  # what it ran in zeroclaw's terminals ends with it
            await asyncio.to_thread(link.terminals.close_all)

    def _watch_exit(self, proc: subprocess.Popen[bytes]) -> None:
        """The loop wakes when the agent process ends (its pidfd), so its sessions hear
        of it even while a child of it holds its stdout open: after
        :data:`EXIT_SETTLE_SECS`, time for what it wrote last to be read, if its
        stdout has not ended by then (the loop thread)."""
        loop = asyncio.get_running_loop()
        try:
            pidfd = os.pidfd_open(proc.pid)
        except OSError:  # no pidfds here: the end of its stdout still tells
            return
        self._pidfd = pidfd

        def ended() -> None:
            loop.remove_reader(pidfd)
            self._close_pidfd()
            loop.call_later(EXIT_SETTLE_SECS, self._tell_exited)

        loop.add_reader(pidfd, ended)

    def _close_pidfd(self) -> None:
        pidfd, self._pidfd = self._pidfd, None
        if pidfd is not None:
            os.close(pidfd)

    def _tell_exited(self) -> list[SessionLink]:
        """Each session's inbox hears once that the agent is gone, behind what its open
        turn gathered (the loop thread at the end of its stdout, or :meth:`stop`'s
        caller when the loop was stopped first): a turn waits on its inbox alone."""
        with self._exit_lock:
            told, self._exit_told = self._exit_told, True
        links = list(self.links.values())
        for link in [] if told else links:
            turn = link.turn
            (turn.put if turn is not None else link.inbox.put)(("exited", None))
        return links

    def _copy_stderr(self, stream: Any) -> None:
        """Stderr thread: each line to the log (prefixed) and to the kept tail."""
        with contextlib.suppress(OSError, ValueError):
            for raw in stream:
                line = raw.decode("utf-8", "replace").rstrip("\r\n")
                self._stderr_tail.append(line[:500])
                log.log(self.spec.stderr_level, "agent %s: %s", self.alias, line)


def _object_of(line: bytes) -> dict[str, Any] | None:
    """``line`` decoded when it is a JSON object; None for anything else."""
    if line[:1] != b"{":
        return None
    try:
        message = orjson.loads(line)
    except orjson.JSONDecodeError:
        return None
    return message if type(message) is dict else None


def _wait_or_kill(proc: subprocess.Popen[bytes]) -> int:
    """The exit status; an agent that closed its stdout but lingers is killed (a worker
    thread)."""
    try:
        return proc.wait(STOP_GRACE_SECS)
    except subprocess.TimeoutExpired:
        log.warning("agent pid %d closed its stdout but did not exit; killing it", proc.pid)
        process_tree.kill_tree(proc.pid)
        return proc.wait()
