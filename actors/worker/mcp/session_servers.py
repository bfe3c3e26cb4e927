"""The MCP servers of one session of zeroclaw's own model agent.

Created and used on the session actor's thread: :meth:`SessionMcp.start` when the
session opens (each server's client starts on the MCP loop thread, nothing waits
here), :meth:`~SessionMcp.ready` at the first turn (waits, bounded, for all of them
at once; their tools join the session's tools then), :meth:`~SessionMcp.stop` when
the session closes or is evicted (a restored session starts them again).
:meth:`~SessionMcp.revive`, at each later turn, starts again a server that died
(:data:`RESTART_ATTEMPTS` tries, :data:`RESTART_BACKOFF_SECS` apart, at most
:data:`MAX_RESTARTS` times a session). :meth:`~SessionMcp.status` may be read from any
thread; ``on_change`` is called (on the MCP loop thread) when a server dies.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from actors.worker.mcp.connection import McpConnection
from actors.worker.mcp.io import mcp_io
from actors.worker.mcp.launch import LaunchRefused, stdio_launch
from actors.worker.mcp.specs import McpServerSpec, parse_servers, tool_name
from actors.worker.mcp.tools import McpTool, mcp_tool
from actors.worker.tools import PathPolicy

__all__ = ["DEFAULT_CALL_TIMEOUT", "DEFAULT_START_TIMEOUT", "MAX_RESTARTS", "RESTART_ATTEMPTS",
           "SessionMcp"]

log = logging.getLogger("zeroclaw.mcp")

DEFAULT_START_TIMEOUT = 30.0
DEFAULT_CALL_TIMEOUT = 300.0
#: Starts of a dead server at one turn, and the waits before the second and third.
RESTART_ATTEMPTS = 3
RESTART_BACKOFF_SECS = (0.25, 1.0)
#: A server that died this many times is not started again in the session.
MAX_RESTARTS = 5


class SessionMcp:
    """The servers of one session: the config's (``[agents.NAME] mcp_servers``) and the
    client's (``mcpServers``)."""

    def __init__(self, specs: Sequence[McpServerSpec], problems: Sequence[str], *,
                 paths: PathPolicy, agent_env: Mapping[str, str],
                 read_only_tools: Iterable[str] = (),
                 start_timeout: float = DEFAULT_START_TIMEOUT,
                 call_timeout: float = DEFAULT_CALL_TIMEOUT) -> None:
        self.specs = tuple(specs)
        self.notices: list[str] = list(problems)
        self.paths = paths
        self.agent_env = dict(agent_env)
        self.read_only_tools = frozenset(read_only_tools)
        self.start_timeout = start_timeout
        self.call_timeout = call_timeout
        self.connections: list[McpConnection] = []
        #: Called when a server dies (the MCP loop thread); set before :meth:`start`.
        self.on_change: Callable[[], None] | None = None
        self.restarts: dict[str, int] = {}
        self._waited = False

    @classmethod
    def from_config(cls, config: Mapping[str, Any], client_entries: Sequence[Any],
                    paths: PathPolicy) -> SessionMcp | None:
        """The servers the agent config and the client give (unless the config says
        ``mcp_client_servers = false``), or None when there are none."""
        if client_entries and config.get("mcp_client_servers", True) is False:
            log.info("agent %s: the client's %d MCP server(s) are not used "
                     "(mcp_client_servers = false)", config.get("alias"), len(client_entries))
            client_entries = ()
        specs, problems = parse_servers(config.get("mcp_servers"), client_entries)
        if not specs and not problems:
            return None
        return cls(specs, problems, paths=paths, agent_env=config.get("env") or {},
                   read_only_tools=config.get("mcp_read_only_tools") or (),
                   start_timeout=float(config.get("mcp_start_timeout_secs",
                                                  DEFAULT_START_TIMEOUT)),
                   call_timeout=float(config.get("mcp_call_timeout_secs",
                                                 DEFAULT_CALL_TIMEOUT)))

    def start(self) -> None:
        """Start every server's client (does not wait)."""
        for spec in self.specs:
            connection = self._connect(spec)
            if connection is not None:
                connection.start()
                self.connections.append(connection)

    def _connect(self, spec: McpServerSpec) -> McpConnection | None:
        """A client for ``spec`` (not started); None, with a notice, when it is refused."""
        launch = None
        if spec.transport != "stdio" and not self.paths.network:
            self.notices.append(f"MCP server {spec.name!r} refused: the session has no "
                                "network (sandbox_network = false)")
            return None
        if spec.transport == "stdio":
            try:
                launch = stdio_launch(spec, self.paths, self.agent_env)
            except LaunchRefused as exc:
                self.notices.append(str(exc))
                log.warning("%s", exc)
                return None
        return McpConnection(spec, launch, mcp_io(), start_timeout=self.start_timeout,
                             call_timeout=self.call_timeout, on_change=self._changed)

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change()

    def ready(self) -> list[str]:
        """Wait for the servers to answer (once); what to tell the user about those that
        did not (and about entries that were not used), once."""
        if self._waited:
            return []
        self._waited = True
        for connection in self.connections:
            connection.wait_ready()
        notices = self.notices + [c.problem for c in self.connections if c.state == "failed"]
        self.notices = []
        return notices

    def tools(self, taken: Iterable[str]) -> dict[str, McpTool]:
        """The running servers' tools by the name the model sees (none of ``taken``)."""
        names = set(taken)
        found: dict[str, McpTool] = {}
        for connection in self.connections:
            if connection.state != "running":
                continue
            for listed in connection.tools:
                name = tool_name(connection.spec, listed.name, names)
                names.add(name)
                found[name] = mcp_tool(name, listed, connection, name in self.read_only_tools)
        return found

    def revive(self, cancelled: threading.Event | None = None) -> tuple[bool, list[str]]:
        """Start again each server that died (a turn begins): whether any connection
        changed (its tools are new objects), and a line for each that could not start."""
        changed = False
        notices: list[str] = []
        for index, connection in enumerate(list(self.connections)):
            if not connection.exited:
                continue
            connection.wait_stopped(1.0)  # its holder left; what is left of it goes
            fresh, notice = self._restart(connection, cancelled or threading.Event())
            self.connections[index] = fresh
            changed = True
            if notice:
                notices.append(notice)
        notices += self.notices
        self.notices = []
        return changed, notices

    def _restart(self, dead: McpConnection, cancelled: threading.Event
                 ) -> tuple[McpConnection, str | None]:
        """A running client in place of ``dead``, or a failed one and why (bounded)."""
        name = dead.spec.name
        count = self.restarts.get(name, 0)
        if count >= MAX_RESTARTS:
            dead.state = "failed"
            dead.problem = (f"{dead.problem}; not started again: it exited {count + 1} times "
                            "in this session")
            return dead, dead.problem
        attempt: McpConnection = dead
        for tries in range(RESTART_ATTEMPTS):
            if tries and cancelled.wait(RESTART_BACKOFF_SECS[min(tries, 2) - 1]):
                break
            fresh = self._connect(dead.spec)
            if fresh is None:
                return dead, self.notices.pop() if self.notices else dead.problem
            fresh.start()
            fresh.wait_ready()
            if fresh.state == "running":
                self.restarts[name] = count + 1
                log.info("%s started again (restart %d)", fresh.label, count + 1)
                return fresh, None
            fresh.stop(1.0)
            attempt = fresh
        attempt.state = "failed"
        return attempt, (f"{dead.problem}; it could not be started again "
                         f"({RESTART_ATTEMPTS} attempts): {attempt.problem}")

    def stop(self) -> None:
        """Stop every server (bounded); their processes are gone after."""
        for connection in self.connections:
            connection.request_stop()
        for connection in self.connections:
            connection.wait_stopped()

    def status(self) -> list[dict[str, Any]]:
        """One entry per server (name, transport, state, pid, tools); any thread."""
        entries = [connection.status() for connection in list(self.connections)]
        for entry in entries:
            if self.restarts.get(entry["name"]):
                entry["restarts"] = self.restarts[entry["name"]]
        return entries
