"""A turn's ACP updates go through the recorder and a real SQLite store and come back
from ``session/load``'s replay as the client got them live: every chunk boundary, every
field an agent sent, and none of the optional fields it left out made up."""

from __future__ import annotations

from typing import Any

import orjson

from actors.persistence import CreateSession, WriteTurn
from actors.worker.turn import TurnRecorder
from ipc.acp import replay_updates, update_of
from ipc.events import AgentUpdate, Event, MessageChunk, ThoughtChunk, ToolItem
from storage import Store, StoredSession

SID = "0d6c2b9e-1f0a-4c55-9a57-2e1b7f3c8a11"


def stored_session() -> StoredSession:
    return StoredSession(id=SID, agent_alias="gemini", workspace_dir="/ws", cwd="/src",
                         mode="supervised", created_at=1.0, last_activity=2.0)


def chunk(kind: str, text: str, **extra: Any) -> AgentUpdate:
    return AgentUpdate({"sessionUpdate": kind, "content": {"type": "text", "text": text},
                        **extra})


# A Gemini-like tool turn: no rawInput, no kind, no title change, no status on the
# first update; chunks with messageIds; a chunk with _meta; a plan; an agent-only field.
HOSTED_TURN: list[Event] = [
    chunk("agent_thought_chunk", "Reading ", messageId="m1"),
    chunk("agent_thought_chunk", "first.", messageId="m1"),
    chunk("agent_message_chunk", "Let me ", messageId="m1"),
    chunk("agent_message_chunk", "look.", messageId="m1"),
    chunk("agent_message_chunk", "!", messageId="m2"),
    AgentUpdate({"sessionUpdate": "tool_call", "toolCallId": "read-1", "title": "calc.py"}),
    AgentUpdate({"sessionUpdate": "tool_call_update", "toolCallId": "read-1",
                 "status": "completed",
                 "content": [{"type": "content",
                              "content": {"type": "text", "text": "def add(a, b):"}}]}),
    AgentUpdate({"sessionUpdate": "tool_call", "toolCallId": "edit-1", "title": "Edit calc.py",
                 "kind": "edit", "status": "pending", "locations": [{"path": "/src/calc.py"}],
                 "_meta": {"vendor": {"x": 1}}}),
    AgentUpdate({"sessionUpdate": "tool_call_update", "toolCallId": "edit-1",
                 "content": [{"type": "diff", "path": "/src/calc.py",
                              "oldText": "a - b", "newText": "a + b"}]}),
    AgentUpdate({"sessionUpdate": "tool_call_update", "toolCallId": "edit-1",
                 "status": "completed"}),
    AgentUpdate({"sessionUpdate": "plan", "entries": [
        {"content": "fix add", "priority": "high", "status": "completed"}]}),
    chunk("agent_message_chunk", "Fixed", _meta={"vendor": True}),
    chunk("agent_message_chunk", " it", messageId="m3"),
    chunk("agent_message_chunk", ".", messageId="m3"),
    AgentUpdate({"sessionUpdate": "usage_update", "used": 10, "size": 100,
                 "futureField": [1, 2]}),
]


def record(events: list[Event]) -> tuple[TurnRecorder, list[dict[str, Any]]]:
    recorder = TurnRecorder("fix calc.py")
    for event in events:
        recorder.add(event)
    return recorder, [update_of(event) for event in events]


def through_the_store(store: Store, writer: Any, recorder: TurnRecorder) -> list[dict[str, Any]]:
    writer.perform(CreateSession(stored_session())).get(timeout=10)
    turn = recorder.build(SID, cancelled=False, started_at=1.0, stop_reason="end_turn")
    writer.perform(WriteTurn(turn)).get(timeout=10)
    return list(replay_updates(store.reader.load_turns(SID)))


def test_a_hosted_tool_turn_without_optional_fields_commits_and_replays_as_sent(
        store: Store, writer: Any) -> None:
    recorder, live = record(HOSTED_TURN)
    replayed = through_the_store(store, writer, recorder)
    user = {"sessionUpdate": "user_message_chunk",
            "content": {"type": "text", "text": "fix calc.py"}}
    assert replayed == [user, *live]
    tools = [item for item in store.reader.load_items(SID) if isinstance(item, ToolItem)]
    assert [(t.tool_call_id, t.title, t.outcome) for t in tools] == [
        ("read-1", "calc.py", "completed"), ("edit-1", "Edit calc.py", "completed")]
    assert tools[0].arguments is None and tools[0].result == "def add(a, b):"


def test_a_long_stream_is_stored_as_one_entry_per_run_not_per_chunk(
        store: Store, writer: Any) -> None:
    events: list[Event] = [MessageChunk(f"w{i} ") for i in range(2000)]
    events += [ThoughtChunk("hm"), MessageChunk("done")]
    recorder, live = record(events)
    turn = recorder.build(SID, cancelled=False, started_at=1.0, stop_reason="end_turn")
    assert len(turn.updates) == 3
    assert len(orjson.dumps(turn.updates)) < 2000 * 12
    replayed = through_the_store(store, writer, recorder)
    assert replayed[1:] == live
    assert store.reader.load_items(SID)[1].text == "".join(f"w{i} " for i in range(2000))
