"""What an MCP server entry says: the ACP ``McpServer`` shape, read once, checked.

Two sources give entries of one shape: the client's ``mcpServers`` on ``session/new``
and ``session/load`` (ACP's ``McpServerStdio``: ``name``, ``command``, ``args``,
``env: [{name, value}]``; ``McpServerHttp`` / ``McpServerSse``: ``type``, ``name``,
``url``, ``headers: [{name, value}]``), and ``[agents.NAME] mcp_servers`` in the
config (the same keys; ``env`` and ``headers`` may also be a table there). Pure:
safe from any thread.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "MAX_TOOL_NAME",
    "McpServerSpec",
    "SpecError",
    "parse_server",
    "parse_servers",
    "tool_name",
]

#: The longest tool name every provider takes (OpenAI: 64, ``[A-Za-z0-9_-]``).
MAX_TOOL_NAME = 64
_NOT_ALLOWED = re.compile(r"[^A-Za-z0-9_-]+")
_VARIABLE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
TRANSPORTS = ("stdio", "http", "sse")


class SpecError(ValueError):
    """An entry that cannot be used; the message names it and says why."""


@dataclass(frozen=True, slots=True)
class McpServerSpec:
    """One server: ``transport`` ``stdio`` (``command``, ``args``, ``env``) or
    ``http`` / ``sse`` (``url``, ``headers``); ``source`` is ``client`` or ``config``."""

    name: str
    transport: str = "stdio"
    command: str = ""
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    url: str = ""
    headers: tuple[tuple[str, str], ...] = ()
    source: str = "client"

    @property
    def prefix(self) -> str:
        """What its tools' names start with (``NAME__``), in the providers' charset."""
        return f"{_clean(self.name) or 'mcp'}__"


def _clean(text: str) -> str:
    return _NOT_ALLOWED.sub("_", text).strip("_")


def tool_name(spec: McpServerSpec, tool: str, taken: Iterable[str] = ()) -> str:
    """The name a model sees for ``tool`` of ``spec``: ``SERVER__tool``, sanitized to
    ``[A-Za-z0-9_-]``, at most :data:`MAX_TOOL_NAME` long, different from ``taken``."""
    base = (spec.prefix + (_clean(tool) or "tool"))[:MAX_TOOL_NAME]
    taken = set(taken)
    name, n = base, 2
    while name in taken:
        suffix = f"_{n}"
        name, n = base[:MAX_TOOL_NAME - len(suffix)] + suffix, n + 1
    return name


def _pairs(value: Any, what: str, label: str) -> tuple[tuple[str, str], ...]:
    """``[{name, value}]`` (ACP) or a table of strings (config) as pairs."""
    if value is None:
        return ()
    if isinstance(value, Mapping):
        items = list(value.items())
    elif isinstance(value, Sequence) and not isinstance(value, str):
        items = []
        for entry in value:
            if not isinstance(entry, Mapping):
                raise SpecError(f"{label}: each of {what} must be {{name, value}}")
            items.append((entry.get("name"), entry.get("value")))
    else:
        raise SpecError(f"{label}: {what} must be a list of {{name, value}} or a table")
    for key, item in items:
        if not isinstance(key, str) or not isinstance(item, str) or "\x00" in item:
            raise SpecError(f"{label}: {what} names and values must be strings")
        if what == "env" and not _VARIABLE_NAME.fullmatch(key):
            raise SpecError(f"{label}: {key!r} is not a variable name")
    return tuple((str(k), str(v)) for k, v in items)


def parse_server(entry: Any, source: str = "client") -> McpServerSpec:
    """One entry as a spec; :class:`SpecError` saying what is wrong with it."""
    if not isinstance(entry, Mapping):
        raise SpecError("an MCP server entry must be an object")
    name = entry.get("name")
    if not isinstance(name, str) or not name.strip():
        raise SpecError("an MCP server entry needs a name")
    label = f"MCP server {name!r}"
    transport = entry.get("type", "stdio")
    if transport not in TRANSPORTS:
        raise SpecError(f"{label}: type must be one of {', '.join(TRANSPORTS)}")
    if transport != "stdio":
        url = entry.get("url")
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise SpecError(f"{label}: url must be an http:// or https:// URL")
        return McpServerSpec(name, transport, url=url, source=source,
                             headers=_pairs(entry.get("headers"), "headers", label))
    command, args = entry.get("command"), entry.get("args", [])
    if not isinstance(command, str) or not command or "\x00" in command:
        raise SpecError(f"{label}: command must be a non-empty string")
    if not isinstance(args, Sequence) or isinstance(args, str) or not all(
            isinstance(a, str) and "\x00" not in a for a in args):
        raise SpecError(f"{label}: args must be a list of strings")
    return McpServerSpec(name, "stdio", command, tuple(args),
                         _pairs(entry.get("env"), "env", label), source=source)


def parse_servers(config_entries: Any, client_entries: Sequence[Any]
                  ) -> tuple[list[McpServerSpec], list[str]]:
    """The agent's own servers (config), then the client's: the usable specs and a
    message per entry that is not (bad shape, or a name already used)."""
    specs: list[McpServerSpec] = []
    problems: list[str] = []
    entries = [(e, "config") for e in (config_entries or ())]
    entries += [(e, "client") for e in client_entries]
    for entry, source in entries:
        try:
            spec = parse_server(entry, source)
        except SpecError as exc:
            problems.append(str(exc))
            continue
        if any(s.prefix == spec.prefix for s in specs):
            problems.append(f"MCP server {spec.name!r}: another server has that name; ignored")
            continue
        specs.append(spec)
    return specs, problems


def config_problem(value: Any) -> str | None:
    """What is wrong with ``[agents.NAME] mcp_servers``, or None."""
    if value is None:
        return None
    if not isinstance(value, Sequence) or isinstance(value, str):
        return "mcp_servers must be a list of tables (name, command, args, env)"
    _, problems = parse_servers(value, ())
    return f"mcp_servers: {problems[0]}" if problems else None
