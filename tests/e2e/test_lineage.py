"""Lineage (``_meta.zeroclaw.parentSessionId``): which sessions are started for another.

A reset key's new session names the old one (tests/e2e/test_session_keys.py). A hosted
ACP agent cannot start sessions through the host: ACP v1 gives an agent no request
that opens a session on its client, and the host relays only ``session/update``,
``session/request_permission``, ``fs/*``, ``terminal/*`` and extension methods
(``actors.worker.agents.acp_client.HANDLERS``). So whatever sub-sessions an agent
runs inside itself never become host sessions, and there is nothing to link. This test
has a real hosted agent (tests/fixtures/acp_fixture_agent.py) ask its client for a
``session/new`` and checks that it is refused and that the host has no new session.
"""

from __future__ import annotations

from pathlib import Path

from .conftest import SdkHostFactory
from .test_acp_hosting import acp_config, fixture_command, prompt_text


async def test_a_hosted_agent_cannot_start_a_session_through_the_host(
    sdk_hosts: SdkHostFactory, config_dir: Path, workspace: Path
) -> None:
    acp_config(config_dir, fixture_command())
    async with sdk_hosts() as host:
        await host.initialize()
        sid = await host.new_session(workspace)
        for method in ("session/new", "session/load"):
            text, _ = await prompt_text(host, sid, f"ask {method}")
            assert text == f"{method} error -32601"
        listed = await host.conn.list_sessions()
        assert [s.session_id for s in listed.sessions] == [sid]
        status = await host.raw("status", {})
        assert [s["sessionId"] for s in status["sessions"]] == [sid]
    incoming = [f for d, f in host.wire if d == "incoming"]  # nothing reached the client
    assert not any(f.get("method") in ("session/new", "session/load") for f in incoming)
