"""A hosted agent's permission request reaches the editor as the agent sent it — its
tool call with the diff, locations, ``rawInput`` and ``_meta``, and its own options —
and the editor's choice goes back as chosen. Where zeroclaw answers itself (``full``,
``read_only``, an editor that does not answer in time, one that answers cancelled) it
picks one of the agent's options by kind, so the agent never sees an option it did not
offer. Real ``zeroclaw acp`` processes, the fixture agent, the editor-like client."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from tests.vendors.harness import EditorClient

from .procs import host_argv, host_env
from .test_acp_hosting import FIXTURE_AGENT, acp_config

REQUEST_WITHOUT_SESSION = {
    "toolCall": {"toolCallId": "edit-1", "title": "Edit notes.txt", "kind": "edit",
                 "status": "pending", "rawInput": {"path": "notes.txt", "new": "b"},
                 "locations": [{"path": "notes.txt", "line": 1}],
                 "content": [{"type": "diff", "path": "notes.txt", "oldText": "a",
                              "newText": "b"}],
                 "_meta": {"fixture": {"risk": "low"}}},
    "options": [
        {"optionId": "allow-with-updates", "name": "Yes, and allow edits",
         "kind": "allow_always"},
        {"optionId": "yes", "name": "Yes", "kind": "allow_once"},
        {"optionId": "no", "name": "No", "kind": "reject_once"},
    ],
}


def start(config_dir: Path, tmp_path: Path, level: str, prelude: str = "",
          **client: Any) -> EditorClient:
    """``zeroclaw acp`` hosting the fixture agent at ``level``; ``prelude``: more lines
    of its ``[acp]`` section."""
    acp_config(config_dir, [sys.executable, str(FIXTURE_AGENT)], level=level)
    config = config_dir / "config.toml"
    config.write_text(config.read_text().replace("[acp]\n", "[acp]\n" + prelude, 1))
    editor = EditorClient.spawn(host_argv(config_dir), env=host_env(),
                                stderr_path=tmp_path / "host.stderr", label="editor", **client)
    editor.initialize()
    return editor


def said(editor: EditorClient, mark: int) -> str:
    return "".join(r.update["content"]["text"] for r in editor.since(mark)
                   if r.method == "session/update"
                   and r.update.get("sessionUpdate") == "agent_message_chunk")


def choose_once(editor: EditorClient, workspace: Path) -> tuple[str, list[Any]]:
    sid = editor.new_session(workspace)
    mark = editor.mark()
    editor.prompt(sid, "choose")
    asks = [r for r in editor.since(mark) if r.method == "session/request_permission"]
    return said(editor, mark), asks


@pytest.mark.parametrize(("kinds", "chosen"), [
    (("allow_always",), "allow-with-updates"), (("allow_once",), "yes"),
    (("reject_once",), "no"), ((), "no")])
def test_supervised_the_editor_sees_the_agents_request_and_its_choice_goes_back(
        config_dir: Path, tmp_path: Path, workspace: Path, kinds: tuple[str, ...],
        chosen: str) -> None:
    """``()``: the editor answers cancelled; outside a cancelled turn that is a no."""
    editor = start(config_dir, tmp_path, "supervised", permission_kinds=kinds)
    try:
        text, asks = choose_once(editor, workspace)
    finally:
        assert not editor.close()
    [ask] = asks
    assert {k: v for k, v in ask.params.items() if k != "sessionId"} == REQUEST_WITHOUT_SESSION
    assert text == f"chose {chosen}"


@pytest.mark.parametrize(("level", "chosen"), [("full", "yes"), ("read_only", "no")])
def test_zeroclaw_answers_by_mode_with_the_agents_own_option(
        config_dir: Path, tmp_path: Path, workspace: Path, level: str, chosen: str) -> None:
    editor = start(config_dir, tmp_path, level)
    try:
        text, asks = choose_once(editor, workspace)
    finally:
        assert not editor.close()
    assert asks == [] and text == f"chose {chosen}"


def test_an_editor_that_does_not_answer_in_time_is_the_agents_reject_option(
        config_dir: Path, tmp_path: Path, workspace: Path) -> None:
    editor = start(config_dir, tmp_path, "supervised", "session_timeout_secs = 2\n",
                   answers_permissions=False)
    try:
        text, asks = choose_once(editor, workspace)
    finally:
        assert not editor.close()
    assert len(asks) == 1 and text == "chose no"
