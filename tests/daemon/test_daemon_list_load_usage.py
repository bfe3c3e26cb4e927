"""``session/list``, ``session/load`` and usage totals on ``daemon.sock``, and the host's
slash commands in the daemon dialect, against a real daemon."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from storage.store import StoreReader

from .helpers import DaemonProc, RpcFailure, zeroclaw_argv

Daemons = Callable[..., DaemonProc]


def _stored_tokens(daemon: DaemonProc) -> dict[str, tuple[int, int]]:
    """``{sessionId: (token_count, turn_count)}`` as the store holds them."""
    reader = StoreReader(daemon.config_dir / "data" / "sessions" / "acp-sessions.db")
    try:
        rows, _ = reader.list_sessions()
        return {row.id: (row.token_count, row.turn_count) for row in rows}
    finally:
        reader.close()


def test_list_pages_stored_sessions_newest_first(daemons: Daemons, tmp_path: Path) -> None:
    daemon = daemons()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    with daemon.client() as client:
        first = client.request("session/new", {"keep_siblings": True})["sessionId"]
        client.request("session/prompt", {"sessionId": first, "prompt": "first words"})
        second = client.request("session/new", {"keep_siblings": True,
                                                "cwd": str(elsewhere)})["sessionId"]
        client.request("session/close", {"sessionId": second})
        listed = client.request("session/list")
        assert "nextCursor" not in listed
        assert [s["sessionId"] for s in listed["sessions"]] == [second, first]
        older = listed["sessions"][1]
        stored = _stored_tokens(daemon)[first]
        assert older["agentAlias"] == "default" and older["turns"] == 1
        assert older["usage"] == {"totalTokens": stored[0]} and stored[0] > 0
        assert older["title"] == "first words" and older["closed"] is False
        assert older["updatedAt"].endswith("Z")
        assert listed["sessions"][0]["closed"] is True
        filtered = client.request("session/list", {"cwd": str(elsewhere.resolve())})
        assert [s["sessionId"] for s in filtered["sessions"]] == [second]
        for bad in ({"cwd": "relative/dir"}, {"cursor": "not-a-cursor"}):
            with pytest.raises(RpcFailure) as info:
                client.request("session/list", bad)
            assert info.value.code == -32602


def test_list_pages_through_a_cursor(daemons: Daemons) -> None:
    daemon = daemons()
    with daemon.client() as client:
        created = {client.request("session/new")["sessionId"] for _ in range(101)}
        first = client.request("session/list")
        assert len(first["sessions"]) == 100 and first["nextCursor"]
        rest = client.request("session/list", {"cursor": first["nextCursor"]})
        assert len(rest["sessions"]) == 1 and "nextCursor" not in rest
        assert {s["sessionId"] for s in first["sessions"] + rest["sessions"]} == created


def test_load_replays_flat_updates_and_makes_the_connection_a_holder(daemons: Daemons) -> None:
    daemon = daemons()
    with daemon.client() as first:
        sid = first.request("session/new")["sessionId"]
        first.request("session/prompt", {"sessionId": sid,
                                         "prompt": "!think deep thought\nspoken reply"})
    with daemon.client() as second, daemon.client() as third:
        result = second.request("session/load", {"sessionId": sid})
        assert result["sessionId"] == sid and result["agentAlias"] == "default"
        assert result["mode"] == "supervised" and result["workspaceDir"]
        replay = [(u["type"], u.get("text")) for u in second.updates()]
        assert all("update" not in u and u["sessionId"] == sid for u in second.updates())
        assert replay[0] == ("user_message_chunk", "!think deep thought\nspoken reply")
        assert ("agent_thought_chunk", "deep thought") in replay
        assert "".join(t or "" for k, t in replay if k == "agent_message_chunk") \
            == "spoken reply"
        answer = next(i for i, f in enumerate(second.frames) if f.get("result") == result)
        assert all(i < answer for i, f in enumerate(second.frames) if f.get("method"))
        [entry] = [s for s in second.request("status")["sessions"] if s["sessionId"] == sid]
        assert entry["clients"] == 1
        with pytest.raises(RpcFailure) as info:  # the loader holds it now
            third.request("session/prompt", {"sessionId": sid, "prompt": "mine?"})
        assert info.value.code == -32003
        out = second.request("session/prompt", {"sessionId": sid, "prompt": "go on"})
        assert out["content"] == "go on"
        with pytest.raises(RpcFailure) as info:
            second.request("session/load", {"sessionId": "5d1e1f52-0000-4000-8000-000000000000"})
        assert info.value.code == -32000


def test_usage_per_session_and_for_the_host(daemons: Daemons) -> None:
    daemon = daemons()
    with daemon.client() as client:
        sid = client.request("session/new", {"keep_siblings": True})["sessionId"]
        other = client.request("session/new", {"keep_siblings": True})["sessionId"]
        status = client.request("status")
        assert status["usage"] == {"totalTokens": 0, "turns": 0}
        client.request("session/prompt", {"sessionId": sid, "prompt": "one two three four"})
        client.request("session/prompt", {"sessionId": other, "prompt": "five"})
        client.request("session/prompt", {"sessionId": sid, "prompt": "/help"})
        stored = _stored_tokens(daemon)
        status = client.request("status")
        entries = {s["sessionId"]: s for s in status["sessions"]}
        for session in (sid, other):
            assert entries[session]["usage"] == {"totalTokens": stored[session][0]}
        assert stored[sid][0] > stored[other][0] > 0
        assert status["usage"] == {"totalTokens": stored[sid][0] + stored[other][0],
                                   "turns": 3}
        table = subprocess.run(zeroclaw_argv("status", "--config-dir", str(daemon.config_dir)),
                               capture_output=True, text=True, timeout=30, env=daemon.env)
        assert table.returncode == 0, table.stderr
        assert f"usage: {status['usage']['totalTokens']} tokens in 3 turns" in table.stdout
        assert "TOKENS" in table.stdout
        row = next(line for line in table.stdout.splitlines() if line.startswith(sid))
        assert f" {stored[sid][0]} " in row
    before = status["usage"]
    assert daemon.terminate() == 0
    restarted = daemons(daemon.config_dir)
    with restarted.client() as client:
        assert client.request("status")["usage"] == before  # read back from the store


def test_slash_commands_on_the_daemon_socket(daemons: Daemons) -> None:
    daemon = daemons()
    with daemon.client() as client:
        sid = client.request("session/new")["sessionId"]
        out = client.request("session/prompt", {"sessionId": sid, "prompt": "/mode read_only"})
        assert out["stopReason"] == "end_turn" and "read_only" in out["content"]
        chunks = [u["text"] for u in client.updates() if u["type"] == "agent_message_chunk"]
        assert "".join(chunks) == out["content"]
        assert client.updates()[-1]["type"] == "turn_complete"
        [listed] = client.request("session/list")["sessions"]
        assert listed["sessionId"] == sid and listed["turns"] == 1  # stored as a turn
        out = client.request("session/prompt", {
            "sessionId": sid, "prompt": '!tool file_write {"path": "x", "content": "y"}'})
        assert "autonomy is read_only" in json.dumps(
            [u for u in client.updates() if u["type"] == "tool_result"])
