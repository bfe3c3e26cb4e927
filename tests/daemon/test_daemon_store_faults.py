"""The session store becoming full mid-run under ``zeroclaw daemon`` (issue 4).

The RPC dialect queues prompts per session and ends each turn with a
``turn_complete`` update. While the disk is full (for the daemon process only,
see :mod:`tests.e2e.faults`) every turn must end ``failed`` with the store's
reason and its prompt answered -32603, including the prompts queued behind it
and the turns of several sessions ending together (one group commit); none
counts as completed. Once the disk has room again the same sessions go on, and
the store holds every completed turn.

Also: a daemon started on a full disk serves sessions in memory and says so
on both sockets, and a daemon whose store file is deleted refuses every write
until it is restarted. Runs on the test's main thread.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.e2e.faults import (
    UNWRITABLE_MESSAGE,
    assert_store_intact,
    file_size_limit,
    full_disk_for_new_processes,
    store_path,
    stored_user_turns,
)
from tests.e2e.test_store_faults import NO_STORE, STORE_GONE, delete_store_files

from .helpers import FRAME_TIMEOUT, DaemonProc, RpcClient, RpcFailure

Daemons = Callable[..., DaemonProc]
SESSIONS = 3
QUEUED = 2  # prompts per session sent at once while the disk is full


def wait_responses(client: RpcClient, ids: list[int]) -> dict[int, dict[str, Any]]:
    """The responses to ``ids``, which may arrive in any order."""
    deadline = time.monotonic() + FRAME_TIMEOUT
    found: dict[int, dict[str, Any]] = {}
    while not set(ids) <= found.keys():
        frame = client.read_frame(max(0.01, deadline - time.monotonic()))
        if "id" in frame and "method" not in frame:
            found[frame["id"]] = frame
    return found


def turn_outcomes(client: RpcClient, sid: str) -> list[tuple[str, str]]:
    """``(outcome, content)`` of each ``turn_complete`` of ``sid`` so far."""
    return [(u["outcome"], u["content"]) for u in client.updates()
            if u["sessionId"] == sid and u["type"] == "turn_complete"]


def test_full_store_fails_every_queued_turn_clearly_and_the_daemon_recovers(
    daemons: Daemons,
) -> None:
    daemon = daemons()
    with daemon.client() as client:
        sids = [client.request("session/new", {"keep_siblings": True})["sessionId"]
                for _ in range(SESSIONS)]
        for sid in sids:
            client.request("session/prompt", {"sessionId": sid, "prompt": "stored"})

        with file_size_limit(daemon.pid, store_path(daemon.config_dir)):
            asked = [client.send("session/prompt", {"sessionId": sid, "prompt": f"lost {n}"})
                     for n in range(QUEUED) for sid in sids]
            responses = wait_responses(client, [i for i in asked if i is not None])
            entries = client.request("status")["sessions"]

        failed = {"code": -32603, "message": UNWRITABLE_MESSAGE}
        assert [r.get("error") for r in responses.values()] == [failed] * len(asked), responses
        for sid in sids:
            assert turn_outcomes(client, sid) == [("completed", "stored")] + [
                ("failed", UNWRITABLE_MESSAGE)] * QUEUED
        # a session whose turn was not stored leaves memory (its agent must forget the
        # turn): each queued prompt restored it from the store, and it left again
        assert entries == []

        for sid in sids:
            result = client.request("session/prompt", {"sessionId": sid, "prompt": "after"})
            assert result["stopReason"] == "end_turn"
    assert daemon.terminate() == 0
    assert_store_intact(store_path(daemon.config_dir))
    for sid in sids:
        assert stored_user_turns(daemon.config_dir, sid) == ["stored", "after"]


def error_of(client: RpcClient, method: str, params: dict[str, Any]) -> dict[str, Any]:
    """The error ``method`` answers (it must fail)."""
    try:
        client.request(method, params)
    except RpcFailure as failure:
        return {"code": failure.code, "message": failure.message}
    raise AssertionError(f"{method} succeeded")


def test_daemon_on_a_full_disk_serves_in_memory_and_says_so(daemons: Daemons) -> None:
    with full_disk_for_new_processes():
        daemon = daemons(wait=False)
    daemon.wait_listening()
    with daemon.client() as ops:
        store = ops.request("status")["store"]
        assert store["persistent"] is False
        sid = ops.request("session/new", {"keep_siblings": True})["sessionId"]
        result = ops.request("session/prompt", {"sessionId": sid, "prompt": "in memory"})
        assert result["content"] == "in memory"
    with RpcClient(daemon.socket_path.parent / "acp.sock") as editor:
        caps = editor.request("initialize", {"protocolVersion": 1})["agentCapabilities"]
        assert caps["loadSession"] is False and caps["sessionCapabilities"] == {}
        for method in ("session/load", "session/list"):
            assert error_of(editor, method, {"sessionId": sid}) == NO_STORE, method
    assert daemon.terminate() == 0


def test_daemon_store_deleted_fails_writes_until_a_restart(daemons: Daemons) -> None:
    daemon = daemons()
    with daemon.client() as client:
        sid = client.request("session/new", {"keep_siblings": True})["sessionId"]
        client.request("session/prompt", {"sessionId": sid, "prompt": "stored"})
        delete_store_files(store_path(daemon.config_dir))
        assert error_of(client, "session/prompt", {"sessionId": sid, "prompt": "lost"}) \
            == STORE_GONE
        assert error_of(client, "session/new", {"keep_siblings": True}) == STORE_GONE
    assert daemon.terminate() == 0

    restarted = daemons(daemon.config_dir)
    with restarted.client() as client:
        kept = client.request("session/new", {"keep_siblings": True})["sessionId"]
        client.request("session/prompt", {"sessionId": kept, "prompt": "new store"})
    assert restarted.terminate() == 0
    assert stored_user_turns(restarted.config_dir, kept) == ["new store"]


def test_store_the_probe_passes_but_sqlite_refuses_is_advertised_once_known(
    daemons: Daemons, scratch_dir: Path
) -> None:
    """A file with SQLite's header and garbage after it passes the cheap probe at
    start; once the host has opened (and refused) it, ``initialize`` says so."""
    corrupt = b"SQLite format 3\x00" + b"\xff" * 4080
    store_path(scratch_dir).parent.mkdir(parents=True)
    store_path(scratch_dir).write_bytes(corrupt)
    daemon = daemons(scratch_dir)
    with daemon.client() as ops:
        assert ops.request("status")["store"]["persistent"] is False  # the host is up
    with RpcClient(daemon.socket_path.parent / "acp.sock") as editor:
        caps = editor.request("initialize", {"protocolVersion": 1})["agentCapabilities"]
        assert caps["loadSession"] is False and caps["sessionCapabilities"] == {}
        assert error_of(editor, "session/list", {}) == NO_STORE
    assert daemon.terminate() == 0
    assert store_path(scratch_dir).read_bytes() == corrupt  # left alone
