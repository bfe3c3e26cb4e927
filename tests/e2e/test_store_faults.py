"""The session store becoming unwritable mid-run (issue 4: fault injection), over stdio.

A real ``zeroclaw acp`` host; the test makes its SQLite store unwritable by holding
an exclusive write lock on the file from a second connection (``BEGIN EXCLUSIVE``),
which works for any user, root included. The host's writer then gets SQLite's
"database is locked" after its busy timeout (5 s). The turn must fail with a clear
-32603, the host must keep serving meanwhile, and once the lock is gone the next
turn must succeed and be on disk. Runs on the test's main thread.
"""

from __future__ import annotations

import contextlib
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .conftest import RawHostFactory
from .rawclient import RawHost

#: The host's SQLite busy timeout is 5 s; the failed write answers after it.
FAILED_WRITE_TIMEOUT = 20.0
#: Requests that never touch the writer must not wait for the stuck write.
SERVED_WHILE_LOCKED_SECS = 2.0


def store_path(config_dir: Path) -> Path:
    return config_dir / "data" / "sessions" / "acp-sessions.db"


@contextlib.contextmanager
def exclusive_lock(db_path: Path) -> Iterator[None]:
    """Hold SQLite's write lock on ``db_path`` (other writers get "database is locked")."""
    db = sqlite3.connect(db_path, timeout=10, isolation_level=None)
    try:
        db.execute("BEGIN EXCLUSIVE")
        yield
        db.execute("ROLLBACK")
    finally:
        db.close()


def prompt(host: RawHost, sid: str, text: str) -> int:
    """Send a ``session/prompt`` without waiting; its request id."""
    req_id = host.new_id()
    host.send({"jsonrpc": "2.0", "id": req_id, "method": "session/prompt",
               "params": {"sessionId": sid, "prompt": text}})
    return req_id


def wait_responses(host: RawHost, ids: set[int], timeout: float,
                   found: dict[int, dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """Until ``found`` (responses by id, in any order) holds the responses to ``ids``."""
    deadline = time.monotonic() + timeout
    while not ids <= found.keys():
        frame = host.next_response(max(0.01, deadline - time.monotonic()))
        found[frame["id"]] = frame
    return found


def wait_agent_text(host: RawHost, sid: str, text: str, timeout: float = 10.0) -> None:
    """Until an ``agent_message_chunk`` of ``sid`` carrying ``text`` has arrived."""
    deadline = time.monotonic() + timeout
    while not any(
        n["params"].get("sessionId") == sid
        and n["params"]["update"].get("sessionUpdate") == "agent_message_chunk"
        and text in n["params"]["update"]["content"]["text"]
        for n in host.notifications if n.get("method") == "session/update"
    ):
        frame = host.next_frame(max(0.01, deadline - time.monotonic()))
        assert "method" in frame, f"unexpected response {frame}"
        (host.notifications if "id" not in frame else host.host_requests).append(frame)


def replayed_user_turns(host: RawHost, sid: str, cwd: Path) -> list[str]:
    """``session/load`` on ``host``: the user text of each replayed turn."""
    mark = len(host.notifications)
    host.call("session/load", {"sessionId": sid, "cwd": str(cwd), "mcpServers": []})
    turns: list[str] = []
    previous = ""
    for note in host.notifications[mark:]:
        update = note["params"]["update"]
        kind = update["sessionUpdate"]
        if kind == "user_message_chunk":
            if previous != kind:
                turns.append("")
            turns[-1] += update["content"]["text"]
        previous = kind
    return [turn.strip() for turn in turns]


def assert_turn_ok(host: RawHost, sid: str, text: str) -> None:
    result = host.call("session/prompt", {"sessionId": sid, "prompt": text})
    assert result["stopReason"] == "end_turn"
    assert result["content"] == text


def test_locked_store_fails_the_turn_clearly_and_the_host_recovers(
    raw_hosts: RawHostFactory, config_dir: Path, workspace: Path
) -> None:
    before = ["first stored turn", "second stored turn"]
    host = raw_hosts()
    host.initialize()
    sid = host.new_session(workspace)
    for text in before:
        assert_turn_ok(host, sid, text)

    with exclusive_lock(store_path(config_dir)):
        started = time.monotonic()
        failing = prompt(host, sid, "turn while the store is locked")
        wait_agent_text(host, sid, "locked")  # the turn ran; its write is now stuck
        asked = {host.new_id(): "status", host.new_id(): "session/list"}
        for req_id, method in asked.items():
            host.send({"jsonrpc": "2.0", "id": req_id, "method": method, "params": {}})
        answers: dict[int, dict[str, Any]] = {}
        wait_responses(host, set(asked), SERVED_WHILE_LOCKED_SECS, answers)
        assert failing not in answers, "the stuck write was answered before status"
        assert all("result" in answers[i] for i in asked), answers
        listed = answers[next(i for i, m in asked.items() if m == "session/list")]["result"]
        assert sid in [s["sessionId"] for s in listed["sessions"]]
        failed = wait_responses(host, {failing}, FAILED_WRITE_TIMEOUT, answers)[failing]
        elapsed = time.monotonic() - started
    error = failed.get("error")
    assert error is not None, f"the turn succeeded although nothing could be stored: {failed}"
    assert error["code"] == -32603
    assert "store write failed" in error["message"] and "locked" in error["message"], error
    assert elapsed < FAILED_WRITE_TIMEOUT

    assert_turn_ok(host, sid, "after the lock was released")
    host.close()
    assert not host.problems, host.problems

    second = raw_hosts()
    second.initialize()
    assert replayed_user_turns(second, sid, workspace) == [
        *before, "after the lock was released"]


def test_locked_store_at_session_new_fails_clearly_and_recovers(
    raw_hosts: RawHostFactory, config_dir: Path, workspace: Path
) -> None:
    host = raw_hosts()
    host.initialize()
    host.new_session(workspace)  # the store exists and is in use
    with exclusive_lock(store_path(config_dir)):
        response = host.request("session/new", {"cwd": str(workspace), "mcpServers": []},
                                timeout=FAILED_WRITE_TIMEOUT)
    error = response.get("error")
    assert error is not None, f"a session was created that is not on disk: {response}"
    assert error["code"] == -32603 and "store write failed" in error["message"], error
    sid = host.new_session(workspace)
    assert_turn_ok(host, sid, "the store works again")
    host.close()
    second = raw_hosts()
    second.initialize()
    assert replayed_user_turns(second, sid, workspace) == ["the store works again"]
