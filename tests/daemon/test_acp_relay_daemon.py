"""A hosted ACP agent's ``fs/*`` and ``terminal/*`` requests behind the daemon's
``acp.sock``: one agent process serves the sessions of two SDK editors, and each
request goes to the editor that holds its session when it arrives (when that editor
offers the capability), else zeroclaw serves it; an editor that goes away with a
request pending leaves the agent an error, not a hang (issue "Real agents 1", point 4).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from acp.client.connection import ClientSideConnection

from tests.e2e.procs import write_config
from tests.e2e.sdkhost import RecordingClient
from tests.e2e.test_acp_client_relay import OFFERING
from tests.e2e.test_acp_hosting import _toml_list, fixture_command

from .helpers import DaemonProc, wait_session_idle
from .test_acp_hosted_daemon import sdk_editor, text_block


def _hosted_fixture(scratch_dir: Path) -> Path:
    workspace = scratch_dir / "ws"
    workspace.mkdir()
    (workspace / "notes.txt").write_text("on disk")
    write_config(scratch_dir, f"""
[acp]
default_agent = "hosted"
[agents.hosted]
provider = "acp"
command = {_toml_list(fixture_command())}
[workers]
max = 1
""")
    return workspace


async def _said(conn: ClientSideConnection, client: RecordingClient, sid: str,
                text: str) -> str:
    mark = client.mark()
    await conn.prompt(session_id=sid, prompt=[text_block(text)])
    return client.text(sid, start=mark)


async def test_each_request_goes_to_the_editor_holding_its_session_when_it_arrives(
    daemons: Any, scratch_dir: Path
) -> None:
    workspace = _hosted_fixture(scratch_dir)
    daemon: DaemonProc = daemons(scratch_dir)
    notes = workspace / "notes.txt"
    acp_path = daemon.socket_path.parent / "acp.sock"
    async with sdk_editor(acp_path, OFFERING) as (offering, offering_client), \
            sdk_editor(acp_path) as (plain, plain_client):
        first = (await offering.new_session(cwd=str(workspace), mcp_servers=[])).session_id
        second = (await plain.new_session(cwd=str(workspace), mcp_servers=[])).session_id
        said = await asyncio.gather(_said(offering, offering_client, first, f"read {notes}"),
                                    _said(plain, plain_client, second, f"read {notes}"))
        assert said == [f"read: the client's copy of {notes}", "read: on disk"]
        assert [(m, p["session_id"]) for m, p in offering_client.client_requests] == [
            ("fs/read_text_file", first)]
        said = await asyncio.gather(_said(offering, offering_client, first, "term true"),
                                    _said(plain, plain_client, second, "term echo own"))
        assert said == ["exit=7 output=the client's terminal", "exit=0 output=own\n"]
        del offering_client.client_requests[1:]  # its terminal's create, wait, output, release
        await plain.load_session(cwd=str(workspace), session_id=first, mcp_servers=[])
        assert await _said(plain, plain_client, first, f"read {notes}") == "read: on disk"
        assert await _said(offering, offering_client, first, f"read {notes}") == (
            f"read: the client's copy of {notes}")  # its prompt made it the holder again
        assert len(offering_client.client_requests) == 2
        assert not plain_client.client_requests


async def test_an_editor_gone_with_a_relayed_request_pending_leaves_the_agent_an_error(
    daemons: Any, scratch_dir: Path
) -> None:
    workspace = _hosted_fixture(scratch_dir)
    daemon: DaemonProc = daemons(scratch_dir)
    acp_path = daemon.socket_path.parent / "acp.sock"
    async with sdk_editor(acp_path, OFFERING) as (leaving, leaving_client):
        sid = (await leaving.new_session(cwd=str(workspace), mcp_servers=[])).session_id
        leaving_client.client_gate.clear()  # the request stays unanswered
        prompt = asyncio.create_task(leaving.prompt(session_id=sid,
                                                    prompt=[text_block("read /any")]))
        await leaving_client.wait_until(lambda: bool(leaving_client.client_requests),
                                        "the relayed fs/read_text_file")
    prompt.cancel()
    with daemon.client() as ops:
        await asyncio.to_thread(wait_session_idle, ops, sid, 1)
    async with sdk_editor(acp_path) as (after, after_client):
        await after.load_session(cwd=str(workspace), session_id=sid, mcp_servers=[])
        replayed = after_client.text(sid)
        assert replayed.startswith("read: {'code': -32603, "), replayed
        assert await _said(after, after_client, sid, "still served") == "still served"


def _agent_pid(client: Any, sid: str) -> str:
    """Which agent process serves ``sid`` (its own token: a confined process's pid is
    the one of its PID namespace)."""
    client.notifications.clear()
    client.request("session/prompt", {"sessionId": sid,
                                      "prompt": [{"type": "text", "text": "ident"}]})
    return "".join(u["update"]["content"]["text"] for u in client.updates()
                   if u["update"].get("sessionUpdate") == "agent_message_chunk")


def test_tenants_never_share_a_hosted_agent_process(daemons: Any, scratch_dir: Path) -> None:
    """An agent process names any of its sessions in its fs/terminal requests, and a
    command it runs can write on its stdout: one process serving two tenants would let
    one tenant's prompts reach the other's files and editor. Each tenant gets its own."""
    from .gateway_helpers import GatewayDaemon, gateway_config

    _hosted_fixture(scratch_dir)
    hosted = (scratch_dir / "config.toml").read_text()
    gateway_config(scratch_dir, hosted)
    gateway = GatewayDaemon(daemons(scratch_dir, "--gateway", "127.0.0.1:0"))
    with gateway.client("alice") as alice, gateway.client("bob") as bob:
        alice_sid = alice.request("session/new", {})["sessionId"]
        bob_sid = bob.request("session/new", {})["sessionId"]
        again = alice.request("session/new", {})["sessionId"]
        alice_pid, bob_pid = _agent_pid(alice, alice_sid), _agent_pid(bob, bob_sid)
        assert len(alice_pid) == len(bob_pid) == 32
        assert alice_pid != bob_pid
        assert _agent_pid(alice, again) == alice_pid  # a tenant's sessions still share one
        alice.request("session/close", {"sessionId": again})
        assert _agent_pid(alice, alice_sid) == alice_pid  # closing one session kept it


def _said_over(client: Any, sid: str, text: str) -> str:
    client.notifications.clear()
    client.request("session/prompt", {"sessionId": sid,
                                      "prompt": [{"type": "text", "text": text}]})
    return "".join(u["update"]["content"]["text"] for u in client.updates()
                   if u["update"].get("sessionUpdate") == "agent_message_chunk")


def test_a_tenants_files_stay_under_its_workspace_root(daemons: Any,
                                                      scratch_dir: Path) -> None:
    """The agent's configured workspace is shared by every session of that agent, so it
    is no root of a tenant's session: nothing one tenant writes there can be read (or
    planted for) another, and no file outside the tenant's workspace root is reached."""
    from .gateway_helpers import GatewayDaemon, gateway_config

    _hosted_fixture(scratch_dir)
    hosted = (scratch_dir / "config.toml").read_text()
    roots = {name: scratch_dir / "roots" / name for name in ("alice", "bob")}
    gateway_config(scratch_dir, hosted,
                   **{name: f'workspace_root = "{root}"' for name, root in roots.items()})
    gateway = GatewayDaemon(daemons(scratch_dir, "--gateway", "127.0.0.1:0"))
    shared = scratch_dir / "agents" / "hosted" / "workspace"
    shared.mkdir(parents=True, exist_ok=True)
    (shared / "owner.txt").write_text("the owner's")
    with gateway.client("alice") as alice, gateway.client("bob") as bob:
        alice_sid = alice.request("session/new", {})["sessionId"]
        bob_sid = bob.request("session/new", {})["sessionId"]
        planted = _said_over(alice, alice_sid, f"write {shared}/planted.txt from alice")
        assert planted.startswith("write refused:") and ("outside" in planted
                                                         or "is forbidden" in planted)
        assert not (shared / "planted.txt").exists()
        read = _said_over(bob, bob_sid, f"read {shared}/owner.txt")
        assert "the owner's" not in read and ("outside" in read or "is forbidden" in read)
        assert _said_over(bob, bob_sid, f"write {roots['bob']}/own.txt mine") == "wrote"
        assert (roots["bob"] / "own.txt").read_text() == "mine"
