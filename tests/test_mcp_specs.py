"""MCP server entries (ACP's McpServer shape, and the config's) and the tool names
a model sees (:mod:`actors.worker.mcp.specs`), and the agent config's MCP keys."""

from __future__ import annotations

from pathlib import Path

import pytest

from actors.worker.agents.llm.config import settings_problem
from actors.worker.mcp.specs import (
    MAX_TOOL_NAME,
    McpServerSpec,
    SpecError,
    parse_server,
    parse_servers,
    tool_name,
)

BASE = {"provider": "openai", "base_url": "http://127.0.0.1:9/v1", "model": "m"}


def test_an_acp_stdio_entry_and_a_config_entry_read_alike() -> None:
    acp = parse_server({"name": "fs", "command": "/bin/fs", "args": ["--root", "/w"],
                        "env": [{"name": "TOKEN", "value": "t"}]})
    config = parse_server({"name": "fs", "command": "/bin/fs", "args": ["--root", "/w"],
                           "env": {"TOKEN": "t"}}, "config")
    assert (acp.command, acp.args, acp.env) == ("/bin/fs", ("--root", "/w"), (("TOKEN", "t"),))
    assert (config.command, config.args, config.env) == (acp.command, acp.args, acp.env)
    assert (acp.source, config.source) == ("client", "config")


@pytest.mark.parametrize(("entry", "why"), [
    ({"command": "x"}, "needs a name"),
    ({"name": "a"}, "command must be"),
    ({"name": "a", "command": "x", "args": "--flag"}, "args must be a list"),
    ({"name": "a", "command": "x", "env": [{"name": "1BAD", "value": "v"}]}, "variable name"),
    ({"name": "a", "type": "ws", "url": "ws://h"}, "type must be one of"),
    ({"name": "a", "type": "http", "url": "file:///x"}, "url must be"),
    ("fs", "must be an object"),
])
def test_unusable_entries_say_why(entry: object, why: str) -> None:
    with pytest.raises(SpecError, match=why):
        parse_server(entry)


def test_config_servers_come_first_and_a_second_name_is_refused() -> None:
    specs, problems = parse_servers([{"name": "git", "command": "g"}],
                                    [{"name": "git", "command": "h"}, {"name": "x"},
                                     {"name": "web", "type": "sse", "url": "http://h/sse"}])
    assert [(s.name, s.source, s.transport) for s in specs] == [
        ("git", "config", "stdio"), ("web", "client", "sse")]
    assert len(problems) == 2 and "another server has that name" in problems[0]


def test_tool_names_are_prefixed_sanitized_bounded_and_unique() -> None:
    spec = McpServerSpec("My Server!", command="x")
    assert tool_name(spec, "read.file") == "My_Server__read_file"
    long = tool_name(spec, "t" * 100)
    assert len(long) == MAX_TOOL_NAME and long.startswith("My_Server__")
    taken = {long}
    again = tool_name(spec, "t" * 100, taken)
    assert again != long and len(again) == MAX_TOOL_NAME and again.endswith("_2")
    assert tool_name(McpServerSpec("★", command="x"), "★") == "mcp__tool"


def test_the_agent_config_checks_its_mcp_keys() -> None:
    ok = {**BASE, "mcp_servers": [{"name": "fs", "command": "fs", "env": {"A": "1"}}],
          "mcp_read_only_tools": ["fs__read"], "mcp_call_timeout_secs": 5}
    assert settings_problem(ok, {}, needs_key=False) is None
    bad_entry = {**BASE, "mcp_servers": [{"name": "fs"}]}
    assert "mcp_servers: MCP server 'fs': command" in str(
        settings_problem(bad_entry, {}, needs_key=False))
    assert "mcp_servers must be a list" in str(
        settings_problem({**BASE, "mcp_servers": "fs"}, {}, needs_key=False))
    assert "mcp_read_only_tools" in str(
        settings_problem({**BASE, "mcp_read_only_tools": "fs__read"}, {}, needs_key=False))
    assert "mcp_client_servers" in str(
        settings_problem({**BASE, "mcp_client_servers": "no"}, {}, needs_key=False))
    assert "mcp_start_timeout_secs" in str(
        settings_problem({**BASE, "mcp_start_timeout_secs": 0}, {}, needs_key=False))


def test_mcp_client_servers_false_keeps_only_the_agents_own(tmp_path: Path) -> None:
    from actors.worker.mcp.session_servers import SessionMcp
    from actors.worker.tools import PathPolicy

    paths = PathPolicy.build(str(tmp_path), str(tmp_path), [])
    client = [{"name": "theirs", "command": "x"}]
    own = [{"name": "mine", "command": "y"}]
    kept = SessionMcp.from_config({"mcp_servers": own, "mcp_client_servers": False},
                                  client, paths)
    assert kept is not None and [s.name for s in kept.specs] == ["mine"]
    assert SessionMcp.from_config({"mcp_client_servers": False}, client, paths) is None
    both = SessionMcp.from_config({"mcp_servers": own}, client, paths)
    assert both is not None and [s.name for s in both.specs] == ["mine", "theirs"]
