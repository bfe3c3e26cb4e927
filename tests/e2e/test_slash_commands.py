"""Host slash commands (``/help``, ``/status``, ``/mode``, ``/clear``) and the permission
request's summary, driven by the official ACP SDK against a real ``zeroclaw acp``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ipc.events import TextItem

from .conftest import SdkHostFactory
from .helpers import (
    host_status,
    response_index,
    split_turns,
    stored_session,
    tool,
    update_indexes,
    words,
)
from .sdkhost import SdkHost

COMMAND_NAMES = ["help", "status", "mode", "clear"]


def _usage_used(host: SdkHost, sid: str, start: int) -> list[int]:
    """The echo agent's ``usage_update.used`` since ``start``: one per agent turn; it
    counts the history the agent remembers, so it shows what the agent was given."""
    return [u.used for u in host.client.of(sid, "usage_update", start)]


async def _commands_after(host: SdkHost, sid: str, method: str, seen: int) -> Any:
    """Wait for the next ``available_commands_update`` of ``sid``; it must come after the
    answer to ``method`` (a request naming ``sid``) on the wire."""
    await host.client.wait_until(
        lambda: len(host.client.of(sid, "available_commands_update")) > seen,
        f"available_commands_update after {method}")
    [last] = update_indexes(host, sid, "available_commands_update")[seen:]
    assert last > response_index(host, method, sid)
    return host.client.of(sid, "available_commands_update")[-1]


async def test_commands_are_announced_after_new_load_and_resume(
        host: SdkHost, workspace: Path) -> None:
    created_at = len(host.wire)
    sid = await host.new_session(workspace)
    await host.client.wait_until(lambda: bool(host.client.of(sid)), "the first update")
    [update] = host.client.of(sid)
    assert update.session_update == "available_commands_update"
    assert [c.name for c in update.available_commands] == COMMAND_NAMES
    by_name = {c.name: c for c in update.available_commands}
    assert all(c.description for c in update.available_commands)
    assert by_name["mode"].input is not None and "supervised" in by_name["mode"].input.root.hint
    assert by_name["help"].input is None
    new_answer = next(i for i, (d, f) in enumerate(host.wire[created_at:], created_at)
                      if d == "incoming" and f.get("result", {}).get("sessionId") == sid)
    # after the answer: the client knows the session id by then
    assert update_indexes(host, sid, "available_commands_update")[0] > new_answer
    await host.conn.close_session(session_id=sid)
    await host.conn.load_session(cwd=str(workspace), session_id=sid)
    await _commands_after(host, sid, "session/load", 1)
    await host.conn.close_session(session_id=sid)
    await host.conn.resume_session(cwd=str(workspace), session_id=sid)
    await _commands_after(host, sid, "session/resume", 2)


async def test_help_and_status_are_answered_by_the_host(host: SdkHost, workspace: Path) -> None:
    sid = await host.new_session(workspace)
    mark = host.client.mark()
    out = await host.prompt(sid, "/help")
    assert out.stop_reason == "end_turn"
    text = host.client.text(sid, start=mark)
    assert out.content == text
    for name in COMMAND_NAMES:
        assert f"/{name}" in text
    assert _usage_used(host, sid, mark) == []  # the agent was not called
    await host.prompt(sid, "hello world")
    mark = host.client.mark()
    out = await host.prompt(sid, "/status")
    text = host.client.text(sid, start=mark)
    [entry] = [s for s in (await host_status(host))["sessions"] if s["sessionId"] == sid]
    assert f"session: {sid}" in text and "agent: default (echo)" in text
    assert "mode: supervised" in text and "turns: 2" in text
    tokens = entry["usage"]["totalTokens"]
    assert tokens > 0 and f"usage: {tokens} tokens" in text
    assert _usage_used(host, sid, mark) == []
    mark = host.client.mark()
    out = await host.prompt(sid, "/foo is not ours")  # unknown: ordinary text for the agent
    assert words(out.content) == ["/foo", "is", "not", "ours"]
    assert len(_usage_used(host, sid, mark)) == 1
    _, items = stored_session(host.config_dir, sid)
    users = [i.text for i in items if isinstance(i, TextItem) and i.role == "user"]
    assert users == ["/help", "hello world", "/status", "/foo is not ours"]


async def test_mode_command_switches_like_set_mode(host: SdkHost, workspace: Path) -> None:
    sid = await host.new_session(workspace)
    mark = host.client.mark()
    out = await host.prompt(sid, "/mode full")
    assert out.stop_reason == "end_turn" and "full" in out.content
    [mode] = host.client.of(sid, "current_mode_update", mark)
    assert mode.current_mode_id == "full"
    session, _ = stored_session(host.config_dir, sid)
    assert session is not None and session.mode == "full"
    out = await host.prompt(sid, tool("shell", {"command": "echo ran"}))
    assert host.client.permission_asks == []  # full: nothing asks
    mark = host.client.mark()
    out = await host.prompt(sid, "/mode reckless")
    assert "Unknown mode" in out.content and host.client.of(sid, "current_mode_update", mark) == []
    out = await host.prompt(sid, "/mode")
    assert "Mode: full" in out.content
    session, _ = stored_session(host.config_dir, sid)
    assert session is not None and session.mode == "full"


async def test_clear_starts_a_fresh_context_and_the_store_keeps_the_history(
        sdk_hosts: SdkHostFactory, workspace: Path) -> None:
    async with sdk_hosts() as first:
        await first.initialize()
        sid = await first.new_session(workspace)
        mark = first.client.mark()
        await first.prompt(sid, "hello world")
        await first.prompt(sid, "hello world")
        fresh, remembered = _usage_used(first, sid, mark)
        assert remembered > fresh  # the second turn carried the first as history
        out = await first.prompt(sid, "/clear")
        assert out.stop_reason == "end_turn" and "cleared" in out.content
        mark = first.client.mark()
        await first.prompt(sid, "hello world")
        assert _usage_used(first, sid, mark) == [fresh]  # nothing remembered before /clear
    async with sdk_hosts() as second:
        await second.initialize()
        await second.conn.load_session(cwd=str(workspace), session_id=sid)
        turns = split_turns(second.client.of(sid))
        assert [t.user for t in turns] == ["hello world", "hello world", "/clear", "hello world"]
        assert "cleared" in turns[2].agent
        mark = second.client.mark()
        await second.prompt(sid, "hello world")
        # restored with only what followed /clear: one turn, as in the live session
        assert _usage_used(second, sid, mark) == [remembered]


async def test_permission_request_carries_a_summary(host: SdkHost, workspace: Path) -> None:
    sid = await host.new_session(workspace)
    await host.prompt(sid, tool("shell", {"command": "git status --short"}))
    [ask] = host.client.permission_asks
    call = ask.tool_call
    assert call.kind == "execute" and call.raw_input == {"command": "git status --short"}
    assert call.title and "git status --short" in call.title
    assert call.content is not None
    [summary] = call.content
    assert summary.type == "content" and summary.content.type == "text"
    assert summary.content.text == call.title
