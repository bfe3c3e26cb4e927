"""``zeroclaw tenant add|remove`` take effect in a running daemon: a revoked token's open
``/acp`` connections are closed, new tokens work without a restart."""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path
from typing import Any

import pytest
from websockets.exceptions import InvalidStatus

from .gateway_helpers import TOKENS, GatewayDaemon, WsClient, gateway_config
from .helpers import RpcClient, RpcFailure, zeroclaw_argv


@pytest.fixture
def gateway(daemons: Any, scratch_dir: Path) -> GatewayDaemon:
    gateway_config(scratch_dir, "", bob="max_sessions = 5")
    return GatewayDaemon(daemons(scratch_dir, "--gateway", "127.0.0.1:0"))


def tenant(gateway: GatewayDaemon, *args: str) -> subprocess.CompletedProcess[str]:
    daemon = gateway.daemon
    return subprocess.run(zeroclaw_argv("tenant", "--config-dir", str(daemon.config_dir), *args),
                          capture_output=True, text=True, timeout=30, env=daemon.env)


def refused_status(url: str, token: str) -> int:
    with pytest.raises(InvalidStatus) as refused:
        WsClient(url, token=token)
    return refused.value.response.status_code


def test_a_removed_tenants_connections_are_closed_and_its_token_refused(
        gateway: GatewayDaemon) -> None:
    cwd = str(gateway.root("bob"))
    with gateway.client("bob") as bob, gateway.client("alice") as alice:
        sid = bob.request("session/new", {"cwd": cwd})["sessionId"]
        bob.request("session/prompt", {"sessionId": sid, "prompt": "a completed turn"})
        running = bob.send("session/prompt", {"sessionId": sid, "prompt": "under way\n!sleep 30"})
        while bob.read_frame().get("params", {}).get("update", {}).get(
                "sessionUpdate") != "agent_message_chunk":
            pass  # until the turn is under way
        kept = alice.request("session/new", {})["sessionId"]

        removed = tenant(gateway, "remove", "bob")
        assert removed.returncode == 0, removed.stderr
        assert "reloaded its tenants (1 gateway connection(s) closed)" in removed.stderr

        with pytest.raises(ConnectionError):
            bob.wait_response(running)
        assert (bob.ws.close_code, bob.ws.close_reason) == (1008, "token revoked")
        assert refused_status(f"{gateway.ws}/acp", TOKENS["bob"]) == 401
        result = alice.request("session/prompt", {"sessionId": kept, "prompt": "still here"})
        assert result["content"] == "still here"
    with RpcClient(gateway.daemon.socket_path.parent / "acp.sock") as owner:
        owner.request("session/load", {"sessionId": sid, "cwd": cwd})  # the owner sees all
        replayed = [u["update"]["content"]["text"] for u in owner.updates()
                    if u["update"].get("sessionUpdate") == "user_message_chunk"]
    assert replayed == ["a completed turn", "under way\n!sleep 30"]  # the cut turn: kept
    assert TOKENS["bob"] not in gateway.daemon.stderr()


def test_a_tenant_added_while_the_daemon_runs_works_at_once(gateway: GatewayDaemon) -> None:
    with gateway.client("alice") as alice:
        added = tenant(gateway, "add", "carol")
        assert added.returncode == 0, added.stderr
        token = added.stdout.strip()
        with WsClient(f"{gateway.ws}/acp", token=token) as carol:
            assert carol.request("session/list", {}) == {"sessions": []}
        assert alice.request("session/list", {}) == {"sessions": []}  # untouched
        assert token not in gateway.daemon.stderr()
        tenant(gateway, "remove", "carol")
        added_again = tenant(gateway, "add", "carol")  # the same name, a new token
        assert refused_status(f"{gateway.ws}/acp", token) == 401
        with WsClient(f"{gateway.ws}/acp", token=added_again.stdout.strip()) as carol:
            assert carol.request("session/list", {}) == {"sessions": []}


def test_reload_is_refused_for_a_broken_config_and_keeps_the_tenants(
        gateway: GatewayDaemon) -> None:
    config = gateway.daemon.config_dir / "config.toml"
    config.write_text(config.read_text() + "\n[tenants.eve]\ntoken_sha256 = 'short'\n")
    with gateway.daemon.client() as rpc, pytest.raises(RpcFailure) as refused:
        rpc.request("tenants/reload", {})
    assert refused.value.code == -32602 and "token_sha256" in refused.value.message
    with gateway.client("bob") as bob:
        assert bob.request("session/list", {}) == {"sessions": []}


def test_a_replaced_token_closes_the_connections_made_with_the_old_one(
        gateway: GatewayDaemon) -> None:
    config = gateway.daemon.config_dir / "config.toml"
    new_token = "alice-new-token-0123456789"
    old_hash, new_hash = (hashlib.sha256(t.encode()).hexdigest()
                          for t in (TOKENS["alice"], new_token))
    with gateway.client("alice") as alice, gateway.client("bob") as bob:
        config.write_text(config.read_text().replace(old_hash, new_hash))
        with gateway.daemon.client() as rpc:
            assert rpc.request("tenants/reload", {}) == {"tenants": 3, "revokedConnections": 1}
        with pytest.raises(ConnectionError):
            alice.read_frame()
        assert alice.ws.close_code == 1008
        assert bob.request("session/list", {}) == {"sessions": []}
    assert refused_status(f"{gateway.ws}/acp", TOKENS["alice"]) == 401
    with WsClient(f"{gateway.ws}/acp", token=new_token) as renewed:
        assert renewed.request("session/list", {}) == {"sessions": []}
