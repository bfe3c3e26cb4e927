"""SPEC §7: the ``anthropic`` agent end to end against a local Messages API server.

Same harness as ``test_model_openai.py``: a real ``zeroclaw acp`` driven by the ACP
SDK, its agent pointed at :class:`~tests.e2e.model_server.ModelServer`.
"""

from __future__ import annotations

import asyncio
import json
import secrets
from contextlib import AbstractAsyncContextManager
from pathlib import Path

from actors.worker.tools import default_tools

from .conftest import SdkHostFactory
from .helpers import CANCEL_MARKER
from .model_server import ModelServer, Reply
from .model_streams import anthropic_reply, anthropic_text, anthropic_tool_use, sse
from .procs import write_config
from .sdkhost import SdkHost, expect_error

KEY_ENV = "ZC_TEST_ANTHROPIC_KEY"
KEY = f"zc-test-anthropic-key-{secrets.token_hex(12)}"  # made per run


def start(sdk_hosts: SdkHostFactory, config_dir: Path, server: ModelServer,
          agent_ws: Path) -> AbstractAsyncContextManager[SdkHost]:
    write_config(config_dir, (
        f'[agents.claude]\nprovider = "anthropic"\nbase_url = "{server.url}"\n'
        f'model = "claude-test"\napi_key_env = "{KEY_ENV}"\nworkspace = "{agent_ws}"\n'
        'max_tokens = 1024\ncontext_window = 200000\nmax_retries = 1\n'
        '[autonomy]\nlevel = "full"\n'))
    return sdk_hosts(env_extra={KEY_ENV: KEY})


async def test_text_and_tool_use_round_trip(
    sdk_hosts: SdkHostFactory, config_dir: Path, tmp_path: Path, workspace: Path,
    model_server: ModelServer,
) -> None:
    (workspace / "a.txt").write_text("alpha")
    thinking = [
        sse({"type": "content_block_start", "index": 0,
             "content_block": {"type": "thinking", "thinking": ""}}, "content_block_start"),
        sse({"type": "content_block_delta", "index": 0,
             "delta": {"type": "thinking_delta", "thinking": "Read it first."}},
            "content_block_delta"),
        sse({"type": "content_block_stop", "index": 0}, "content_block_stop"),
    ]
    model_server.script(
        anthropic_reply([*thinking, *anthropic_text(1, "Let me ", "look."),
                         *anthropic_tool_use(2, "toolu_01A", "file_read", '{"path"', ': "a.txt"}'),
                         *anthropic_tool_use(3, "toolu_01B", "shell", '{"command": "exit 3"}')],
                        stop_reason="tool_use"),
        anthropic_reply(anthropic_text(0, "It says alpha."), usage=(90, 6)),
        anthropic_reply(anthropic_text(0, "Yes.")),
    )
    async with start(sdk_hosts, config_dir, model_server, tmp_path / "aws") as host:
        await host.initialize()
        sid = await host.new_session(workspace)
        out = await host.prompt(sid, "what is in a.txt?")
        assert (out.stop_reason, out.content) == ("end_turn", "Let me look.It says alpha.")
        assert host.client.text(sid, "agent_thought_chunk") == "Read it first."
        assert host.client.of(sid, "usage_update")[-1].used == 96
        await host.prompt(sid, "sure?")
    first, second, third = model_server.requests
    assert first.path == "/v1/messages"
    assert first.headers["x-api-key"] == KEY and first.headers["anthropic-version"]
    assert "authorization" not in first.headers
    body = first.body
    assert (body["model"], body["max_tokens"], body["stream"]) == ("claude-test", 1024, True)
    assert f"Working directory: {workspace}" in body["system"]
    assert {t["name"] for t in body["tools"]} == set(default_tools())
    assert all("input_schema" in t for t in body["tools"])
    assert body["messages"] == [{"role": "user", "content": [
        {"type": "text", "text": "what is in a.txt?"}]}]
    assistant, results = second.body["messages"][1:]
    assert assistant == {"role": "assistant", "content": [
        {"type": "text", "text": "Let me look."},
        {"type": "tool_use", "id": "toolu_01A", "name": "file_read", "input": {"path": "a.txt"}},
        {"type": "tool_use", "id": "toolu_01B", "name": "shell", "input": {"command": "exit 3"}},
    ]}
    read, shell = results["content"]
    assert results["role"] == "user"
    assert (read["tool_use_id"], read["content"], read["is_error"]) == ("toolu_01A", "alpha", False)
    assert (shell["tool_use_id"], shell["is_error"]) == ("toolu_01B", True)
    # the stored turn is the next request's history, roles alternating
    roles = [m["role"] for m in third.body["messages"]]
    assert roles == ["user", "assistant", "user", "assistant", "user"]


async def test_stop_reasons_errors_and_cancel(
    sdk_hosts: SdkHostFactory, config_dir: Path, tmp_path: Path, workspace: Path,
    model_server: ModelServer,
) -> None:
    slow = anthropic_reply(anthropic_text(0, "slowly", " more"))
    overloaded = sse({"type": "error", "error": {"type": "overloaded_error",
                                                 "message": "Overloaded"}}, "error")
    model_server.script(
        anthropic_reply(anthropic_text(0, "trunc"), stop_reason="max_tokens"),
        anthropic_reply(anthropic_text(0, "No."), stop_reason="refusal"),
        Reply(events=(*slow.events[:4], overloaded)),
        Reply(events=slow.events, hold_after=4),
    )
    async with start(sdk_hosts, config_dir, model_server, tmp_path / "aws") as host:
        await host.initialize()
        sid = await host.new_session(workspace)
        assert (await host.prompt(sid, "a")).stop_reason == "max_tokens"
        assert (await host.prompt(sid, "b")).stop_reason == "refusal"
        error = await expect_error(host.prompt(sid, "c"), -32603)
        assert "Overloaded" in str(error) and KEY not in json.dumps(error.data)
        mark = host.client.mark()
        turn = asyncio.create_task(host.prompt(sid, "d"))
        await host.client.wait_text(sid, "slowly", start=mark)
        await host.conn.cancel(session_id=sid)
        out = await asyncio.wait_for(turn, 10)
        assert (out.stop_reason, out.content) == ("cancelled", f"slowly\n{CANCEL_MARKER}")
        assert await asyncio.to_thread(model_server.state.client_gone.wait, 10)
