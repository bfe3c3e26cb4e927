"""SPEC §7: the ``openai`` agent end to end against a local Chat Completions server.

A real ``zeroclaw acp`` (driven by the ACP SDK) runs an agent whose ``base_url``
points at :class:`~tests.e2e.model_server.ModelServer`, which replays streams shaped
like real servers' and records what the model was sent.
"""

from __future__ import annotations

import asyncio
import json
import secrets
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

from actors.worker.agents.llm.conversation import INTERRUPTED_NOTE
from actors.worker.tools import default_tools

from .conftest import SdkHostFactory
from .helpers import CANCEL_MARKER, stored_session
from .model_server import ModelServer, Reply
from .model_streams import openai_reply
from .procs import write_config
from .sdkhost import SdkHost, expect_error

KEY_ENV = "ZC_TEST_MODEL_KEY"
KEY = f"zc-test-model-key-{secrets.token_hex(12)}"  # made per run: no key-shaped literal


def openai_config(server: ModelServer, agent_ws: Path, extra: str = "",
                  level: str = "full") -> str:
    return (f'[agents.main]\nprovider = "openai"\nbase_url = "{server.url}/v1"\n'
            f'model = "gpt-test"\napi_key_env = "{KEY_ENV}"\nworkspace = "{agent_ws}"\n'
            f'context_window = 16000\nmax_retries = 2\n{extra}'
            f'[autonomy]\nlevel = "{level}"\n')


def start(sdk_hosts: SdkHostFactory, config_dir: Path, text: str,
          **env: str) -> AbstractAsyncContextManager[SdkHost]:
    """A host whose config is ``text``, with the key variable set."""
    write_config(config_dir, text)
    return sdk_hosts(env_extra={KEY_ENV: KEY, **env})


def text_of(host: SdkHost, sid: str, kind: str = "agent_message_chunk") -> str:
    return host.client.text(sid, kind)


async def test_plain_text_streams_with_usage_system_prompt_and_history(
    sdk_hosts: SdkHostFactory, config_dir: Path, tmp_path: Path, workspace: Path,
    model_server: ModelServer,
) -> None:
    agent_ws = tmp_path / "agent-ws"
    agent_ws.mkdir()
    (agent_ws / "IDENTITY.md").write_text("I am Ferris, the careful crab.")
    (agent_ws / "SOUL.md").write_text("Be kind to borrow checkers.")
    model_server.script(
        openai_reply({"content": "Hel"}, {"content": "lo "}, {"content": "world"}),
        openai_reply({"content": "Again"}, usage=(40, 2)),
    )
    async with start(sdk_hosts, config_dir, openai_config(model_server, agent_ws)) as host:
        await host.initialize()
        sid = await host.new_session(workspace)
        out = await host.prompt(sid, "hello there")
        assert (out.stop_reason, out.content) == ("end_turn", "Hello world")
        assert text_of(host, sid) == "Hello world"
        [usage] = host.client.of(sid, "usage_update")
        assert (usage.used, usage.size) == (17, 16000)
        out = await host.prompt(sid, "and again")
        assert out.content == "Again"
    first, second = model_server.requests
    assert first.path == "/v1/chat/completions"
    assert first.headers["authorization"] == f"Bearer {KEY}"
    body = first.body
    assert body["model"] == "gpt-test" and body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert {t["function"]["name"] for t in body["tools"]} == set(default_tools())
    system = body["messages"][0]
    assert system["role"] == "system"
    assert f"Working directory: {workspace}" in system["content"]
    assert "I am Ferris" in system["content"] and "borrow checkers" in system["content"]
    assert body["messages"][1:] == [{"role": "user", "content": "hello there"}]
    assert second.body["messages"][1:] == [
        {"role": "user", "content": "hello there"},
        {"role": "assistant", "content": "Hello world"},
        {"role": "user", "content": "and again"},
    ]


async def test_reasoning_deltas_and_think_tags_become_thoughts(
    sdk_hosts: SdkHostFactory, config_dir: Path, tmp_path: Path, workspace: Path,
    model_server: ModelServer,
) -> None:
    model_server.script(
        openai_reply({"reasoning_content": "The user "}, {"reasoning_content": "greets."},
                     {"content": "Hi!"}),
        openai_reply({"content": "<thi"}, {"content": "nk>plan: be brief</th"},
                     {"content": "ink>\n\nShort answer."}),
    )
    text = openai_config(model_server, tmp_path / "aws")
    async with start(sdk_hosts, config_dir, text) as host:
        await host.initialize()
        sid = await host.new_session(workspace)
        assert (await host.prompt(sid, "hi")).content == "Hi!"
        assert text_of(host, sid, "agent_thought_chunk") == "The user greets."
        mark = host.client.mark()
        out = await host.prompt(sid, "again")
        assert out.content == "\n\nShort answer."
        assert host.client.text(sid, "agent_thought_chunk", mark) == "plan: be brief"
    second = model_server.requests[1].body["messages"]
    assert {"role": "assistant", "content": "Hi!"} in second  # thoughts are not sent back


def split_tool_calls() -> list[dict[str, Any]]:
    """Two parallel calls, each split across chunks and interleaved, ids on the first."""
    return [
        {"tool_calls": [{"index": 0, "id": "call_aaa", "type": "function",
                         "function": {"name": "file_read", "arguments": ""}}]},
        {"tool_calls": [{"index": 0, "function": {"arguments": '{"pa'}}]},
        {"tool_calls": [{"index": 1, "id": "call_bbb", "type": "function",
                         "function": {"name": "shell", "arguments": '{"command": '}}]},
        {"tool_calls": [{"index": 0, "function": {"arguments": 'th": "notes.txt"}'}}]},
        {"tool_calls": [{"index": 1, "function": {"arguments": '"echo from-shell"}'}}]},
    ]


async def test_parallel_split_tool_calls_run_and_results_go_back(
    sdk_hosts: SdkHostFactory, config_dir: Path, tmp_path: Path, workspace: Path,
    model_server: ModelServer,
) -> None:
    (workspace / "notes.txt").write_text("the notes")
    model_server.script(
        openai_reply({"content": "Looking."}, *split_tool_calls(), finish="tool_calls"),
        openai_reply({"content": "Both done."}),
    )
    async with start(sdk_hosts, config_dir,
                           openai_config(model_server, tmp_path / "aws")) as host:
        await host.initialize()
        sid = await host.new_session(workspace)
        out = await host.prompt(sid, "read and run")
        assert (out.stop_reason, out.content) == ("end_turn", "Looking.Both done.")
        calls = host.client.of(sid, "tool_call")
        assert [c.title for c in calls] == ["Read notes.txt", "shell: echo from-shell"]
        finals = [u for u in host.client.of(sid, "tool_call_update") if u.status != "in_progress"]
        assert [u.status for u in finals] == ["completed", "completed"]
    follow_up = model_server.requests[1].body["messages"]
    assistant, read, shell = follow_up[-3:]
    assert assistant["role"] == "assistant" and assistant["content"] == "Looking."
    assert [(c["id"], c["function"]["name"], json.loads(c["function"]["arguments"]))
            for c in assistant["tool_calls"]] == [
        ("call_aaa", "file_read", {"path": "notes.txt"}),
        ("call_bbb", "shell", {"command": "echo from-shell"})]
    assert (read["role"], read["tool_call_id"], read["content"]) == (
        "tool", "call_aaa", "the notes")
    assert (shell["tool_call_id"], shell["content"].strip()) == ("call_bbb", "from-shell")


async def test_tool_calls_without_ids_are_keyed_by_index_and_history_keeps_them(
    sdk_hosts: SdkHostFactory, config_dir: Path, tmp_path: Path, workspace: Path,
    model_server: ModelServer,
) -> None:
    model_server.script(
        openai_reply({"tool_calls": [{"index": 0, "function": {"name": "file_write",
                                                                "arguments": '{"path": "o'}}]},
                     {"tool_calls": [{"index": 0, "function": {
                         "arguments": 'ut.txt", "content": "written"}'}}]},
                     finish="tool_calls", usage=None),
        openai_reply({"content": "Wrote it."}, usage=None),
        openai_reply({"content": "ok"}),
    )
    async with start(sdk_hosts, config_dir,
                           openai_config(model_server, tmp_path / "aws")) as host:
        await host.initialize()
        sid = await host.new_session(workspace)
        out = await host.prompt(sid, "write")
        assert out.content == "Wrote it."
        assert (workspace / "out.txt").read_text() == "written"
        usages = host.client.of(sid, "usage_update")
        assert usages and all(u.used > 0 for u in usages)  # estimated: the server sent none
        await host.prompt(sid, "next")
    _, second_round, next_turn = (r.body["messages"] for r in model_server.requests)
    call = second_round[-2]["tool_calls"][0]
    assert second_round[-1]["tool_call_id"] == call["id"] and call["id"]
    # the stored turn comes back as history: the call, its result, the answer
    history = next_turn[1:-1]
    assert [m["role"] for m in history] == ["user", "assistant", "tool", "assistant"]
    assert history[1]["tool_calls"][0]["function"]["name"] == "file_write"
    assert history[2]["tool_call_id"] == history[1]["tool_calls"][0]["id"]
    assert "wrote 7 bytes" in history[2]["content"]


async def test_429_503_and_a_cut_before_the_first_event_are_retried(
    sdk_hosts: SdkHostFactory, config_dir: Path, tmp_path: Path, workspace: Path,
    model_server: ModelServer,
) -> None:
    model_server.script(
        Reply(status=429, headers=(("retry-after", "1"),),
              body=b'{"error":{"message":"Rate limit reached","type":"requests"}}'),
        Reply(status=503, body=b'{"error":{"message":"overloaded"}}'),
        Reply(events=openai_reply().events, cut_after=0),  # cut before the first event
        openai_reply({"content": "finally"}),
    )
    text = openai_config(model_server, tmp_path / "aws").replace("max_retries = 2",
                                                                 "max_retries = 3")
    async with start(sdk_hosts, config_dir, text) as host:
        await host.initialize()
        sid = await host.new_session(workspace)
        out = await host.prompt(sid, "hi")
        assert (out.stop_reason, out.content) == ("end_turn", "finally")
    first, second, third, fourth = model_server.requests
    assert second.at - first.at >= 0.95, "Retry-After: 1 was not honoured"
    assert first.body == second.body == third.body == fourth.body


async def test_errors_that_retries_cannot_fix_fail_the_turn_clearly(
    sdk_hosts: SdkHostFactory, config_dir: Path, tmp_path: Path, workspace: Path,
    model_server: ModelServer,
) -> None:
    model_server.script(
        Reply(status=401, body=json.dumps({"error": {
            "message": f"Incorrect API key provided: {KEY}.", "type": "invalid_request_error",
        }}).encode()),
        *[Reply(status=500, body=b'{"error":{"message":"boom"}}')] * 3,
    )
    async with start(sdk_hosts, config_dir,
                           openai_config(model_server, tmp_path / "aws")) as host:
        await host.initialize()
        sid = await host.new_session(workspace)
        error = await expect_error(host.prompt(sid, "hi"), -32603)
        assert "HTTP 401" in str(error) and "Incorrect API key" in str(error)
        assert KEY not in str(error) and KEY not in json.dumps(error.data)
        error = await expect_error(host.prompt(sid, "again"), -32603)
        assert "HTTP 500: boom" in str(error) and "3 attempts" in str(error)
    assert len(model_server.requests) == 4


async def test_a_stream_cut_midway_fails_the_turn_without_a_retry(
    sdk_hosts: SdkHostFactory, config_dir: Path, tmp_path: Path, workspace: Path,
    model_server: ModelServer,
) -> None:
    reply = openai_reply({"content": "partial "}, {"content": "answer"})
    model_server.script(Reply(events=reply.events, cut_after=2), openai_reply({"content": "ok"}))
    async with start(sdk_hosts, config_dir,
                           openai_config(model_server, tmp_path / "aws")) as host:
        await host.initialize()
        sid = await host.new_session(workspace)
        error = await expect_error(host.prompt(sid, "hi"), -32603)
        assert "stream broke" in str(error)
        assert text_of(host, sid) == "partial "  # the client saw what came
        assert len(model_server.requests) == 1
        out = await host.prompt(sid, "still there?")
        assert out.content == "ok"
    # what was streamed is kept as the failed turn's partial output: in the store, and
    # in what the model is sent next
    _, items = stored_session(config_dir, sid)
    texts = [getattr(i, "text", None) for i in items]
    assert texts[0] == "hi" and texts[2:] == ["still there?", "ok"]
    assert texts[1].startswith("partial \n[turn failed: ") and "stream broke" in texts[1]
    # the model is told the reply was cut short, not the error's text (an exception's
    # words, the API's URL)
    assert model_server.requests[1].body["messages"][1:] == [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": f"partial \n{INTERRUPTED_NOTE}"},
        {"role": "user", "content": "still there?"}]


async def test_a_stream_that_ends_without_finish_reason_or_done_fails_the_turn(
    sdk_hosts: SdkHostFactory, config_dir: Path, tmp_path: Path, workspace: Path,
    model_server: ModelServer,
) -> None:
    """The body ends cleanly (the last chunk of its chunked encoding) after a delta:
    a server or proxy that gave up, not an answer."""
    role, delta = openai_reply({"content": "half an ans"}).events[:2]
    model_server.script(Reply(events=(role, delta)), openai_reply({"content": "whole"}))
    async with start(sdk_hosts, config_dir,
                           openai_config(model_server, tmp_path / "aws")) as host:
        await host.initialize()
        sid = await host.new_session(workspace)
        error = await expect_error(host.prompt(sid, "hi"), -32603)
        assert "ended before the reply did" in str(error)
        assert text_of(host, sid) == "half an ans"
        assert (await host.prompt(sid, "again")).content == "whole"
    assert len(model_server.requests) == 2


async def test_cancel_aborts_a_stalled_stream_and_keeps_what_was_streamed(
    sdk_hosts: SdkHostFactory, config_dir: Path, tmp_path: Path, workspace: Path,
    model_server: ModelServer,
) -> None:
    reply = openai_reply({"content": "thinking about it"}, {"content": " and more"})
    model_server.script(Reply(events=reply.events, hold_after=2))
    async with start(sdk_hosts, config_dir,
                           openai_config(model_server, tmp_path / "aws")) as host:
        await host.initialize()
        sid = await host.new_session(workspace)
        turn = asyncio.create_task(host.prompt(sid, "slow"))
        await host.client.wait_text(sid, "thinking about it")
        await host.conn.cancel(session_id=sid)
        out = await asyncio.wait_for(turn, 10)
        assert out.stop_reason == "cancelled"
        assert out.content == f"thinking about it\n{CANCEL_MARKER}"
        assert await asyncio.to_thread(model_server.state.client_gone.wait, 10), (
            "the HTTP stream was not closed")
    _, items = stored_session(config_dir, sid)
    assert getattr(items[-1], "text", "").endswith(CANCEL_MARKER)


async def test_length_and_refusals_set_the_stop_reason(
    sdk_hosts: SdkHostFactory, config_dir: Path, tmp_path: Path, workspace: Path,
    model_server: ModelServer,
) -> None:
    model_server.script(
        openai_reply({"content": "cut sh"}, finish="length"),
        openai_reply({"refusal": "I can't help with that."}),
        openai_reply({"content": ""}, finish="content_filter"),
    )
    async with start(sdk_hosts, config_dir,
                           openai_config(model_server, tmp_path / "aws")) as host:
        await host.initialize()
        sid = await host.new_session(workspace)
        out = await host.prompt(sid, "long")
        assert (out.stop_reason, out.content) == ("max_tokens", "cut sh")
        out = await host.prompt(sid, "bad")
        assert (out.stop_reason, out.content) == ("refusal", "I can't help with that.")
        assert (await host.prompt(sid, "worse")).stop_reason == "refusal"


async def test_max_tool_rounds_stops_a_model_that_keeps_calling_tools(
    sdk_hosts: SdkHostFactory, config_dir: Path, tmp_path: Path, workspace: Path,
    model_server: ModelServer,
) -> None:
    call = {"tool_calls": [{"index": 0, "id": "c1", "function": {
        "name": "shell", "arguments": '{"command": "true"}'}}]}
    model_server.script(*[openai_reply(call, finish="tool_calls")] * 3)
    text = openai_config(model_server, tmp_path / "aws", extra="max_tool_rounds = 2\n")
    async with start(sdk_hosts, config_dir, text) as host:
        await host.initialize()
        sid = await host.new_session(workspace)
        out = await host.prompt(sid, "loop")
        assert out.stop_reason == "end_turn" and "max_tool_rounds" in out.content
        assert len(host.client.of(sid, "tool_call")) == 2
    assert len(model_server.requests) == 3


async def test_the_api_key_never_reaches_logs_store_or_status(
    sdk_hosts: SdkHostFactory, config_dir: Path, tmp_path: Path, workspace: Path,
    model_server: ModelServer,
) -> None:
    call = {"tool_calls": [{"index": 0, "id": "c1", "function": {
        "name": "shell", "arguments": json.dumps({"command": "echo tool ran"})}}]}
    model_server.script(
        openai_reply(call, finish="tool_calls"), openai_reply({"content": "done"}),
        Reply(status=401, body=json.dumps({"error": {"message": f"bad key {KEY}"}}).encode()),
    )
    text = openai_config(model_server, tmp_path / "aws", extra='headers = {"x-team" = "t1"}\n')
    async with start(sdk_hosts, config_dir, text, ZEROCLAW_LOG="debug") as host:
        await host.initialize()
        sid = await host.new_session(workspace)
        assert (await host.prompt(sid, "go")).content == "done"
        await expect_error(host.prompt(sid, "again"), -32603)
        assert KEY not in json.dumps(await host.raw("status", {}))
        assert KEY not in json.dumps(host.wire)
    assert model_server.requests[0].headers["x-team"] == "t1"
    stderr = "".join(p.read_text(errors="replace") for p in tmp_path.glob("host-*.stderr"))
    assert "session" in stderr  # debug logging was on
    assert KEY not in stderr
    for path in (config_dir / "data").rglob("*"):
        if path.is_file():
            assert KEY.encode() not in path.read_bytes(), path


async def test_history_is_trimmed_to_the_context_window_oldest_turns_first(
    sdk_hosts: SdkHostFactory, config_dir: Path, tmp_path: Path, workspace: Path,
    model_server: ModelServer,
) -> None:
    model_server.script(*[openai_reply({"content": f"answer {n}"}) for n in range(3)])
    text = openai_config(model_server, tmp_path / "aws").replace(
        "context_window = 16000", "context_window = 2000")
    async with start(sdk_hosts, config_dir, text, ZEROCLAW_LOG="info") as host:
        await host.initialize()
        sid = await host.new_session(workspace)
        await host.prompt(sid, "old " * 2000)  # ~2,000 tokens: more than the whole window
        await host.prompt(sid, "recent")
        await host.prompt(sid, "now")
    sent = [m["content"] for m in model_server.requests[2].body["messages"][1:]]
    assert sent == ["recent", "answer 1", "now"]
    stderr = "".join(p.read_text() for p in tmp_path.glob("host-*.stderr"))
    assert "1 oldest turn(s) left out to fit context_window 2000" in stderr


async def test_supervised_tool_calls_ask_and_a_rejection_goes_back_to_the_model(
    sdk_hosts: SdkHostFactory, config_dir: Path, tmp_path: Path, workspace: Path,
    model_server: ModelServer,
) -> None:
    write = {"tool_calls": [{"index": 0, "id": "w1", "function": {
        "name": "file_write", "arguments": '{"path": "no.txt", "content": "x"}'}}]}
    model_server.script(openai_reply(write, finish="tool_calls"),
                        openai_reply({"content": "Understood."}))
    text = openai_config(model_server, tmp_path / "aws", level="supervised")
    async with start(sdk_hosts, config_dir, text) as host:
        host.client.permission_policy = "reject_once"
        await host.initialize()
        sid = await host.new_session(workspace)
        out = await host.prompt(sid, "write no.txt")
        assert out.content == "Understood."
        assert len(host.client.permission_asks) == 1
    assert not (workspace / "no.txt").exists()
    result = model_server.requests[1].body["messages"][-1]
    assert result["tool_call_id"] == "w1" and "denied" in result["content"]


async def test_a_resumed_session_continues_with_its_stored_history(
    sdk_hosts: SdkHostFactory, config_dir: Path, tmp_path: Path, workspace: Path,
    model_server: ModelServer,
) -> None:
    call = {"tool_calls": [{"index": 0, "id": "r1", "function": {
        "name": "file_read", "arguments": '{"path": "f.txt"}'}}]}
    (workspace / "f.txt").write_text("file body")
    model_server.script(openai_reply(call, finish="tool_calls"),
                        openai_reply({"content": "It says file body."}),
                        openai_reply({"content": "Still file body."}))
    text = openai_config(model_server, tmp_path / "aws")
    async with start(sdk_hosts, config_dir, text) as first:
        await first.initialize()
        sid = await first.new_session(workspace)
        await first.prompt(sid, "read f.txt")
    async with start(sdk_hosts, config_dir, text) as second:
        await second.initialize()
        await second.conn.resume_session(session_id=sid, cwd=str(workspace))
        assert (await second.prompt(sid, "what did it say?")).content == "Still file body."
    live = model_server.requests[1].body["messages"][1:]
    restored = model_server.requests[2].body["messages"][1:]
    assert [m["role"] for m in restored] == ["user", "assistant", "tool", "assistant", "user"]
    assert restored[2]["content"] == live[2]["content"] == "file body"
    assert restored[3]["content"] == "It says file body."
    assert restored[:3] == live  # as sent: the same ids and arguments (prompt caches match)


async def test_a_tool_call_id_the_session_already_has_gets_a_new_one_everywhere(
    sdk_hosts: SdkHostFactory, config_dir: Path, tmp_path: Path, workspace: Path,
    model_server: ModelServer,
) -> None:
    """A server that numbers tool calls per reply sends ``call_0`` every turn: the
    editor, the store and the model all see one id per call."""
    (workspace / "f.txt").write_text("body")
    call = {"tool_calls": [{"index": 0, "id": "call_0", "function": {
        "name": "file_read", "arguments": '{"path": "f.txt"}'}}]}
    model_server.script(openai_reply(call, finish="tool_calls"), openai_reply({"content": "A"}),
                        openai_reply(call, finish="tool_calls"), openai_reply({"content": "B"}))
    async with start(sdk_hosts, config_dir, openai_config(model_server, tmp_path / "aws")) as host:
        await host.initialize()
        sid = await host.new_session(workspace)
        await host.prompt(sid, "read it")
        await host.prompt(sid, "read it again")
        first, second = [c.tool_call_id for c in host.client.of(sid, "tool_call")]
    assert first == "call_0" and second not in ("call_0", "")
    messages = model_server.requests[3].body["messages"]
    ids = [c["id"] for m in messages if m["role"] == "assistant" for c in m.get("tool_calls", [])]
    results = [m["tool_call_id"] for m in messages if m["role"] == "tool"]
    assert ids == results == [first, second]
    assert messages[:len(model_server.requests[1].body["messages"])] == (
        model_server.requests[1].body["messages"])


async def test_cancel_is_prompt_while_waiting_to_retry_or_for_the_response(
    sdk_hosts: SdkHostFactory, config_dir: Path, tmp_path: Path, workspace: Path,
    model_server: ModelServer,
) -> None:
    model_server.script(
        Reply(status=429, headers=(("retry-after", "30"),), body=b"{}"),
        Reply(events=openai_reply().events, hold_headers=True),
    )
    async with start(sdk_hosts, config_dir,
                     openai_config(model_server, tmp_path / "aws")) as host:
        await host.initialize()
        sid = await host.new_session(workspace)
        for waiting_on in ("a 30 s Retry-After", "a server that does not answer"):
            count = len(model_server.requests)
            turn = asyncio.create_task(host.prompt(sid, "hi"))
            await asyncio.to_thread(model_server.wait_requests, count + 1)
            await host.conn.cancel(session_id=sid)
            out = await asyncio.wait_for(turn, 10)
            assert out.stop_reason == "cancelled", waiting_on
        assert await asyncio.to_thread(model_server.state.client_gone.wait, 10)
    assert len(model_server.requests) == 2  # no retry after the cancel


async def test_a_worker_that_streamed_replies_exits_without_errors_in_its_log(
    sdk_hosts: SdkHostFactory, config_dir: Path, tmp_path: Path, workspace: Path,
    model_server: ModelServer,
) -> None:
    model_server.script(openai_reply({"content": "one"}), openai_reply({"content": "two"}))
    async with start(sdk_hosts, config_dir,
                     openai_config(model_server, tmp_path / "aws")) as host:
        await host.initialize()
        for _ in range(2):
            sid = await host.new_session(workspace)
            assert (await host.prompt(sid, "hi")).stop_reason == "end_turn"
    stderr = "".join(p.read_text(errors="replace") for p in tmp_path.glob("host-*.stderr"))
    assert " ERROR " not in stderr and "Unclosed" not in stderr, stderr


async def test_a_stream_kept_open_by_comments_ends_cancelled_at_max_turn_secs(
    sdk_hosts: SdkHostFactory, config_dir: Path, tmp_path: Path, workspace: Path,
    model_server: ModelServer,
) -> None:
    """A comment every 0.2 s keeps the socket busy, so ``request_timeout_secs`` (1 s)
    never fires; the turn's deadline does, and keeps what was streamed."""
    reply = openai_reply({"content": "partial"}, {"content": " never"})
    model_server.script(Reply(events=reply.events, hold_after=2, comment_every=0.2))
    text = openai_config(model_server, tmp_path / "aws",
                         extra="request_timeout_secs = 1\nmax_turn_secs = 2.5\n")
    async with start(sdk_hosts, config_dir, text) as host:
        await host.initialize()
        sid = await host.new_session(workspace)
        began = asyncio.get_running_loop().time()
        out = await asyncio.wait_for(host.prompt(sid, "go on forever"), 20)
        assert asyncio.get_running_loop().time() - began >= 2.5
        assert out.stop_reason == "cancelled"
        assert out.content == "partial\n[turn stopped: it ran past max_turn_secs (2.5 s)]"
        assert await asyncio.to_thread(model_server.state.client_gone.wait, 10), (
            "the HTTP stream was not closed")
    _, items = stored_session(config_dir, sid)
    assert [getattr(i, "text", None) for i in items] == ["go on forever", out.content]


async def test_tool_calls_past_max_tool_calls_per_reply_are_refused_to_model_and_client(
    sdk_hosts: SdkHostFactory, config_dir: Path, tmp_path: Path, workspace: Path,
    model_server: ModelServer,
) -> None:
    calls = {"tool_calls": [
        {"index": n, "id": f"c{n}", "function": {
            "name": "shell", "arguments": json.dumps({"command": f"echo ran-{n}"})}}
        for n in range(5)]}
    model_server.script(openai_reply(calls, finish="tool_calls"), openai_reply({"content": "ok"}))
    text = openai_config(model_server, tmp_path / "aws", extra="max_tool_calls_per_reply = 3\n")
    async with start(sdk_hosts, config_dir, text) as host:
        await host.initialize()
        sid = await host.new_session(workspace)
        out = await host.prompt(sid, "five at once")
        assert (out.stop_reason, out.content) == ("end_turn", "ok")
        assert [c.tool_call_id for c in host.client.of(sid, "tool_call")] == [
            f"c{n}" for n in range(5)]
        finals = {u.tool_call_id: u for u in host.client.of(sid, "tool_call_update")
                  if u.status != "in_progress"}
        assert [finals[f"c{n}"].status for n in range(5)] == ["completed"] * 3 + ["failed"] * 2, \
            [finals[f"c{n}"].raw_output for n in range(5)]
        assert "max_tool_calls_per_reply" in json.dumps(finals["c4"].raw_output)
    results = [m for m in model_server.requests[1].body["messages"] if m["role"] == "tool"]
    assert [r["tool_call_id"] for r in results] == [f"c{n}" for n in range(5)]
    assert [r["content"].strip() for r in results[:3]] == ["ran-0", "ran-1", "ran-2"]
    assert all(r["content"].startswith("refused: the reply asked for 5 tool calls; only the "
                                       "first 3 run") for r in results[3:])
