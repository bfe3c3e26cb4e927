"""Requests that arrive together: cancel, close, eviction and restore must not race.

Each case writes several frames in one ``write`` so the host sees them in the same
loop iteration, which is what a quick Esc in an editor or a scripted client does.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

import orjson

from .procs import host_argv, host_env, write_config
from .rawclient import RawHost


def frames(*messages: dict[str, Any]) -> bytes:
    return b"".join(orjson.dumps(m, option=orjson.OPT_APPEND_NEWLINE) for m in messages)


def responses(host: RawHost, count: int, timeout: float = 15) -> dict[Any, dict[str, Any]]:
    got = {}
    while len(got) < count:
        frame = host.next_response(timeout)
        got[frame["id"]] = frame
    return got


def prompt(req_id: int, sid: str, text: str) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": req_id, "method": "session/prompt",
            "params": {"sessionId": sid, "prompt": text}}


def test_cancel_right_behind_its_prompt_is_not_lost(raw_host: RawHost, workspace: Path) -> None:
    raw_host.initialize()
    sid = raw_host.new_session(workspace)
    started = time.monotonic()
    raw_host.send_bytes(frames(
        prompt(100, sid, "!sleep 20\nnever shown"),
        {"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": sid}},
    ))
    answer = responses(raw_host, 1)[100]
    assert answer["result"]["stopReason"] == "cancelled"
    assert time.monotonic() - started < 10
    assert raw_host.call("session/prompt", {"sessionId": sid, "prompt": "after"})["content"] == (
        "after")


def test_close_right_behind_a_prompt_answers_both(raw_host: RawHost, workspace: Path) -> None:
    raw_host.initialize()
    sid = raw_host.new_session(workspace)
    raw_host.send_bytes(frames(
        prompt(100, sid, "hello there"),
        {"jsonrpc": "2.0", "id": 101, "method": "session/close", "params": {"sessionId": sid}},
    ))
    got = responses(raw_host, 2)
    assert got[101]["result"] == {}
    assert got[100]["result"]["stopReason"] in ("end_turn", "cancelled")
    loaded = raw_host.call("session/load", {"sessionId": sid, "cwd": str(workspace)})
    assert "modes" in loaded


def request(req_id: int, method: str, sid: str) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": req_id, "method": method, "params": {"sessionId": sid}}


def test_a_prompt_right_behind_a_close_does_not_revive_the_session(
    raw_host: RawHost, workspace: Path
) -> None:
    """close, prompt, close in one write: the prompt finds the session closed (it is
    not restored behind the client's back) and the second close answers at once."""
    raw_host.initialize()
    sid = raw_host.new_session(workspace)
    started = time.monotonic()
    raw_host.send_bytes(frames(request(100, "session/close", sid), prompt(101, sid, "too late"),
                               request(102, "session/close", sid)))
    got = responses(raw_host, 3)
    assert time.monotonic() - started < 5  # no close waits on a confirmation it never gets
    assert got[100]["result"] == {}
    assert got[101]["error"]["code"] == -32000  # not restored behind the client's back
    # the second close came while the first was still storing: closed too, or not active
    assert got[102].get("result") == {} or got[102]["error"]["code"] == -32000
    assert raw_host.call("status", {})["sessions"] == []  # not live any more
    assert raw_host.call("session/list", {})["sessions"][0]["sessionId"] == sid  # kept


def test_requests_right_behind_a_delete_answer_not_found(
    raw_host: RawHost, workspace: Path
) -> None:
    raw_host.initialize()
    sid = raw_host.new_session(workspace)
    event = {"jsonrpc": "2.0", "id": 102, "method": "session/event",
             "params": {"sessionId": sid, "type": "note"}}
    raw_host.send_bytes(frames(request(100, "session/delete", sid), prompt(101, sid, "gone?"),
                               event, request(103, "session/resume", sid)))
    got = responses(raw_host, 4)
    assert got[100]["result"] == {}
    assert [got[i]["error"]["code"] for i in (101, 102, 103)] == [-32000] * 3
    assert raw_host.call("session/list", {})["sessions"] == []


def test_prompt_to_the_session_a_new_one_evicts_is_restored(
    raw_hosts: Any, config_dir: Path, workspace: Path
) -> None:
    write_config(config_dir, "[acp]\nmax_sessions = 2\n")
    host = raw_hosts()
    host.initialize()
    sessions = [host.new_session(workspace), host.new_session(workspace)]
    for n in range(20):
        oldest = sessions.pop(0)  # the least recently used: the next session/new evicts it
        host.send_bytes(frames(
            {"jsonrpc": "2.0", "id": 1000 + n, "method": "session/new",
             "params": {"cwd": str(workspace)}},
            prompt(2000 + n, oldest, f"still here {n}"),
        ))
        got = responses(host, 2)
        assert "error" not in got[2000 + n], got[2000 + n]
        assert got[2000 + n]["result"]["content"] == f"still here {n}"
        sessions += [got[1000 + n]["result"]["sessionId"], oldest]
        sessions = sessions[-2:]


def test_two_prompts_to_an_evicted_session_busy_not_invalid(
    raw_hosts: Any, config_dir: Path, workspace: Path
) -> None:
    write_config(config_dir, "[acp]\nmax_sessions = 1\n")
    host = raw_hosts()
    host.initialize()
    evicted = host.new_session(workspace)
    host.new_session(workspace)
    host.send_bytes(frames(prompt(100, evicted, "!sleep 1\nfirst"), prompt(101, evicted, "second")))
    got = responses(host, 2)
    assert got[100]["result"]["stopReason"] == "end_turn"
    assert got[101]["error"]["code"] == -32002


def test_a_turn_cut_off_by_a_vanished_client_is_kept(
    raw_hosts: Any, config_dir: Path, workspace: Path
) -> None:
    first = subprocess.Popen(host_argv(config_dir), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, env=host_env())
    assert first.stdin is not None and first.stdout is not None
    first.stdin.write(frames({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}},
                             {"jsonrpc": "2.0", "id": 2, "method": "session/new",
                              "params": {"cwd": str(workspace)}}))
    first.stdin.flush()
    sid = None
    while sid is None:
        frame = orjson.loads(first.stdout.readline())
        sid = frame.get("result", {}).get("sessionId") if frame.get("id") == 2 else None
    first.stdin.write(frames(prompt(3, sid, "kept one")))
    first.stdin.flush()
    while orjson.loads(first.stdout.readline()).get("id") != 3:
        pass
    first.stdin.write(frames(prompt(4, sid, "partial words\n!sleep 30")))
    first.stdin.flush()
    while b"partial" not in first.stdout.readline():
        pass
    first.stdout.close()  # the editor stops reading; the host's next write fails
    first.stdin.write(frames({"jsonrpc": "2.0", "id": 5, "method": "session/list", "params": {}}))
    first.stdin.close()
    assert first.wait(20) == 0
    second = raw_hosts()
    second.initialize()
    second.call("session/load", {"sessionId": sid, "cwd": str(workspace)})
    users = [n["params"]["update"]["content"]["text"] for n in second.notifications
             if n["params"]["update"]["sessionUpdate"] == "user_message_chunk"]
    assert users[0] == "kept one"
    assert users[1].startswith("partial words")
