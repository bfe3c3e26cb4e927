"""The host's own files, attacked over the real gateway ``/acp`` as a tenant would: read
``config.toml`` (every tenant's token hash), read the store and its ``-wal`` (other
tenants' conversations), write ``config.toml`` (to make itself admin). Every way in is
tried, in every mode, with and without a workspace root: zeroclaw's file tools, its
shell, a hosted ACP agent's ``fs/*`` and ``terminal/*`` requests and the agent's own
child process (as an MCP server it starts would be). Symlinks, hard links and
``/proc/self/root`` paths are refused too, and the owner's sessions get the same.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from actors.worker.sandbox import detect
from tests.e2e.test_acp_hosting import _toml_list, fixture_command

from .gateway_helpers import GatewayDaemon, gateway_config
from .helpers import FRAME_TIMEOUT, DaemonProc, RpcClient, RpcFailure

MODES = ("read_only", "supervised", "full")
#: Said by the admin tenant before the attack: it must never reach another tenant.
SECRET = "ops-private-conversation-7f3a"
needs_sandbox = pytest.mark.skipif(not detect("auto").confines, reason="no sandbox backend here")


def _configure(scratch_dir: Path, mode: str) -> Path:
    """The echo agent as the default, the fixture ACP agent as ``hosted``; alice has a
    workspace root (returned), bob none (his default root, inside the host's data dir)."""
    root = scratch_dir / "roots" / "alice"
    gateway_config(scratch_dir, f"""
[acp]
default_agent = "echo"
[autonomy]
level = "{mode}"
[agents.echo]
provider = "echo"
[agents.hosted]
provider = "acp"
command = {_toml_list(fixture_command())}
""", alice=f'workspace_root = "{root}"')
    return root


def _turn(client: Any, sid: str, text: str) -> str:
    """Prompt, granting every permission asked; everything the client saw, as JSON."""
    start = len(client.frames)
    request_id = client.send("session/prompt", {"sessionId": sid,
                                                "prompt": [{"type": "text", "text": text}]})
    while True:
        frame = client.read_frame(FRAME_TIMEOUT)
        if frame.get("method") == "session/request_permission":
            client._write(json.dumps({"jsonrpc": "2.0", "id": frame["id"], "result": {
                "outcome": {"outcome": "selected", "optionId": "allow-once"}}}))
        elif frame.get("id") == request_id and "method" not in frame:
            return json.dumps(client.frames[start:])


class Targets:
    """The host's files the attack goes for, and what must never leak from them."""

    def __init__(self, daemon: DaemonProc) -> None:
        self.config_dir = daemon.config_dir
        self.config = daemon.config_dir / "config.toml"
        self.data = daemon.socket_path.parent
        self.store = self.data / "sessions" / "acp-sessions.db"
        self.wal = self.store.with_name(self.store.name + "-wal")
        self.config_text = self.config.read_bytes()

    @property
    def reads(self) -> list[str]:
        return [str(self.config), str(self.store), str(self.wal),
                f"/proc/self/root{self.config}", f"/proc/self/root{self.wal}"]

    def leaked(self, seen: str) -> bool:
        return "token_sha256" in seen or SECRET in seen

    def check_untouched(self) -> None:
        assert self.config.read_bytes() == self.config_text


def _tool(name: str, **args: Any) -> str:
    return f"!tool {name} {json.dumps(args)}"


def _attack_with_zeroclaws_tools(client: Any, sid: str, targets: Targets) -> None:
    evil = targets.config_text.decode() + "\nadmin = true\n"
    for path in targets.reads:
        seen = _turn(client, sid, _tool("file_read", path=path))
        assert "is forbidden" in seen and not targets.leaked(seen), path
    for path in (str(targets.config_dir), str(targets.data)):
        seen = _turn(client, sid, _tool("search", path=path, pattern="token_sha2[5]6|ops-private"))
        assert not targets.leaked(seen) and "acp-sessions.db" not in seen, path
        assert "config.toml" not in _turn(client, sid, _tool("file_list", path=path)), path
    for call in (_tool("deliver_file", path=str(targets.config)),
                 _tool("file_write", path=str(targets.config), content=evil),
                 _tool("file_edit", path=str(targets.config), old_string="[tenants.ops]",
                       new_string="[tenants.ops]\nadmin = true")):
        seen = _turn(client, sid, call)
        assert "is forbidden" in seen or "denied: autonomy is read_only" in seen, call
    hidden = f"$(printf %s {targets.config_dir})"  # a path the word check cannot see
    for command in (f"cat {targets.config}", f"cat {hidden}/config.toml",
                    f"cat {hidden}/data/sessions/acp-sessions.db-wal",
                    f"echo 'admin = true' >> {hidden}/config.toml"):
        assert not targets.leaked(_turn(client, sid, _tool("shell", command=command))), command
    targets.check_untouched()


def _attack_through_a_hosted_agent(client: Any, sid: str, targets: Targets) -> None:
    hidden = f"$(printf %s {targets.config_dir})"
    for path in targets.reads:
        for ask in ("read", "peek"):  # fs/read_text_file; the agent process itself
            assert not targets.leaked(_turn(client, sid, f"{ask} {path}")), (ask, path)
    for command in (f"cat {targets.config}", f"cat {hidden}/config.toml",
                    f"cat {hidden}/data/sessions/acp-sessions.db-wal"):
        for how in ("term", "run"):  # terminal/create; a child of the agent (an MCP server)
            assert not targets.leaked(_turn(client, sid, f"{how} {command}")), (how, command)
    _turn(client, sid, f"write {targets.config} admin = true")
    _turn(client, sid, f"put {targets.config} admin = true")
    _turn(client, sid, f"run echo 'admin = true' >> {hidden}/config.toml")
    targets.check_untouched()


def _refused_cwds(client: Any, targets: Targets, why: str = "host's own",
                  more: tuple[Path, ...] = ()) -> None:
    """``session/new`` in each of the host's directories (and ``more``): -32602 saying
    ``why`` (a tenant's: its cwd must be inside its root)."""
    for cwd in (targets.config_dir, targets.data, targets.data / "sessions",
                targets.data / "run", *more):
        with pytest.raises(RpcFailure) as refused:
            client.request("session/new", {"cwd": str(cwd), "mcpServers": []})
        assert refused.value.code == -32602 and why in refused.value.message, cwd


def _open(client: Any, cwd: Path | None) -> str:
    """A new session in ``cwd`` (None: the tenant's default root)."""
    params: dict[str, Any] = {"mcpServers": []}
    if cwd is not None:
        cwd.mkdir(parents=True, exist_ok=True)
        params["cwd"] = str(cwd)
    return str(client.request("session/new", params)["sessionId"])


def _secret_said_by_ops(gateway: GatewayDaemon) -> None:
    with gateway.client("ops") as ops:
        sid = ops.request("session/new", {"mcpServers": []})["sessionId"]
        _turn(ops, sid, SECRET)


@needs_sandbox
@pytest.mark.parametrize("mode", MODES)
def test_a_tenant_cannot_reach_the_hosts_files_through_zeroclaws_tools(
        daemons: Any, scratch_dir: Path, mode: str) -> None:
    root = _configure(scratch_dir, mode)
    gateway = GatewayDaemon(daemons(scratch_dir, "--gateway", "127.0.0.1:0"))
    targets = Targets(gateway.daemon)
    _secret_said_by_ops(gateway)
    with gateway.client("alice") as alice, gateway.client("bob") as bob:
        _refused_cwds(bob, targets, "workspace root", (Path("/"), scratch_dir / "roots"))
        for client, cwd in ((alice, root), (bob, None)):  # bob: <data_dir>/tenants/bob
            _attack_with_zeroclaws_tools(client, _open(client, cwd), targets)


@needs_sandbox
@pytest.mark.parametrize("mode", MODES)
def test_a_tenant_cannot_reach_the_hosts_files_through_a_hosted_agent(
        daemons: Any, scratch_dir: Path, mode: str) -> None:
    root = _configure(scratch_dir, mode)
    gateway = GatewayDaemon(daemons(scratch_dir, "--gateway", "127.0.0.1:0"))
    targets = Targets(gateway.daemon)
    _secret_said_by_ops(gateway)
    with gateway.client("alice", query="?agent=hosted") as alice, \
            gateway.client("bob", query="?agent=hosted") as bob:
        for client, cwd in ((alice, root), (bob, None)):
            _attack_through_a_hosted_agent(client, _open(client, cwd), targets)


@needs_sandbox
def test_links_into_the_hosts_files_are_refused(daemons: Any, scratch_dir: Path) -> None:
    """A symlink into the config dir planted in the tenant's root, a hard link the owner
    made to ``config.toml`` there, and ``/proc/self/root`` paths: all refused."""
    root = _configure(scratch_dir, "full")
    root.mkdir(parents=True)
    gateway = GatewayDaemon(daemons(scratch_dir, "--gateway", "127.0.0.1:0"))
    targets = Targets(gateway.daemon)
    os.symlink(targets.config_dir, root / "config-link")
    os.link(targets.config, root / "hard-config")
    with gateway.client("alice") as alice, \
            gateway.client("alice", query="?agent=hosted") as hosted:
        sid = alice.request("session/new", {"mcpServers": []})["sessionId"]
        agent_sid = hosted.request("session/new", {"mcpServers": []})["sessionId"]
        for path in ("config-link/config.toml", "hard-config", f"{root}/hard-config",
                     f"/proc/self/root{targets.config}"):
            assert not targets.leaked(_turn(alice, sid, _tool("file_read", path=path))), path
            assert not targets.leaked(_turn(hosted, agent_sid, f"read {path}")), path
        for command in ("cat hard-config", "cat config-link/config.toml"):
            assert not targets.leaked(_turn(alice, sid, _tool("shell", command=command)))
            assert not targets.leaked(_turn(hosted, agent_sid, f"run {command}"))
            assert not targets.leaked(_turn(hosted, agent_sid, f"term {command}"))
        _turn(alice, sid, _tool("file_write", path="hard-config", content="admin = true"))
    targets.check_untouched()


@needs_sandbox
def test_the_owners_sessions_are_kept_from_the_hosts_files_too(
        daemons: Any, scratch_dir: Path) -> None:
    _configure(scratch_dir, "full")
    project = scratch_dir.parent / f"{scratch_dir.name}-project"
    project.mkdir()
    daemon = daemons(scratch_dir)
    targets = Targets(daemon)
    with RpcClient(daemon.socket_path.parent / "acp.sock") as owner:
        _refused_cwds(owner, targets)
        sid = owner.request("session/new", {"cwd": str(project)})["sessionId"]
        _attack_with_zeroclaws_tools(owner, sid, targets)
        home = owner.request("session/new", {"cwd": "/"})["sessionId"]
        _attack_with_zeroclaws_tools(owner, home, targets)
