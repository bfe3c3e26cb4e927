"""The official ACP Python SDK drives a real ``zeroclaw acp``: handshake, sessions, turns.

SPEC §1-3 and §7 (echo agent directives). Session lifecycle (load, resume, list,
close, limits) is in ``test_acp_sdk_sessions.py``.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import os
import uuid
from pathlib import Path
from typing import Any

from acp import embedded_blob_resource, embedded_text_resource, resource_block, text_block
from acp.schema import InitializeResponse, NewSessionResponse

from .conftest import SdkHostFactory
from .helpers import response_index, tool, update_indexes, wire_index, words
from .procs import write_config
from .sdkhost import PermissionPolicy, SdkHost, expect_error

MODES = ["read_only", "supervised", "full"]
SPEC_OPTION_KINDS = {"allow_once", "allow_always", "reject_once", "reject_always"}
SPEC_OPTION_IDS = {"allow-once", "allow_once", "allow-always", "allow_always",
                   "reject-once", "reject_once", "reject-always", "reject_always"}


# --- initialize ----------------------------------------------------------------


async def test_initialize_advertises_the_spec_capabilities(host: SdkHost) -> None:
    raw: dict[str, Any] = {}
    for d, frame in host.wire:
        if d == "incoming" and isinstance(frame.get("result"), dict) and (
            "agentCapabilities" in frame["result"]
        ):
            raw = frame["result"]
    assert raw["protocolVersion"] == 1
    caps = raw["agentCapabilities"]
    assert caps["loadSession"] is True
    prompt_caps = caps["promptCapabilities"]
    assert (prompt_caps["image"], prompt_caps["audio"], prompt_caps["embeddedContext"]) == (
        False, False, True)
    assert caps["mcpCapabilities"] == {"http": True, "sse": True}  # the model agents use them
    for name in ("list", "resume", "close", "delete"):
        assert caps["sessionCapabilities"][name] == {}, name
    assert raw["agentInfo"]["name"] == "zeroclaw-acp"
    assert raw["agentInfo"]["title"] == "ZeroClaw ACP"
    assert isinstance(raw["agentInfo"]["version"], str) and raw["agentInfo"]["version"]
    assert raw["authMethods"] == []
    meta = raw["_meta"]["zeroclaw"]
    assert meta["maxSessions"] == 10 and meta["sessionTimeoutSecs"] == 3600
    assert "defaultModel" in meta
    typed = InitializeResponse.model_validate(raw)
    assert typed.agent_capabilities is not None and typed.agent_capabilities.load_session


async def test_initialize_answers_version_1_to_a_version_0_client(
    sdk_hosts: SdkHostFactory,
) -> None:
    async with sdk_hosts() as host:
        response = await host.conn.initialize(protocol_version=0)
        assert response.protocol_version == 1


# --- session/new -----------------------------------------------------------------


async def test_new_session_returns_uuid_canonical_workspace_and_modes(
    host: SdkHost, workspace: Path
) -> None:
    (workspace / "sub").mkdir()
    raw = await host.raw("session/new", {"cwd": f"{workspace}/sub/..", "mcpServers": []})
    assert str(uuid.UUID(raw["sessionId"])) == raw["sessionId"]
    assert raw["workspaceDir"] == str(workspace)
    modes = raw["modes"]
    assert modes["currentModeId"] == "supervised"
    assert [m["id"] for m in modes["availableModes"]] == MODES
    assert all(m["name"] for m in modes["availableModes"])
    NewSessionResponse.model_validate(raw)

    typed = await host.conn.new_session(cwd=str(workspace))
    assert typed.session_id != raw["sessionId"]
    assert typed.modes is not None and typed.modes.current_mode_id == "supervised"


async def test_new_session_accepts_mcp_servers_and_rejects_unusable_cwd(
    host: SdkHost, workspace: Path
) -> None:
    zed_like = [{"name": "fs", "command": "/bin/true", "args": [], "env": []}]
    raw = await host.raw("session/new", {"cwd": str(workspace), "mcpServers": zed_like})
    assert uuid.UUID(raw["sessionId"])
    a_file = workspace / "plain.txt"
    a_file.write_text("x")
    for bad in (str(a_file), str(workspace / "missing")):
        exc = await expect_error(host.raw("session/new", {"cwd": bad, "mcpServers": []}), -32602)
        assert "cwd" in str(exc).lower() or "director" in str(exc).lower()
    exc = await expect_error(
        host.raw("session/new", {"cwd": str(workspace), "agentAlias": "nobody"}), -32602)
    raw_default = await host.raw("session/new", {})
    assert os.path.isabs(raw_default["workspaceDir"]) and os.path.isdir(raw_default["workspaceDir"])


async def test_param_aliases_are_accepted(host: SdkHost, workspace: Path) -> None:
    raw = await host.raw("session/new", {"workspace_dir": str(workspace), "agent": "default"})
    assert raw["workspaceDir"] == str(workspace)
    result = await host.raw("session/prompt", {"session_id": raw["sessionId"],
                                                "prompt": "alias words"})
    assert result["stopReason"] == "end_turn"
    assert words(result["content"]) == ["alias", "words"]


# --- prompts -------------------------------------------------------------------------


async def test_prompt_streams_the_echo_word_by_word(host: SdkHost, workspace: Path) -> None:
    sid = await host.new_session(workspace)
    text = "the quick brown fox jumps over"
    mark = host.client.mark()
    out = await host.prompt(sid, text)
    assert out.stop_reason == "end_turn"
    chunks = host.client.of(sid, "agent_message_chunk", mark)
    assert len(chunks) >= len(words(text)), "expected one chunk per word at least"
    streamed = host.client.text(sid, start=mark)
    assert words(streamed) == words(text)
    assert words(out.content) == words(streamed)
    last_chunk = update_indexes(host, sid, "agent_message_chunk")[-1]
    assert last_chunk < response_index(host, "session/prompt", sid), "chunks after the result"
    await host.client.wait_until(lambda: bool(host.client.of(sid, "usage_update", mark)),
                                 "a usage_update")
    usage = host.client.of(sid, "usage_update", mark)[-1]
    assert usage.used > 0 and usage.size >= usage.used


async def test_plain_string_and_bare_text_parts_are_prompts(host: SdkHost, workspace: Path) -> None:
    sid = await host.new_session(workspace)
    result = await host.raw("session/prompt", {"sessionId": sid, "prompt": "plain string words"})
    assert result["stopReason"] == "end_turn" and result["sessionId"] == sid
    assert words(result["content"]) == ["plain", "string", "words"]
    result = await host.raw("session/prompt", {"sessionId": sid,
                                               "prompt": [{"text": "bare"}, {"text": "part"}]})
    assert words(result["content"]) == ["bare", "part"]


async def test_two_sessions_prompt_at_once(host: SdkHost, workspace: Path) -> None:
    s1, s2 = await host.new_session(workspace), await host.new_session(workspace)
    loop = asyncio.get_running_loop()
    started = loop.time()
    r1, r2 = await asyncio.gather(
        host.prompt(s1, "!sleep 2\nalpha apple avocado"),
        host.prompt(s2, "!sleep 2\nbeta banana blueberry"),
    )
    elapsed = loop.time() - started
    assert (r1.stop_reason, r2.stop_reason) == ("end_turn", "end_turn")
    assert words(host.client.text(s1)) == ["alpha", "apple", "avocado"]
    assert words(host.client.text(s2)) == ["beta", "banana", "blueberry"]
    assert elapsed < 3.8, f"the two 2 s turns ran one after the other ({elapsed:.1f} s)"


async def test_cancel_mid_turn_keeps_partial_text(host: SdkHost, workspace: Path) -> None:
    sid = await host.new_session(workspace)
    turn = asyncio.create_task(host.prompt(sid, "partial words here\n!sleep 30\nnever said"))
    await host.client.wait_text(sid, "here")
    loop = asyncio.get_running_loop()
    cancelled_at = loop.time()
    await host.conn.cancel(session_id=sid)
    out = await asyncio.wait_for(turn, 5)
    assert out.stop_reason == "cancelled"
    assert loop.time() - cancelled_at < 3, "cancel was not prompt"
    assert "never" not in host.client.text(sid)
    assert words(host.client.text(sid)) == ["partial", "words", "here"]
    assert "partial words here" in " ".join(words(out.content))
    assert out.content.rstrip().endswith("[turn cancelled via client]")
    again = await host.prompt(sid, "still usable")
    assert again.stop_reason == "end_turn"


async def test_cancel_without_a_turn_is_a_no_op_and_a_request_gets_empty_result(
    host: SdkHost, workspace: Path
) -> None:
    sid = await host.new_session(workspace)
    await host.conn.cancel(session_id=sid)
    assert await host.raw("session/cancel", {"sessionId": sid}) == {}
    assert (await host.prompt(sid, "fine")).stop_reason == "end_turn"


async def test_second_prompt_while_a_turn_runs_is_busy(host: SdkHost, workspace: Path) -> None:
    sid = await host.new_session(workspace)
    turn = asyncio.create_task(host.prompt(sid, "busy start\n!sleep 30"))
    await host.client.wait_text(sid, "start")
    await expect_error(host.prompt(sid, "second"), -32002)
    await host.conn.cancel(session_id=sid)
    assert (await asyncio.wait_for(turn, 5)).stop_reason == "cancelled"


async def test_fail_directive_is_an_internal_error_and_the_session_survives(
    host: SdkHost, workspace: Path
) -> None:
    sid = await host.new_session(workspace)
    exc = await expect_error(host.prompt(sid, "!fail boom"), -32603)
    assert "boom" in str(exc) + json.dumps(exc.data)
    assert "Traceback" not in str(exc) + json.dumps(exc.data)
    out = await host.prompt(sid, "after the failure")
    assert out.stop_reason == "end_turn"
    assert words(out.content) == ["after", "the", "failure"]


async def test_thought_and_plan_updates(host: SdkHost, workspace: Path) -> None:
    sid = await host.new_session(workspace)
    out = await host.prompt(sid, "!think pondering deeply\n!plan first step; second step\nhello")
    assert out.stop_reason == "end_turn"
    assert words(host.client.text(sid, "agent_thought_chunk")) == ["pondering", "deeply"]
    plans = host.client.of(sid, "plan")
    assert plans, "no plan update"
    assert [e.content for e in plans[-1].entries] == ["first step", "second step"]
    assert words(host.client.text(sid)) == ["hello"]


# --- permissions and tools ---------------------------------------------------------------


async def test_permission_allow_once_runs_the_shell_tool(host: SdkHost, workspace: Path) -> None:
    sid = await host.new_session(workspace)
    out = await host.prompt(sid, tool("shell", {"command": "echo hi"}))
    assert out.stop_reason == "end_turn"
    [started] = host.client.of(sid, "tool_call")
    assert started.status == "pending" and started.raw_input == {"command": "echo hi"}
    assert started.title
    [ask] = host.client.permission_asks
    assert ask.session_id == sid and ask.tool_call.tool_call_id == started.tool_call_id
    assert {o.kind for o in ask.options} <= SPEC_OPTION_KINDS
    assert {"allow_once", "reject_once"} <= {o.kind for o in ask.options}
    assert {o.option_id for o in ask.options} <= SPEC_OPTION_IDS
    finished = [u for u in host.client.of(sid, "tool_call_update")
                if u.tool_call_id == started.tool_call_id]
    assert finished and finished[-1].status == "completed"
    assert "hi" in json.dumps(finished[-1].raw_output)
    tool_call_at = update_indexes(host, sid, "tool_call")[0]
    ask_at = wire_index(host, lambda d, f: d == "incoming"
                        and f.get("method") == "session/request_permission")[0]
    assert str(host.wire[ask_at][1]["id"]).startswith("zc-out-")
    assert tool_call_at < ask_at < update_indexes(host, sid, "tool_call_update")[-1]


async def test_permission_allow_once_lets_file_write_write(host: SdkHost, workspace: Path) -> None:
    sid = await host.new_session(workspace)
    out = await host.prompt(sid, tool("file_write", {"path": "x.txt", "content": "written!"}))
    assert out.stop_reason == "end_turn"
    assert len(host.client.permission_asks) == 1
    assert host.client.of(sid, "tool_call_update")[-1].status == "completed"
    assert (workspace / "x.txt").read_text() == "written!"


async def test_file_read_needs_no_permission(host: SdkHost, workspace: Path) -> None:
    (workspace / "x.txt").write_text("readable content")
    sid = await host.new_session(workspace)
    out = await host.prompt(sid, tool("file_read", {"path": "x.txt"}))
    assert out.stop_reason == "end_turn"
    assert host.client.permission_asks == []
    final = host.client.of(sid, "tool_call_update")[-1]
    assert final.status == "completed"
    assert "readable content" in json.dumps(final.raw_output) + json.dumps(
        [c.model_dump() for c in final.content or []])


async def test_permission_reject_and_cancelled_deny_the_tool(
    host: SdkHost, workspace: Path
) -> None:
    policies: tuple[PermissionPolicy, ...] = ("reject_once", "cancelled")
    for policy in policies:
        host.client.permission_policy = policy
        sid = await host.new_session(workspace)
        out = await host.prompt(sid, tool("file_write", {"path": f"{policy}.txt", "content": "no"})
                                + "\nturn goes on")
        assert out.stop_reason == "end_turn", policy
        assert host.client.of(sid, "tool_call_update")[-1].status == "failed", policy
        assert not (workspace / f"{policy}.txt").exists(), policy
        assert words(host.client.text(sid)) == ["turn", "goes", "on"], policy


async def test_unanswered_permission_times_out_as_denied(
    sdk_hosts: SdkHostFactory, config_dir: Path, workspace: Path
) -> None:
    write_config(config_dir, "[acp]\nsession_timeout_secs = 2\n")
    async with sdk_hosts() as host:
        await host.initialize()
        host.client.permission_policy = "never"
        sid = await host.new_session(workspace)
        loop = asyncio.get_running_loop()
        started = loop.time()
        out = await asyncio.wait_for(
            host.prompt(sid, tool("file_write", {"path": "late.txt", "content": "no"})), 15)
        assert out.stop_reason == "end_turn"
        assert loop.time() - started >= 1.5, "denied before the timeout"
        assert len(host.client.permission_asks) == 1
        assert host.client.of(sid, "tool_call_update")[-1].status == "failed"
        assert not (workspace / "late.txt").exists()


# --- prompt parts and uploads ---------------------------------------------------------------


def blob_part(uri: str, data: bytes | str, mime: str) -> Any:
    encoded = data if isinstance(data, str) else base64.b64encode(data).decode()
    return resource_block(embedded_blob_resource(uri, encoded, mime_type=mime))


async def test_prompt_parts_with_text_and_blob_resources(host: SdkHost, workspace: Path) -> None:
    sid = await host.new_session(workspace)
    pdf, png = b"%PDF-1.4 zeroclaw test\n", bytes.fromhex("89504e470d0a1a0a") + b"fake png"
    parts = [
        text_block("intro words"),
        resource_block(embedded_text_resource("file:///notes.txt", "resource body text")),
        blob_part("file:///report.pdf", pdf, "application/pdf"),
        blob_part("file:///pic.png", png, "image/png"),
    ]
    out = await host.prompt(sid, parts)
    assert out.stop_reason == "end_turn"
    pdf_name = hashlib.sha256(pdf).hexdigest() + ".pdf"
    png_name = hashlib.sha256(png).hexdigest() + ".png"
    uploads = workspace / "uploads"
    assert sorted(p.name for p in uploads.iterdir()) == sorted([pdf_name, png_name])
    assert (uploads / pdf_name).read_bytes() == pdf and (uploads / png_name).read_bytes() == png
    echoed = " ".join(words(host.client.text(sid)))
    in_order = ["intro words", "resource body text", "[Document: report.pdf]",
                f"uploads/{pdf_name}", "[IMAGE:", f"uploads/{png_name}]"]
    positions = [echoed.find(piece) for piece in in_order]
    assert -1 not in positions and positions == sorted(positions), (in_order, echoed)


async def test_invalid_or_oversized_blob_is_rejected_and_nothing_is_written(
    host: SdkHost, workspace: Path
) -> None:
    sid = await host.new_session(workspace)
    valid = blob_part("file:///ok.pdf", b"%PDF fine", "application/pdf")
    bad = blob_part("file:///bad.pdf", "!!!not*base64!!!", "application/pdf")
    exc = await expect_error(host.prompt(sid, [text_block("x"), valid, bad]), -32602)
    assert "Traceback" not in str(exc)
    huge = blob_part("file:///huge.bin", b"\0" * (10 * 1024 * 1024 + 1), "application/pdf")
    await expect_error(host.prompt(sid, [valid, huge]), -32602)
    uploads = workspace / "uploads"
    assert not uploads.exists() or list(uploads.iterdir()) == []
    assert (await host.prompt(sid, "still fine")).stop_reason == "end_turn"


async def test_a_10_mib_blob_fits_in_one_frame(host: SdkHost, workspace: Path) -> None:
    sid = await host.new_session(workspace)
    data = os.urandom(10 * 1024 * 1024)
    out = await host.prompt(sid, [blob_part("file:///big.pdf", data, "application/pdf")])
    assert out.stop_reason == "end_turn"
    stored = workspace / "uploads" / (hashlib.sha256(data).hexdigest() + ".pdf")
    assert stored.read_bytes() == data
