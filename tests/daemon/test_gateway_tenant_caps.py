"""A tenant's ``max_sessions`` over the real gateway: at its cap the tenant's least
recently used idle session is evicted (it stays in the store and loads back), never
another tenant's; only when every live session of the tenant is busy is a new one
refused with -32001 (SPEC §5, the host's own rule, within the tenant)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from .gateway_helpers import GatewayDaemon, WsClient, gateway_config
from .helpers import FRAME_TIMEOUT, RpcFailure


def live_sessions(client: WsClient) -> set[str]:
    """The ids of the live sessions the client's tenant sees in ``status``."""
    return {s["sessionId"] for s in client.request("status")["sessions"]}


def wait_streaming(client: WsClient, sids: set[str], timeout: float = FRAME_TIMEOUT) -> None:
    """Until each of ``sids``' running turns has streamed its first chunk (they are
    busy), in whatever order they come."""
    deadline = time.monotonic() + timeout
    waiting = set(sids)
    while waiting:
        frame = client.read_frame(max(0.01, deadline - time.monotonic()))
        params: dict[str, Any] = frame.get("params") or {}
        if (frame.get("method") == "session/update"
                and params["update"]["sessionUpdate"] == "agent_message_chunk"):
            waiting.discard(params.get("sessionId"))


def user_text(client: WsClient) -> str:
    return "".join(u["update"]["content"]["text"] for u in client.updates()
                   if u["update"]["sessionUpdate"] == "user_message_chunk")


def test_a_tenant_at_its_cap_evicts_its_own_least_recently_used_idle_session(
        daemons: Any, scratch_dir: Path) -> None:
    gateway_config(scratch_dir, alice="max_sessions = 2")
    gateway = GatewayDaemon(daemons(scratch_dir, "--gateway", "127.0.0.1:0"))
    cwd = str(gateway.root("alice"))  # each tenant opens in its own root
    with gateway.client("bob") as bob:  # bob's session is the host's least recently used
        bob_sid = bob.request("session/new", {})["sessionId"]
        with gateway.client("alice") as first:
            old = first.request("session/new", {"cwd": cwd})["sessionId"]
            first.request("session/prompt", {"sessionId": old, "prompt": "the oldest turn"})
            newer = first.request("session/new", {"cwd": cwd})["sessionId"]
            first.request("session/prompt", {"sessionId": newer, "prompt": "a newer turn"})
        with gateway.client("alice") as second:  # her first connection has closed
            made = second.request("session/new", {"cwd": cwd})["sessionId"]
            assert live_sessions(second) == {newer, made}  # `old` was evicted, not bob's
            assert live_sessions(bob) == {bob_sid}
            second.request("session/load", {"sessionId": old, "cwd": cwd})  # evicts `newer`
            assert user_text(second) == "the oldest turn"
            assert live_sessions(second) == {made, old}
            turns = [second.send("session/prompt", {"sessionId": sid, "prompt": "busy\n!sleep 30"})
                     for sid in (made, old)]
            wait_streaming(second, {made, old})
            try:
                second.request("session/new", {"cwd": cwd})
            except RpcFailure as failure:
                assert (failure.code, failure.message) == (
                    -32001, "Maximum session limit reached (2)")
            else:
                raise AssertionError("session/new past a cap of busy sessions succeeded")
            bob.request("session/new", {})  # bob has no cap: unaffected
            for sid in (made, old):
                second.send("session/cancel", {"sessionId": sid}, notify=True)
            for turn in turns:
                assert turn is not None
                assert second.wait_response(turn)["result"]["stopReason"] == "cancelled"
            second.request("session/load", {"sessionId": newer, "cwd": cwd})  # idle again
            assert "a newer turn" in user_text(second)
            assert len(live_sessions(second)) == 2
