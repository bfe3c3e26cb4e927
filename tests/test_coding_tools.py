"""The coding tools on real files: file_read ranges, file_edit, file_list, search,
deliver_file and ask_user; and how their results travel (wire form, ACP encoding)."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import os
import threading
from pathlib import Path
from typing import Any

import pytest
from acp.schema import ToolCallProgress, ToolCallStart

from actors.worker.tools import PathPolicy, ToolEnv, ToolError, default_tools
from actors.worker.tools.ask import question_schema
from actors.worker.tools.tree import glob_regex
from ipc import acp
from ipc.events import (
    DiffContent,
    ResourceContent,
    ToolCallFinished,
    ToolCallStarted,
    ToolLocation,
    event_from_wire,
    event_to_wire,
)
from tests.test_tools import Flipper

TOOLS = default_tools()


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = tmp_path / "project"
    root.mkdir()
    return Path(os.path.realpath(root))


def env_for(root: Path, forbidden: tuple[str, ...] = (), ask: Any = None) -> ToolEnv:
    policy = PathPolicy.build(str(root), str(root), forbidden)
    if ask is None:
        return ToolEnv(paths=policy, cancelled=threading.Event())
    return ToolEnv(paths=policy, cancelled=threading.Event(), ask_user=ask)


def run(name: str, args: dict[str, Any], env: ToolEnv) -> Any:
    return TOOLS[name].run(args, env)


def write(root: Path, rel: str, text: str | bytes) -> Path:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    return path


# --- file_read ranges ------------------------------------------------------------------


def test_file_read_line_ranges_and_the_whole_file_without_them(project: Path) -> None:
    write(project, "f.txt", "one\ntwo\nthree\nfour\n")
    env = env_for(project)
    whole = run("file_read", {"path": "f.txt"}, env)
    assert whole.text == "one\ntwo\nthree\nfour\n" and "offset" not in whole.raw_output
    part = run("file_read", {"path": "f.txt", "offset": 2, "limit": 2}, env)
    assert part.raw_output["content"] == "two\nthree\n"
    assert part.text == "two\nthree\n[lines 2-3 of 4]"
    assert part.locations == (ToolLocation(str(project / "f.txt"), 2),)
    assert run("file_read", {"path": "f.txt", "offset": 4}, env).raw_output["content"] == "four\n"
    assert run("file_read", {"path": "f.txt", "limit": 1}, env).raw_output["content"] == "one\n"
    with pytest.raises(ToolError, match="past the end"):
        run("file_read", {"path": "f.txt", "offset": 9}, env)
    for bad in ({"offset": 0}, {"limit": "3"}, {"offset": True}):
        with pytest.raises(ToolError, match="integer"):
            run("file_read", {"path": "f.txt", **bad}, env)


# --- file_edit -------------------------------------------------------------------------


def test_file_edit_replaces_one_exact_string_and_returns_the_diff(project: Path) -> None:
    path = write(project, "src/a.py", "def f():\n    return 1\n")
    path.chmod(0o600)
    result = run("file_edit", {"path": "src/a.py", "old_string": "return 1",
                               "new_string": "return 2"}, env_for(project))
    assert path.read_text() == "def f():\n    return 2\n"
    assert path.stat().st_mode & 0o777 == 0o600
    assert result.content == (DiffContent(str(path), "def f():\n    return 1\n",
                                          "def f():\n    return 2\n"),)
    assert result.locations == (ToolLocation(str(path), 2),)
    assert result.raw_output == {"path": str(path), "replacements": 1, "line": 2}
    assert [p.name for p in path.parent.iterdir()] == ["a.py"], "a temporary file was left"


def test_file_edit_fails_clearly_when_absent_or_ambiguous(project: Path) -> None:
    path = write(project, "a.txt", "x = 1\nx = 1\n")
    env = env_for(project)
    with pytest.raises(ToolError, match="not found"):
        run("file_edit", {"path": "a.txt", "old_string": "y", "new_string": "z"}, env)
    with pytest.raises(ToolError, match="occurs 2 times"):
        run("file_edit", {"path": "a.txt", "old_string": "x = 1", "new_string": "x = 2"}, env)
    assert path.read_text() == "x = 1\nx = 1\n"
    result = run("file_edit", {"path": "a.txt", "old_string": "x = 1", "new_string": "x = 2",
                               "replace_all": True}, env)
    assert path.read_text() == "x = 2\nx = 2\n" and result.raw_output["replacements"] == 2
    with pytest.raises(ToolError, match="file_write creates files"):
        run("file_edit", {"path": "new.txt", "old_string": "a", "new_string": "b"}, env)
    with pytest.raises(ToolError, match="the same"):
        run("file_edit", {"path": "a.txt", "old_string": "x", "new_string": "x"}, env)
    with pytest.raises(ToolError, match="outside"):
        run("file_edit", {"path": "/etc/hostname", "old_string": "a", "new_string": "b"}, env)


def test_file_edit_refuses_a_symlink_and_binary_files(project: Path, tmp_path: Path) -> None:
    outside = write(tmp_path, "outside.txt", "secret = 1\n")
    (project / "link.txt").symlink_to(outside)
    write(project, "blob.bin", b"\xff\xfe x = 1")
    env = env_for(project)
    with pytest.raises(ToolError, match="outside"):
        run("file_edit", {"path": "link.txt", "old_string": "1", "new_string": "2"}, env)
    assert outside.read_text() == "secret = 1\n"
    with pytest.raises(ToolError, match="not UTF-8"):
        run("file_edit", {"path": "blob.bin", "old_string": "x", "new_string": "y"}, env)


# --- file_list -------------------------------------------------------------------------


def test_glob_patterns() -> None:
    cases = [("src/**/*.py", "src/a.py", True), ("src/**/*.py", "src/x/y/a.py", True),
             ("*.py", "a.py", True), ("*.py", "d/a.py", False), ("**/*.py", "a.py", True),
             ("[ab].txt", "b.txt", True), ("[!ab].txt", "a.txt", False), ("a?c", "abc", True),
             ("a?c", "a/c", False), ("**", "x/y", True), ("a.b", "axb", False)]
    for pattern, path, expected in cases:
        assert bool(glob_regex(pattern).match(path)) is expected, (pattern, path)


def test_file_list_globs_honours_gitignore_and_never_follows_links(
    project: Path, tmp_path: Path
) -> None:
    write(project, ".gitignore", "build/\n*.log\n")
    write(project, "src/a.py", "")
    write(project, "src/sub/b.py", "")
    write(project, "src/sub/.gitignore", "!keep.log\n")
    write(project, "src/sub/keep.log", "")
    write(project, "build/gen.py", "")
    write(project, "x.log", "")
    write(project, ".git/config", "")
    write(tmp_path, "outside/leak.py", "")
    (project / "src" / "out").symlink_to(tmp_path / "outside")
    (project / "src" / "l.py").symlink_to(project / "src" / "a.py")
    env = env_for(project)
    listed = run("file_list", {"pattern": "src/**/*.py"}, env)
    assert listed.raw_output["files"] == ["src/a.py", "src/sub/b.py"]
    everything = run("file_list", {}, env).raw_output["files"]
    assert everything == [".gitignore", "src/", "src/a.py", "src/sub/", "src/sub/.gitignore",
                          "src/sub/b.py", "src/sub/keep.log"]
    top = run("file_list", {"pattern": "*", "path": "src"}, env)
    assert top.raw_output["files"] == ["a.py", "sub/"]
    assert top.raw_output["path"] == str(project / "src")
    with pytest.raises(ToolError, match="relative"):
        run("file_list", {"pattern": "../*"}, env)
    with pytest.raises(ToolError, match="outside"):
        run("file_list", {"path": str(tmp_path / "outside")}, env)


def test_file_list_is_bounded_and_skips_forbidden_directories(project: Path) -> None:
    for n in range(30):
        write(project, f"many/{n:02}.txt", "")
    write(project, "secret/key.txt", "")
    env = env_for(project, forbidden=(str(project / "secret"),))
    result = run("file_list", {"pattern": "**/*.txt", "limit": 10}, env)
    assert len(result.raw_output["files"]) == 10 and result.raw_output["truncated"]
    assert "stopped after 10" in result.text
    assert all("secret" not in f for f in run("file_list", {}, env).raw_output["files"])


# --- search ----------------------------------------------------------------------------


def test_search_finds_lines_skips_binary_ignored_and_linked_files(
    project: Path, tmp_path: Path
) -> None:
    write(project, ".gitignore", "vendor/\n")
    write(project, "src/a.py", "def foo():\n    return FOO\n")
    write(project, "src/b.txt", "foo in text\n")
    write(project, "src/blob.bin", b"foo\0binary")
    write(project, "vendor/lib.py", "foo = 1\n")
    write(tmp_path, "outside.py", "foo outside\n")
    (project / "src" / "link.py").symlink_to(tmp_path / "outside.py")
    env = env_for(project)
    result = run("search", {"pattern": r"foo\b"}, env)
    hits = [(m["path"], m["line"]) for m in result.raw_output["matches"]]
    assert hits == [("src/a.py", 1), ("src/b.txt", 1)]
    assert result.text.splitlines()[0] == "src/a.py:1: def foo():"
    assert result.locations[0] == ToolLocation(str(project / "src/a.py"), 1)
    folded = run("search", {"pattern": "foo", "ignore_case": True, "glob": "*.py"}, env)
    assert [(m["path"], m["line"]) for m in folded.raw_output["matches"]] == [
        ("src/a.py", 1), ("src/a.py", 2)]
    assert run("search", {"pattern": "nothing-here"}, env).text.startswith("no match")
    with pytest.raises(ToolError, match="regular expression"):
        run("search", {"pattern": "("}, env)


def test_search_output_is_bounded(project: Path) -> None:
    write(project, "big.txt", "hit " + "x" * 1000 + "\n" + "hit\n" * 500)
    result = run("search", {"pattern": "hit", "limit": 20}, env_for(project))
    assert len(result.raw_output["matches"]) == 20 and result.raw_output["truncated"]
    assert len(result.raw_output["matches"][0]["text"]) == 300


# --- deliver_file ----------------------------------------------------------------------


def test_deliver_file_embeds_a_content_addressed_copy(project: Path) -> None:
    data = b"%PDF-1.4 pretend\n"
    write(project, "out/report.pdf", data)
    result = run("deliver_file", {"path": "out/report.pdf", "title": "Quarterly report"},
                 env_for(project))
    digest = hashlib.sha256(data).hexdigest()
    uri = f"attachment://deliver/{digest}.pdf"
    assert result.raw_output == {"uri": uri, "mimeType": "application/pdf", "bytes": len(data),
                                 "title": "Quarterly report",
                                 "path": str(project / "out/report.pdf")}
    assert result.title == "Quarterly report"
    assert result.content == (ResourceContent(uri, "application/pdf",
                                              base64.b64encode(data).decode()),)
    assert "base64" not in result.text and len(result.text) < 200
    assert (project / "uploads" / f"{digest}.pdf").read_bytes() == data


def test_deliver_file_refuses_large_and_outside_files(project: Path, tmp_path: Path) -> None:
    with open(project / "huge.bin", "wb") as handle:
        handle.truncate(acp.MAX_BLOB_BYTES + 1)
    write(tmp_path, "outside.txt", "no")
    env = env_for(project)
    with pytest.raises(ToolError, match="larger than 10 MiB"):
        run("deliver_file", {"path": "huge.bin"}, env)
    with pytest.raises(ToolError, match="outside"):
        run("deliver_file", {"path": str(tmp_path / "outside.txt")}, env)
    assert not (project / "uploads").exists()


# --- ask_user --------------------------------------------------------------------------


def test_ask_user_sends_choices_and_returns_the_answer(project: Path) -> None:
    asked: list[tuple[str, dict[str, Any]]] = []

    def ask(message: str, schema: dict[str, Any]) -> dict[str, Any] | None:
        asked.append((message, schema))
        return {"action": "accept", "content": {"answer": "red"}}

    result = run("ask_user", {"question": "Colour?", "choices": ["blue", "red"]},
                 env_for(project, ask=ask))
    assert result.text == "red" and result.ok
    assert asked == [("Colour?", question_schema(["blue", "red"]))]
    declined = run("ask_user", {"question": "Colour?"},
                   env_for(project, ask=lambda m, s: {"action": "decline", "content": {}}))
    assert not declined.ok and "decline" in declined.text
    with pytest.raises(ToolError, match="only answer questions with choices"):
        run("ask_user", {"question": "Name?"}, env_for(project))
    with pytest.raises(ToolError, match="choices"):
        run("ask_user", {"question": "?", "choices": ["a", "a"]}, env_for(project))


def test_acp_questions_map_choices_to_permission_options() -> None:
    form = acp.question_choices(question_schema(["blue", "red"]))
    assert form == ("answer", ["blue", "red"])
    assert acp.question_choices(question_schema(None)) is None
    params = acp.question_params("s1", "ask-1", "Colour?", ["blue", "red"])
    assert [(o["optionId"], o["name"]) for o in params["options"]] == [
        ("choice-0", "blue"), ("choice-1", "red")]
    chosen = {"outcome": {"outcome": "selected", "optionId": "choice-1"}}
    assert acp.question_answer(chosen, "answer", ["blue", "red"]) == {
        "action": "accept", "content": {"answer": "red"}}
    cancelled = {"outcome": {"outcome": "cancelled"}}
    assert acp.question_answer(cancelled, "answer", ["blue"])["action"] == "cancel"


# --- how results travel ----------------------------------------------------------------


def test_tool_content_crosses_the_wire_and_encodes_as_acp() -> None:
    started = ToolCallStarted("c1", "file_edit", "Edit /p/a.py", "edit", {"path": "a.py"},
                              (ToolLocation("/p/a.py"),))
    finished = ToolCallFinished(
        "c1", "file_edit", "completed", {"line": 2}, "edited",
        (DiffContent("/p/a.py", "a\n", "b\n"), ResourceContent("attachment://deliver/x.txt",
                                                               "text/plain", "eA==")),
        (ToolLocation("/p/a.py", 2),), "Edited a.py")
    for event in (started, finished):
        assert event_from_wire(event_to_wire(event)) == event
    start = acp.encode_event("s", started)["update"]
    ToolCallStart.model_validate(start)
    assert start["locations"] == [{"path": "/p/a.py"}]
    update = acp.encode_event("s", finished)["update"]
    parsed = ToolCallProgress.model_validate(update)
    assert update["content"][1] == {"type": "diff", "path": "/p/a.py", "oldText": "a\n",
                                    "newText": "b\n"}
    assert update["content"][2]["content"]["resource"]["uri"] == "attachment://deliver/x.txt"
    assert parsed.title == "Edited a.py" and update["locations"] == [{"path": "/p/a.py",
                                                                      "line": 2}]


def test_permission_options_include_the_always_answers() -> None:
    params = acp.permission_params("s", "c", "Write x", "edit", {})
    assert [o["kind"] for o in params["options"]] == [
        "allow_once", "allow_always", "reject_once", "reject_always"]
    picked = {"outcome": {"outcome": "selected", "optionId": "reject-always"}}
    assert acp.selected_option(picked) == "reject_always"


def test_edit_and_write_previews_are_diffs_or_nothing(project: Path) -> None:
    path = write(project, "a.txt", "one\n")
    policy = env_for(project).paths
    edit = TOOLS["file_edit"]
    assert edit.preview({"path": "a.txt", "old_string": "one", "new_string": "two"},
                        policy) == (DiffContent(str(path), "one\n", "two\n"),)
    assert edit.preview({"path": "a.txt", "old_string": "zzz", "new_string": "y"}, policy) == ()
    assert edit.preview({"path": "/etc/hostname", "old_string": "a", "new_string": "b"},
                        policy) == ()
    written = TOOLS["file_write"]
    assert written.preview({"path": "a.txt", "content": "new"}, policy) == (
        DiffContent(str(path), "one\n", "new"),)
    assert written.preview({"path": "d/b.txt", "content": "x"}, policy) == (
        DiffContent(str(project / "d" / "b.txt"), None, "x"),)
    assert path.read_text() == "one\n" and not (project / "d").exists()


def test_search_and_edit_never_reach_through_a_swapped_in_symlink(
    project: Path, tmp_path: Path
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("OUTSIDE-SECRET\n")
    (project / "src").mkdir()
    (project / "src" / "code.txt").write_text("inside\n")
    (project / "src.swap").symlink_to(outside)
    env = env_for(project)
    with Flipper(project, "src", "src.swap") as flipper:
        for _ in range(300):
            result = run("search", {"pattern": "OUTSIDE|inside"}, env)
            assert "OUTSIDE" not in result.text
    assert flipper.flips > 0
    (project / "e.txt").write_text("OUTSIDE-SECRET\n")
    (project / "e.swap").symlink_to(outside / "secret.txt")
    with Flipper(project, "e.txt", "e.swap") as flipper:
        for _ in range(300):
            with contextlib.suppress(ToolError):
                run("file_edit", {"path": "e.txt", "old_string": "OUTSIDE", "new_string": "X",
                                  "replace_all": True}, env)
            with contextlib.suppress(OSError):  # put the text back, never through the link
                fd = os.open(project / "e.txt", os.O_WRONLY | os.O_TRUNC | os.O_NOFOLLOW)
                os.write(fd, b"OUTSIDE-SECRET\n")
                os.close(fd)
    assert flipper.flips > 0
    assert (outside / "secret.txt").read_text() == "OUTSIDE-SECRET\n"
