"""SPEC §7 tools through the echo agent: confinement, autonomy, approvals under cancel.

Driven by the official ACP SDK against a real ``zeroclaw acp``.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from .conftest import SdkHostFactory
from .helpers import tool
from .procs import write_config
from .sdkhost import SdkHost


async def last_tool_status(host: SdkHost, sid: str, prompt: str) -> str:
    out = await host.prompt(sid, prompt)
    assert out.stop_reason == "end_turn"
    return str(host.client.of(sid, "tool_call_update")[-1].status)


async def test_paths_are_confined_to_cwd_and_agent_workspace(
    sdk_hosts: SdkHostFactory, config_dir: Path, tmp_path: Path, workspace: Path
) -> None:
    agent_ws, outside = tmp_path / "agent-ws", tmp_path / "outside"
    agent_ws.mkdir()
    outside.mkdir()
    (workspace / "link").symlink_to(outside)
    write_config(
        config_dir,
        f'[agents.default]\nprovider = "echo"\nworkspace = "{agent_ws}"\n'
        f'[autonomy]\nlevel = "full"\nforbidden_paths = ["{workspace}/secret"]\n',
    )
    (workspace / "secret").mkdir()
    async with sdk_hosts() as host:
        await host.initialize()
        sid = await host.new_session(workspace)
        denied = ["../escape.txt", str(outside / "abs.txt"), "link/through.txt", "secret/x.txt"]
        for path in denied:
            status = await last_tool_status(host, sid, tool("file_write", {"path": path,
                                                                           "content": "no"}))
            assert status == "failed", path
        assert list(outside.iterdir()) == [] and not (tmp_path / "escape.txt").exists()
        assert list((workspace / "secret").iterdir()) == []
        assert await last_tool_status(
            host, sid, tool("file_read", {"path": "/etc/hostname"})) == "failed"
        allowed = [("inside.txt", workspace / "inside.txt"),
                   (str(agent_ws / "agent.txt"), agent_ws / "agent.txt")]
        for path, target in allowed:
            status = await last_tool_status(host, sid, tool("file_write", {"path": path,
                                                                           "content": "ok"}))
            assert status == "completed" and target.read_text() == "ok", path
        assert host.client.permission_asks == [], "full autonomy asked for permission"


async def test_read_only_runs_no_shell(host: SdkHost, workspace: Path) -> None:
    sid = await host.new_session(workspace)
    await host.conn.set_session_mode(session_id=sid, mode_id="read_only")
    marker = workspace / "ran"
    status = await last_tool_status(host, sid, tool("shell", {"command": f"touch {marker}"}))
    assert status == "failed" and not marker.exists()
    assert host.client.permission_asks == []
    (workspace / "r.txt").write_text("reading is fine")
    status = await last_tool_status(host, sid, tool("file_read", {"path": "r.txt"}))
    assert status == "completed"


async def test_cancel_withdraws_a_pending_permission_request(
    host: SdkHost, workspace: Path
) -> None:
    host.client.permission_policy = "never"
    sid = await host.new_session(workspace)
    turn = asyncio.create_task(
        host.prompt(sid, tool("file_write", {"path": "never.txt", "content": "no"})))
    await host.client.wait_until(lambda: bool(host.client.permission_asks), "a permission ask")
    await host.conn.cancel(session_id=sid)
    out = await asyncio.wait_for(turn, 5)
    assert out.stop_reason == "cancelled"
    assert not (workspace / "never.txt").exists()
    statuses = [u.status for u in host.client.of(sid, "tool_call_update")]
    assert "completed" not in statuses
    host.client.permission_policy = "allow_once"
    out = await host.prompt(sid, tool("shell", {"command": "echo next turn"}))
    assert out.stop_reason == "end_turn"
    assert "next turn" in json.dumps(host.client.of(sid, "tool_call_update")[-1].raw_output)
