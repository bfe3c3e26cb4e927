"""Session lifecycle through the official ACP SDK against a real ``zeroclaw acp``.

SPEC §3 (load, resume, list, close, stop, delete, set_mode) and §5 (limits,
eviction, persistence across host processes).
"""

from __future__ import annotations

import asyncio
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any

from .conftest import SdkHostFactory
from .helpers import (
    host_status,
    response_index,
    split_turns,
    tool,
    tool_result_text,
    update_indexes,
    words,
)
from .procs import write_config
from .sdkhost import SdkHost, expect_error


async def live_ids(host: SdkHost) -> set[str]:
    return {s["sessionId"] for s in (await host_status(host))["sessions"]}


# --- load and resume --------------------------------------------------------------------


async def test_load_from_a_new_host_replays_every_turn(
    sdk_hosts: SdkHostFactory, workspace: Path
) -> None:
    prompts = [
        "first turn words",
        "!think careful thought\nsecond turn reply",
        tool("shell", {"command": "echo replayed-output"}) + "\nthird turn done",
    ]
    live: list[tuple[str, str]] = []
    async with sdk_hosts() as first:
        await first.initialize()
        sid = await first.new_session(workspace)
        for text in prompts:
            mark = first.client.mark()
            assert (await first.prompt(sid, text)).stop_reason == "end_turn"
            live.append((first.client.text(sid, start=mark),
                         first.client.text(sid, "agent_thought_chunk", mark)))
        [live_tool] = first.client.of(sid, "tool_call")
    async with sdk_hosts() as second:
        await second.initialize()
        loaded = await second.conn.load_session(cwd=str(workspace), session_id=sid)
        assert loaded.modes is not None and loaded.modes.current_mode_id == "supervised"
        turns = split_turns(second.client.of(sid))
        assert len(turns) == 3, [t.user for t in turns]
        for n, turn in enumerate(turns):
            assert turn.user.strip() == prompts[n].strip(), n
            assert words(turn.agent) == words(live[n][0]), n
            assert words(turn.thought) == words(live[n][1]), n
        assert list(turns[2].tools) == [live_tool.tool_call_id]
        replayed = turns[2].tools[live_tool.tool_call_id]
        assert replayed[-1].status == "completed"
        assert "replayed-output" in tool_result_text(replayed)
        last_update = max(i for kind in ("user_message_chunk", "agent_message_chunk")
                          for i in update_indexes(second, sid, kind))
        assert last_update < response_index(second, "session/load", sid)
        assert (await second.prompt(sid, "fourth turn")).stop_reason == "end_turn"


async def test_resume_restores_without_replay(sdk_hosts: SdkHostFactory, workspace: Path) -> None:
    async with sdk_hosts() as first:
        await first.initialize()
        sid = await first.new_session(workspace)
        await first.prompt(sid, "remember this")
    async with sdk_hosts() as second:
        await second.initialize()
        resumed = await second.conn.resume_session(session_id=sid, cwd=str(workspace))
        assert resumed.modes is not None
        await second.conn.list_sessions()  # one more round trip: any replay would be here by now
        replayed = [u for u in second.client.of(sid) if u.session_update in (
            "user_message_chunk", "agent_message_chunk", "tool_call")]
        assert replayed == []
        out = await second.prompt(sid, "after resume")
        assert out.stop_reason == "end_turn" and words(out.content) == ["after", "resume"]


async def test_load_of_a_session_live_on_this_connection_replays_it_and_keeps_serving(
    host: SdkHost, workspace: Path
) -> None:
    """Zed reopens a thread from its history with ``session/load`` on the connection
    that has it open. The stored turns are replayed and the session stays live; a
    turn running meanwhile goes on and ends normally; resuming it answers too."""
    sid = await host.new_session(workspace)
    await host.prompt(sid, "first turn words")
    host.client.permission_gate.clear()
    running = asyncio.create_task(host.prompt(
        sid, tool("shell", {"command": "echo held-output"}) + "\nsecond turn done"))
    await host.client.wait_until(lambda: bool(host.client.permission_asks), "a permission ask")
    mark = host.client.mark()
    loaded = await host.conn.load_session(cwd=str(workspace), session_id=sid)
    assert loaded.modes is not None and loaded.modes.current_mode_id == "supervised"
    replayed = split_turns(host.client.of(sid, start=mark))
    assert [(t.user.strip(), words(t.agent)) for t in replayed] == [
        ("first turn words", ["first", "turn", "words"])]
    assert not running.done()
    host.client.permission_gate.set()
    out = await running
    assert out.stop_reason == "end_turn" and "second turn done" in out.content
    assert "held-output" in tool_result_text(host.client.of(sid, "tool_call_update", mark))
    resumed = await host.conn.resume_session(session_id=sid, cwd=str(workspace))
    assert resumed.modes is not None
    assert (await host.prompt(sid, "third turn")).stop_reason == "end_turn"
    mark = host.client.mark()
    await host.conn.load_session(cwd=str(workspace), session_id=sid)
    assert len(split_turns(host.client.of(sid, start=mark))) == 3
    assert sid in await live_ids(host)


async def test_load_and_resume_of_unknown_sessions(host: SdkHost, workspace: Path) -> None:
    ghost = str(uuid.uuid4())
    await expect_error(host.conn.load_session(cwd=str(workspace), session_id=ghost), -32000)
    await expect_error(host.conn.resume_session(session_id=ghost, cwd=str(workspace)), -32000)
    await expect_error(host.prompt(ghost, "hello?"), -32000)


# --- list ----------------------------------------------------------------------------------


async def create_sessions(host: SdkHost, cwd: Path, count: int) -> list[str]:
    ids: list[str] = []
    for start in range(0, count, 20):
        batch = [host.new_session(cwd) for _ in range(min(20, count - start))]
        ids.extend(await asyncio.gather(*batch))
    return ids


async def list_all(host: SdkHost, cwd: Path | None) -> tuple[list[Any], int]:
    sessions: list[Any] = []
    cursor: str | None = None
    for pages in range(1, 20):
        page = await host.conn.list_sessions(cwd=str(cwd) if cwd else None, cursor=cursor)
        assert len(page.sessions) <= 100
        sessions.extend(page.sessions)
        cursor = page.next_cursor
        if not cursor:
            return sessions, pages
    raise AssertionError("session/list never ended")


async def test_list_pages_filters_and_orders_by_activity(host: SdkHost, workspace: Path) -> None:
    dir_a, dir_b = workspace / "a", workspace / "b"
    dir_a.mkdir()
    dir_b.mkdir()
    a_ids = await create_sessions(host, dir_a, 103)
    b_ids = await create_sessions(host, dir_b, 2)
    listed, pages = await list_all(host, dir_a)
    assert pages >= 2, "103 sessions fit in one page of at most 100?"
    assert sorted(s.session_id for s in listed) == sorted(a_ids)
    assert {s.cwd for s in listed} == {str(dir_a)}
    stamps = [datetime.fromisoformat(s.updated_at) for s in listed]
    assert stamps == sorted(stamps, reverse=True), "not newest activity first"
    await host.prompt(a_ids[0], "wake up")
    first_page = await host.conn.list_sessions(cwd=str(dir_a))
    assert first_page.sessions[0].session_id == a_ids[0]
    only_b = await host.conn.list_sessions(cwd=str(dir_b))
    assert sorted(s.session_id for s in only_b.sessions) == sorted(b_ids)
    assert only_b.next_cursor is None
    everything, _ = await list_all(host, None)
    assert sorted(s.session_id for s in everything) == sorted(a_ids + b_ids)
    await expect_error(host.conn.list_sessions(cwd="relative/dir"), -32602)
    cursor = (await host.conn.list_sessions(cwd=str(dir_a))).next_cursor
    await expect_error(host.conn.list_sessions(cwd=str(dir_b), cursor=cursor), -32602)


# --- close, stop, delete, set_mode ---------------------------------------------------------------


async def test_close_drops_the_live_session_but_keeps_the_record(
    host: SdkHost, workspace: Path
) -> None:
    sid = await host.new_session(workspace)
    await host.prompt(sid, "before close")
    assert await host.raw("session/close", {"sessionId": sid}) == {}
    await expect_error(host.prompt(sid, "after close"), -32000)
    await expect_error(host.conn.close_session(session_id=sid), -32000)
    mark = host.client.mark()
    await host.conn.load_session(cwd=str(workspace), session_id=sid)
    assert words(host.client.text(sid, "user_message_chunk", mark)) == ["before", "close"]
    assert (await host.prompt(sid, "after load")).stop_reason == "end_turn"


async def test_close_cancels_a_running_turn(host: SdkHost, workspace: Path) -> None:
    sid = await host.new_session(workspace)
    turn = asyncio.create_task(host.prompt(sid, "going\n!sleep 30"))
    await host.client.wait_text(sid, "going")
    await host.conn.close_session(session_id=sid)
    assert (await asyncio.wait_for(turn, 5)).stop_reason == "cancelled"
    await expect_error(host.prompt(sid, "gone"), -32000)


async def test_stop_waits_for_the_running_turn(host: SdkHost, workspace: Path) -> None:
    sid = await host.new_session(workspace)
    turn = asyncio.create_task(host.prompt(sid, "started\n!sleep 2\nfinished"))
    await host.client.wait_text(sid, "started")
    stopped = await asyncio.wait_for(host.raw("session/stop", {"sessionId": sid}), 10)
    assert stopped == {"sessionId": sid, "stopped": True}
    out = await asyncio.wait_for(turn, 5)
    assert out.stop_reason == "end_turn" and words(out.content) == ["started", "finished"]
    assert response_index(host, "session/prompt", sid) < response_index(host, "session/stop", sid)
    await expect_error(host.prompt(sid, "after stop"), -32000)
    await host.conn.load_session(cwd=str(workspace), session_id=sid)


async def test_set_mode_read_only_and_full(host: SdkHost, workspace: Path) -> None:
    sid = await host.new_session(workspace)
    mark = host.client.mark()
    await host.conn.set_session_mode(session_id=sid, mode_id="read_only")
    await host.client.wait_until(lambda: bool(host.client.of(sid, "current_mode_update", mark)),
                                 "current_mode_update")
    assert host.client.of(sid, "current_mode_update", mark)[-1].current_mode_id == "read_only"
    out = await host.prompt(sid, tool("file_write", {"path": "ro.txt", "content": "no"}))
    assert out.stop_reason == "end_turn"
    assert host.client.permission_asks == []
    assert host.client.of(sid, "tool_call_update")[-1].status == "failed"
    assert not (workspace / "ro.txt").exists()

    await host.conn.set_session_mode(session_id=sid, mode_id="full")
    await host.prompt(sid, tool("file_write", {"path": "full.txt", "content": "yes"}))
    assert host.client.permission_asks == []
    assert (workspace / "full.txt").read_text() == "yes"
    await expect_error(host.conn.set_session_mode(session_id=sid, mode_id="godmode"), -32602)


async def test_delete_removes_the_record(host: SdkHost, workspace: Path) -> None:
    sid = await host.new_session(workspace)
    await host.prompt(sid, "doomed")
    await host.conn.close_session(session_id=sid)
    await host.raw("session/delete", {"sessionId": sid})
    await expect_error(host.conn.load_session(cwd=str(workspace), session_id=sid), -32000)
    assert sid not in {s.session_id for s in (await host.conn.list_sessions()).sessions}
    await host.raw("session/delete", {"sessionId": str(uuid.uuid4())})  # unknown: success


async def test_client_custom_events_are_processed(host: SdkHost, workspace: Path) -> None:
    sid = await host.new_session(workspace)
    result = await host.raw("session/event", {"sessionId": sid, "type": "note", "data": {"x": 1}})
    assert result == {"sessionId": sid, "type": "note", "status": "processed"}


# --- ids and limits ------------------------------------------------------------------------------


async def test_session_ids_are_uuids_unique_across_processes(
    sdk_hosts: SdkHostFactory, tmp_path: Path, workspace: Path
) -> None:
    other = tmp_path / "cfg2"
    other.mkdir()
    async with sdk_hosts() as one, sdk_hosts(other) as two:
        await asyncio.gather(one.initialize(), two.initialize())
        ids = await asyncio.gather(*(h.new_session(workspace) for h in [one, two] * 20))
    assert all(str(uuid.UUID(i)) == i for i in ids)
    assert len(set(ids)) == 40


async def test_max_sessions_evicts_lru_idle_and_restores_it(
    sdk_hosts: SdkHostFactory, config_dir: Path, workspace: Path
) -> None:
    write_config(config_dir, "[acp]\nmax_sessions = 2\n")
    async with sdk_hosts() as host:
        await host.initialize()
        s1 = await host.new_session(workspace)
        s2 = await host.new_session(workspace)
        await host.prompt(s1, "one")
        s3 = await host.new_session(workspace)
        assert await live_ids(host) == {s1, s3}, "the LRU idle session (s2) was not evicted"
        out = await host.prompt(s2, "back again")
        assert out.stop_reason == "end_turn" and words(out.content) == ["back", "again"]
        assert await live_ids(host) == {s2, s3}
        snapshot = await host_status(host)
        assert snapshot["activeSessions"] == 2 and snapshot["limits"]["maxSessions"] == 2


async def test_all_sessions_busy_means_limit_reached(
    sdk_hosts: SdkHostFactory, config_dir: Path, workspace: Path
) -> None:
    write_config(config_dir, "[acp]\nmax_sessions = 2\n")
    async with sdk_hosts() as host:
        await host.initialize()
        sids = [await host.new_session(workspace) for _ in range(2)]
        spare = await host.new_session(workspace)  # evicts sids[0]; prompting restores it
        await host.conn.close_session(session_id=spare)
        turns = [asyncio.create_task(host.prompt(s, "busy now\n!sleep 30")) for s in sids]
        for s in sids:
            await host.client.wait_text(s, "now")
        exc = await expect_error(host.conn.new_session(cwd=str(workspace)), -32001)
        assert "Maximum session limit reached (2)" in str(exc)
        listed = await host.conn.list_sessions()
        assert {s.session_id for s in listed.sessions} == {*sids, spare}, (
            "the refused session's row was not removed"
        )
        await expect_error(host.conn.resume_session(session_id=spare, cwd=str(workspace)),
                           -32001)
        for s in sids:
            await host.conn.cancel(session_id=s)
        results = await asyncio.wait_for(asyncio.gather(*turns), 5)
        assert [r.stop_reason for r in results] == ["cancelled", "cancelled"]
        assert await host.new_session(workspace)


async def test_idle_sessions_are_evicted_after_the_timeout_and_restored(
    sdk_hosts: SdkHostFactory, config_dir: Path, workspace: Path
) -> None:
    write_config(config_dir, "[acp]\nsession_timeout_secs = 1\n")
    async with sdk_hosts() as host:
        await host.initialize()
        sid = await host.new_session(workspace)
        await host.prompt(sid, "early words")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 10
        while sid in await live_ids(host):
            assert loop.time() < deadline, "idle session never evicted"
            await asyncio.sleep(0.2)
        out = await host.prompt(sid, "later words")
        assert words(out.content) == ["later", "words"]
