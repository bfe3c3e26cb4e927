"""The pure parts of the ``acp`` provider: config checks, the agent's environment, and
``session/update`` → zeroclaw events."""

from __future__ import annotations

import asyncio
import concurrent.futures
import queue
import sys
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from actors.worker.agents import TurnContext, agent_config_problem
from actors.worker.agents.acp import command_problem
from actors.worker.agents.acp_confine import jail_for
from actors.worker.agents.acp_process import AgentProcess, SessionLink, clean_env
from actors.worker.agents.acp_turn import AcpTurn, UpdateRelay
from actors.worker.agents.acp_updates import (
    ToolNames,
    events_from_update,
    events_from_updates,
    merged_chunks,
)
from actors.worker.agents.base import SessionSetup
from actors.worker.sandbox import AGENT_STATE_VARIABLE, SANDBOX_VARIABLE, detect
from actors.worker.tools import PathPolicy
from ipc.events import (
    CurrentMode,
    MessageChunk,
    PlanEntry,
    PlanUpdate,
    ThoughtChunk,
    ToolCallFinished,
    ToolCallStarted,
    UsageUpdate,
)
from tests.acp_doubles import RecordingStream


def test_command_problems_name_the_reason() -> None:
    assert command_problem({"command": [sys.executable, "-V"]}) is None
    assert command_problem({"command": ["python3"]}) is None  # a name on PATH
    assert "array of strings" in str(command_problem({"command": "python3 -V"}))
    assert "array of strings" in str(command_problem({"command": []}))
    assert "not found" in str(command_problem({"command": ["no-such-binary-zc"]}))
    assert "not found" in str(command_problem({"command": ["relative/agent"]}))
    assert "env must be" in str(command_problem({"command": ["python3"], "env": {"A": 1}}))
    assert "positive" in str(command_problem({"command": ["python3"],
                                              "agent_start_timeout_secs": 0}))
    grace = command_problem({"command": ["python3"], "cancel_grace_secs": "5"})
    assert grace == "cancel_grace_secs must be a positive number"
    assert command_problem({"command": ["python3"], "sandbox": "bwrap"}) == (
        "sandbox must be one of auto, off")
    assert "true or false" in str(command_problem({"command": ["python3"],
                                                   "allow_unconfined_tenants": "yes"}))
    assert "unknown agent provider 'gpt'" in str(agent_config_problem({"provider": "gpt"}))
    assert agent_config_problem({"provider": "echo"}) is None


def test_clean_env_keeps_only_the_basics_plus_the_agents_own() -> None:
    host = {"PATH": "/bin", "HOME": "/h", "LANG": "C", "TERM": "xterm", "AWS_SECRET": "x",
            "OPENAI_API_KEY": "y"}
    assert clean_env({"AGENT_KEY": "z"}, host) == {
        "PATH": "/bin", "HOME": "/h", "LANG": "C", "TERM": "xterm", "AGENT_KEY": "z"}


def _text(kind: str, text: str) -> dict[str, object]:
    return {"sessionUpdate": kind, "content": {"type": "text", "text": text}}


def test_updates_map_to_events() -> None:
    tools = ToolNames()
    assert events_from_update(_text("agent_message_chunk", "hi"), tools) == [MessageChunk("hi")]
    assert events_from_update(_text("agent_thought_chunk", "hm"), tools) == [ThoughtChunk("hm")]
    assert events_from_update(_text("user_message_chunk", "me"), tools) == []
    assert events_from_update({"sessionUpdate": "available_commands_update"}, tools) == []
    started = events_from_update({"sessionUpdate": "tool_call", "toolCallId": "t1",
                                  "title": "Read a", "kind": "read", "rawInput": {"p": 1}},
                                 tools)
    assert started == [ToolCallStarted("t1", "Read a", "Read a", "read", {"p": 1})]
    done = events_from_update({"sessionUpdate": "tool_call_update", "toolCallId": "t1",
                               "status": "completed", "rawOutput": {"ok": True},
                               "content": [{"type": "content",
                                            "content": {"type": "text", "text": "out"}},
                                           {"type": "diff", "path": "/a"}]}, tools)
    assert done == [ToolCallFinished("t1", "Read a", "completed", {"ok": True},
                                     "out\ndiff of /a")]
    only_raw = events_from_update({"sessionUpdate": "tool_call", "toolCallId": "t3",
                                   "status": "completed", "rawOutput": {"ok": 1, "a": "b"}},
                                  tools)
    assert only_raw[-1] == ToolCallFinished("t3", "tool call", "completed", {"ok": 1, "a": "b"},
                                            '{"a":"b","ok":1}')
    late = {"sessionUpdate": "tool_call_update", "toolCallId": "t1", "status": "failed"}
    assert events_from_update(late, tools) == []  # already finished
    plan = events_from_update({"sessionUpdate": "plan", "entries": [
        {"content": "a", "priority": "high", "status": "in_progress"}]}, tools)
    assert plan == [PlanUpdate((PlanEntry("a", "high", "in_progress"),))]
    usage = events_from_update({"sessionUpdate": "usage_update", "used": 5, "size": 10,
                                "cost": {"amount": 0.5, "currency": "USD"}}, tools)
    assert usage == [UsageUpdate(5, 10, 0.5)]


def test_a_tool_call_announced_as_finished_is_started_and_finished() -> None:
    events = events_from_update({"sessionUpdate": "tool_call", "toolCallId": "t2",
                                 "title": "Ran", "status": "completed"}, ToolNames())
    assert [type(e) for e in events] == [ToolCallStarted, ToolCallFinished]


def test_malformed_updates_give_no_events() -> None:
    tools = ToolNames()
    bad: object
    for bad in (None, [], "x", {"sessionUpdate": "tool_call"},
                {"sessionUpdate": "usage_update", "used": "1", "size": 2},
                {"sessionUpdate": "plan", "entries": "no"},
                {"sessionUpdate": "agent_message_chunk", "content": {"type": "image"}}):
        assert events_from_update(bad, tools) == []


@pytest.mark.skipif(not detect("auto").confines, reason="no sandbox backend here")
def test_a_tenants_agent_state_dir_stays_one_level_below_the_state_root(tmp_path: Path) -> None:
    """Tenant names may be "." or ".." (and aliases odd): never a way out of the state dir."""
    state = tmp_path / "agent-homes"
    env = {AGENT_STATE_VARIABLE: str(state), SANDBOX_VARIABLE: "auto"}
    for tenant, alias in ((".", "a"), ("..", "sessions"), ("t", "../x")):
        setup = SessionSetup(sid="s", paths=PathPolicy.build(str(tmp_path), str(tmp_path), ()),
                             mode=lambda: "full", meta={"tenant": tenant})
        config = {"alias": alias}
        home = jail_for(config, setup, env).home
        assert home is not None and home.parent.parent == state, home


def test_updates_that_arrive_together_merge_their_consecutive_chunks_in_order() -> None:
    def chunk(kind: str, text: str) -> dict[str, object]:
        return {"sessionUpdate": kind, "content": {"type": "text", "text": text}}

    updates = [chunk("agent_message_chunk", "a"), chunk("agent_message_chunk", "b"),
               chunk("agent_thought_chunk", "t"), chunk("agent_thought_chunk", "u"),
               {"sessionUpdate": "current_mode_update", "currentModeId": "plan"},
               chunk("agent_message_chunk", "c"), {"sessionUpdate": "unknown_kind"},
               chunk("agent_message_chunk", "d")]
    assert merged_chunks(events_from_updates(updates, ToolNames())) == [
        MessageChunk("ab"), ThoughtChunk("tu"), CurrentMode("plan"), MessageChunk("cd")]
    assert merged_chunks([]) == []


def test_the_relay_streams_bursts_merged_and_queues_in_order_once_the_window_is_full() -> None:
    inbox: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
    stream = RecordingStream(room=1)
    relay = UpdateRelay(cast(TurnContext, stream), ToolNames(), inbox)
    loop = asyncio.new_event_loop()
    replies: list[object] = []

    def chunk(text: str) -> dict[str, object]:
        return {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": text}}

    def burst(*updates: dict[str, object]) -> None:
        for update in updates:
            loop.call_soon(relay.update, update)
        loop.call_soon(loop.call_soon, loop.stop)  # after the relay's first flush
        loop.run_forever()
        relay.flush()  # what a later burst gathers goes on within GATHER_SECS

    try:
        burst(chunk("a"), chunk("b"))  # one burst: one event, and the window is full
        assert stream.events == [MessageChunk("ab")]
        burst(chunk("c"))  # queued for the turn's thread
        relay.put(("permission", ({}, replies.append)))
        burst(chunk("d"))  # behind the permission request
        relay.put(("done", None))
        queued = [inbox.get_nowait() for _ in range(4)]
        assert [kind for kind, _ in queued] == ["update", "permission", "update", "done"]
        assert [queued[0][1], queued[2][1]] == [chunk("c"), chunk("d")]
        relay.caught_up()  # the turn's thread relayed them: the loop thread again
        stream.room = 10
        burst(chunk("e"))
        assert stream.events == [MessageChunk("ab"), MessageChunk("e")] and inbox.empty()
        relay.close()
        burst(chunk("f"))
        relay.put(("permission", ({}, replies.append)))
    finally:
        loop.close()
    assert stream.events == [MessageChunk("ab"), MessageChunk("e")] and inbox.empty()
    assert replies == [{"outcome": {"outcome": "cancelled"}}]  # after the turn: cancelled


class _AnsweredThenExited:
    """An agent process whose answer is settled by its loop thread only after the turn saw
    the process exited, as when the agent answers and closes its stdout at once: the
    loop marks the process exited at the end of its stdout before the answer's future
    (settled a few loop steps after the answer was read) is done."""

    def __init__(self) -> None:
        self.answer: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self.exit_seen = threading.Event()
        self.loop_thread = threading.Thread(target=self._settle_answer, daemon=True)
        self.loop_thread.start()

    def _settle_answer(self) -> None:
        if self.exit_seen.wait(10) and not self.answer.cancelled():
            self.answer.set_result({"stopReason": "end_turn"})

    @property
    def alive(self) -> bool:
        self.exit_seen.set()
        return False

    def call(self, method: str, params: Any) -> concurrent.futures.Future[Any]:
        return self.answer

    def notify(self, method: str, params: Any) -> None:
        pass

    def hold_reading(self, holder: object, held: bool) -> None:
        pass

    def failure_text(self, doing: str) -> str:
        return f"agent exited {doing}"


def test_a_turn_answered_just_before_the_agent_exited_ends_with_its_answer() -> None:
    process = _AnsweredThenExited()
    link = SessionLink("agent-session", cast(PathPolicy, None), lambda: "full")
    ctx = SimpleNamespace(cancelled=threading.Event())
    turn = AcpTurn(cast(AgentProcess, process), link, cast(TurnContext, ctx),
                   lambda: "full", cancel_grace=1.0)
    assert turn.run("hi") == "end_turn"
    process.loop_thread.join(10)
