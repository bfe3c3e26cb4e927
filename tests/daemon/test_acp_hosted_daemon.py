"""A hosted ACP agent (``provider = "acp"``) behind the daemon: editors on ``acp.sock``
driven by the official ACP Python SDK client share one agent process, and ``status``
(JSON and ``zeroclaw status``) shows it under its worker (issue "Real agents 1").

The agent is the ACP TypeScript SDK's example agent (``ZEROCLAW_ACP_TS_AGENT``, run
with ``node`` from PATH; scripts/test sets both).
"""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import psutil
from acp import connect_to_agent
from acp.client.connection import ClientSideConnection
from acp.schema import ClientCapabilities, TextContentBlock

from tests.e2e.procs import write_config
from tests.e2e.sdkhost import RecordingClient
from tests.e2e.test_acp_hosting import _toml_list, _ts_agent

from .helpers import DaemonProc, zeroclaw_argv

STREAM_LIMIT = 64 * 1024 * 1024


@asynccontextmanager
async def sdk_editor(socket_path: Path, capabilities: ClientCapabilities | None = None
                     ) -> AsyncIterator[tuple[ClientSideConnection, RecordingClient]]:
    """One editor: the SDK's client connection over the daemon's ``acp.sock``, offering
    ``capabilities`` (none by default)."""
    reader, writer = await asyncio.open_unix_connection(str(socket_path), limit=STREAM_LIMIT)
    client = RecordingClient()
    conn = connect_to_agent(client, writer, reader)  # type: ignore[arg-type]
    try:
        await conn.initialize(protocol_version=1, client_capabilities=capabilities)
        yield conn, client
    finally:
        await conn.close()
        writer.close()


def agent_entries(daemon: DaemonProc, sessions: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """The worker and its one agent entry of ``status``, once the agent holds ``sessions``
    sessions (workers report their agents with each heartbeat)."""
    deadline = time.monotonic() + 10
    with daemon.client() as ops:
        while True:
            status = ops.request("status")
            found = [(w, a) for w in status["workers"] for a in w["agents"]]
            if len(found) == 1 and found[0][1]["sessions"] == sessions:
                return found[0]
            assert time.monotonic() < deadline, f"no agent with {sessions} sessions: {status}"
            time.sleep(0.1)


async def test_two_sdk_editors_on_acp_sock_share_one_hosted_agent_shown_in_status(
    daemons: Any, scratch_dir: Path
) -> None:
    node, agent = _ts_agent()
    workspace = scratch_dir / "ws"
    workspace.mkdir()
    write_config(scratch_dir, f"""
[acp]
default_agent = "hosted"
[agents.hosted]
provider = "acp"
command = {_toml_list([node, agent])}
[workers]
max = 1
""")
    daemon = daemons(scratch_dir)
    acp_path = daemon.socket_path.parent / "acp.sock"
    async with sdk_editor(acp_path) as (first, first_client), \
            sdk_editor(acp_path) as (second, second_client):
        sids = [(await conn.new_session(cwd=str(workspace), mcp_servers=[])).session_id
                for conn in (first, second)]
        second_client.permission_policy = "reject_once"
        results = await asyncio.gather(
            first.prompt(session_id=sids[0], prompt=[text_block("first editor")]),
            second.prompt(session_id=sids[1], prompt=[text_block("second editor")]))
        assert [r.stop_reason for r in results] == ["end_turn", "end_turn"]
        assert "Perfect!" in first_client.text(sids[0])
        assert "skip the configuration update" in second_client.text(sids[1])
        assert [a.session_id for a in first_client.permission_asks] == [sids[0]]
        assert [a.session_id for a in second_client.permission_asks] == [sids[1]]
        worker, entry = await asyncio.to_thread(agent_entries, daemon, 2)
        process = psutil.Process(entry["pid"])
        launcher = process.parent()  # the root of the agent's process tree
        assert launcher is not None and launcher.ppid() == worker["pid"]
        assert agent in process.cmdline()
        assert entry["agentAlias"] == "hosted" and entry["restarts"] == 0
        assert entry["rssBytes"] > 0 and worker["sessions"] == 2
        rendered = subprocess.run(
            zeroclaw_argv("status", "--config-dir", str(scratch_dir)), env=daemon.env,
            capture_output=True, text=True, timeout=30, check=True).stdout
        assert f"└ {entry['pid']}" in rendered and "agent hosted, restarts 0" in rendered
        await second.load_session(cwd=str(workspace), session_id=sids[0], mcp_servers=[])
        replayed = [u for u in second_client.of(sids[0]) if u.session_update in (
            "user_message_chunk", "tool_call")]
        assert [getattr(u, "tool_call_id", None) or u.content.text for u in replayed] == [
            "first editor", "call_1", "call_2"]


def text_block(text: str) -> Any:
    return TextContentBlock(type="text", text=text)
