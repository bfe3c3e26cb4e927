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
from collections.abc import Iterator
from pathlib import Path

import pytest

from .anthropic_api import TITLE, CodingTask, kind_of, tool_results
from .bench import (
    ANSWER,
    FIXED_CALC,
    PROMPT,
    Bench,
    Hosted,
    Run,
    open_bench,
    reloaded,
    replay_differences,
    two_editors,
)
from .claude import adapter, claude_env, claude_hosting
from .harness import Received, said, streams

pytestmark = pytest.mark.timeout(240)

EDIT_ID, BASH_ID = "toolu_01EditCalc00000000002", "toolu_01BashCalc00000000003"


def has_title(records: list[Received]) -> bool:
    return any(r.update.get("sessionUpdate") == "session_info_update" for r in records)


@pytest.fixture(scope="module")
def bench(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bench]:
    """The title is waited for (bounded) after each run: it may come after the turn."""
    command = [adapter()]
    root = Path(os.path.realpath(tmp_path_factory.mktemp("claude")))
    (root / "ws").mkdir()
    yield from open_bench(root, CodingTask(root / "ws"), command=command, env=claude_env,
                          config=lambda config_dir: claude_hosting(config_dir, command),
                          prompts=(PROMPT,), settled=has_title)


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
    records = reloaded(bench, hosted)
    user, differences = replay_differences(direct, records, "replayed")
    assert user == PROMPT
    assert ANSWER in said(records)
    assert not differences, differences


def test_two_editors_on_the_daemon_acp_sock_see_what_claude_code_sent(
    bench: Bench, direct: Run
) -> None:
    def did_the_task(run: Run) -> None:
        assert run.calc_after == FIXED_CALC
        assert command_output_reached_the_model(run)

    run, loaded_records = two_editors(bench, did_the_task)
    user, loaded = replay_differences(direct, loaded_records, "editor 2 load")
    assert user == PROMPT
    live = streams(direct.records).diff(streams(run.records), ("direct", "editor 1"))
    assert not (live or loaded), f"{live}\n{loaded}"
