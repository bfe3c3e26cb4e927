"""A gateway tenant's own root, stable ids and ``sandbox_network``, against a real daemon
with ``--gateway``: a tenant without ``workspace_root`` is confined to
``<data_dir>/tenants/<id>/`` (made 0700) and cannot reach the owner's HOME or the host's
files with any cwd; load and resume keep the rule; a tenant removed and added again is
another tenant; ``sandbox_network = false`` takes the network from its commands."""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from actors.worker.sandbox import detect

from .gateway_helpers import GatewayDaemon, WsClient, gateway_config
from .helpers import RpcClient, RpcFailure, zeroclaw_argv

FULL = '[autonomy]\nlevel = "full"\n'  # no permission questions: the tools just run
needs_sandbox = pytest.mark.skipif(not detect("auto").confines, reason="no sandbox backend here")
needs_bwrap = pytest.mark.skipif(not detect("bwrap").confines,
                                 reason=f"bwrap: {detect('bwrap').reason}")


def refused(client: RpcClient, method: str, params: dict[str, Any]) -> tuple[int, str]:
    with pytest.raises(RpcFailure) as failure:
        client.request(method, params)
    return failure.value.code, failure.value.message


def tool(client: RpcClient, sid: str, name: str, args: dict[str, Any]) -> tuple[str, str]:
    """Run one tool with the echo agent's ``!tool``: its final status and output text."""
    client.notifications.clear()
    client.request("session/prompt",
                   {"sessionId": sid, "prompt": f"!tool {name} {json.dumps(args)}"})
    final = [u["update"] for u in client.updates()
             if u["update"].get("sessionUpdate") == "tool_call_update"
             and u["update"].get("status") in ("completed", "failed")]
    assert len(final) == 1, client.updates()
    text = "".join(part.get("content", {}).get("text", "")
                   for part in final[0].get("content") or [])
    return final[0]["status"], text


def owner_home(tmp_path: Path) -> Path:
    """The owner's HOME, outside the host's config and data dirs (which no session
    reaches anyway) as it usually is not: the default root alone must keep it safe."""
    home = tmp_path / "home"
    home.mkdir()
    (home / ".bashrc").write_text("the owner's\n")
    return home


@needs_sandbox
def test_a_tenant_without_a_workspace_root_cannot_leave_its_default_root(
        daemons: Any, scratch_dir: Path, tmp_path: Path) -> None:
    home = owner_home(tmp_path)
    gateway_config(scratch_dir, FULL)
    gateway = GatewayDaemon(daemons(scratch_dir, "--gateway", "127.0.0.1:0",
                                    env_extra={"HOME": str(home)}))
    data_dir = gateway.data_dir
    data_mode = stat.S_IMODE(data_dir.stat().st_mode)
    root = data_dir / "tenants" / "alice"
    with gateway.client("alice") as alice:
        made = alice.request("session/new", {})
        assert made["workspaceDir"] == str(root.resolve())
        for directory in (data_dir / "tenants", root):
            assert stat.S_IMODE(directory.stat().st_mode) == 0o700, directory
        assert stat.S_IMODE(data_dir.stat().st_mode) == data_mode  # not loosened, nor tightened
        (root / "to-home").symlink_to(home)
        (root / "project").mkdir()
        agent_workspace = scratch_dir / "agents" / "default" / "workspace"
        for cwd in (str(home), "/", str(scratch_dir), str(data_dir), str(agent_workspace),
                    "project", ".." , str(root / "project" / ".." / ".."),
                    str(root / "to-home")):
            code, message = refused(alice, "session/new", {"cwd": cwd})
            assert code == -32602 and "workspace root" in message, (cwd, message)
        sid = made["sessionId"]
        for path in ("~/.bashrc", str(home / ".bashrc"), "to-home/.bashrc",
                     str(scratch_dir / "config.toml")):
            status, said = tool(alice, sid, "file_write", {"path": path, "content": "pwned"})
            assert status == "failed", (path, said)
        status, said = tool(alice, sid, "shell", {
            "command": "echo pwned >> ~/.bashrc; echo pwned >> to-home/.bashrc; "
                       "echo mine > mine.txt"})
        assert status == "completed" and said.count("cannot create") == 2, said
        # The agent's workspace lies in the host's config dir here: refused before it runs.
        status, said = tool(alice, sid, "shell", {"command": f"echo x > {agent_workspace}/p"})
        assert status == "failed" and "host's own directory" in said, said
        inside = alice.request("session/new", {"cwd": str(root / "project")})
        assert inside["workspaceDir"] == str(root.resolve())
        status, said = tool(alice, inside["sessionId"], "file_write",
                            {"path": "../beside.txt", "content": "still hers"})
        assert status == "completed", said
    assert (home / ".bashrc").read_text() == "the owner's\n"
    assert not (agent_workspace / "p").exists()
    assert (root / "mine.txt").read_text() == "mine\n"
    assert (root / "beside.txt").read_text() == "still hers"


def test_load_and_resume_keep_the_tenants_root(daemons: Any, scratch_dir: Path,
                                              tmp_path: Path) -> None:
    """A session whose cwd left the root since it was stored (a directory of the root
    replaced by a symlink to the owner's HOME) opens at the root; a load's cwd outside
    the root is refused."""
    home = owner_home(tmp_path)
    gateway_config(scratch_dir, FULL)
    gateway = GatewayDaemon(daemons(scratch_dir, "--gateway", "127.0.0.1:0",
                                    env_extra={"HOME": str(home)}))
    root = gateway.root("alice")
    (root / "sub").mkdir()
    with gateway.client("alice") as alice:
        sid = alice.request("session/new", {"cwd": str(root / "sub")})["sessionId"]
        alice.request("session/close", {"sessionId": sid})
        (root / "sub").rmdir()
        (root / "sub").symlink_to(home)
        for method in ("session/load", "session/resume"):
            assert refused(alice, method, {"sessionId": sid, "cwd": str(home)})[0] == -32602
        alice.request("session/load", {"sessionId": sid, "cwd": str(root)})
        status, said = tool(alice, sid, "file_write", {"path": "planted.txt", "content": "x"})
        assert status == "completed", said
        alice.request("session/close", {"sessionId": sid})
        alice.request("session/resume", {"sessionId": sid})
        status, said = tool(alice, sid, "file_write", {"path": "sub/.bashrc", "content": "x"})
        assert status == "failed", said
    assert (root.resolve() / "planted.txt").read_text() == "x"
    assert not (home / "planted.txt").exists()
    assert (home / ".bashrc").read_text() == "the owner's\n"


def tenant_cli(gateway: GatewayDaemon, *args: str) -> subprocess.CompletedProcess[str]:
    daemon = gateway.daemon
    done = subprocess.run(zeroclaw_argv("tenant", "--config-dir", str(daemon.config_dir), *args),
                          capture_output=True, text=True, timeout=30, env=daemon.env)
    assert done.returncode == 0, done.stderr
    return done


def test_a_tenant_removed_and_added_again_is_another_tenant(
        daemons: Any, scratch_dir: Path) -> None:
    gateway_config(scratch_dir)
    gateway = GatewayDaemon(daemons(scratch_dir, "--gateway", "127.0.0.1:0"))
    url = f"{gateway.ws}/acp"
    token = tenant_cli(gateway, "add", "carol").stdout.strip()
    first_id = json.loads(tenant_cli(gateway, "list", "--json").stdout)[-1]["id"]
    with WsClient(url, token=token) as carol:
        made = carol.request("session/new", {})
        sid = made["sessionId"]
        carol.request("session/prompt", {"sessionId": sid, "prompt": "carol's first"})
        (Path(made["workspaceDir"]) / "old.txt").write_text("the first carol's")
    assert Path(made["workspaceDir"]).name == first_id
    tenant_cli(gateway, "remove", "carol")
    token = tenant_cli(gateway, "add", "carol").stdout.strip()
    second_id = json.loads(tenant_cli(gateway, "list", "--json").stdout)[-1]["id"]
    assert second_id != first_id
    assert first_id in (scratch_dir / "config.toml").read_text()  # retired, not forgotten
    with WsClient(url, token=token) as carol:
        assert carol.request("session/list", {}) == {"sessions": []}
        for method in ("session/load", "session/resume"):
            assert refused(carol, method, {"sessionId": sid})[0] == -32000
        root = Path(carol.request("session/new", {})["workspaceDir"])
        assert root.name == second_id and not (root / "old.txt").exists()
    with RpcClient(gateway.data_dir / "acp.sock") as owner:  # the owner still has it
        listed = {s["sessionId"] for s in owner.request("session/list", {})["sessions"]}
    assert sid in listed


def test_tenants_of_an_earlier_release_keep_their_stored_sessions(
        daemons: Any, scratch_dir: Path) -> None:
    """Tenants written without ``id``: their id is their name, so the sessions stored
    for them (``meta.tenant`` = the name, as earlier releases stored it) stay theirs
    across a restart; another tenant still does not see them."""
    gateway_config(scratch_dir)
    assert "id =" not in (scratch_dir / "config.toml").read_text()
    daemon = daemons(scratch_dir, "--gateway", "127.0.0.1:0")
    with GatewayDaemon(daemon).client("alice") as alice:
        sid = alice.request("session/new", {})["sessionId"]
        alice.request("session/prompt", {"sessionId": sid, "prompt": "kept across"})
    assert daemon.terminate() == 0
    gateway = GatewayDaemon(daemons(scratch_dir, "--gateway", "127.0.0.1:0"))
    with gateway.client("alice") as alice, gateway.client("bob") as bob:
        listed = alice.request("session/list", {})["sessions"]
        assert [s["sessionId"] for s in listed] == [sid]
        alice.request("session/load", {"sessionId": sid})
        replayed = [u["update"]["content"]["text"] for u in alice.updates()
                    if u["update"].get("sessionUpdate") == "user_message_chunk"]
        assert replayed == ["kept across"]
        assert bob.request("session/list", {}) == {"sessions": []}
    with RpcClient(gateway.data_dir / "acp.sock") as owner:
        stored = owner.request("session/list", {})["sessions"]
    assert [s["sessionId"] for s in stored] == [sid]


# --- sandbox_network ------------------------------------------------------------------


@pytest.fixture
def listener() -> Iterator[tuple[int, list[bytes]]]:
    """A TCP server on the host's 127.0.0.1: its port, and what each connection sent."""
    server = socket.create_server(("127.0.0.1", 0))
    received: list[bytes] = []

    def serve() -> None:
        while True:
            try:
                connection, _ = server.accept()
            except OSError:
                return
            with connection:
                connection.settimeout(5)
                received.append(connection.recv(100))

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield server.getsockname()[1], received
    server.close()
    thread.join(5)


def dial(port: int, word: str) -> dict[str, str]:
    return {"command": f"python3 -c \"import socket; s = socket.create_connection(('127.0.0.1',"
                       f" {port}), 5); s.sendall(b'{word}'); s.close(); print('CONNECTED')\""}


@needs_bwrap
def test_sandbox_network_false_leaves_a_tenants_commands_only_their_own_loopback(
        daemons: Any, scratch_dir: Path, listener: tuple[int, list[bytes]]) -> None:
    port, received = listener
    gateway_config(scratch_dir, FULL + '[agents.offline]\nprovider = "echo"\n'
                   'sandbox_network = false\n[agents.default]\nprovider = "echo"\n'
                   '[acp]\ndefault_agent = "default"\n', alice="sandbox_network = false")
    gateway = GatewayDaemon(daemons(scratch_dir, "--gateway", "127.0.0.1:0"))
    with gateway.client("alice") as alice, gateway.client("bob") as bob:
        alice_sid = alice.request("session/new", {})["sessionId"]
        status, said = tool(alice, alice_sid, "shell", dial(port, "alice"))
        assert status == "failed" and "CONNECTED" not in said, said
        status, said = tool(alice, alice_sid, "shell", {
            "command": "python3 -c \"import socket; s = socket.create_server(('127.0.0.1', 0));"
                       " socket.create_connection(s.getsockname()); print('LOOPBACK')\""})
        assert status == "completed" and "LOOPBACK" in said, said  # its own loopback works
        offline = bob.request("session/new", {"agentAlias": "offline"})["sessionId"]
        status, said = tool(bob, offline, "shell", dial(port, "offline"))
        assert status == "failed" and "CONNECTED" not in said, said
        bob_sid = bob.request("session/new", {})["sessionId"]
        status, said = tool(bob, bob_sid, "shell", dial(port, "bob"))
        assert status == "completed" and "CONNECTED" in said, said
    assert received == [b"bob"]


def test_sandbox_network_false_is_refused_where_no_sandbox_can_take_the_network(
        daemons: Any, scratch_dir: Path) -> None:
    """Only bubblewrap gives commands a network namespace: with Landlock (or none) such a
    session is refused, naming why; the others are served."""
    backend = "landlock" if detect("landlock").confines else "none"
    gateway_config(scratch_dir, f'[autonomy]\nsandbox = "{backend}"\n'
                   "allow_unsandboxed_shell = true\n", alice="sandbox_network = false")
    gateway = GatewayDaemon(daemons(scratch_dir, "--gateway", "127.0.0.1:0"))
    with gateway.client("alice") as alice, gateway.client("bob") as bob:
        code, message = refused(alice, "session/new", {})
        assert code == -32602, message
        assert "tenants.alice.sandbox_network = false needs the bubblewrap sandbox" in message
        assert backend in message
        bob.request("session/new", {})


def test_tenant_add_no_network_writes_the_option(scratch_dir: Path) -> None:
    done = subprocess.run(zeroclaw_argv("tenant", "--config-dir", str(scratch_dir), "add",
                                        "dave", "--no-network"),
                          capture_output=True, text=True, timeout=30, env=dict(os.environ))
    assert done.returncode == 0, done.stderr
    assert "sandbox_network = false" in (scratch_dir / "config.toml").read_text()
