"""The vendor tests' editor client (:mod:`tests.vendors.harness`) on agents of this repo:
the fixture agent spawned directly (its fs, terminal and permission requests answered
for real) and ``zeroclaw acp`` with its own echo agent, compared as the vendor tests do.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.procs import REPO_ROOT, host_argv, host_env

from .harness import EditorClient, Received, diff_records, normalised, said, streams

FIXTURE_AGENT = REPO_ROOT / "tests" / "fixtures" / "acp_fixture_agent.py"


@pytest.fixture
def clients() -> Iterator[list[EditorClient]]:
    started: list[EditorClient] = []
    yield started
    problems = [p for client in started for p in client.close()]
    assert not problems, "\n".join(problems)


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    path = tmp_path / "ws"
    path.mkdir()
    return Path(os.path.realpath(path))


def test_fixture_agent_requests_are_answered_for_real_and_recorded_in_order(
    clients: list[EditorClient], tmp_path: Path, workspace: Path
) -> None:
    agent = EditorClient.spawn([sys.executable, str(FIXTURE_AGENT)], env=host_env(),
                               cwd=workspace, stderr_path=tmp_path / "fixture.stderr")
    clients.append(agent)
    assert agent.initialize()["protocolVersion"] == 1
    sid = agent.new_session(workspace)
    source = workspace / "notes.txt"
    source.write_text("line one\n")
    agent.prompt(sid, f"read {source}")
    agent.prompt(sid, f"write {workspace / 'out.txt'} written")
    agent.prompt(sid, "term echo from-a-terminal; exit 3")
    agent.prompt(sid, "asks 2")
    assert (workspace / "out.txt").read_text() == "written"
    text = said(agent.records)
    assert "read: line one" in text
    assert "exit=3 output=from-a-terminal\n" in text
    assert "allowed 2" in text
    methods = [r.method for r in agent.requests()]
    assert methods == ["fs/read_text_file", "fs/write_text_file", "terminal/create",
                       "terminal/wait_for_exit", "terminal/output", "terminal/release",
                       "session/request_permission", "session/request_permission"]
    asks = agent.requests("session/request_permission")
    assert [a.chosen for a in asks] == ["yes", "yes"]
    assert [a.params["toolCall"]["toolCallId"] for a in asks] == ["t0", "t1"]


def test_zeroclaw_echo_agent_twice_compares_equal_apart_from_session_ids(
    clients: list[EditorClient], tmp_path: Path, workspace: Path
) -> None:
    runs = []
    for n in (1, 2):
        config = tmp_path / f"cfg{n}"
        config.mkdir()
        host = EditorClient.spawn(host_argv(config), env=host_env(), cwd=workspace,
                                  stderr_path=tmp_path / f"host{n}.stderr", label=f"host{n}")
        clients.append(host)
        host.initialize()
        sid = host.new_session(workspace)
        host.prompt(sid, "hello harness")
        assert "hello harness" in said(host.records)
        assert {r.params["sessionId"] for r in host.updates()} == {sid}
        runs.append([without_clock(r) for r in normalised(host.updates())])
    assert runs[0] == runs[1], diff_records(runs[0], runs[1], "first", "second")
    assert "agent_message_chunk" in [r["params"]["update"]["sessionUpdate"] for r in runs[0]]


def without_clock(record: dict[str, Any]) -> dict[str, Any]:
    """``record`` without a ``session_info_update``'s ``updatedAt`` (a wall clock time:
    two runs differ there by design)."""
    update = record["params"]["update"]
    if update.get("sessionUpdate") == "session_info_update":
        update.pop("updatedAt", None)
    return record


def test_normalised_drops_only_session_ids_and_meta_and_the_diff_shows_the_rest() -> None:
    update = {"sessionId": "a", "_meta": {"x": 1}, "update": {
        "sessionUpdate": "tool_call", "toolCallId": "c1", "_meta": {"claudeCode": {}},
        "content": [{"type": "diff", "path": "/p", "_meta": None, "sessionId": "kept"}]}}
    other = {"sessionId": "b", "update": {"sessionUpdate": "tool_call", "toolCallId": "c1",
                                          "content": [{"type": "content", "path": "/p",
                                                       "sessionId": "kept"}]}}
    [first] = normalised([Received("session/update", update)])
    assert first == {"method": "session/update", "params": {"update": {
        "sessionUpdate": "tool_call", "toolCallId": "c1",
        "content": [{"type": "diff", "path": "/p", "sessionId": "kept"}]}}}
    [second] = normalised([Received("session/update", other)])
    diff = diff_records([first], [second])
    assert first != second
    assert '"type": "diff"' in diff and '"type": "content"' in diff
    asked = Received("session/request_permission", {"sessionId": "a", "options": []},
                     request_id=3, chosen="allow")
    assert normalised([asked]) == [{"method": "session/request_permission",
                                    "params": {"options": []}, "chosen": "allow"}]


def test_streams_leave_out_a_tool_call_update_that_carried_only_meta() -> None:
    def update(**fields: Any) -> Received:
        return Received("session/update", {"sessionId": "a", "update": {
            "sessionUpdate": "tool_call_update", "toolCallId": "c1", **fields}})

    hook = update(_meta={"claudeCode": {"toolResponse": {"type": "text"}}})
    done = update(status="completed", _meta={"claudeCode": {"toolName": "Read"}})
    emptied = update(content=[])
    assert streams([hook, done]) == streams([done])
    assert streams([hook, done, emptied]).turn == [
        {"method": "session/update", "params": {"update": {
            "sessionUpdate": "tool_call_update", "toolCallId": "c1", **fields}}}
        for fields in ({"status": "completed"}, {"content": []})]


def test_streams_compare_a_usage_cost_without_its_last_bits() -> None:
    def usage(amount: float) -> Received:
        return Received("session/update", {"sessionId": "a", "update": {
            "sessionUpdate": "usage_update", "used": 2130, "size": 1000000,
            "cost": {"amount": amount, "currency": "USD"}}})

    assert streams([usage(0.0354165)]) == streams([usage(0.035416500000000004)])
    assert streams([usage(0.0354165)]) != streams([usage(0.0354166)])
