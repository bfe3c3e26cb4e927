"""``zeroclaw acp client``'s auto-approval rule, its rendering and its flags, on crafted
requests (zeroclaw's own agent never asks for reads, so the rule is tested here),
plus the ``_meta.zeroclaw.tool`` zeroclaw puts on its own tool calls."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from ipc import acp
from ipc.events import ToolCallStarted, ToolLocation
from supervisor.cli.acp_client_cli import parse
from supervisor.cli.acp_client_policy import auto_approval, option_of_kind, tool_name
from supervisor.cli.acp_client_view import StreamBuffer, diff_lines, paint, update_lines


def ask(tool: str | None, raw: Any, kind: str = "read",
        locations: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """A request shaped like zeroclaw's own (its four options, ``_meta`` with the tool)."""
    params = acp.permission_params("s1", "c1", f"{tool} call", kind, raw, (), tool)
    if locations is not None:
        params["toolCall"]["locations"] = locations
    return params


@pytest.fixture
def cwd(tmp_path: Path) -> Path:
    root = tmp_path / "project"
    (root / "src").mkdir(parents=True)
    (root / "src" / "a.py").write_text("x = 1\n")
    (tmp_path / "secret.txt").write_text("s")
    return root


@pytest.mark.parametrize("tool,raw", [
    ("file_read", {"path": "src/a.py"}),
    ("file_read", {"path": "src/../src/a.py"}),
    ("file_read", {"path": "new-file-not-there-yet.txt"}),
    ("file_list", {}),
    ("file_list", {"path": "src", "pattern": "*.py"}),
    ("search", {"pattern": "x =", "glob": "*.py"}),
])
def test_reads_inside_cwd_are_approved_once(cwd: Path, tool: str, raw: dict[str, Any]) -> None:
    verdict = auto_approval(ask(tool, raw), cwd)
    assert verdict.option_id == "allow-once", verdict.reason
    assert tool in verdict.reason and "inside" in verdict.reason


def test_an_absolute_path_inside_cwd_is_approved(cwd: Path) -> None:
    raw = {"path": str(cwd / "src" / "a.py")}
    assert auto_approval(ask("file_read", raw), cwd).option_id == "allow-once"


@pytest.mark.parametrize("raw", [
    {"path": "../secret.txt"},
    {"path": "src/../../secret.txt"},
    {"path": "/etc/passwd"},
    {"path": "~/.ssh/id_rsa"},
    {"path": ""},
    {"path": 7},
    {"path": "src/a.py", "paths": ["../secret.txt"]},
])
def test_paths_that_escape_cwd_are_asked(cwd: Path, raw: dict[str, Any]) -> None:
    verdict = auto_approval(ask("file_read", raw), cwd)
    assert verdict.option_id is None, verdict.reason


def test_a_symlink_out_of_cwd_is_followed_and_asked(cwd: Path) -> None:
    os.symlink(cwd.parent / "secret.txt", cwd / "innocent.txt")
    os.symlink(cwd.parent, cwd / "up")
    assert auto_approval(ask("file_read", {"path": "innocent.txt"}), cwd).option_id is None
    assert auto_approval(ask("file_list", {"path": "up"}), cwd).option_id is None
    assert auto_approval(ask("file_read", {"path": "up/project/src/a.py"}), cwd).option_id \
        == "allow-once"  # back inside after the link: resolved, it is in cwd


def test_a_cwd_reached_through_a_symlink_still_approves(cwd: Path, tmp_path: Path) -> None:
    os.symlink(cwd, tmp_path / "link")
    assert auto_approval(ask("file_read", {"path": "src/a.py"}), tmp_path / "link").option_id \
        == "allow-once"


def test_a_location_outside_cwd_is_asked(cwd: Path) -> None:
    outside = [{"path": str(cwd.parent / "secret.txt")}]
    assert auto_approval(ask("file_read", {"path": "src/a.py"}, locations=outside),
                         cwd).option_id is None
    inside = [{"path": str(cwd / "src" / "a.py"), "line": 1}]
    assert auto_approval(ask("file_read", {"path": "src/a.py"}, locations=inside),
                         cwd).option_id == "allow-once"


@pytest.mark.parametrize("tool", ["shell", "file_write", "file_edit", "deliver_file", "ask_user",
                                  "mcp_fs__read_file", None])
def test_kind_read_never_approves_another_tool(cwd: Path, tool: str | None) -> None:
    params = ask(tool, {"path": "src/a.py", "command": "cat src/a.py"}, kind="read")
    assert auto_approval(params, cwd).option_id is None


def test_a_hosted_agents_request_without_our_meta_is_asked(cwd: Path) -> None:
    params = {"sessionId": "s", "toolCall": {"toolCallId": "t", "title": "Read a.py",
                                             "kind": "read", "rawInput": {"path": "src/a.py"}},
              "options": [{"optionId": "ok", "name": "Yes", "kind": "allow_once"}]}
    assert auto_approval(params, cwd).option_id is None
    assert tool_name(params["toolCall"]) is None


def test_file_read_without_a_path_and_a_non_object_input_are_asked(cwd: Path) -> None:
    assert auto_approval(ask("file_read", {}), cwd).option_id is None
    assert auto_approval(ask("file_read", "src/a.py"), cwd).option_id is None


def test_the_allow_once_option_is_picked_by_kind_not_by_id(cwd: Path) -> None:
    params = ask("file_read", {"path": "src/a.py"})
    params["options"] = [{"optionId": "yes-forever", "name": "Always", "kind": "allow_always"},
                         {"optionId": "yes", "name": "Once", "kind": "allow_once"}]
    assert auto_approval(params, cwd).option_id == "yes"
    params["options"] = params["options"][:1]
    assert auto_approval(params, cwd).option_id is None  # no allow_once: asked
    assert option_of_kind(params, "reject_once", "allow_always") == "yes-forever"


def test_zeroclaws_tool_calls_name_their_tool_in_meta() -> None:
    params = acp.permission_params("s", "c", "Write x", "edit", {"path": "x"}, (), "file_write")
    assert params["toolCall"]["_meta"] == {"zeroclaw": {"tool": "file_write"}}
    started = acp.update_of(ToolCallStarted("c", "file_read", "Read x", "read", {"path": "x"},
                                            (ToolLocation("/w/x"),)))
    assert started["_meta"] == {"zeroclaw": {"tool": "file_read"}}
    assert started["kind"] == "read" and started["locations"] == [{"path": "/w/x"}]


def test_streams_are_line_buffered_and_diffs_unified() -> None:
    stream = StreamBuffer()
    assert update_lines({"sessionUpdate": "agent_message_chunk",
                         "content": {"type": "text", "text": "hel"}}, stream) == []
    lines = update_lines({"sessionUpdate": "agent_thought_chunk",
                          "content": {"type": "text", "text": "hmm\n"}}, stream)
    assert lines == [("", "hel"), ("thought", "hmm")]
    diff = diff_lines({"type": "diff", "path": "/w/a.py", "oldText": "a\nb\n",
                       "newText": "a\nc\n"})
    text = paint(diff, color=False)
    assert "--- /w/a.py\n" in text and "  -b\n" in text and "  +c\n" in text
    assert "\x1b[31m  -b\x1b[0m" in paint(diff, color=True)
    new_file = paint(diff_lines({"type": "diff", "path": "n", "oldText": None,
                                 "newText": "x"}), color=False)
    assert "--- /dev/null" in new_file and "  +x" in new_file


def test_plan_usage_and_tool_updates_render() -> None:
    stream = StreamBuffer()
    plan = update_lines({"sessionUpdate": "plan", "entries": [
        {"content": "look", "status": "completed", "priority": "high"},
        {"content": "fix", "status": "in_progress", "priority": "medium"}]}, stream)
    assert [t for _, t in plan] == ["plan:", "  [x] look (high)", "  [~] fix (medium)"]
    usage = update_lines({"sessionUpdate": "usage_update", "used": 5, "size": 100}, stream)
    assert usage == [("dim", "usage: 5/100 tokens")]
    update = update_lines({"sessionUpdate": "tool_call_update", "toolCallId": "t1",
                           "status": "completed", "locations": [{"path": "/w/a", "line": 3}],
                           "content": [{"type": "content",
                                        "content": {"type": "text", "text": "ok"}}]}, stream)
    assert [t for _, t in update] == ["  -> t1 completed", "  at /w/a:3", "  | ok"]


@pytest.mark.parametrize("argv", [
    ["--server", "x", "--attach"],
    ["--server-args", "a"],
    ["--prompt", "hi"],
    ["--approve-all"],
    ["--cwd", "/no/such/dir"],
    ["--bogus"],
])
def test_usage_errors_exit_2(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        parse(argv)
    assert exited.value.code == 2


def test_server_commands(tmp_path: Path) -> None:
    own = parse(["--config-dir", str(tmp_path), "--attach", "ws://h:1/acp"])
    assert own.server[1:] == ["-m", "supervisor.cli.main", "acp", "--config-dir", str(tmp_path),
                              "--attach", "ws://h:1/acp"]
    assert parse(["--attach"]).server[-1] == "--attach"
    other = parse(["--server", "node agent.js", "--server-args", "--flag", "x"])
    assert other.server == ["node", "agent.js", "--flag", "x"]
    assert parse([]).cwd == Path.cwd() and parse([]).auto_approve
