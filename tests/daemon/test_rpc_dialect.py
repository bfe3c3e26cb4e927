"""Pure functions of the daemon RPC dialect (:mod:`ipc.rpc`) and the ephemeral lifetime."""

from __future__ import annotations

import asyncio

import pytest

from ipc import rpc
from ipc.errors import InvalidParams, ProtocolVersionMismatch
from ipc.events import (
    MessageChunk,
    PlanEntry,
    PlanUpdate,
    SessionInfo,
    ThoughtChunk,
    ToolCallFinished,
    ToolCallStarted,
    UsageUpdate,
)
from supervisor.servers.daemon import Lifetime


def test_protocol_version_rules() -> None:
    assert rpc.protocol_version({"protocolVersion": 1}) == 1
    assert rpc.protocol_version({"protocol_version": 1}) == 1
    with pytest.raises(ProtocolVersionMismatch, match="server=1, client=7"):
        rpc.protocol_version({"protocolVersion": 7})
    for bad in ({}, {"protocolVersion": "1"}, {"protocolVersion": True}, [1]):
        with pytest.raises(InvalidParams):
            rpc.protocol_version(bad)


def test_flat_events() -> None:
    sid = "s"
    assert rpc.encode_event(sid, MessageChunk("hi")) == {
        "sessionId": sid, "type": "agent_message_chunk", "text": "hi"}
    assert rpc.encode_event(sid, ThoughtChunk("hm"))["type"] == "agent_thought_chunk"
    assert rpc.encode_event(sid, ToolCallStarted("t1", "shell", "ls", "execute", {"c": 1})) == {
        "sessionId": sid, "type": "tool_call", "toolCallId": "t1", "name": "shell",
        "rawInput": {"c": 1}}
    result = rpc.encode_event(sid, ToolCallFinished("t1", "shell", "completed", "out", "out"))
    assert result is not None
    assert (result["type"], result["toolCallId"], result["rawOutput"]) == \
        ("tool_result", "t1", "out")
    assert rpc.encode_event(sid, ToolCallFinished("t1", "shell", "in_progress", None, "")) is None
    plan = rpc.encode_event(sid, PlanUpdate((PlanEntry("a"),)))
    assert plan == {"sessionId": sid, "type": "plan",
                    "entries": [{"content": "a", "priority": "medium", "status": "pending"}]}
    assert rpc.encode_event(sid, SessionInfo(title="t")) is None
    assert rpc.encode_event(sid, UsageUpdate(1, 2)) is None


def test_turn_complete_outcomes() -> None:
    assert rpc.turn_complete("s", "end_turn", "x")["outcome"] == "completed"
    assert rpc.turn_complete("s", "cancelled", "x")["outcome"] == "cancelled"
    assert rpc.turn_complete("s", None, "boom")["outcome"] == "failed"


def test_new_session_and_approve_params() -> None:
    request = rpc.new_session_request({"agent_alias": "a", "cwd": "/x", "keep_siblings": True})
    assert (request.request.agent_alias, request.request.cwd, request.keep_siblings) == \
        ("a", "/x", True)
    assert rpc.new_session_request({}).keep_siblings is False
    with pytest.raises(InvalidParams, match="keep_siblings"):
        rpc.new_session_request({"keep_siblings": "yes"})
    approval = rpc.approve_request({"sessionId": "s", "requestId": "r", "decision": "allow-once"})
    assert approval == rpc.Approval("s", "r", "allow_once")
    with pytest.raises(InvalidParams, match="decision"):
        rpc.approve_request({"sessionId": "s", "requestId": "r", "decision": "maybe"})
    with pytest.raises(InvalidParams, match="requestId"):
        rpc.approve_request({"sessionId": "s", "decision": "allow_once"})


async def test_lifetime_never_stops_before_a_first_client_and_honours_the_grace() -> None:
    stop = asyncio.Event()
    lifetime = Lifetime(stop.set, ephemeral=True, grace=0.2)
    lifetime.connected()
    lifetime.disconnected()
    await asyncio.sleep(0.1)
    lifetime.connected()  # back within the grace period
    await asyncio.sleep(0.3)
    assert not stop.is_set()
    lifetime.disconnected()
    await asyncio.wait_for(stop.wait(), 2)


async def test_lifetime_without_ephemeral_ignores_clients() -> None:
    stop = asyncio.Event()
    lifetime = Lifetime(stop.set, ephemeral=False, grace=0.05)
    lifetime.connected()
    lifetime.disconnected()
    await asyncio.sleep(0.2)
    assert not stop.is_set()
