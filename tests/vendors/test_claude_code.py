"""Claude Code through zeroclaw exactly as without it (issue 22): the real adapter
(``@agentclientprotocol/claude-agent-acp``, pinned in scripts/test) does one coding task
against a local Anthropic Messages API (:mod:`tests.vendors.anthropic_api`): read
``calc.py``, fix it with an edit, run it, answer.

The same editor client (:mod:`tests.vendors.harness`), the same cwd path (its files
reset between runs) and the same model server drive it once directly and then through
``zeroclaw acp``, a new ``zeroclaw acp`` on the same store (``session/load``) and the
daemon's ``acp.sock`` with two editors; every ``session/update`` and every permission
request must be the same as direct apart from ``sessionId`` and ``_meta``
(:class:`~tests.vendors.harness.Streams`).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.daemon.helpers import DaemonProc, short_dir
from tests.e2e.model_server import ModelServer
from tests.e2e.procs import host_argv, host_env

from .anthropic_api import ANSWER, FIXED_CALC, PROMPT, TITLE, CodingTask, kind_of, tool_results
from .claude import adapter, claude_env, fresh_home, hosting_config
from .harness import (
    EditorClient,
    Received,
    closed_cleanly,
    live_as_replayed,
    replayed,
    said,
    streams,
)

pytestmark = pytest.mark.timeout(240)

EDIT_ID, BASH_ID = "toolu_01EditCalc00000000002", "toolu_01BashCalc00000000003"
TURN_WAIT = 120.0


@dataclass
class Bench:
    """What every run shares: the adapter, one model server, one cwd path, one HOME."""

    command: list[str]
    root: Path
    task: CodingTask
    server: ModelServer
    home: Path

    def reset(self) -> dict[str, str]:
        """The files as the task starts and a fresh HOME; the adapter's variables."""
        self.task.reset()
        for extra in self.task.cwd.iterdir():
            if extra.name != "calc.py":
                shutil.rmtree(extra) if extra.is_dir() else extra.unlink()
        return claude_env(self.server.url, fresh_home(self.home))


@dataclass(frozen=True)
class Run:
    session_id: str
    records: list[Received]
    calc_after: str
    model_requests: list[Any]


@pytest.fixture(scope="module")
def bench(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bench]:
    command = [adapter()]
    root = Path(os.path.realpath(tmp_path_factory.mktemp("claude")))
    (root / "ws").mkdir()
    task = CodingTask(root / "ws")
    server = task.start_server()
    yield Bench(command, root, task, server, root / "home")
    server.close()


def has_title(records: list[Received]) -> bool:
    return any(r.update.get("sessionUpdate") == "session_info_update" for r in records)


def run_task(bench: Bench, client: EditorClient) -> Run:
    """The coding task in a new session of ``client``; the title is waited for (bounded)
    as it may come after the turn."""
    before = len(bench.server.requests)
    client.initialize(timeout=60)
    sid = client.new_session(bench.task.cwd, timeout=60)
    result = client.prompt(sid, PROMPT, timeout=TURN_WAIT)
    assert result["stopReason"] == "end_turn", result
    client.settle(has_title)
    return Run(sid, client.records, bench.task.calc.read_text(),
               bench.server.requests[before:])


@pytest.fixture(scope="module")
def direct(bench: Bench) -> Run:
    env = bench.reset()
    client = EditorClient.spawn(bench.command, env=env, cwd=bench.task.cwd,
                                stderr_path=bench.root / "direct.stderr", label="direct")
    try:
        return run_task(bench, client)
    finally:
        closed_cleanly(client)


@dataclass(frozen=True)
class Hosted:
    run: Run
    config_dir: Path
    env: dict[str, str]


def zeroclaw(bench: Bench, config_dir: Path, env: dict[str, str], label: str
             ) -> EditorClient:
    return EditorClient.spawn(host_argv(config_dir), env=host_env(env), cwd=bench.task.cwd,
                              stderr_path=bench.root / f"{label}.stderr", label=label)


@pytest.fixture(scope="module")
def hosted(bench: Bench, direct: Run) -> Hosted:
    env = bench.reset()
    config_dir = bench.root / "cfg"
    hosting_config(config_dir, bench.command)
    client = zeroclaw(bench, config_dir, env, "hosted")
    try:
        return Hosted(run_task(bench, client), config_dir, env)
    finally:
        closed_cleanly(client)


def command_output_reached_the_model(run: Run) -> bool:
    return any(block.get("tool_use_id") == BASH_ID and "add(2, 3) = 5" in str(block)
               for request in run.model_requests if kind_of(request) == "turn"
               for block in tool_results(request.body))


# --- the direct run: what Claude Code does without zeroclaw ---------------------------


def test_direct_claude_code_reads_edits_runs_and_answers(direct: Run) -> None:
    assert direct.calc_after == FIXED_CALC
    assert command_output_reached_the_model(direct)
    asks = [r for r in direct.records if r.method == "session/request_permission"]
    assert [a.params["toolCall"]["toolCallId"] for a in asks] == [EDIT_ID, BASH_ID]
    assert [a.chosen for a in asks] == ["allow-once", "allow-once"]
    [edit_ask] = [a for a in asks if a.params["toolCall"]["toolCallId"] == EDIT_ID]
    assert edit_ask.params["toolCall"]["content"][0]["type"] == "diff"
    assert said(direct.records).endswith(ANSWER)
    assert [r.update.get("title") for r in direct.records if has_title([r])] == [TITLE]
    kinds = {r.update.get("sessionUpdate") for r in direct.records}
    assert {"agent_thought_chunk", "tool_call", "tool_call_update", "usage_update"} <= kinds


# --- through zeroclaw -------------------------------------------------------------------


def test_through_zeroclaw_acp_the_editor_gets_what_claude_code_sent(
    direct: Run, hosted: Hosted
) -> None:
    run = hosted.run
    assert run.calc_after == FIXED_CALC
    assert command_output_reached_the_model(run)
    asks = [r for r in run.records if r.method == "session/request_permission"]
    assert len(asks) == 2 and all(a.chosen is not None for a in asks), asks
    assert said(run.records).endswith(ANSWER)
    differences = streams(direct.records).diff(streams(run.records))
    assert not differences, differences


def test_load_from_a_new_zeroclaw_replays_what_the_editor_saw_live(
    bench: Bench, direct: Run, hosted: Hosted
) -> None:
    client = zeroclaw(bench, hosted.config_dir, hosted.env, "reloaded")
    try:
        client.initialize(timeout=60)
        client.load_session(hosted.run.session_id, bench.task.cwd, timeout=60)
        records = client.records
    finally:
        closed_cleanly(client)
    user, replay = replayed(records)
    assert user == PROMPT
    assert ANSWER in said(records)
    differences = live_as_replayed(direct.records).diff(replay, ("direct live", "replayed"))
    assert not differences, differences


def test_two_editors_on_the_daemon_acp_sock_see_what_claude_code_sent(
    bench: Bench, direct: Run
) -> None:
    env = bench.reset()
    config_dir = short_dir()
    hosting_config(config_dir, bench.command)
    daemon = DaemonProc(config_dir, env_extra=env)
    first = second = None
    try:
        daemon.wait_listening()
        acp_sock = daemon.socket_path.parent / "acp.sock"
        first = EditorClient.connect(acp_sock, label="editor-1")
        run = run_task(bench, first)
        assert run.calc_after == FIXED_CALC
        assert command_output_reached_the_model(run)
        second = EditorClient.connect(acp_sock, label="editor-2")
        second.initialize()
        second.load_session(run.session_id, bench.task.cwd, timeout=60)
        user, replay = replayed(second.records)
        assert user == PROMPT
        live = streams(direct.records).diff(streams(run.records), ("direct", "editor 1"))
        loaded = live_as_replayed(direct.records).diff(replay, ("direct live", "editor 2 load"))
        assert not (live or loaded), f"{live}\n{loaded}"
    finally:
        closed_cleanly(*(c for c in (first, second) if c is not None))
        daemon.terminate()
        leaks = daemon.cleanup()
        shutil.rmtree(config_dir, ignore_errors=True)
        assert not leaks, leaks
