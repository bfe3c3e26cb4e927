"""A gateway tenant's session of zeroclaw's model agent with an MCP server it sends: the
server runs confined to the tenant's root, and neither the model's API key nor any
tenant's token reaches its environment (a daemon with ``--gateway``, a WebSocket client,
the fake model server scripting the calls, the fixture server of the MCP tests).

And the tenant attack on the host's own files (issue 21) through MCP servers: the
reference filesystem server, pointed by the tenant at the host's config and data dirs,
never reads the config, the store or its ``-wal``, nor writes the config, in any mode,
with or without a workspace root; nor does the fixture server's write tool."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.e2e.model_server import ModelServer
from tests.e2e.model_streams import openai_reply

from .gateway_helpers import TOKENS, GatewayDaemon, gateway_config
from .test_host_paths import MODES, SECRET, Targets, _turn, needs_sandbox

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "mcp_fault_server.py"
KEY_ENV = "ZC_TEST_GATEWAY_MODEL_KEY"
KEY = "zc-test-gateway-model-key-" + "5" * 16


@pytest.fixture
def model_server() -> Iterator[ModelServer]:
    server = ModelServer()
    yield server
    server.close()


def call(name: str, arguments: dict[str, Any], call_id: str) -> Any:
    return openai_reply({"tool_calls": [{"index": 0, "id": call_id, "type": "function",
                                         "function": {"name": name,
                                                      "arguments": json.dumps(arguments)}}]},
                        finish="tool_calls")


def test_a_tenants_server_is_confined_to_its_root_and_sees_no_secret(
        daemons: Any, scratch_dir: Path, model_server: ModelServer) -> None:
    outside = scratch_dir / "outside"
    outside.mkdir()
    gateway_config(scratch_dir, (
        f'[agents.main]\nprovider = "openai"\nbase_url = "{model_server.url}/v1"\n'
        f'model = "gpt-test"\napi_key_env = "{KEY_ENV}"\n'
        f'workspace = "{scratch_dir / "aws"}"\n[autonomy]\nlevel = "full"\n'))
    gateway = GatewayDaemon(daemons(scratch_dir, "--gateway", "127.0.0.1:0",
                                    env_extra={KEY_ENV: KEY}))
    model_server.script(
        call("fx__env", {}, "g1"), openai_reply({"content": "env seen"}),
        call("fx__write_here", {"name": str(outside / "escaped.txt"), "text": "x"}, "g2"),
        call("fx__write_here", {"name": "inside.txt", "text": "y"}, "g3"),
        openai_reply({"content": "writes tried"}))
    root = gateway.root("alice")
    server = {"name": "fx", "command": sys.executable, "args": [str(FIXTURE)], "env": []}
    with gateway.client("alice") as alice:
        sid = alice.request("session/new", {"cwd": str(root),
                                            "mcpServers": [server]})["sessionId"]
        assert alice.request("session/prompt", {"sessionId": sid, "prompt": "env"},
                             timeout=60)["content"] == "env seen"
        environs = _server_environs(gateway.daemon.proc.pid)
        assert environs, "the tenant's MCP server runs while its session is open"
        for environ in environs:
            assert KEY.encode() not in environ and f"{KEY_ENV}=".encode() not in environ
            assert not any(token.encode() in environ for token in TOKENS.values())
        assert alice.request("session/prompt", {"sessionId": sid, "prompt": "write"},
                             timeout=60)["content"] == "writes tried"
    env_result = _tool_results(model_server, 1)[-1]["content"]
    assert "names=" in env_result and KEY_ENV not in env_result
    for token in TOKENS.values():
        assert token not in env_result
    escaped, inside = _tool_results(model_server, 4)[-2:]
    assert not (outside / "escaped.txt").exists(), escaped["content"]
    assert (root / "inside.txt").read_text() == "y", inside["content"]


def _attack_config(scratch_dir: Path, model_server: ModelServer, mode: str) -> Path:
    """The model agent as the default (the echo agent for ops' secret), ``mode``; alice
    has a workspace root (returned), bob his default one."""
    root = scratch_dir / "roots" / "alice"
    gateway_config(scratch_dir, (
        f'[acp]\ndefault_agent = "main"\n'
        f'[agents.main]\nprovider = "openai"\nbase_url = "{model_server.url}/v1"\n'
        f'model = "gpt-test"\napi_key_env = "{KEY_ENV}"\n'
        f'workspace = "{scratch_dir / "aws"}"\n[agents.echo]\nprovider = "echo"\n'
        f'[autonomy]\nlevel = "{mode}"\n'), alice=f'workspace_root = "{root}"')
    return root


def _attack_calls(targets: Targets, root: Path) -> list[tuple[str, dict[str, Any]]]:
    """What the model asks of the two servers: a control read in the tenant's root, then
    reads, a listing, a search and writes of the host's files."""
    evil = "[tenants.alice]\nadmin = true\n"  # the hashes are what a read must not show
    calls: list[tuple[str, dict[str, Any]]] = [
        ("mine__read_text_file", {"path": str(root / "control.txt")})]
    calls += [("fs__read_text_file", {"path": path}) for path in targets.reads]
    calls += [("fs__read_multiple_files", {"paths": [str(targets.config), str(targets.wal)]}),
              ("fs__list_directory", {"path": str(targets.config_dir)}),
              ("fs__search_files", {"path": str(targets.data), "pattern": "acp-sessions"}),
              ("fs__write_file", {"path": str(targets.config), "content": evil}),
              ("fx__write_here", {"name": str(targets.config), "text": evil})]
    return calls


@needs_sandbox
@pytest.mark.parametrize("mode", MODES)
def test_a_tenants_mcp_servers_cannot_reach_the_hosts_files(
        daemons: Any, scratch_dir: Path, model_server: ModelServer, mode: str) -> None:
    binary = os.environ.get("ZEROCLAW_MCP_FILESYSTEM")
    if not binary:
        pytest.skip("ZEROCLAW_MCP_FILESYSTEM: scripts/test installs it")
    root = _attack_config(scratch_dir, model_server, mode)
    gateway = GatewayDaemon(daemons(scratch_dir, "--gateway", "127.0.0.1:0",
                                    env_extra={KEY_ENV: KEY}))
    targets = Targets(gateway.daemon)
    with gateway.client("ops", query="?agent=echo") as ops:
        _turn(ops, ops.request("session/new", {"mcpServers": []})["sessionId"], SECRET)
    for tenant, tenant_root in (("alice", root), ("bob", gateway.root("bob"))):
        tenant_root.mkdir(parents=True, exist_ok=True)
        (tenant_root / "control.txt").write_text("control-read-works")
        servers = [{"name": "mine", "command": binary, "args": [str(tenant_root)], "env": []},
                   {"name": "fs", "command": binary,
                    "args": [str(targets.config_dir), str(targets.data)], "env": []},
                   {"name": "fx", "command": sys.executable, "args": [str(FIXTURE)],
                    "env": []}]
        calls = _attack_calls(targets, tenant_root)
        first = len(model_server.requests)
        for number, (name, arguments) in enumerate(calls):
            model_server.script(call(name, arguments, f"{tenant}{number}"),
                                openai_reply({"content": "done"}))
        with gateway.client(tenant) as client:
            sid = client.request("session/new", {"cwd": str(tenant_root),
                                                 "mcpServers": servers})["sessionId"]
            seen = [_turn(client, sid, f"call {name}") for name, _ in calls]
        results = [json.dumps(_tool_results(model_server, first + 2 * n + 1)[-1])
                   for n in range(len(calls))]
        if mode != "read_only":
            assert "control-read-works" in results[0], results[0]
        for shown, told, (name, arguments) in zip(seen, results, calls, strict=True):
            assert not targets.leaked(shown) and not targets.leaked(told), (name, arguments)
        targets.check_untouched()


def _server_environs(daemon_pid: int) -> list[bytes]:
    """The environments of the daemon's descendants that run the fixture server."""
    found = []
    for proc in psutil.Process(daemon_pid).children(recursive=True):
        try:
            if any(str(FIXTURE) in part for part in proc.cmdline()):
                found.append(Path(f"/proc/{proc.pid}/environ").read_bytes())
        except (psutil.Error, OSError):
            continue
    return found


def _tool_results(server: ModelServer, index: int) -> list[dict[str, Any]]:
    return [m for m in server.requests[index].body["messages"] if m["role"] == "tool"]
