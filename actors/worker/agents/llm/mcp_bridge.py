"""The model agent's MCP servers: started when its session opens, their tools offered
to the model beside zeroclaw's own from the first turn on, stopped when it closes.

Runs on the session actor's thread (``open``, the turns, ``close``); the servers'
clients run on the worker's MCP loop thread (:mod:`actors.worker.mcp`), which also
reports a server's death to the host as it happens (:meth:`McpBridge.report`, any
thread). Each later turn starts a dead server again (:meth:`McpBridge.revive`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, MutableMapping
from typing import Any

from actors.worker.agents.base import SessionSetup
from actors.worker.agents.llm.tool_specs import ToolSpec
from actors.worker.mcp.session_servers import SessionMcp
from actors.worker.mcp.tools import McpTool
from actors.worker.tools import Tool

__all__ = ["McpBridge"]

log = logging.getLogger("zeroclaw.mcp")


class McpBridge:
    """One session's servers and the tools they added to it."""

    def __init__(self, servers: SessionMcp, registry: MutableMapping[str, Tool] | None,
                 report: Callable[[list[dict[str, Any]]], None] | None = None) -> None:
        self.servers = servers
        self.registry = registry
        self.tools: dict[str, McpTool] = {}
        self._report = report
        self._reported: list[dict[str, Any]] | None = None
        self._report_lock = threading.Lock()

    @classmethod
    def open(cls, config: Mapping[str, Any], setup: SessionSetup) -> McpBridge | None:
        """Start the servers of the agent config and the client (None: there are none)."""
        servers = SessionMcp.from_config(config, setup.mcp_servers, setup.paths)
        if servers is None:
            return None
        bridge = cls(servers, setup.tools, setup.report_mcp)
        servers.on_change = bridge.report
        servers.start()
        bridge.report()
        return bridge

    def report(self) -> None:
        """Tell the host the servers' state when it changed since the last time (any
        thread: the session's, or the MCP loop's when a server dies)."""
        with self._report_lock:
            status = self.servers.status()
            if self._report is None or status == self._reported:
                return
            self._reported = status
            try:
                self._report(status)
            except Exception:  # status is not worth failing a turn for
                log.exception("the MCP servers' status could not be sent")

    def ready(self) -> tuple[list[ToolSpec], list[str]]:
        """Wait for the servers (the first call only): the specs of their tools, and a
        line for each server (or entry) that cannot be used."""
        notices = self.servers.ready()
        self.report()
        if not self.tools:
            taken = set(self.registry or ())
            self.tools = self.servers.tools(taken)
            if self.registry is not None:
                self.registry.update(self.tools)
        return [tool_spec(tool) for tool in self.tools.values()], notices

    def revive(self, cancelled: threading.Event | None = None
               ) -> tuple[list[ToolSpec] | None, list[str]]:
        """At a later turn: start again the servers that died. The specs of all MCP
        tools when they changed (else None), and a line for each that cannot start."""
        changed, notices = self.servers.revive(cancelled)
        if not changed:
            return None, notices
        if self.registry is not None:
            for name in self.tools:
                self.registry.pop(name, None)
        self.tools = self.servers.tools(set(self.registry or ()))
        if self.registry is not None:
            self.registry.update(self.tools)
        self.report()
        return [tool_spec(tool) for tool in self.tools.values()], notices

    def close(self) -> None:
        self.servers.stop()
        if self.registry is not None:
            for name in self.tools:
                self.registry.pop(name, None)


def tool_spec(tool: McpTool) -> ToolSpec:
    """What the model sees of an MCP tool: its schema as the server gave it."""
    listed = tool.listed
    description = listed.description.strip() or listed.name
    description += f" (tool {listed.name!r} of MCP server {tool.connection.spec.name!r}"
    if listed.read_only_hint:
        description += "; the server says it only reads"
    description += ")"
    if tool.mutating:
        description += " Needs the user's approval in supervised mode."
    schema = dict(listed.input_schema)
    schema.setdefault("type", "object")
    if schema.get("type") == "object":
        schema.setdefault("properties", {})
    return ToolSpec(tool.name, description, schema)
