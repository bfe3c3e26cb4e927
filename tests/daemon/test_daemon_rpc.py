"""The daemon RPC dialect on ``daemon.sock`` (SPEC §4), against a real daemon."""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from .helpers import DaemonProc, RpcClient, RpcFailure, short_dir

Daemons = Callable[..., DaemonProc]


@pytest.fixture
def daemon(daemons: Daemons) -> Iterator[DaemonProc]:
    yield daemons()


def test_first_request_must_be_initialize(daemon: DaemonProc) -> None:
    with daemon.client(initialize=False) as client:
        with pytest.raises(RpcFailure) as info:
            client.request("status")
        assert info.value.code == -32010
        with pytest.raises(RpcFailure) as info:
            client.request("session/new", {})
        assert info.value.code == -32010


@pytest.mark.parametrize("version", [0, 2, 99])
def test_protocol_version_mismatch(daemon: DaemonProc, version: int) -> None:
    with daemon.client(initialize=False) as client:
        with pytest.raises(RpcFailure) as info:
            client.request("initialize", {"protocolVersion": version})
        assert info.value.code == -32011
        assert info.value.message == f"Protocol version mismatch: server=1, client={version}"
        with pytest.raises(RpcFailure) as info:  # still not initialized
            client.request("status")
        assert info.value.code == -32010


def test_initialize_result_and_snake_case_alias(daemon: DaemonProc) -> None:
    with daemon.client(initialize=False) as client:
        result = client.request("initialize", {"protocol_version": 1})
        assert result["protocolVersion"] == 1
        assert result["serverPid"] == daemon.pid
        assert isinstance(result["serverVersion"], str) and result["serverVersion"]
    with daemon.client(initialize=False) as client:
        with pytest.raises(RpcFailure) as info:
            client.request("initialize", {})
        assert info.value.code == -32602
        assert "protocolVersion" in info.value.message


def test_connections_are_logged_with_peer_pid_and_uid(daemon: DaemonProc) -> None:
    with daemon.client() as client:
        client.request("status")
    expected = f"from pid {os.getpid()} uid {os.getuid()}"
    deadline = time.monotonic() + 10
    while expected not in daemon.stderr() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert expected in daemon.stderr()


def test_prompt_streams_flat_updates_then_the_result(daemon: DaemonProc) -> None:
    with daemon.client() as client:
        created = client.request("session/new")
        assert set(created) == {"sessionId", "agentAlias", "workspaceDir"}
        assert created["agentAlias"] == "default"
        assert os.path.isdir(created["workspaceDir"])
        sid = created["sessionId"]
        result = client.request("session/prompt", {
            "sessionId": sid, "prompt": "!think pondering\n!plan first; second\nhello world"})
        assert result == {"sessionId": sid, "stopReason": "end_turn",
                          "content": "hello world"}
        updates = client.updates()
        assert all(u["sessionId"] == sid and "update" not in u for u in updates)
        kinds = [u["type"] for u in updates]
        assert kinds[-1] == "turn_complete"
        assert {"agent_thought_chunk", "plan", "agent_message_chunk"} <= set(kinds)
        assert "".join(u["text"] for u in updates if u["type"] == "agent_message_chunk") \
            == "hello world"
        plan = next(u for u in updates if u["type"] == "plan")
        assert [e["content"] for e in plan["entries"]] == ["first", "second"]
        assert updates[-1] == {"sessionId": sid, "type": "turn_complete",
                               "outcome": "completed", "content": "hello world"}
        # the turn_complete notification came before the prompt's response
        last_update = max(i for i, f in enumerate(client.frames) if f.get("method"))
        response = next(i for i, f in enumerate(client.frames) if "result" in f
                        and isinstance(f["result"], dict) and "stopReason" in f["result"])
        assert last_update < response


@pytest.fixture
def workspace() -> Iterator[Path]:
    path = short_dir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


def ask_to_write(client: RpcClient, workspace: Path, name: str,
                 content: str) -> tuple[str, int, dict[str, Any]]:
    """A session whose turn waits on approval of a ``file_write``: (sid, prompt id, ask)."""
    sid = client.request("session/new", {"cwd": str(workspace)})["sessionId"]
    args = json.dumps({"path": name, "content": content})
    prompt_id = client.send("session/prompt", {"sessionId": sid,
                                               "prompt": f"!tool file_write {args}"})
    assert prompt_id is not None
    return sid, prompt_id, client.wait_update("approval_request")


def test_tool_call_waits_for_session_approve(daemon: DaemonProc, workspace: Path) -> None:
    with daemon.client() as client:
        sid, prompt_id, ask = ask_to_write(client, workspace, "note.txt", "hi")
        assert ask["toolName"] == "file_write"
        assert ask["timeoutSecs"] > 0 and ask["summary"]
        with pytest.raises(RpcFailure) as info:
            client.request("session/approve", {"sessionId": sid, "requestId": "nope",
                                               "decision": "allow_once"})
        assert info.value.code == -32602
        assert client.request("session/approve", {
            "sessionId": sid, "requestId": ask["requestId"], "decision": "allow_once"}) == {}
        response = client.wait_response(prompt_id)
        assert response["result"]["stopReason"] == "end_turn"
        kinds = [u["type"] for u in client.updates()]
        assert "tool_call" in kinds and "tool_result" in kinds
        result = next(u for u in client.updates() if u["type"] == "tool_result")
        assert result["name"] == "file_write" and result["status"] == "completed"
    assert (workspace / "note.txt").read_text() == "hi"


def test_rejected_approval_denies_the_tool(daemon: DaemonProc, workspace: Path) -> None:
    with daemon.client() as client:
        sid, prompt_id, ask = ask_to_write(client, workspace, "no.txt", "x")
        client.request("session/approve", {"sessionId": sid, "requestId": ask["requestId"],
                                           "decision": "reject_once"})
        assert "result" in client.wait_response(prompt_id)
    assert not (workspace / "no.txt").exists()


def test_reject_always_denies_that_tool_from_then_on_without_asking(
    daemon: DaemonProc, workspace: Path
) -> None:
    with daemon.client() as client:
        sid, prompt_id, ask = ask_to_write(client, workspace, "no.txt", "x")
        client.request("session/approve", {"sessionId": sid, "requestId": ask["requestId"],
                                           "decision": "reject_always"})
        client.wait_response(prompt_id)
        args = json.dumps({"path": "no2.txt", "content": "x"})
        client.request("session/prompt", {"sessionId": sid,
                                          "prompt": f"!tool file_write {args}"})
        results = [u for u in client.updates() if u["type"] == "tool_result"]
        assert [r["status"] for r in results] == ["failed", "failed"]
        assert len([u for u in client.updates() if u["type"] == "approval_request"]) == 1
    assert not (workspace / "no.txt").exists() and not (workspace / "no2.txt").exists()


def test_another_connections_session_is_not_ours(daemon: DaemonProc) -> None:
    with daemon.client() as owner, daemon.client() as other:
        sid = owner.request("session/new")["sessionId"]
        for method in ("session/cancel", "session/close"):
            with pytest.raises(RpcFailure) as info:
                other.request(method, {"sessionId": sid})
            assert info.value.code == -32003
        with pytest.raises(RpcFailure) as info:
            other.request("session/prompt", {"sessionId": sid, "prompt": "hi"})
        assert info.value.code == -32003
        assert owner.request("session/cancel", {"sessionId": sid}) == {}
        assert owner.request("session/prompt", {"sessionId": sid, "prompt": "x"})["content"] == "x"
        assert owner.request("session/close", {"sessionId": sid}) == {}
        with pytest.raises(RpcFailure) as info:
            owner.request("session/close", {"sessionId": sid})
        assert info.value.code == -32000


def test_cancel_stops_a_running_turn(daemon: DaemonProc) -> None:
    with daemon.client() as client:
        sid = client.request("session/new")["sessionId"]
        prompt_id = client.send("session/prompt", {"sessionId": sid,
                                                   "prompt": "start\n!sleep 30\nnever"})
        client.wait_update("agent_message_chunk")
        client.send("session/cancel", {"sessionId": sid}, notify=True)
        response = client.wait_response(prompt_id, timeout=10)
        assert response["result"]["stopReason"] == "cancelled"
        complete = [u for u in client.updates() if u["type"] == "turn_complete"]
        assert complete[-1]["outcome"] == "cancelled"


def test_a_disconnected_owner_releases_its_sessions(daemon: DaemonProc) -> None:
    owner = daemon.client()
    sid = owner.request("session/new")["sessionId"]
    owner.close()
    with daemon.client() as other:
        deadline = time.monotonic() + 10
        while True:  # the owner's disconnect is processed asynchronously
            try:
                result = other.request("session/prompt", {"sessionId": sid, "prompt": "mine"})
                break
            except RpcFailure as failure:
                assert failure.code == -32003
                assert time.monotonic() < deadline
                time.sleep(0.05)
        assert result["content"] == "mine"
        status = other.request("status")
        assert [s["clients"] for s in status["sessions"] if s["sessionId"] == sid] == [1]


def test_new_session_evicts_idle_siblings_unless_kept(daemon: DaemonProc) -> None:
    with daemon.client() as client:
        first = client.request("session/new")["sessionId"]
        second = client.request("session/new", {"keep_siblings": True})["sessionId"]
        live = {s["sessionId"] for s in client.request("status")["sessions"]}
        assert {first, second} <= live
        third = client.request("session/new")["sessionId"]
        live = {s["sessionId"] for s in client.request("status")["sessions"]}
        assert live == {third}
        # evicted, not closed: a prompt restores it transparently
        assert client.request("session/prompt", {"sessionId": first,
                                                 "prompt": "back"})["content"] == "back"


def test_status_shape(daemon: DaemonProc) -> None:
    with daemon.client() as client:
        sid = client.request("session/new")["sessionId"]
        status = client.request("status")
    assert {"serverVersion", "protocolVersion", "pid", "uptimeSecs", "activeSessions",
            "sessions", "workers", "limits"} <= set(status)
    assert status["pid"] == daemon.pid and status["protocolVersion"] == 1
    assert status["activeSessions"] == 1
    [session] = status["sessions"]
    assert session["sessionId"] == sid and session["agentAlias"] == "default"
    assert session["state"] == "idle" and session["clients"] == 1 and session["turns"] == 0
    assert isinstance(session["lastActivity"], float)
    assert status["workers"], "no worker listed"
    for worker in status["workers"]:
        assert {"pid", "rssBytes", "cpuPercent", "sessions", "responsive"} <= set(worker)
        assert worker["rssBytes"] > 0 and worker["responsive"] is True
    assert sum(w["sessions"] for w in status["workers"]) == 1
    assert status["limits"] == {"maxSessions": 10, "sessionTimeoutSecs": 3600.0}
    store = status["store"]
    assert store["backend"] == "sqlite" and store["persistent"] is True
    assert store["path"].endswith("acp-sessions.db")
    assert isinstance(store["lastCommit"], float)  # the new session's row


def test_unknown_method_and_bad_params(daemon: DaemonProc) -> None:
    with daemon.client() as client:
        with pytest.raises(RpcFailure) as info:
            client.request("session/teleport", {"sessionId": "x"})
        assert info.value.code == -32601
        with pytest.raises(RpcFailure) as info:
            client.request("session/prompt", {"prompt": "x"})
        assert info.value.code == -32602 and "sessionId" in info.value.message
        with pytest.raises(RpcFailure) as info:
            client.request("session/new", {"agentAlias": "ghost"})
        assert info.value.code == -32602
        with pytest.raises(RpcFailure) as info:
            client.request("session/prompt", {"sessionId": "no-such", "prompt": "x"})
        assert info.value.code == -32000


def test_a_client_that_leaves_mid_turn_does_not_stop_the_host(daemon: DaemonProc) -> None:
    leaver = daemon.client()
    sid = leaver.request("session/new")["sessionId"]
    leaver.send("session/prompt", {"sessionId": sid, "prompt": "going\n!sleep 30\ngone"})
    leaver.wait_update("agent_message_chunk")
    leaver.close()
    with daemon.client() as other:
        deadline = time.monotonic() + 15
        while True:  # the turn is cancelled, persisted, and the session becomes idle
            [entry] = [s for s in other.request("status")["sessions"] if s["sessionId"] == sid]
            if entry["state"] == "idle" and entry["turns"] == 1:
                break
            assert time.monotonic() < deadline, entry
            time.sleep(0.05)
        assert other.request("session/prompt", {"sessionId": sid, "prompt": "still here"}) \
            == {"sessionId": sid, "stopReason": "end_turn", "content": "still here"}
