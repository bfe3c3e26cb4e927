"""Session keys on the gateway: a key is per tenant. Two tenants (alice, bob) of a real
daemon started with ``--gateway`` send the same ``_meta.sessionKey`` through the
official ACP SDK client over the WebSocket and get two sessions, each its own
transcript; a later connection of each gets its own back (replayed); a label is per
tenant too, and a tenant cannot label another's session."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from acp import RequestError, text_block
from acp.client.connection import ClientSideConnection
from websockets.asyncio.client import connect as async_connect

from tests.e2e.helpers import split_turns
from tests.e2e.sdkhost import RecordingClient

from .gateway_helpers import TOKENS, GatewayDaemon, WebSocketTransport, gateway_config

KEY = "agent:main:main"


@pytest.fixture
def gateway(daemons: Any, scratch_dir: Path) -> GatewayDaemon:
    gateway_config(scratch_dir)
    return GatewayDaemon(daemons(scratch_dir, "--gateway", "127.0.0.1:0"))


@asynccontextmanager
async def tenant_connection(gateway: GatewayDaemon, tenant: str
                            ) -> AsyncIterator[tuple[ClientSideConnection, RecordingClient]]:
    client = RecordingClient()
    headers = {"Authorization": f"Bearer {TOKENS[tenant]}"}
    async with async_connect(f"{gateway.ws}/acp", additional_headers=headers) as ws:
        conn = ClientSideConnection(client, WebSocketTransport(ws))
        await conn.initialize(protocol_version=1)
        try:
            yield conn, client
        finally:
            await conn.close()


async def keyed_turn(gateway: GatewayDaemon, tenant: str, text: str) -> tuple[str, list[str]]:
    """A ``session/new`` with :data:`KEY` for ``tenant``, then one prompt: the session id
    and the user turns it had before (replayed after the answer)."""
    async with tenant_connection(gateway, tenant) as (conn, client):
        answer = await conn.new_session(cwd=str(gateway.root(tenant)), sessionKey=KEY)
        sid = answer.session_id
        assert (answer.field_meta or {})["sessionKey"] == KEY
        await conn.prompt(session_id=sid, prompt=[text_block(text)])
        await client.wait_text(sid, text)
        before = [turn.user for turn in split_turns(client.of(sid))]
        listed = await conn.list_sessions()
        assert [(s.session_id, (s.field_meta or {}).get("sessionKey"))
                for s in listed.sessions] == [(sid, KEY)]
    return sid, before


async def test_two_tenants_with_the_same_key_get_their_own_sessions(
        gateway: GatewayDaemon) -> None:
    alice, alice_before = await keyed_turn(gateway, "alice", "alice first")
    bob, bob_before = await keyed_turn(gateway, "bob", "bob first")
    assert alice != bob and alice_before == bob_before == []
    again, before = await keyed_turn(gateway, "alice", "alice second")
    assert (again, before) == (alice, ["alice first"])
    again, before = await keyed_turn(gateway, "bob", "bob second")
    assert (again, before) == (bob, ["bob first"])


async def test_labels_are_per_tenant(gateway: GatewayDaemon) -> None:
    async with tenant_connection(gateway, "alice") as (conn, _):
        alice = (await conn.new_session(cwd=str(gateway.root("alice")), sessionKey=KEY,
                                        sessionLabel="inbox")).session_id
    async with tenant_connection(gateway, "bob") as (conn, _):
        with pytest.raises(RequestError) as missing:
            await conn.new_session(cwd=str(gateway.root("bob")), sessionLabel="inbox")
        assert missing.value.code == -32602
        with pytest.raises(RequestError) as foreign:
            await conn.ext_method("zeroclaw/session_info_update",
                                  {"sessionId": alice, "_meta": {"sessionLabel": "mine"}})
        assert foreign.value.code == -32000  # not bob's session: as if there were none
        bob = (await conn.new_session(cwd=str(gateway.root("bob")), sessionKey="other",
                                      sessionLabel="inbox")).session_id
    async with tenant_connection(gateway, "alice") as (conn, _):
        found = await conn.new_session(cwd=str(gateway.root("alice")), sessionLabel="inbox")
        assert found.session_id == alice != bob
