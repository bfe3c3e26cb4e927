"""Codex through zeroclaw exactly as without it (issue 22): the real adapter
(``@zed-industries/codex-acp``, pinned in scripts/test) answers a question and then
does one coding task against a local OpenAI Responses API
(:mod:`tests.vendors.openai_responses`): read ``calc.py`` (``exec_command``), fix it
(``apply_patch``), run it, answer.

The same editor client (:mod:`tests.vendors.harness`), the same cwd path (its files
reset between runs) and the same model server drive it once directly and then through
``zeroclaw acp``, a new ``zeroclaw acp`` on the same store (``session/load``) and the
daemon's ``acp.sock`` with two editors; every ``session/update`` and every permission
request must be the same as direct apart from ``sessionId``, ``_meta`` and Codex's own
clock and ids (:func:`~tests.vendors.codex.comparable`). Codex's JSON-RPC error for a
missing API key reaches the editor with its ``data``.
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

from .codex import FAKE_KEY, adapter, closed_cleanly, codex_env, comparable, hosting_config
from .harness import AcpError, EditorClient, Received, Streams, streams
from .openai_responses import (
    ANSWER,
    FIXED_CALC,
    HELLO,
    HELLO_PROMPT,
    PATCH_ID,
    PROMPT,
    RUN_ID,
    CodexTask,
    is_turn,
    tool_outputs,
)

pytestmark = pytest.mark.timeout(240)

TURN_WAIT = 120.0
MISSING_KEY = "Missing environment variable: `OPENAI_API_KEY`."


@dataclass
class Bench:
    """What every run shares: the adapter, one model server, one cwd path, one HOME."""

    command: list[str]
    root: Path
    task: CodexTask
    server: ModelServer
    home: Path

    def reset(self, key: bool = True) -> dict[str, str]:
        """The files as the task starts and a fresh HOME; the adapter's variables."""
        self.task.reset()
        for extra in self.task.cwd.iterdir():
            if extra.name != "calc.py":
                shutil.rmtree(extra) if extra.is_dir() else extra.unlink()
        return codex_env(self.server.url, self.home, key=key)


@dataclass(frozen=True)
class Run:
    session_id: str
    records: list[Received]
    calc_after: str
    model_requests: list[Any]


@pytest.fixture(scope="module")
def bench(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bench]:
    command = [adapter()]
    root = Path(os.path.realpath(tmp_path_factory.mktemp("codex")))
    (root / "ws").mkdir()
    task = CodexTask(root / "ws")
    server = task.start_server()
    yield Bench(command, root, task, server, root / "home")
    server.close()


def run_task(bench: Bench, client: EditorClient) -> Run:
    """The question, then the coding task, in a new session of ``client``."""
    before = len(bench.server.requests)
    client.initialize(timeout=60)
    sid = client.new_session(bench.task.cwd, timeout=60)
    for prompt in (HELLO_PROMPT, PROMPT):
        result = client.prompt(sid, prompt, timeout=TURN_WAIT)
        assert result["stopReason"] == "end_turn", result
    return Run(sid, comparable(client.records), bench.task.calc.read_text(),
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
    return any(item.get("call_id") == RUN_ID and "add(2, 3) = 5" in str(item.get("output"))
               for request in run.model_requests if is_turn(request)
               for item in tool_outputs(request.body))


def said(records: list[Received]) -> str:
    return "".join(r.update["content"].get("text", "") for r in records
                   if r.update.get("sessionUpdate") == "agent_message_chunk")


def replayed(records: list[Received]) -> tuple[str, Streams]:
    """A ``session/load`` replay: the user's text, and the rest as :class:`Streams`
    without ``available_commands_update`` (the agent's state, not the turn)."""
    user = "".join(r.update["content"].get("text", "") for r in records
                   if r.update.get("sessionUpdate") == "user_message_chunk")
    rest = [r for r in records if r.update.get("sessionUpdate")
            not in ("user_message_chunk", "available_commands_update")]
    return user, streams(comparable(rest))


def live_as_replayed(run: Run) -> Streams:
    """What a replay of ``run`` must hold: its updates (no permission requests: those
    were answered live)."""
    _, live = replayed(run.records)
    return Streams(live.turn, live.session, [])


# --- the direct run: what Codex does without zeroclaw ---------------------------------


def test_direct_codex_answers_then_reads_patches_runs_and_answers(direct: Run) -> None:
    assert direct.calc_after == FIXED_CALC
    assert command_output_reached_the_model(direct)
    asks = [r for r in direct.records if r.method == "session/request_permission"]
    assert [a.params["toolCall"]["toolCallId"] for a in asks] == [PATCH_ID, RUN_ID]
    assert all(a.chosen is not None for a in asks), asks
    assert asks[0].params["toolCall"]["content"][0]["type"] == "diff"
    text = said(direct.records)
    assert text.startswith(HELLO) and text.endswith(ANSWER)
    kinds = {r.update.get("sessionUpdate") for r in direct.records}
    assert {"agent_thought_chunk", "tool_call", "tool_call_update", "usage_update"} <= kinds
    turns = [r for r in direct.model_requests if is_turn(r)]
    assert len(turns) == 5 and all(r.body.get("stream") is True for r in turns)
    assert all(r.headers.get("authorization") == f"Bearer {FAKE_KEY}" for r in turns)


# --- through zeroclaw -------------------------------------------------------------------


def test_through_zeroclaw_acp_the_editor_gets_what_codex_sent(
    direct: Run, hosted: Hosted
) -> None:
    run = hosted.run
    assert run.calc_after == FIXED_CALC
    assert command_output_reached_the_model(run)
    asks = [r for r in run.records if r.method == "session/request_permission"]
    assert len(asks) == 2 and all(a.chosen is not None for a in asks), asks
    assert said(run.records).endswith(ANSWER)
    assert all(r.headers.get("authorization") == f"Bearer {FAKE_KEY}"
               for r in run.model_requests if is_turn(r))
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
    assert user == HELLO_PROMPT + PROMPT
    assert ANSWER in said(records)
    differences = live_as_replayed(direct).diff(replay, ("direct live", "replayed"))
    assert not differences, differences


def test_two_editors_on_the_daemon_acp_sock_see_what_codex_sent(
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
        assert user == HELLO_PROMPT + PROMPT
        live = streams(direct.records).diff(streams(run.records), ("direct", "editor 1"))
        loaded = live_as_replayed(direct).diff(replay, ("direct live", "editor 2 load"))
        assert not (live or loaded), f"{live}\n{loaded}"
    finally:
        closed_cleanly(*(c for c in (first, second) if c is not None))
        daemon.terminate()
        leaks = daemon.cleanup()
        shutil.rmtree(config_dir, ignore_errors=True)
        assert not leaks, leaks


# --- errors -------------------------------------------------------------------------------


def prompt_error(bench: Bench, client: EditorClient) -> AcpError:
    client.initialize(timeout=60)
    sid = client.new_session(bench.task.cwd, timeout=60)
    with pytest.raises(AcpError) as caught:
        client.prompt(sid, HELLO_PROMPT, timeout=TURN_WAIT)
    return caught.value


def test_direct_codex_without_a_key_answers_the_prompt_with_its_error(bench: Bench) -> None:
    env = bench.reset(key=False)
    client = EditorClient.spawn(bench.command, env=env, cwd=bench.task.cwd,
                                stderr_path=bench.root / "nokey.stderr", label="direct")
    try:
        error = prompt_error(bench, client)
    finally:
        closed_cleanly(client)
    assert error.code == -32603
    assert isinstance(error.data, dict) and error.data.get("message") == MISSING_KEY


def test_through_zeroclaw_codex_missing_key_error_reaches_the_editor(bench: Bench) -> None:
    env = bench.reset(key=False)
    config_dir = bench.root / "cfg-nokey"
    hosting_config(config_dir, bench.command)
    client = zeroclaw(bench, config_dir, env, "hosted-nokey")
    try:
        error = prompt_error(bench, client)
    finally:
        closed_cleanly(client)
    assert isinstance(error.data, dict) and error.data.get("message") == MISSING_KEY, error
