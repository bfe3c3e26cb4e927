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
from collections.abc import Iterator
from pathlib import Path

import pytest

from .bench import (
    ANSWER,
    FIXED_CALC,
    PROMPT,
    TURN_WAIT,
    Bench,
    Hosted,
    Run,
    open_bench,
    reloaded,
    replay_differences,
    two_editors,
)
from .codex import FAKE_KEY, adapter, closed_cleanly, codex_env, codex_hosting, comparable
from .harness import AcpError, EditorClient, said, streams
from .openai_responses import (
    HELLO,
    HELLO_PROMPT,
    PATCH_ID,
    RUN_ID,
    CodexTask,
    is_turn,
    tool_outputs,
)

pytestmark = pytest.mark.timeout(240)

MISSING_KEY = "Missing environment variable: `OPENAI_API_KEY`."


@pytest.fixture(scope="module")
def bench(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bench]:
    """Records are compared with Codex's own clock and ids masked (:func:`comparable`)."""
    command = [adapter()]
    root = Path(os.path.realpath(tmp_path_factory.mktemp("codex")))
    (root / "ws").mkdir()
    yield from open_bench(root, CodexTask(root / "ws"), command=command, env=codex_env,
                          config=lambda config_dir: codex_hosting(config_dir, command),
                          prompts=(HELLO_PROMPT, PROMPT), comparable=comparable,
                          close=closed_cleanly)


def command_output_reached_the_model(run: Run) -> bool:
    return any(item.get("call_id") == RUN_ID and "add(2, 3) = 5" in str(item.get("output"))
               for request in run.model_requests if is_turn(request)
               for item in tool_outputs(request.body))


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
    records = reloaded(bench, hosted)
    user, differences = replay_differences(direct, records, "replayed")
    assert user == HELLO_PROMPT + PROMPT
    assert ANSWER in said(records)
    assert not differences, differences


def test_two_editors_on_the_daemon_acp_sock_see_what_codex_sent(
    bench: Bench, direct: Run
) -> None:
    def did_the_task(run: Run) -> None:
        assert run.calc_after == FIXED_CALC
        assert command_output_reached_the_model(run)

    run, loaded_records = two_editors(bench, did_the_task)
    user, loaded = replay_differences(direct, loaded_records, "editor 2 load")
    assert user == HELLO_PROMPT + PROMPT
    live = streams(direct.records).diff(streams(run.records), ("direct", "editor 1"))
    assert not (live or loaded), f"{live}\n{loaded}"


# --- errors -------------------------------------------------------------------------------


def prompt_error(bench: Bench, client: EditorClient) -> AcpError:
    client.initialize(timeout=60)
    sid = client.new_session(bench.task.cwd, timeout=60)
    with pytest.raises(AcpError) as caught:
        client.prompt(sid, HELLO_PROMPT, timeout=TURN_WAIT)
    return caught.value


def test_direct_codex_without_a_key_answers_the_prompt_with_its_error(bench: Bench) -> None:
    client = bench.spawn(bench.reset(key=False), "direct-nokey")
    try:
        error = prompt_error(bench, client)
    finally:
        closed_cleanly(client)
    assert error.code == -32603
    assert isinstance(error.data, dict) and error.data.get("message") == MISSING_KEY


def test_through_zeroclaw_codex_missing_key_error_reaches_the_editor(bench: Bench) -> None:
    env = bench.reset(key=False)
    config_dir = bench.root / "cfg-nokey"
    bench.config(config_dir)
    client = bench.zeroclaw(config_dir, env, "hosted-nokey")
    try:
        error = prompt_error(bench, client)
    finally:
        closed_cleanly(client)
    assert isinstance(error.data, dict) and error.data.get("message") == MISSING_KEY, error
