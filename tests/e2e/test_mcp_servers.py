"""zeroclaw's own model agent uses the MCP servers a client sends (and its config's).

A real ``zeroclaw acp`` (driven by the ACP SDK) runs an ``openai`` agent on the local
fake model server, which scripts the tool calls; the MCP servers are real processes:
the fixture server of :mod:`tests.fixtures.mcp_fault_server` (the mcp SDK's MCPServer:
faults, environment, a lying ``readOnlyHint``) and the reference servers nobody here
wrote (``@modelcontextprotocol/server-filesystem``, ``server-everything``,
``mcp-server-git``), installed pinned by ``scripts/test``.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest
from acp.schema import EnvVariable, McpServerStdio

from .conftest import SdkHostFactory
from .model_server import ModelServer
from .model_streams import openai_reply
from .procs import descendants, write_config
from .sdkhost import SdkHost
from .test_model_openai import KEY, KEY_ENV, openai_config

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "mcp_fault_server.py"
GONE_SECS = 15.0


def fixture_server(name: str = "fx", *extra: str, **env: str) -> McpServerStdio:
    return McpServerStdio(name=name, command=sys.executable, args=[str(FIXTURE), *extra],
                          env=[EnvVariable(name=k, value=v) for k, v in env.items()])


def call(name: str, arguments: dict[str, Any], call_id: str) -> Any:
    """A scripted reply that calls one tool."""
    return openai_reply({"tool_calls": [{"index": 0, "id": call_id, "type": "function",
                                         "function": {"name": name,
                                                      "arguments": json.dumps(arguments)}}]},
                        finish="tool_calls")


def server_procs(host: SdkHost, needle: str) -> list[psutil.Process]:
    """The host's descendants whose command line names ``needle`` (launchers too)."""
    found = []
    for proc in descendants(host.pid):
        try:
            if any(needle in part for part in proc.cmdline()):
                found.append(proc)
        except psutil.Error:
            continue
    return found


async def wait_for(condition: Callable[[], bool], timeout: float = GONE_SECS) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        await asyncio.sleep(0.05)
    return condition()


def session_status(status: dict[str, Any], sid: str) -> dict[str, Any]:
    [entry] = [e for e in status["sessions"] if e["sessionId"] == sid]
    return entry


def tool_results(server: ModelServer, index: int) -> list[dict[str, Any]]:
    return [m for m in server.requests[index].body["messages"] if m["role"] == "tool"]


async def start_host(sdk_hosts: SdkHostFactory, config_dir: Path, server: ModelServer,
                     tmp_path: Path, level: str, extra: str = "", **env: str) -> Any:
    write_config(config_dir, openai_config(server, tmp_path / "aws", extra, level=level))
    return sdk_hosts(env_extra={KEY_ENV: KEY, **env})


async def test_supervised_a_call_asks_permission_and_the_server_sees_no_host_secret(
    sdk_hosts: SdkHostFactory, config_dir: Path, tmp_path: Path, workspace: Path,
    model_server: ModelServer,
) -> None:
    model_server.script(call("fx__env", {"name": KEY_ENV}, "e1"),
                        openai_reply({"content": "Seen."}))
    async with await start_host(sdk_hosts, config_dir, model_server, tmp_path,
                                "supervised") as host:
        await host.initialize()
        new = await host.conn.new_session(cwd=str(workspace), mcp_servers=[
            fixture_server(FROM_CLIENT="given")])
        sid = new.session_id
        out = await host.prompt(sid, "what env do you have?")
        assert out.content == "Seen."
        [ask] = host.client.permission_asks
        assert ask.tool_call.title == "fx: env"
        [started] = host.client.of(sid, "tool_call")
        assert (started.title, started.kind) == ("fx: env", "other")
        [entry] = session_status(await host.raw("status", {}), sid)["mcpServers"]
        assert (entry["name"], entry["state"], entry["tools"]) == ("fx", "running", 5)
        procs = server_procs(host, str(FIXTURE))
        assert entry["pid"] in {p.pid for p in procs}
        assert procs, "the MCP server runs while the session is open"
        for proc in procs:
            environ = Path(f"/proc/{proc.pid}/environ").read_bytes()
            assert KEY.encode() not in environ and f"{KEY_ENV}=".encode() not in environ
            assert b"FROM_CLIENT=given" in environ
        await host.conn.close_session(session_id=sid)
        assert await wait_for(lambda: not server_procs(host, str(FIXTURE))), \
            "the server's processes are gone after session/close"
    first = model_server.requests[0].body
    tools = {t["function"]["name"]: t["function"] for t in first["tools"]}
    assert {"shell", "fx__echo", "fx__env", "fx__crash", "fx__slow"} <= set(tools)
    assert tools["fx__echo"]["parameters"]["properties"]["text"]["type"] == "string"
    [result] = tool_results(model_server, 1)
    assert "set=False" in result["content"] and "FROM_CLIENT" in result["content"]


async def test_read_only_refuses_a_tool_whatever_its_read_only_hint_says(
    sdk_hosts: SdkHostFactory, config_dir: Path, tmp_path: Path, workspace: Path,
    model_server: ModelServer,
) -> None:
    model_server.script(call("fx__write_here", {"name": "lie.txt", "text": "x"}, "w1"),
                        openai_reply({"content": "Refused, fine."}))
    async with await start_host(sdk_hosts, config_dir, model_server, tmp_path,
                                "read_only") as host:
        await host.initialize()
        new = await host.conn.new_session(cwd=str(workspace), mcp_servers=[fixture_server()])
        out = await host.prompt(new.session_id, "write")
        assert out.content == "Refused, fine."
        assert not host.client.permission_asks
    assert not (workspace / "lie.txt").exists()
    [result] = tool_results(model_server, 1)
    assert "denied: autonomy is read_only" in result["content"]
    described = {t["function"]["name"]: t["function"]["description"]
                 for t in model_server.requests[0].body["tools"]}
    assert "the server says it only reads" in described["fx__write_here"]


async def test_a_server_that_crashes_mid_call_fails_the_call_and_starts_again_next_turn(
    sdk_hosts: SdkHostFactory, config_dir: Path, tmp_path: Path, workspace: Path,
    model_server: ModelServer,
) -> None:
    model_server.script(call("fx__crash", {}, "c1"), openai_reply({"content": "It died."}),
                        call("fx__echo", {"text": "hi"}, "c2"),
                        openai_reply({"content": "Still here."}))
    async with await start_host(sdk_hosts, config_dir, model_server, tmp_path, "full") as host:
        await host.initialize()
        new = await host.conn.new_session(cwd=str(workspace), mcp_servers=[
            fixture_server(), fixture_server("broken", "--fail-start")])
        sid = new.session_id
        out = await host.prompt(sid, "crash it")
        assert out.content.endswith("It died.")
        assert "MCP server 'broken' could not start" in out.content
        assert "refusing to start" in out.content  # its stderr says why
        failed = [u for u in host.client.of(sid, "tool_call_update") if u.status == "failed"]
        assert len(failed) == 1
        servers = session_status(await host.raw("status", {}), sid)["mcpServers"]
        assert [(e["name"], e["state"]) for e in servers] == [("fx", "exited"),
                                                              ("broken", "failed")]
        assert "refusing to start" in servers[1]["problem"]
        assert (await host.prompt(sid, "again")).content == "Still here."
        servers = session_status(await host.raw("status", {}), sid)["mcpServers"]
        assert [(e["name"], e["state"], e.get("restarts")) for e in servers] == [
            ("fx", "running", 1), ("broken", "failed", None)]
    [crashed] = tool_results(model_server, 1)
    assert "MCP server 'fx' exited" in crashed["content"]
    assert "crashing on purpose" in crashed["content"]
    [later] = tool_results(model_server, 3)[-1:]
    assert "echo: hi" in later["content"]  # the server was started again for the turn
    tools = {t["function"]["name"] for t in model_server.requests[0].body["tools"]}
    assert not any(name.startswith("broken__") for name in tools)


async def mcp_state(host: SdkHost, sid: str, name: str) -> dict[str, Any]:
    servers = session_status(await host.raw("status", {}), sid)["mcpServers"]
    [entry] = [e for e in servers if e["name"] == name]
    return entry


async def state_becomes(host: SdkHost, sid: str, name: str, state: str,
                        timeout: float = GONE_SECS) -> dict[str, Any]:
    """The server's ``status`` entry once it shows ``state`` (polled, bounded)."""
    deadline = time.monotonic() + timeout
    while (entry := await mcp_state(host, sid, name))["state"] != state:
        assert time.monotonic() < deadline, f"{name} stayed {entry}"
        await asyncio.sleep(0.05)
    return entry


async def kill_idle_then_call(host: SdkHost, workspace: Path, server: McpServerStdio,
                              prompt: str) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """Open a session with ``server``, let a turn start it, kill its pid while idle: the
    status entry that says it exited (without a turn), the next turn's answer, and the
    entry after it."""
    sid = (await host.conn.new_session(cwd=str(workspace), mcp_servers=[server])).session_id
    await host.prompt(sid, "start")
    first = await state_becomes(host, sid, server.name, "running")
    psutil.Process(first["pid"]).kill()
    dead = await state_becomes(host, sid, server.name, "exited", timeout=5.0)
    assert "pid" in dead and dead["pid"] == first["pid"]
    out = await host.prompt(sid, prompt)
    after = await mcp_state(host, sid, server.name)
    assert after.get("pid") != first["pid"]
    return out.content, dead, after


async def test_a_server_killed_while_idle_shows_exited_and_the_next_turn_restarts_it(
    sdk_hosts: SdkHostFactory, config_dir: Path, tmp_path: Path, workspace: Path,
    model_server: ModelServer,
) -> None:
    model_server.script(openai_reply({"content": "started"}),
                        call("fx__echo", {"text": "revived"}, "k1"),
                        openai_reply({"content": "works again"}))
    async with await start_host(sdk_hosts, config_dir, model_server, tmp_path, "full") as host:
        await host.initialize()
        text, dead, after = await kill_idle_then_call(host, workspace, fixture_server(),
                                                      "echo")
        assert text == "works again"
        assert "MCP server 'fx' exited" in dead["problem"]
        assert (after["state"], after["restarts"]) == ("running", 1)
        assert after["pid"] in {p.pid for p in server_procs(host, str(FIXTURE))}
        assert not psutil.pid_exists(dead["pid"])
    assert "echo: revived" in tool_results(model_server, 2)[-1]["content"]


async def test_a_server_that_cannot_start_again_is_a_line_in_the_turn(
    sdk_hosts: SdkHostFactory, config_dir: Path, tmp_path: Path, workspace: Path,
    model_server: ModelServer,
) -> None:
    model_server.script(openai_reply({"content": "started"}),
                        openai_reply({"content": "without it"}))
    # in the session's cwd: the sandbox gives each start a private /tmp
    server = fixture_server("fx", "--once", str(workspace / "started-once"))
    async with await start_host(sdk_hosts, config_dir, model_server, tmp_path, "full") as host:
        await host.initialize()
        text, _, after = await kill_idle_then_call(host, workspace, server, "go on")
        assert text.endswith("without it")
        assert "MCP server 'fx' exited" in text
        assert "could not be started again (3 attempts)" in text
        assert after["state"] == "failed" and "refusing to start" in after["problem"]
    tools = {t["function"]["name"] for t in model_server.requests[1].body["tools"]}
    assert not any(name.startswith("fx__") for name in tools)


async def test_servers_start_again_on_load_and_stop_on_eviction(
    sdk_hosts: SdkHostFactory, config_dir: Path, tmp_path: Path, workspace: Path,
    model_server: ModelServer,
) -> None:
    model_server.script(call("fx__echo", {"text": "one"}, "l1"), openai_reply({"content": "1"}),
                        call("again__echo", {"text": "two"}, "l2"),
                        openai_reply({"content": "2"}),
                        openai_reply({"content": "other"}))
    async with await start_host(sdk_hosts, config_dir, model_server, tmp_path, "full") as host:
        await host.initialize()
        sid = (await host.conn.new_session(cwd=str(workspace),
                                           mcp_servers=[fixture_server()])).session_id
        assert (await host.prompt(sid, "echo one")).content == "1"
    async with await start_host(sdk_hosts, config_dir, model_server, tmp_path, "full",
                                ZEROCLAW_acp__max_sessions="1") as host:
        await host.initialize()
        await host.conn.load_session(session_id=sid, cwd=str(workspace),  # the load's list
                                     mcp_servers=[fixture_server("again")])
        assert (await host.prompt(sid, "echo two")).content == "2"
        assert server_procs(host, str(FIXTURE))
        other = (await host.conn.new_session(cwd=str(workspace))).session_id  # evicts sid
        assert await wait_for(lambda: not server_procs(host, str(FIXTURE))), \
            "the evicted session's server is gone"
        assert (await host.prompt(other, "hi")).content == "other"
    assert "echo: two" in tool_results(model_server, 3)[-1]["content"]


async def test_the_agents_own_servers_from_config_and_an_allowlisted_read(
    sdk_hosts: SdkHostFactory, config_dir: Path, tmp_path: Path, workspace: Path,
    model_server: ModelServer,
) -> None:
    extra = (f'mcp_read_only_tools = ["own__echo"]\n'
             f'mcp_servers = [{{name = "own", command = "{sys.executable}", '
             f'args = ["{FIXTURE}"], env = {{ OWN = "1" }}}}]\n')
    model_server.script(call("own__echo", {"text": "cfg"}, "o1"), openai_reply({"content": "ok"}))
    async with await start_host(sdk_hosts, config_dir, model_server, tmp_path, "supervised",
                                extra) as host:
        await host.initialize()
        sid = await host.new_session(workspace)
        assert (await host.prompt(sid, "echo")).content == "ok"
        assert not host.client.permission_asks  # zeroclaw's allowlist, not the server's word
        [started] = host.client.of(sid, "tool_call")
        assert started.kind == "read"
    assert "echo: cfg" in tool_results(model_server, 1)[0]["content"]


# --- servers nobody here wrote -------------------------------------------------------------


def installed(variable: str) -> str:
    path = os.environ.get(variable)
    if not path:
        pytest.skip(os.environ.get(f"{variable}_SKIP") or f"{variable}: scripts/test installs it")
    return path


async def run_reference(sdk_hosts: SdkHostFactory, config_dir: Path, tmp_path: Path,
                        workspace: Path, model_server: ModelServer, server: McpServerStdio,
                        tool: str, arguments: dict[str, Any]) -> tuple[str, set[str]]:
    """One supervised call of ``tool``: the result the model got, and the tools it saw."""
    model_server.script(call(tool, arguments, "r1"), openai_reply({"content": "done"}))
    async with await start_host(sdk_hosts, config_dir, model_server, tmp_path,
                                "supervised") as host:
        await host.initialize()
        sid = (await host.conn.new_session(cwd=str(workspace),
                                           mcp_servers=[server])).session_id
        out = await host.prompt(sid, f"use {tool}")
        assert out.content.endswith("done"), out.content
        assert len(host.client.permission_asks) == 1
        await host.conn.close_session(session_id=sid)
        assert await wait_for(lambda: not server_procs(host, server.command))
    [result] = tool_results(model_server, 1)
    names = {t["function"]["name"] for t in model_server.requests[0].body["tools"]}
    return result["content"], names


async def test_the_reference_filesystem_server(
    sdk_hosts: SdkHostFactory, config_dir: Path, tmp_path: Path, workspace: Path,
    model_server: ModelServer,
) -> None:
    binary = installed("ZEROCLAW_MCP_FILESYSTEM")
    (workspace / "hello.txt").write_text("hello from the workspace")
    server = McpServerStdio(name="files", command=binary, args=[str(workspace)], env=[])
    text, names = await run_reference(sdk_hosts, config_dir, tmp_path, workspace, model_server,
                                      server, "files__read_text_file",
                                      {"path": str(workspace / "hello.txt")})
    assert "hello from the workspace" in text
    assert {"files__list_directory", "files__write_file"} <= names


async def test_the_reference_everything_server(
    sdk_hosts: SdkHostFactory, config_dir: Path, tmp_path: Path, workspace: Path,
    model_server: ModelServer,
) -> None:
    binary = installed("ZEROCLAW_MCP_EVERYTHING")
    server = McpServerStdio(name="every", command=binary, args=["stdio"], env=[])
    text, names = await run_reference(sdk_hosts, config_dir, tmp_path, workspace, model_server,
                                      server, "every__echo", {"message": "ping-everything"})
    assert "ping-everything" in text
    assert "every__echo" in names


async def test_the_reference_everything_server_killed_while_idle_starts_again(
    sdk_hosts: SdkHostFactory, config_dir: Path, tmp_path: Path, workspace: Path,
    model_server: ModelServer,
) -> None:
    binary = installed("ZEROCLAW_MCP_EVERYTHING")
    model_server.script(openai_reply({"content": "started"}),
                        call("every__echo", {"message": "after-kill"}, "k1"),
                        openai_reply({"content": "done"}))
    server = McpServerStdio(name="every", command=binary, args=["stdio"], env=[])
    async with await start_host(sdk_hosts, config_dir, model_server, tmp_path, "full") as host:
        await host.initialize()
        text, _, after = await kill_idle_then_call(host, workspace, server, "echo")
        assert text == "done" and after["state"] == "running"
    assert "after-kill" in tool_results(model_server, 2)[-1]["content"]


async def test_the_reference_git_server(
    sdk_hosts: SdkHostFactory, config_dir: Path, tmp_path: Path, workspace: Path,
    model_server: ModelServer,
) -> None:
    binary = installed("ZEROCLAW_MCP_GIT")
    subprocess.run(["git", "init", "-q", str(workspace)], check=True)
    (workspace / "tracked.txt").write_text("x")
    server = McpServerStdio(name="git", command=binary, args=["--repository", str(workspace)],
                            env=[])
    text, names = await run_reference(sdk_hosts, config_dir, tmp_path, workspace, model_server,
                                      server, "git__git_status", {"repo_path": str(workspace)})
    assert "tracked.txt" in text
    assert "git__git_log" in names


def listening(stderr: Any, port: int) -> None:
    """Read the server's stderr until it says it listens on ``port``."""
    for line in stderr:
        if str(port) in line:
            return
    raise AssertionError("the server ended before it listened")


@pytest.mark.parametrize(("transport", "path"), [("http", "/mcp"), ("sse", "/sse")])
async def test_the_reference_everything_server_over_http_and_sse(
    sdk_hosts: SdkHostFactory, config_dir: Path, tmp_path: Path, workspace: Path,
    model_server: ModelServer, transport: str, path: str,
) -> None:
    binary = installed("ZEROCLAW_MCP_EVERYTHING")
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    mode = "streamableHttp" if transport == "http" else "sse"
    server = subprocess.Popen([binary, mode], env={**os.environ, "PORT": str(port)},
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        assert server.stderr is not None
        await asyncio.wait_for(asyncio.to_thread(listening, server.stderr, port), 20)
        model_server.script(call("web__echo", {"message": f"over-{transport}"}, "h1"),
                            openai_reply({"content": "done"}))
        async with await start_host(sdk_hosts, config_dir, model_server, tmp_path,
                                    "supervised") as host:
            caps = (await host.initialize()).agent_capabilities
            assert caps is not None and caps.mcp_capabilities is not None
            assert caps.mcp_capabilities.http and caps.mcp_capabilities.sse
            entry = {"type": transport, "name": "web", "url": f"http://127.0.0.1:{port}{path}",
                     "headers": []}
            sid = (await host.raw("session/new", {"cwd": str(workspace),
                                                  "mcpServers": [entry]}))["sessionId"]
            out = await host.prompt(sid, "echo over the network")
            assert out.content == "done", out.content
            assert len(host.client.permission_asks) == 1
    finally:
        server.terminate()
        server.wait(10)
    [result] = tool_results(model_server, 1)
    assert f"over-{transport}" in result["content"]


async def test_a_cancelled_turn_withdraws_a_slow_call_and_a_hung_server_times_out(
    sdk_hosts: SdkHostFactory, config_dir: Path, tmp_path: Path, workspace: Path,
    model_server: ModelServer,
) -> None:
    model_server.script(call("fx__slow", {"seconds": 60}, "s1"),
                        call("fx__echo", {"text": "after"}, "s2"),
                        openai_reply({"content": "fine"}))
    async with await start_host(sdk_hosts, config_dir, model_server, tmp_path, "full",
                                "mcp_start_timeout_secs = 6\n") as host:  # fx: a loaded machine
        await host.initialize()
        sid = (await host.conn.new_session(cwd=str(workspace), mcp_servers=[
            fixture_server(), fixture_server("hung", "--hang-start")])).session_id
        prompt = asyncio.ensure_future(host.prompt(sid, "sleep"))
        await host.client.wait_until(lambda: any(
            u.status == "in_progress" for u in host.client.of(sid, "tool_call_update")),
            "the slow call to run", timeout=20)
        started = time.monotonic()
        await host.conn.cancel(session_id=sid)
        out = await asyncio.wait_for(prompt, 10)
        assert out.stop_reason == "cancelled" and time.monotonic() - started < 5
        assert "MCP server 'hung' could not start: no answer within 6 s" in out.content
        assert (await host.prompt(sid, "echo")).content == "fine"  # the server still serves
    assert "echo: after" in tool_results(model_server, 2)[-1]["content"]


async def test_without_a_sandbox_servers_are_refused_unless_the_shell_may_run_unconfined(
    sdk_hosts: SdkHostFactory, config_dir: Path, tmp_path: Path, workspace: Path,
    model_server: ModelServer,
) -> None:
    model_server.script(openai_reply({"content": "no tools"}))
    text = openai_config(model_server, tmp_path / "aws", level="full").replace(
        "[autonomy]\n", '[autonomy]\nsandbox = "none"\nallow_unsandboxed_shell = false\n')
    write_config(config_dir, text)
    async with sdk_hosts(env_extra={KEY_ENV: KEY}) as host:
        await host.initialize()
        sid = (await host.conn.new_session(cwd=str(workspace),
                                           mcp_servers=[fixture_server()])).session_id
        out = await host.prompt(sid, "hi")
        assert "MCP server 'fx' refused: no OS sandbox is available" in out.content
        assert not server_procs(host, str(FIXTURE))
    tools = {t["function"]["name"] for t in model_server.requests[0].body["tools"]}
    assert not any(name.startswith("fx__") for name in tools)


async def test_the_anthropic_agent_lists_and_calls_a_servers_tool_supervised(
    sdk_hosts: SdkHostFactory, config_dir: Path, tmp_path: Path, workspace: Path,
    model_server: ModelServer,
) -> None:
    from .model_streams import anthropic_reply, anthropic_text, anthropic_tool_use
    from .test_model_anthropic import KEY as ANTHROPIC_KEY
    from .test_model_anthropic import start as start_anthropic

    model_server.script(
        anthropic_reply(anthropic_tool_use(0, "toolu_01", "fx__echo", '{"text": "claude"}'),
                        stop_reason="tool_use"),
        anthropic_reply(anthropic_text(0, "Echoed.")))
    async with start_anthropic(sdk_hosts, config_dir, model_server, tmp_path / "aws") as host:
        await host.initialize()
        sid = (await host.conn.new_session(cwd=str(workspace),
                                           mcp_servers=[fixture_server()])).session_id
        await host.conn.set_session_mode(session_id=sid, mode_id="supervised")
        out = await host.prompt(sid, "echo claude")
        assert out.content == "Echoed."
        assert [a.tool_call.title for a in host.client.permission_asks] == ["fx: echo"]
        for proc in server_procs(host, str(FIXTURE)):
            assert ANTHROPIC_KEY.encode() not in Path(f"/proc/{proc.pid}/environ").read_bytes()
    first = model_server.requests[0].body
    schema = {t["name"]: t["input_schema"] for t in first["tools"]}["fx__echo"]
    assert schema["properties"]["text"]["type"] == "string"
    result = model_server.requests[1].body["messages"][-1]["content"][0]
    assert result["tool_use_id"] == "toolu_01" and "echo: claude" in str(result["content"])
