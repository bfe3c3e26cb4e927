"""A gateway tenant's hosted ACP agent process, attacked from inside as a prompt-injected
agent would: the agent itself and the commands it runs (its own children) try to read
zeroclaw's config file (tenants' token hashes, agents' env) and store, connect to
``daemon.sock`` and ``acp.sock`` (owner access to every session), and write outside
the tenant's workspace root. Each backend the machine has (bubblewrap, Landlock) is
forced in turn with ``[autonomy] sandbox``; ``status`` names it next to the process.
Without a backend a tenant's session on such an agent is refused, the owner's runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from actors.worker.sandbox import detect
from tests.e2e.test_acp_hosting import _toml_list, fixture_command

from .gateway_helpers import GatewayDaemon, gateway_config
from .helpers import DaemonProc, RpcClient, RpcFailure
from .test_acp_hosted_daemon import agent_entries
from .test_acp_relay_daemon import _said_over

BACKENDS = [pytest.param(name, marks=pytest.mark.skipif(
    not detect(name).confines, reason=f"{name}: {detect(name).reason}")) for name in
    ("bwrap", "landlock")]


def _hosted(scratch_dir: Path, sandbox: str, agent_extra: str = "") -> Path:
    """config.toml: the fixture agent as the default, the tenants, alice with a
    workspace root; returns that root."""
    root = scratch_dir / "roots" / "alice"
    gateway_config(scratch_dir, f"""
[acp]
default_agent = "hosted"
[autonomy]
sandbox = "{sandbox}"
[agents.hosted]
provider = "acp"
command = {_toml_list(fixture_command())}
{agent_extra}
[workers]
max = 1
""", alice=f'workspace_root = "{root}"')
    return root


def _agent_sandbox(daemon: DaemonProc) -> str:
    """The ``sandbox`` of the one agent process in ``status`` (it holds one session)."""
    return str(agent_entries(daemon, 1)[1]["sandbox"])


def _runs(alice: Any, sid: str, command: str) -> str:
    return _said_over(alice, sid, f"run {command}")


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_tenants_agent_cannot_reach_the_hosts_files_and_sockets(
        daemons: Any, scratch_dir: Path, backend: str) -> None:
    root = _hosted(scratch_dir, backend)
    daemon = daemons(scratch_dir, "--gateway", "127.0.0.1:0")
    gateway = GatewayDaemon(daemon)
    config = scratch_dir / "config.toml"
    store = daemon.socket_path.parent / "sessions" / "acp-sessions.db"
    sockets = (daemon.socket_path, daemon.socket_path.parent / "acp.sock")
    assert store.exists() and all(s.exists() for s in sockets)
    outside = scratch_dir / "outside.txt"
    with gateway.client("alice") as alice:
        sid = alice.request("session/new", {})["sessionId"]
        assert _said_over(alice, sid, f"peek {config}").startswith("peek failed")
        assert _said_over(alice, sid, f"peek {store}").startswith("peek failed")
        for path in sockets:
            assert _said_over(alice, sid, f"dial {path}").startswith("dial failed")
        assert _said_over(alice, sid, f"put {outside} agent").startswith("put failed")
        assert _said_over(alice, sid, f"put {root}/agent.txt agent") == "put"
        said = _runs(alice, sid, f"cat {config}; cat {store}; echo child > {outside}")
        assert "token_sha256" not in said and "SQLite" not in said, said
        said = _runs(alice, sid, "python3 -c \"import socket; socket.socket(socket.AF_UNIX)"
                                 f".connect('{sockets[0]}')\" && echo CONNECTED")
        assert "CONNECTED" not in said, said
        said = _runs(alice, sid, f"echo child > {root}/child.txt && echo kept > $HOME/state")
        assert said.startswith("exit=0"), said
        assert _agent_sandbox(daemon) == backend
    assert not outside.exists()
    assert (root / "agent.txt").read_text() == "agent"
    assert (root / "child.txt").read_text() == "child\n"
    home = daemon.socket_path.parent / "agent-homes" / "alice" / "hosted"
    assert (home / "state").read_text() == "kept\n"  # its own state dir, as HOME


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_owners_agent_with_sandbox_auto_writes_only_home_workspace_and_cwd(
        daemons: Any, scratch_dir: Path, backend: str) -> None:
    _hosted(scratch_dir, backend, 'sandbox = "auto"')
    home, project = scratch_dir / "home", scratch_dir / "project"
    for directory in (home / "state", project):
        directory.mkdir(parents=True)
    daemon = daemons(scratch_dir, env_extra={"HOME": str(home)})
    config, outside = scratch_dir / "config.toml", scratch_dir / "outside.txt"
    with RpcClient(daemon.socket_path.parent / "acp.sock") as owner:
        sid = owner.request("session/new", {"cwd": str(project)})["sessionId"]
        assert _said_over(owner, sid, f"peek {config}").startswith("peek failed")
        assert _said_over(owner, sid, f"dial {daemon.socket_path}").startswith("dial failed")
        said = _runs(owner, sid, f"echo a > {project}/a.txt && echo b > $HOME/state/b.txt"
                                 f" && echo c > {outside}")
        assert not said.startswith("exit=0"), said
        assert _agent_sandbox(daemon) == backend
    assert (project / "a.txt").read_text() == "a\n"
    assert (home / "state" / "b.txt").read_text() == "b\n"
    assert not outside.exists()


def test_without_a_sandbox_tenants_are_refused_and_the_owner_is_served(
        daemons: Any, scratch_dir: Path) -> None:
    _hosted(scratch_dir, "none", 'sandbox = "auto"')
    daemon = daemons(scratch_dir, "--gateway", "127.0.0.1:0")
    gateway = GatewayDaemon(daemon)
    with gateway.client("alice") as alice:
        with pytest.raises(RpcFailure) as refused:
            alice.request("session/new", {})
        assert refused.value.code == -32602
        assert "never runs unconfined" in refused.value.message
    (scratch_dir / "project").mkdir()
    with daemon.client() as owner:
        sid = owner.request("session/new", {"cwd": str(scratch_dir / "project")})["sessionId"]
        result = owner.request("session/prompt", {
            "sessionId": sid, "prompt": [{"type": "text", "text": "hello"}]})
        assert result["stopReason"] == "end_turn", result
        assert _agent_sandbox(daemon) == "none"
    assert "runs unconfined: no sandbox here" in daemon.stderr()


def test_no_setting_runs_a_tenants_agent_unconfined(daemons: Any, scratch_dir: Path) -> None:
    """``allow_unconfined_tenants = true`` once did; a tenant's agent could then read
    the host's own files with its own rights."""
    _hosted(scratch_dir, "none", "allow_unconfined_tenants = true")
    gateway = GatewayDaemon(daemons(scratch_dir, "--gateway", "127.0.0.1:0"))
    with gateway.client("alice") as alice:
        with pytest.raises(RpcFailure) as refused:
            alice.request("session/new", {})
        assert refused.value.code == -32602
        assert "never runs unconfined" in refused.value.message


@pytest.mark.skipif(not detect("auto").confines, reason="no sandbox backend here")
def test_a_stored_tenant_session_is_refused_its_agent_once_no_sandbox_is_left(
        daemons: Any, scratch_dir: Path) -> None:
    """The host checks at session/new; a session stored before (when a backend was
    there) meets the worker's own check at its next prompt."""
    root = _hosted(scratch_dir, "auto")
    daemon = daemons(scratch_dir, "--gateway", "127.0.0.1:0")
    with GatewayDaemon(daemon).client("alice") as alice:
        sid = alice.request("session/new", {})["sessionId"]
        assert _said_over(alice, sid, "hello") == "hello"
    assert daemon.terminate() == 0
    _hosted(scratch_dir, "none")
    gateway = GatewayDaemon(daemons(scratch_dir, "--gateway", "127.0.0.1:0"))
    with gateway.client("alice") as alice:
        alice.request("session/load", {"sessionId": sid, "cwd": str(root), "mcpServers": []})
        with pytest.raises(RpcFailure) as refused:
            _said_over(alice, sid, "hello again")
        assert refused.value.code == -32603
        assert "never runs unconfined" in refused.value.message


@pytest.mark.skipif(not detect("auto").confines, reason="no sandbox backend here")
def test_a_tenant_without_a_workspace_root_gets_its_default_root_as_the_jail(
        daemons: Any, scratch_dir: Path) -> None:
    """bob has no workspace root: his processes write only ``<data_dir>/tenants/bob``,
    whatever the session's cwd inside it (one process for them all), and a cwd outside
    it is refused."""
    _hosted(scratch_dir, "auto")
    daemon = daemons(scratch_dir, "--gateway", "127.0.0.1:0")
    gateway = GatewayDaemon(daemon)
    root = gateway.root("bob")
    (root / "one").mkdir()
    outside = scratch_dir / "bob-outside"
    outside.mkdir()
    with gateway.client("bob") as bob:
        with pytest.raises(RpcFailure) as refused:
            bob.request("session/new", {"cwd": str(outside)})
        assert refused.value.code == -32602
        first = bob.request("session/new", {})["sessionId"]
        second = bob.request("session/new", {"cwd": str(root / "one")})["sessionId"]
        idents = [_said_over(bob, sid, "ident") for sid in (first, second)]
        assert idents[0] == idents[1]
        assert _said_over(bob, second, f"put {root}/from-one.txt x") == "put"
        assert _said_over(bob, first, f"put {outside}/x.txt x").startswith("put failed")
        said = _runs(bob, second, f"echo child > {root}/child.txt; echo no > {outside}/y.txt")
        assert not said.startswith("exit=0"), said
    assert (root / "from-one.txt").read_text() == "x"
    assert (root / "child.txt").read_text() == "child\n"
    assert list(outside.iterdir()) == []


@pytest.mark.skipif(not detect("bwrap").confines, reason="bwrap: no usable bubblewrap")
def test_a_tenants_agent_process_without_network_has_only_its_loopback(
        daemons: Any, scratch_dir: Path) -> None:
    import socket

    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    _hosted(scratch_dir, "bwrap")
    text = (scratch_dir / "config.toml").read_text()
    (scratch_dir / "config.toml").write_text(text.replace(
        "[tenants.bob]", "[tenants.bob]\nsandbox_network = false"))
    gateway = GatewayDaemon(daemons(scratch_dir, "--gateway", "127.0.0.1:0"))
    dial = (f"python3 -c \"import socket; socket.create_connection(('127.0.0.1', {port}), 5)\""
            " && echo CONNECTED")
    try:
        with gateway.client("bob") as bob, gateway.client("alice") as alice:
            bob_sid = bob.request("session/new", {})["sessionId"]
            assert "CONNECTED" not in _runs(bob, bob_sid, dial)
            alice_sid = alice.request("session/new", {})["sessionId"]
            assert "CONNECTED" in _runs(alice, alice_sid, dial)
    finally:
        server.close()
