"""The coding tools end to end: a real ``zeroclaw acp`` driven by the ACP SDK, the echo
agent's ``!tool`` directives (and one model conversation through the local model
server), checking what an editor receives: locations, diffs, embedded files,
questions as permission options, and always-answers that outlive the host."""

from __future__ import annotations

import base64
import hashlib
from pathlib import Path
from typing import Any

from acp.schema import (
    ContentToolCallContent,
    EmbeddedResourceContentBlock,
    FileEditToolCallContent,
)

from .conftest import SdkHostFactory
from .helpers import tool
from .model_server import ModelServer
from .model_streams import openai_reply
from .procs import write_config
from .sdkhost import SdkHost

KEY_ENV = "ZC_TEST_MODEL_KEY"


def last_update(host: SdkHost, sid: str) -> Any:
    return host.client.of(sid, "tool_call_update")[-1]


async def test_file_edit_sends_locations_and_a_diff(host: SdkHost, workspace: Path) -> None:
    host.client.permission_policy = "allow_once"
    target = workspace / "src" / "app.py"
    target.parent.mkdir()
    target.write_text("def main():\n    return 1\n")
    sid = await host.new_session(workspace)
    out = await host.prompt(sid, tool("file_edit", {
        "path": "src/app.py", "old_string": "return 1", "new_string": "return 2"}))
    assert out.stop_reason == "end_turn"
    assert target.read_text() == "def main():\n    return 2\n"
    [started] = host.client.of(sid, "tool_call")
    assert (started.kind, started.title) == ("edit", "Edit src/app.py")
    assert [(loc.path, loc.line) for loc in started.locations] == [(str(target), None)]
    [ask] = host.client.permission_asks
    assert ask.tool_call.tool_call_id == started.tool_call_id
    [preview] = [c for c in ask.tool_call.content or []
                 if isinstance(c, FileEditToolCallContent)]  # seen before it is allowed
    assert (preview.old_text, preview.new_text) == (
        "def main():\n    return 1\n", "def main():\n    return 2\n")
    update = last_update(host, sid)
    assert update.status == "completed"
    diff = next(c for c in update.content if isinstance(c, FileEditToolCallContent))
    assert (diff.path, diff.old_text, diff.new_text) == (
        str(target), "def main():\n    return 1\n", "def main():\n    return 2\n")
    assert [(loc.path, loc.line) for loc in update.locations] == [(str(target), 2)]

    await host.prompt(sid, tool("file_edit", {
        "path": "src/app.py", "old_string": "return 1", "new_string": "return 3"}))
    failed = last_update(host, sid)
    assert failed.status == "failed" and "not found" in failed.raw_output["error"]
    assert not any(isinstance(c, FileEditToolCallContent) for c in failed.content)

    await host.prompt(sid, tool("file_write", {"path": "new/file.txt", "content": "fresh"}))
    [new_file] = [c for c in host.client.permission_asks[-1].tool_call.content or []
                  if isinstance(c, FileEditToolCallContent)]
    assert (new_file.path, new_file.old_text, new_file.new_text) == (
        str(workspace / "new" / "file.txt"), None, "fresh")


async def test_read_ranges_list_and_search_through_the_agent_loop(
    host: SdkHost, workspace: Path
) -> None:
    (workspace / ".gitignore").write_text("dist/\n")
    (workspace / "dist").mkdir()
    (workspace / "dist" / "bundle.py").write_text("needle\n")
    (workspace / "pkg").mkdir()
    (workspace / "pkg" / "mod.py").write_text("a\nneedle = 1\nc\n")
    sid = await host.new_session(workspace)
    await host.prompt(sid, tool("file_read", {"path": "pkg/mod.py", "offset": 2, "limit": 1}))
    read = last_update(host, sid)
    assert read.raw_output["content"] == "needle = 1\n"
    await host.prompt(sid, tool("file_list", {"pattern": "**/*.py"}))
    assert last_update(host, sid).raw_output["files"] == ["pkg/mod.py"]
    await host.prompt(sid, tool("search", {"pattern": "needle", "glob": "*.py"}))
    found = last_update(host, sid)
    assert [(m["path"], m["line"]) for m in found.raw_output["matches"]] == [("pkg/mod.py", 2)]
    assert [(loc.path, loc.line) for loc in found.locations] == [
        (str(workspace / "pkg" / "mod.py"), 2)]
    assert host.client.permission_asks == [], "reading tools asked for permission"


async def test_deliver_file_embeds_the_blob_under_its_content_hash(
    host: SdkHost, workspace: Path
) -> None:
    data = bytes(range(256)) * 40
    (workspace / "chart.png").write_bytes(data)
    sid = await host.new_session(workspace)
    out = await host.prompt(sid, tool("deliver_file", {"path": "chart.png", "title": "Chart"}))
    assert out.stop_reason == "end_turn"
    update = last_update(host, sid)
    uri = f"attachment://deliver/{hashlib.sha256(data).hexdigest()}.png"
    assert update.title == "Chart" and update.raw_output["uri"] == uri
    [embedded] = [c.content for c in update.content if isinstance(c, ContentToolCallContent)
                  and isinstance(c.content, EmbeddedResourceContentBlock)]
    resource = embedded.resource
    assert (resource.uri, resource.mime_type) == (uri, "image/png")
    assert base64.b64decode(resource.blob) == data
    assert "blob" not in str(update.raw_output)


async def test_ask_user_offers_the_choices_as_permission_options(
    host: SdkHost, workspace: Path
) -> None:
    host.client.choose_option_named = "staging"
    sid = await host.new_session(workspace)
    await host.prompt(sid, tool("ask_user", {"question": "Deploy where?",
                                             "choices": ["prod", "staging"]}))
    [ask] = host.client.permission_asks
    assert [o.name for o in ask.options] == ["prod", "staging"]
    assert ask.tool_call.title == "Deploy where?"
    answered = last_update(host, sid)
    assert answered.status == "completed" and answered.raw_output["answer"] == "staging"
    await host.prompt(sid, tool("ask_user", {"question": "Your name?"}))
    free_text = last_update(host, sid)
    assert free_text.status == "failed" and "choices" in free_text.raw_output["error"]
    assert len(host.client.permission_asks) == 1


async def test_always_answers_are_remembered_per_tool_and_survive_a_new_host(
    sdk_hosts: SdkHostFactory, workspace: Path
) -> None:
    async with sdk_hosts() as first:
        await first.initialize()
        sid = await first.new_session(workspace)
        first.client.permission_policy = "allow_always"
        for n in range(2):
            await first.prompt(sid, tool("file_write", {"path": f"w{n}.txt", "content": "x"}))
            assert last_update(first, sid).status == "completed"
        assert len(first.client.permission_asks) == 1
        first.client.permission_policy = "reject_always"
        await first.prompt(sid, tool("shell", {"command": "touch ran1"}))
        assert len(first.client.permission_asks) == 2
    async with sdk_hosts() as second:
        await second.initialize()
        await second.conn.load_session(cwd=str(workspace), session_id=sid)
        second.client.permission_policy = "allow_once"
        await second.prompt(sid, tool("file_write", {"path": "w2.txt", "content": "x"}))
        assert last_update(second, sid).status == "completed"
        await second.prompt(sid, tool("shell", {"command": "touch ran2"}))
        refused = last_update(second, sid)
        assert refused.status == "failed" and "always reject" in refused.raw_output["error"]
        await second.prompt(sid, tool("file_edit", {"path": "w2.txt", "old_string": "x",
                                                    "new_string": "y"}))
        assert len(second.client.permission_asks) == 1, "only the new tool asked"
    assert not (workspace / "ran1").exists() and not (workspace / "ran2").exists()
    assert (workspace / "w2.txt").read_text() == "y"


async def test_a_model_reads_edits_and_answers(
    sdk_hosts: SdkHostFactory, config_dir: Path, tmp_path: Path, workspace: Path,
    model_server: ModelServer,
) -> None:
    (workspace / "greet.py").write_text("print('helo')\n")
    read = {"tool_calls": [{"index": 0, "id": "r1", "type": "function", "function": {
        "name": "file_read", "arguments": '{"path": "greet.py"}'}}]}
    edit = {"tool_calls": [{"index": 0, "id": "e1", "type": "function", "function": {
        "name": "file_edit",
        "arguments": '{"path": "greet.py", "old_string": "helo", "new_string": "hello"}'}}]}
    model_server.script(openai_reply(read, finish="tool_calls"),
                        openai_reply(edit, finish="tool_calls"),
                        openai_reply({"content": "Fixed the typo."}))
    write_config(config_dir, (
        f'[agents.main]\nprovider = "openai"\nbase_url = "{model_server.url}/v1"\n'
        f'model = "gpt-test"\napi_key_env = "{KEY_ENV}"\nworkspace = "{tmp_path / "aws"}"\n'
        '[autonomy]\nlevel = "full"\n'))
    async with sdk_hosts(env_extra={KEY_ENV: "sk-test"}) as host:
        await host.initialize()
        sid = await host.new_session(workspace)
        out = await host.prompt(sid, "fix the typo in greet.py")
        assert (out.stop_reason, out.content) == ("end_turn", "Fixed the typo.")
        updates = [u for u in host.client.of(sid, "tool_call_update")
                   if u.status == "completed"]
        diffs = [c for u in updates for c in u.content or []
                 if isinstance(c, FileEditToolCallContent)]
        assert [(d.old_text, d.new_text) for d in diffs] == [
            ("print('helo')\n", "print('hello')\n")]
    assert (workspace / "greet.py").read_text() == "print('hello')\n"
    first, second, third = model_server.requests
    assert {t["function"]["name"] for t in first.body["tools"]} >= {
        "file_edit", "file_list", "search", "ask_user", "deliver_file"}
    read_result = second.body["messages"][-1]
    assert read_result["role"] == "tool" and read_result["tool_call_id"] == "r1"
    assert read_result["content"] == "print('helo')\n"
    edit_result = third.body["messages"][-1]
    assert edit_result["tool_call_id"] == "e1" and "1 replacement" in edit_result["content"]
