"""Fault injection on a real daemon (issue 4): a client that goes away while an approval
waits (``daemon.sock`` and ``acp.sock``), an approval nobody answers, and idle eviction
seen by ``zeroclaw status --json`` followed by a transparent restore.

Every wait is on something observable (a frame, ``status``, the store); the store is
read the way the host reads it. Runs on the test's main thread.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from ipc.events import TextItem, ToolItem
from supervisor.cli.status_cmd import EXIT_DEGRADED, EXIT_OK
from tests.e2e.helpers import (
    CANCEL_MARKER,
    assert_denied_and_cancelled,
    sdk_updates,
    split_turns,
    stored_session,
    tool,
    tool_result_text,
)
from tests.e2e.procs import write_config

from .helpers import DaemonProc, RpcClient, short_dir, wait_session_idle
from .test_status_cmd import _status as status_command

Daemons = Callable[..., DaemonProc]
#: A request from another client is answered this fast although an approval waits.
SERVED_WITHIN = 5.0


@pytest.fixture
def workspace() -> Iterator[Path]:
    path = short_dir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def config_dir() -> Iterator[Path]:
    path = short_dir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


def asking_prompt(workspace: Path) -> tuple[str, Path]:
    """A prompt whose tool call needs approval and whose turn runs on until cancelled;
    and the file the tool would write."""
    target = workspace / "never.txt"
    return tool("file_write", {"path": target.name, "content": "no"}) + "\n!sleep 30", target


def start_kept_and_asking_turns(client: RpcClient, workspace: Path) -> tuple[str, Path]:
    """A session with one completed turn and a second one waiting for approval."""
    sid = client.request("session/new", {"cwd": str(workspace)})["sessionId"]
    assert client.request("session/prompt", {"sessionId": sid, "prompt": "kept one"})[
        "stopReason"] == "end_turn"
    prompt, target = asking_prompt(workspace)
    client.send("session/prompt", {"sessionId": sid, "prompt": prompt})
    return sid, target


def wait_request(client: RpcClient, method: str) -> dict[str, Any]:
    """The next request of ``method`` the daemon sends this client."""
    while True:
        frame = client.read_frame()
        if frame.get("method") == method and "id" in frame:
            return frame


# --- (e) a client goes away while an approval waits -------------------------------------------


def test_rpc_client_gone_during_an_approval(daemons: Daemons, workspace: Path) -> None:
    daemon = daemons()
    with daemon.client() as other:
        own = other.request("session/new")["sessionId"]
        leaver = daemon.client()
        sid, target = start_kept_and_asking_turns(leaver, workspace)
        leaver.wait_update("approval_request")
        leaver.close()
        started = time.monotonic()
        assert other.request("session/prompt", {"sessionId": own, "prompt": "served"})[
            "content"] == "served"
        assert time.monotonic() - started < SERVED_WITHIN
        wait_session_idle(other, sid, turns=2)  # the waiting turn ended and was kept
        assert not target.exists(), "the tool ran although nobody approved it"
        assert_denied_and_cancelled(daemon.config_dir, sid, turns=2)
        assert other.request("session/prompt", {"sessionId": sid, "prompt": "usable again"}) \
            == {"sessionId": sid, "stopReason": "end_turn", "content": "usable again"}


def test_acp_socket_client_gone_during_a_permission_request(
    daemons: Daemons, workspace: Path
) -> None:
    daemon = daemons()
    acp_path = daemon.socket_path.parent / "acp.sock"
    leaver = RpcClient(acp_path)
    sid, target = start_kept_and_asking_turns(leaver, workspace)
    ask = wait_request(leaver, "session/request_permission")
    assert ask["params"]["sessionId"] == sid
    leaver.close()
    with RpcClient(acp_path) as editor:
        wait_session_idle(editor, sid, turns=2)
        assert not target.exists(), "the tool ran although nobody allowed it"
        assert_denied_and_cancelled(daemon.config_dir, sid, turns=2)
        editor.request("session/load", {"sessionId": sid, "cwd": str(workspace)})
        kept, interrupted = split_turns(sdk_updates(editor.updates()))
        assert (kept.user, kept.agent) == ("kept one", "kept one")
        assert interrupted.agent.endswith(CANCEL_MARKER)
        [updates] = interrupted.tools.values()
        assert updates[-1].status == "failed" and "denied" in tool_result_text(updates)
        assert editor.request("session/prompt", {"sessionId": sid, "prompt": "usable again"})[
            "content"] == "usable again"


# --- (f) nobody answers an approval -------------------------------------------------------------


def test_unanswered_approval_times_out_as_denied_and_is_kept(
    daemons: Daemons, config_dir: Path, workspace: Path
) -> None:
    write_config(config_dir, "[acp]\nsession_timeout_secs = 2\n")
    daemon = daemons(config_dir)
    target = workspace / "late.txt"
    with daemon.client() as client:
        sid = client.request("session/new", {"cwd": str(workspace)})["sessionId"]
        started = time.monotonic()
        prompt_id = client.send("session/prompt", {"sessionId": sid, "prompt": tool(
            "file_write", {"path": target.name, "content": "no"}) + "\ngoes on"})
        assert prompt_id is not None
        assert client.wait_update("approval_request")["timeoutSecs"] == 2
        response = client.wait_response(prompt_id)
        assert time.monotonic() - started >= 1.5, "denied before the timeout"
        assert response["result"] == {"sessionId": sid, "stopReason": "end_turn",
                                      "content": "goes on"}
        [result] = [u for u in client.updates() if u["type"] == "tool_result"]
        assert result["status"] == "failed" and "denied" in json.dumps(result["rawOutput"])
    assert not target.exists()
    session, items = stored_session(config_dir, sid)
    assert session is not None and session.turn_count == 1
    assert [i.outcome for i in items if isinstance(i, ToolItem)] == ["denied"]


# --- (g) idle eviction, seen by ``zeroclaw status --json``, then a restore ----------------------


def live_in_status_json(daemon: DaemonProc) -> set[str]:
    """The live sessions ``zeroclaw status --json`` prints (the ops tool, its own process)."""
    done = status_command(daemon, "--json")
    assert done.returncode in (EXIT_OK, EXIT_DEGRADED), done.stderr
    return {s["sessionId"] for s in json.loads(done.stdout)["sessions"]}


def test_idle_eviction_seen_by_status_then_a_prompt_restores_it(
    daemons: Daemons, config_dir: Path
) -> None:
    write_config(config_dir, "[acp]\nsession_timeout_secs = 2\n")
    daemon = daemons(config_dir)
    earlier = ["first words kept", "second words kept"]
    with daemon.client() as client:
        sid = client.request("session/new")["sessionId"]
        for text in earlier:
            client.request("session/prompt", {"sessionId": sid, "prompt": text})
        deadline = time.monotonic() + 15
        while sid in live_in_status_json(daemon):
            assert time.monotonic() < deadline, "the idle session was never evicted"
        assert client.request("session/prompt", {"sessionId": sid, "prompt": "back again"}) \
            == {"sessionId": sid, "stopReason": "end_turn", "content": "back again"}
        [entry] = [s for s in client.request("status")["sessions"] if s["sessionId"] == sid]
        assert entry["turns"] == 3, "the restored session lost its earlier turns"
    _, items = stored_session(config_dir, sid)
    users = [i.text for i in items if isinstance(i, TextItem) and i.role == "user"]
    assert users == [*earlier, "back again"]
