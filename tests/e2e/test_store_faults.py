"""The session store becoming unwritable mid-run (issue 4: fault injection), over stdio.

A real ``zeroclaw acp`` host whose SQLite store the test makes unwritable
(:mod:`tests.e2e.faults`): locked by another connection, full (the host's file
size limit), or read-only (immutable files). Each turn or ``session/new`` that
needs a write must fail with a clear -32603 and leave nothing half-written; the
host must keep serving meanwhile, and once writing works again the next turn
must succeed and be on disk, next to every turn completed before the fault.

Also: a disk full from the start (in-memory sessions, advertised as such, the
store's methods answering -32000) and the store's file deleted while the host
runs (every write refused, loudly, until a restart makes a new store).
Runs on the test's main thread.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import pytest

from .conftest import RawHostFactory
from .faults import (
    UNWRITABLE_MESSAGE,
    assert_store_intact,
    exclusive_lock,
    file_size_limit,
    full_disk_for_new_processes,
    immutable_files,
    immutable_unsupported,
    lift_file_size_limit,
    store_path,
    stored_user_turns,
)
from .helpers import tool
from .rawclient import RawHost

#: The host's SQLite busy timeout is 5 s; the failed write answers after it.
FAILED_WRITE_TIMEOUT = 20.0
#: Requests that never touch the writer must not wait for the stuck write.
SERVED_WHILE_LOCKED_SECS = 2.0
#: A write refused by a full or read-only disk is answered without the lock's 5 s wait.
REFUSED_WRITE_SECS = 4.0

#: ``fault(host pid, store path)``: the store stays unwritable inside the ``with``.
Fault = Callable[[int, Path], AbstractContextManager[None]]


@pytest.fixture(params=["full", "read-only"])
def unwritable(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Fault]:
    """Each way to make the store unwritable without waiting (the lock waits 5 s)."""
    if request.param == "full":
        yield file_size_limit
        return
    reason = immutable_unsupported(tmp_path)
    if reason is not None:
        pytest.skip(f"cannot make the store read-only here: {reason}")
    yield lambda _pid, db_path: immutable_files(db_path)


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


def assert_write_failed(host: RawHost, method: str, params: dict[str, Any]) -> None:
    """``method`` answers the clear -32603 of a write refused by the unwritable store."""
    response = host.request(method, params, timeout=REFUSED_WRITE_SECS)
    assert "result" not in response, f"answered as done although nothing was stored: {response}"
    assert response["error"] == {"code": -32603, "message": UNWRITABLE_MESSAGE}, response


def listed_ids(host: RawHost) -> set[str]:
    """The ids ``session/list`` returns (what the store holds)."""
    return {s["sessionId"] for s in host.call("session/list", {})["sessions"]}


def live_turns(host: RawHost) -> dict[str, int]:
    """From ``status``: each session the host has admitted, and its completed turns."""
    return {s["sessionId"]: s["turns"] for s in host.call("status", {})["sessions"]}


def announced_titles(host: RawHost) -> list[tuple[str, str]]:
    """``(sessionId, title)`` of each ``session_info_update`` received so far."""
    return [(n["params"]["sessionId"], n["params"]["update"]["title"])
            for n in host.notifications if n.get("method") == "session/update"
            and n["params"]["update"]["sessionUpdate"] == "session_info_update"]


def context_used(host: RawHost, sid: str, text: str) -> int:
    """Run a turn that must succeed; the context size its last usage update reports
    (the echo agent counts the whole conversation it remembers)."""
    mark = len(host.notifications)
    assert_turn_ok(host, sid, text)
    usages = [n["params"]["update"]["used"] for n in host.notifications[mark:]
              if n["params"].get("sessionId") == sid
              and n["params"]["update"].get("sessionUpdate") == "usage_update"]
    assert usages, f"no usage_update for {text!r}"
    return int(usages[-1])


def test_unwritable_store_fails_turns_clearly_and_the_host_recovers(
    raw_hosts: RawHostFactory, config_dir: Path, workspace: Path, unwritable: Fault
) -> None:
    before = ["first stored turn", "second stored turn"]
    host = raw_hosts()
    host.initialize()
    sid, control = host.new_session(workspace), host.new_session(workspace)
    for text in before:
        assert_turn_ok(host, sid, text)
        assert_turn_ok(host, control, text)

    with unwritable(host.pid, store_path(config_dir)):
        for text in ("a lost turn", "another lost turn"):  # it stays broken: each write fails
            assert_write_failed(host, "session/prompt", {"sessionId": sid, "prompt": text})
        assert listed_ids(host) == {sid, control}  # the host keeps serving
        # a turn not stored is not completed, and the agent forgets it: the session
        # leaves memory, to be restored from the store by the next prompt
        assert live_turns(host) == {control: 2}
    assert stored_user_turns(config_dir, sid) == before

    after = [*before, "after the fault", "and one more"]
    # the writer, its transaction and the WAL work again; the agent's context holds
    # exactly the stored turns, as the control session's (same turns, no fault) does
    assert context_used(host, sid, after[2]) == context_used(host, control, after[2])
    assert_turn_ok(host, sid, after[3])
    assert stored_user_turns(config_dir, sid) == after
    host.close()
    assert not host.problems, host.problems
    assert_store_intact(store_path(config_dir))

    second = raw_hosts()
    second.initialize()
    assert replayed_user_turns(second, sid, workspace) == after


def test_unwritable_store_at_session_new_fails_clearly_and_recovers(
    raw_hosts: RawHostFactory, config_dir: Path, workspace: Path, unwritable: Fault
) -> None:
    host = raw_hosts()
    host.initialize()
    kept = host.new_session(workspace)  # no turn yet
    new_session = {"cwd": str(workspace), "mcpServers": []}
    with unwritable(host.pid, store_path(config_dir)):
        for _ in range(2):
            assert_write_failed(host, "session/new", new_session)
        assert_write_failed(host, "session/prompt",
                            {"sessionId": kept, "prompt": "a lost first turn"})
        # nothing half-written: neither stored nor admitted, no title for a lost turn;
        # the session whose turn was lost left memory (the next prompt restores it)
        assert listed_ids(host) == {kept}
        assert live_turns(host) == {}
    assert stored_user_turns(config_dir, kept) == []
    assert announced_titles(host) == []

    created = host.new_session(workspace)
    assert_turn_ok(host, kept, "first stored turn")
    assert_turn_ok(host, created, "a new session's turn")
    assert announced_titles(host) == [(kept, "first stored turn"),
                                      (created, "a new session's turn")]
    host.close()
    second = raw_hosts()
    second.initialize()
    assert listed_ids(second) == {kept, created}
    assert replayed_user_turns(second, kept, workspace) == ["first stored turn"]


def test_unwritable_store_at_session_load_fails_clearly_and_a_retry_loads(
    raw_hosts: RawHostFactory, config_dir: Path, workspace: Path, unwritable: Fault
) -> None:
    first = raw_hosts()
    first.initialize()
    sid = first.new_session(workspace)
    assert_turn_ok(first, sid, "stored before")
    first.close()

    host = raw_hosts()
    host.initialize()
    assert listed_ids(host) == {sid}  # the host has opened its store
    load = {"sessionId": sid, "cwd": str(workspace), "mcpServers": []}
    with unwritable(host.pid, store_path(config_dir)):
        assert_write_failed(host, "session/load", load)
        assert live_turns(host) == {}, "a session whose load failed was left admitted"
    assert replayed_user_turns(host, sid, workspace) == ["stored before"]
    assert_turn_ok(host, sid, "after the fault")
    host.close()
    assert stored_user_turns(config_dir, sid) == ["stored before", "after the fault"]


def test_unwritable_store_at_set_mode_leaves_the_mode_unchanged(
    raw_hosts: RawHostFactory, config_dir: Path, workspace: Path, unwritable: Fault
) -> None:
    host = raw_hosts()
    host.initialize()
    sid = host.new_session(workspace)  # supervised: a mutating tool asks first
    with unwritable(host.pid, store_path(config_dir)):
        assert_write_failed(host, "session/set_mode", {"sessionId": sid, "modeId": "full"})
    asked = prompt(host, sid, tool("file_write", {"path": "unasked.txt", "content": "x"}))
    frame = host.next_frame()
    while frame.get("method") == "session/update":
        frame = host.next_frame()
    assert frame.get("method") == "session/request_permission", f"ran unasked: {frame}"
    host.send({"jsonrpc": "2.0", "id": frame["id"],
               "result": {"outcome": {"outcome": "cancelled"}}})
    assert "result" in wait_responses(host, {asked}, REFUSED_WRITE_SECS, {})[asked]
    assert not (workspace / "unasked.txt").exists()


def test_unwritable_store_at_session_close_leaves_the_session_live(
    raw_hosts: RawHostFactory, config_dir: Path, workspace: Path, unwritable: Fault
) -> None:
    host = raw_hosts()
    host.initialize()
    sid = host.new_session(workspace)
    assert_turn_ok(host, sid, "before the fault")
    close = {"sessionId": sid}
    with unwritable(host.pid, store_path(config_dir)):
        assert_write_failed(host, "session/close", close)
        assert live_turns(host) == {sid: 1}  # refused: nothing changed
    assert_turn_ok(host, sid, "still open")
    assert host.call("session/close", close) == {}
    assert live_turns(host) == {}
    host.close()
    second = raw_hosts()
    second.initialize()
    refused = second.request("session/prompt", {"sessionId": sid, "prompt": "closed?"})
    assert refused["error"]["code"] == -32000  # closed for good: not restored


#: What ``session/load``, ``resume``, ``list``, ``close`` and ``delete`` answer without a store.
NO_STORE = {"code": -32000, "message": "Session not found: the session store is not available "
                                        "(sessions are kept in memory only)"}


def assert_store_methods_refused(host: RawHost, sid: str, cwd: Path) -> None:
    """Every method whose capability is only advertised with a store answers -32000."""
    restore = {"sessionId": sid, "cwd": str(cwd), "mcpServers": []}
    for method, params in (("session/load", restore), ("session/resume", restore),
                           ("session/list", {}), ("session/close", {"sessionId": sid}),
                           ("session/delete", {"sessionId": sid})):
        response = host.request(method, params)
        assert response.get("error") == NO_STORE, (method, response)


def test_full_disk_at_start_means_in_memory_sessions_until_a_restart(
    raw_hosts: RawHostFactory, config_dir: Path, workspace: Path
) -> None:
    with full_disk_for_new_processes():
        host = raw_hosts()
    caps = host.initialize()["agentCapabilities"]
    assert caps["loadSession"] is False
    assert caps["sessionCapabilities"] == {}  # no list, resume, close, delete
    sid = host.new_session(workspace)
    assert_turn_ok(host, sid, "kept in memory")
    assert_store_methods_refused(host, sid, workspace)
    assert live_turns(host) == {sid: 1}  # refused: the live session is untouched

    lift_file_size_limit(host.pid)  # the disk has room again: the host goes on in memory
    assert_turn_ok(host, sid, "still in memory")
    assert_store_methods_refused(host, sid, workspace)
    host.close()
    assert not host.problems, host.problems

    second = raw_hosts()  # a restart uses the store
    caps = second.initialize()["agentCapabilities"]
    assert caps["loadSession"] is True
    assert set(caps["sessionCapabilities"]) == {"list", "resume", "close", "delete"}
    assert listed_ids(second) == set()  # the in-memory sessions ended with their host
    kept = second.new_session(workspace)
    assert_turn_ok(second, kept, "stored at last")
    second.close()
    assert stored_user_turns(config_dir, kept) == ["stored at last"]


@pytest.mark.parametrize("damage", ["garbage after the header", "a truncated store"])
def test_a_corrupt_store_is_not_advertised_even_for_the_first_initialize(
    raw_hosts: RawHostFactory, config_dir: Path, workspace: Path, damage: str
) -> None:
    """A file that starts like SQLite but is not a usable database (a copy cut short,
    a crash mid-write): the host runs with in-memory sessions, and the very first
    ``initialize``, answered before the host opens its store, already says so."""
    db_path = store_path(config_dir)
    if damage == "a truncated store":
        first = raw_hosts()
        first.initialize()
        assert_turn_ok(first, first.new_session(workspace), "soon cut short")
        first.close()
        db_path.write_bytes(db_path.read_bytes()[:100])  # the header, no schema page
        for side in db_path.parent.glob(f"{db_path.name}-*"):
            side.unlink()
    else:
        db_path.parent.mkdir(parents=True, exist_ok=True)
        db_path.write_bytes(b"SQLite format 3\x00" + bytes(range(256)) * 16)
    host = raw_hosts()
    caps = host.initialize()["agentCapabilities"]
    assert caps["loadSession"] is False
    assert caps["sessionCapabilities"] == {}
    sid = host.new_session(workspace)
    assert_turn_ok(host, sid, "kept in memory")
    assert_store_methods_refused(host, sid, workspace)
    assert host.initialize()["agentCapabilities"]["loadSession"] is False
    host.close()


#: What every write answers once the store's file was deleted under the running host.
STORE_GONE = {"code": -32603, "message": (
    "store write failed: the store file was deleted or replaced while zeroclaw was "
    "running; nothing more can be saved until zeroclaw is restarted")}


def delete_store_files(db_path: Path) -> None:
    """``rm acp-sessions.db*``: the store, its WAL and its shared-memory index."""
    for path in db_path.parent.glob(f"{db_path.name}*"):
        path.unlink()


def test_store_deleted_while_running_fails_every_write_loudly_until_a_restart(
    raw_hosts: RawHostFactory, config_dir: Path, workspace: Path
) -> None:
    host = raw_hosts()
    host.initialize()
    sid = host.new_session(workspace)
    assert_turn_ok(host, sid, "stored before the deletion")
    delete_store_files(store_path(config_dir))

    new_session = {"cwd": str(workspace), "mcpServers": []}
    for method, params in (("session/new", new_session),
                           ("session/prompt", {"sessionId": sid, "prompt": "lost"}),
                           ("session/new", new_session)):
        response = host.request(method, params)
        assert response.get("error") == STORE_GONE, (method, response)
    host.close()
    assert not host.problems, host.problems
    explained = f"session store {store_path(config_dir)}: the store file was deleted"
    assert host.stderr_path.read_text().count(explained) == 1  # logged once, not per write

    second = raw_hosts()  # a restart makes a new store
    second.initialize()
    assert listed_ids(second) == set()
    kept = second.new_session(workspace)
    assert_turn_ok(second, kept, "in the new store")
    second.close()
    assert stored_user_turns(config_dir, kept) == ["in the new store"]
