"""The echo agent through a real SessionActor, in-process: events, records, tools, approvals."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pykka
import pytest

from actors.worker.agents import Agent, TurnContext, create_agent
from actors.worker.session import (
    PermissionBoard,
    RunTurn,
    SessionActor,
    SessionConfig,
    SessionState,
)
from ipc.events import TextItem, ToolItem, TurnRecord, event_from_wire
from ipc.worker_wire import (
    OpenSession,
    PermissionAsk,
    TurnEnded,
    TurnEvent,
    TurnFailed,
    WorkerMessage,
)

WAIT = 5.0


class Inbox:
    """What the actor sends, collected thread-safely; tests wait on it."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self.messages: list[WorkerMessage] = []

    def __call__(self, message: WorkerMessage) -> None:
        with self._cond:
            self.messages.append(message)
            self._cond.notify_all()

    def wait_for(self, predicate: Callable[[WorkerMessage], bool], start: int = 0) -> Any:
        with self._cond:
            found = self._cond.wait_for(
                lambda: any(predicate(m) for m in self.messages[start:]), timeout=WAIT
            )
            assert found, f"no matching message; got {self.messages[start:]}"
            return next(m for m in self.messages[start:] if predicate(m))

    def turn_end(self, turn_id: str) -> TurnEnded | TurnFailed:
        message = self.wait_for(lambda m: isinstance(m, TurnEnded | TurnFailed)
                                and m.turn_id == turn_id)
        assert isinstance(message, TurnEnded | TurnFailed)
        return message

    def ended(self, turn_id: str) -> TurnRecord:
        end = self.turn_end(turn_id)
        assert isinstance(end, TurnEnded), end
        return TurnRecord.from_wire(end.record)

    def failed(self, turn_id: str) -> str:
        end = self.turn_end(turn_id)
        assert isinstance(end, TurnFailed), end
        return end.message

    def events(self, turn_id: str) -> list[Any]:
        return [event_from_wire(m.event) for m in self.messages
                if isinstance(m, TurnEvent) and m.turn_id == turn_id]


@dataclass
class Session:
    actor: pykka.ActorRef[SessionActor]
    state: SessionState
    board: PermissionBoard
    inbox: Inbox
    cwd: Path

    def start_turn(self, prompt: str, turn_id: str = "t1") -> threading.Event:
        """As the worker's IO thread does it."""
        cancel = self.state.begin_turn()
        assert cancel is not None
        self.actor.tell(RunTurn(turn_id, prompt, cancel))
        return cancel

    def run(self, prompt: str, turn_id: str = "t1") -> TurnRecord:
        self.start_turn(prompt, turn_id)
        return self.inbox.ended(turn_id)

    def cancel(self) -> None:
        """As the worker's IO thread handles CancelTurn."""
        self.state.cancel()
        self.board.withdraw_session(self.state.sid)


def tool(record: TurnRecord, index: int) -> ToolItem:
    item = record.items[index]
    assert isinstance(item, ToolItem), item
    return item


def text(record: TurnRecord, index: int) -> str:
    item = record.items[index]
    assert isinstance(item, TextItem), item
    return item.text


@pytest.fixture
def open_session(tmp_path: Path) -> Callable[..., Session]:
    def opener(mode: str = "full", permission_timeout: float = WAIT, agent: Agent | None = None,
               history: list[dict[str, Any]] | None = None) -> Session:
        cwd = tmp_path / "cwd"
        cwd.mkdir(exist_ok=True)
        message = OpenSession(
            sid="s1", agent={"provider": "echo", "alias": "main"},
            workspace_dir=str(tmp_path / "ws"), cwd=str(cwd), mode=mode,
            forbidden_paths=["/etc"], permission_timeout=permission_timeout,
            history=history or [],
        )
        state = SessionState("s1", mode)
        board, inbox = PermissionBoard(), Inbox()
        actor = SessionActor.start(
            config=SessionConfig.from_open(message), state=state,
            agent=agent or create_agent(message.agent), send=inbox, permissions=board,
        )
        return Session(actor, state, board, inbox, cwd)

    return opener


def test_lines_are_echoed_word_by_word(open_session: Callable[..., Session]) -> None:
    session = open_session()
    record = session.run("hello world\nsecond  line")
    events = session.inbox.events("t1")
    chunks = [e.text for e in events if e.KIND == "message"]
    assert chunks == ["hello ", "world", "\n", "second  ", "line"]
    assert record.content == "hello world\nsecond  line"
    assert record.stop_reason == "end_turn"
    assert record.items == (TextItem("user", "hello world\nsecond  line"),
                            TextItem("assistant", "hello world\nsecond  line"))
    usage = events[-1]
    assert usage.KIND == "usage" and usage.size == 128_000 and usage.used > 0
    assert record.tokens > 0


def test_directives_cover_every_update_kind_in_order(
    open_session: Callable[..., Session],
) -> None:
    session = open_session()
    prompt = "\n".join([
        "!think first", "!think second", "!plan read; write; check",
        'intro text', '!tool file_write {"path": "out.txt", "content": "data"}',
        '!tool file_read {"path": "out.txt"}', "done",
    ])
    record = session.run(prompt)
    kinds = [e.KIND for e in session.inbox.events("t1")]
    assert kinds == ["thought", "thought", "plan", "message", "message", "tool_call",
                     "tool_call_update", "tool_call_update", "tool_call", "tool_call_update",
                     "tool_call_update", "message", "message", "usage"]
    statuses = [e.status for e in session.inbox.events("t1") if e.KIND == "tool_call_update"]
    assert statuses == ["in_progress", "completed", "in_progress", "completed"]
    assert (session.cwd / "out.txt").read_text() == "data"
    plan = next(e for e in session.inbox.events("t1") if e.KIND == "plan")
    assert [(p.content, p.status) for p in plan.entries] == [
        ("read", "in_progress"), ("write", "pending"), ("check", "pending")]
    items = record.items
    assert [getattr(i, "role", "tool") for i in items] == [
        "user", "thought", "assistant", "tool", "tool", "assistant"]
    assert text(record, 1) == "first\nsecond"
    write, read = tool(record, 3), tool(record, 4)
    assert write.name == "file_write" and write.outcome == "completed"
    assert write.kind == "edit" and write.arguments == {"path": "out.txt", "content": "data"}
    assert read.result == "data" and read.kind == "read"
    assert record.content == "intro text\ndone"


def test_fail_directive_fails_the_turn_and_the_session_goes_on(
    open_session: Callable[..., Session],
) -> None:
    session = open_session()
    session.start_turn("!fail before any output", "t0")
    assert session.inbox.failed("t0") == "before any output"
    assert session.inbox.turn_end("t0").record is None  # nothing streamed: nothing kept
    session.start_turn("partial\n!fail model exploded", "t1")
    assert session.inbox.failed("t1") == "model exploded"
    kept = TurnRecord.from_wire(session.inbox.turn_end("t1").record)
    assert kept.stop_reason == "failed"
    assert kept.content == "partial\n[turn failed: model exploded]"
    record = session.run("again", "t2")
    assert record.content == "again"
    history = session.actor.proxy().history.get(timeout=WAIT)
    assert [i.text for i in history] == [  # the failed turn is kept for what it streamed
        "partial\n!fail model exploded", "partial\n[turn failed: model exploded]",
        "again", "again"]


class BrokenAgent(Agent):
    provider = "broken"

    def run_turn(self, prompt: str, ctx: TurnContext) -> None:
        raise RuntimeError("kaput")


def test_unexpected_agent_error_is_reported_with_its_class(
    open_session: Callable[..., Session],
) -> None:
    session = open_session(agent=BrokenAgent({}))
    session.start_turn("x")
    assert session.inbox.failed("t1") == "agent error: RuntimeError: kaput"
    assert not session.state.busy


def test_cancel_mid_sleep_keeps_the_text_so_far(open_session: Callable[..., Session]) -> None:
    session = open_session()
    session.start_turn("before\n!sleep 30\nafter")
    session.inbox.wait_for(lambda m: isinstance(m, TurnEvent) and m.event.get("text") == "before")
    cancelled_at = time.monotonic()
    session.cancel()
    record = session.inbox.ended("t1")
    assert time.monotonic() - cancelled_at < 1.0
    assert record.stop_reason == "cancelled"
    assert record.content == "before\n[turn cancelled via client]"
    assert text(record, -1) == record.content
    assert "after" not in [e.text for e in session.inbox.events("t1") if e.KIND == "message"]


def test_supervised_asks_and_allow_once_runs_the_tool(
    open_session: Callable[..., Session],
) -> None:
    session = open_session(mode="supervised")
    session.start_turn('!tool file_write {"path": "a.txt", "content": "A"}\nok')
    ask = session.inbox.wait_for(lambda m: isinstance(m, PermissionAsk))
    assert (ask.tool_name, ask.kind, ask.title) == ("file_write", "edit", "Write a.txt")
    assert ask.raw_input == {"path": "a.txt", "content": "A"}
    assert not (session.cwd / "a.txt").exists()
    assert session.board.resolve(ask.request_id, "allow-once")
    record = session.inbox.ended("t1")
    assert tool(record, 1).outcome == "completed"
    assert (session.cwd / "a.txt").read_text() == "A"
    assert record.content == "ok"


def test_reject_denies_the_call_and_the_turn_goes_on(
    open_session: Callable[..., Session],
) -> None:
    session = open_session(mode="supervised")
    session.start_turn('!tool shell {"command": "touch made"}\nstill here')
    ask = session.inbox.wait_for(lambda m: isinstance(m, PermissionAsk))
    session.board.resolve(ask.request_id, "reject_once")
    record = session.inbox.ended("t1")
    denied = tool(record, 1)
    assert denied.outcome == "denied" and "denied" in denied.result
    update = next(e for e in session.inbox.events("t1") if e.KIND == "tool_call_update")
    assert update.status == "failed"
    assert not (session.cwd / "made").exists()
    assert record.content == "still here"


def test_allow_always_is_remembered_for_that_tool(open_session: Callable[..., Session]) -> None:
    session = open_session(mode="supervised")
    session.start_turn('!tool shell {"command": "echo 1"}\n!tool shell {"command": "echo 2"}')
    ask = session.inbox.wait_for(lambda m: isinstance(m, PermissionAsk))
    session.board.resolve(ask.request_id, "allow_always")
    record = session.inbox.ended("t1")
    assert [tool(record, 1).result, tool(record, 2).result] == ["1\n", "2\n"]
    assert sum(isinstance(m, PermissionAsk) for m in session.inbox.messages) == 1


def test_permission_timeout_denies(open_session: Callable[..., Session]) -> None:
    session = open_session(mode="supervised", permission_timeout=0.2)
    record = session.run('!tool file_write {"path": "t.txt", "content": "x"}')
    assert tool(record, 1).outcome == "denied"
    assert "timed out" in tool(record, 1).result


def test_cancel_while_waiting_for_permission(open_session: Callable[..., Session]) -> None:
    session = open_session(mode="supervised")
    session.start_turn('!tool file_write {"path": "c.txt", "content": "x"}\nnever')
    session.inbox.wait_for(lambda m: isinstance(m, PermissionAsk))
    session.cancel()
    record = session.inbox.ended("t1")
    assert record.stop_reason == "cancelled"
    assert tool(record, 1).outcome == "denied"
    assert record.content == "[turn cancelled via client]"
    assert not (session.cwd / "c.txt").exists()


def test_read_only_runs_no_mutating_tool_and_mode_changes_apply(
    open_session: Callable[..., Session],
) -> None:
    session = open_session(mode="read_only")
    (session.cwd / "r.txt").write_text("readable")
    record = session.run('!tool file_read {"path": "r.txt"}\n!tool shell {"command": "true"}')
    read, shell = tool(record, 1), tool(record, 2)
    assert read.outcome == "completed" and read.result == "readable"
    assert shell.outcome == "denied"
    assert shell.result == "denied: autonomy is read_only"
    assert not any(isinstance(m, PermissionAsk) for m in session.inbox.messages)
    session.state.set_mode("full")
    record = session.run('!tool shell {"command": "echo now"}', "t2")
    assert tool(record, 1).result == "now\n"


def test_unknown_tools_and_confined_paths_fail_the_call_only(
    open_session: Callable[..., Session],
) -> None:
    session = open_session()
    record = session.run('!tool teleport {}\n!tool file_read {"path": "/etc/hostname"}\nend')
    unknown, outside = tool(record, 1), tool(record, 2)
    assert unknown.outcome == "failed" and "unknown tool 'teleport'" in unknown.result
    assert outside.outcome == "failed" and "forbidden" in outside.result
    assert record.content == "end"


def test_bad_directives_fail_clearly(open_session: Callable[..., Session]) -> None:
    session = open_session()
    session.start_turn("!sleep soon", "t1")
    assert session.inbox.failed("t1").startswith("!sleep needs")
    session.start_turn("!tool shell {not json", "t2")
    assert "not valid JSON" in session.inbox.failed("t2")


def test_usage_counts_the_stored_history(open_session: Callable[..., Session]) -> None:
    history = [{"role": "user", "text": "x" * 400}, {"role": "assistant", "text": "y" * 400}]
    session = open_session(history=history)
    session.run("hi")
    usage = next(e for e in session.inbox.events("t1") if e.KIND == "usage")
    assert usage.used == 200 + 1 + 1
