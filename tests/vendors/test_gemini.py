"""Gemini CLI through zeroclaw exactly as without it (issue 22): the real CLI
(``@google/gemini-cli``, pinned in scripts/test, as ``gemini --acp``) answers a greeting
and then does one coding task against a local Gemini API
(:mod:`tests.vendors.gemini_api`): read ``calc.py``, fix it with ``replace``, run it with
``run_shell_command``, answer.

The same editor client (:mod:`tests.vendors.harness`), the same cwd path (its files
reset between runs) and the same model server drive it once directly and then through
``zeroclaw acp``, a new ``zeroclaw acp`` on the same store (``session/load``) and the
daemon's ``acp.sock`` with two editors; every ``session/update`` and every permission
request must be the same as direct apart from ``sessionId`` and ``_meta``
(:class:`~tests.vendors.harness.Streams`). Gemini CLI's tool calls carry no
``rawInput``: zeroclaw stores them all the same (the session loads).
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

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
from .gemini import FAKE_KEY, cli, gemini_env, gemini_hosting
from .gemini_api import (
    EDIT_ID,
    GREETING,
    HELLO,
    READ_ID,
    SHELL_ID,
    GeminiTask,
    function_responses,
    kind_of,
)
from .harness import Received, said, streams

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def bench(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bench]:
    """zeroclaw starts the CLI in its agent ``workspace``: the cwd its direct run had
    (as an editor starts it in the project). Gemini CLI names its own process's cwd in
    a shell command's permission request (the command runs in the session's cwd all
    the same)."""
    command = [cli(), "--acp"]
    root = Path(os.path.realpath(tmp_path_factory.mktemp("gemini")))
    cwd = root / "ws"
    cwd.mkdir()
    yield from open_bench(
        root, GeminiTask(cwd), command=command, env=gemini_env, prompts=(GREETING, PROMPT),
        config=lambda config_dir: gemini_hosting(config_dir, command, f'workspace = "{cwd}"'))


def did_the_task(run: Run) -> None:
    """The file is fixed, the command's output reached the model, the answers were
    said, and every model request carried the key."""
    assert run.calc_after == FIXED_CALC
    assert any(response.get("id") == SHELL_ID and "add(2, 3) = 5" in str(response)
               for request in run.model_requests if kind_of(request) == "turn"
               for response in function_responses(request.body)), run.model_requests
    text = said(run.records)
    assert text.startswith(HELLO) and text.endswith(ANSWER), text
    assert run.model_requests and all(
        request.headers.get("x-goog-api-key") == FAKE_KEY for request in run.model_requests)


def permission_asks(run: Run) -> list[Received]:
    return [r for r in run.records if r.method == "session/request_permission"]


# --- the direct run: what Gemini CLI does without zeroclaw ------------------------------


def test_direct_gemini_cli_answers_then_reads_edits_runs_and_answers(direct: Run) -> None:
    did_the_task(direct)
    asks = permission_asks(direct)
    assert [a.params["toolCall"]["toolCallId"] for a in asks] == [
        f"replace__{EDIT_ID}", f"run_shell_command__{SHELL_ID}"]
    assert [a.chosen for a in asks] == ["proceed_once", "proceed_once"]
    assert asks[0].params["toolCall"]["content"][0]["type"] == "diff"
    kinds = {r.update.get("sessionUpdate") for r in direct.records}
    assert {"agent_thought_chunk", "tool_call", "tool_call_update"} <= kinds
    # a call that needs no permission is announced by a tool_call, the others by the
    # permission request; none has a rawInput (what zeroclaw's store must take)
    announced = [r.params["toolCall"] if r.request_id is not None else r.update
                 for r in direct.records if r.update.get("sessionUpdate") == "tool_call"
                 or r.method == "session/request_permission"]
    assert [call["kind"] for call in announced] == ["read", "edit", "execute"]
    assert not any("rawInput" in r.update or "rawInput" in r.params.get("toolCall", {})
                   for r in direct.records)
    assert {kind_of(request) for request in direct.model_requests} <= {"turn", "json"}


# --- through zeroclaw -------------------------------------------------------------------


def test_through_zeroclaw_acp_the_editor_gets_what_gemini_cli_sent(
    bench: Bench, direct: Run, hosted: Hosted
) -> None:
    run = hosted.run
    did_the_task(run)
    assert len(permission_asks(run)) == 2
    differences = streams(direct.records).diff(streams(run.records))
    assert not differences, differences
    assert FAKE_KEY not in (bench.root / "hosted.stderr").read_text(encoding="utf-8")


def stored_tool_calls(config_dir: Path) -> list[tuple[str, str | None, str]]:
    """The store's tool call rows (id, arguments as stored, outcome), read-only."""
    store = config_dir / "data" / "sessions" / "acp-sessions.db"
    with sqlite3.connect(f"file:{store}?mode=ro", uri=True) as db:
        rows = db.execute("SELECT tool_call_id, arguments, outcome FROM tool_calls"
                          " ORDER BY seq").fetchall()
    return [(str(row[0]), row[1], str(row[2])) for row in rows]


def test_the_store_keeps_gemini_tool_calls_without_raw_input(hosted: Hosted) -> None:
    assert stored_tool_calls(hosted.config_dir) == [
        (f"read_file__{READ_ID}", "null", "completed"),
        (f"replace__{EDIT_ID}", "null", "completed"),
        (f"run_shell_command__{SHELL_ID}", "null", "completed")]


def test_load_from_a_new_zeroclaw_replays_what_the_editor_saw_live(
    bench: Bench, direct: Run, hosted: Hosted
) -> None:
    records = reloaded(bench, hosted)
    user, differences = replay_differences(direct, records, "replayed")
    assert user == GREETING + PROMPT
    assert said(records) == said(direct.records)
    assert not differences, differences


def test_two_editors_on_the_daemon_acp_sock_see_what_gemini_cli_sent(
    bench: Bench, direct: Run
) -> None:
    run, loaded_records = two_editors(bench, did_the_task)
    user, loaded = replay_differences(direct, loaded_records, "editor 2 load")
    assert user == GREETING + PROMPT
    live = streams(direct.records).diff(streams(run.records), ("direct", "editor 1"))
    assert not (live or loaded), f"{live}\n{loaded}"
