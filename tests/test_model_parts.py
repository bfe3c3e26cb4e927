"""The pure parts of the model agents: stream assembly, history, context fitting, tool
schemas, config checks. (End to end: ``tests/e2e/test_model_*.py``.)"""

from __future__ import annotations

import pytest

from actors.worker.agents.llm.config import settings_problem
from actors.worker.agents.llm.conversation import (
    INTERRUPTED_NOTE,
    AssistantMessage,
    ToolCallRequest,
    ToolResultMessage,
    UserMessage,
    fit_history,
    history_turns,
    system_prompt,
)
from actors.worker.agents.llm.http import SseDecoder, redact
from actors.worker.agents.llm.model_io import env_proxy
from actors.worker.agents.llm.reply import ReplyBuilder, ThinkSplitter
from actors.worker.agents.llm.tool_specs import TOOL_SCHEMAS, model_tools
from actors.worker.tools import default_tools
from ipc.events import Event, MessageChunk, TextItem, ThoughtChunk, ToolItem


def test_think_tags_split_anywhere_become_thoughts() -> None:
    text = "<think>plan</think>answer <b>bold</b> <thinker"
    for cut in range(1, len(text)):
        splitter = ThinkSplitter()
        pieces = splitter.feed(text[:cut]) + splitter.feed(text[cut:]) + splitter.flush()
        thought = "".join(t for is_thought, t in pieces if is_thought)
        said = "".join(t for is_thought, t in pieces if not is_thought)
        assert (thought, said) == ("plan", "answer <b>bold</b> <thinker"), cut


def build(*deltas: tuple[int | None, str | None, str | None, str]) -> list[ToolCallRequest]:
    events: list[Event] = []
    reply = ReplyBuilder(events.append)
    for delta in deltas:
        reply.tool_delta(*delta)
    return list(reply.build().tool_calls)


def test_tool_call_fragments_by_index_with_or_without_ids() -> None:
    calls = build((0, "a", "shell", '{"command":'), (1, "b", "file_read", "{}"),
                  (0, None, None, ' "ls"}'))
    assert [(c.call_id, c.name, c.arguments) for c in calls] == [
        ("a", "shell", '{"command": "ls"}'), ("b", "file_read", "{}")]
    [anonymous] = build((0, None, "shell", '{"comm'), (0, None, None, 'and": "ls"}'))
    assert anonymous.call_id.startswith("call_") and anonymous.arguments == '{"command": "ls"}'
    reused = build((0, "a", "shell", "{}"), (0, "b", "file_read", "{}"))
    assert [c.call_id for c in reused] == ["a", "b"]
    unindexed = build((None, "a", "shell", "{"), (None, "b", "shell", "{}"), (None, "a", None, "}"))
    assert [(c.call_id, c.arguments) for c in unindexed] == [("a", "{}"), ("b", "{}")]


def test_reply_streams_text_and_thoughts_at_each_flush_merged_by_kind() -> None:
    events: list[Event] = []
    reply = ReplyBuilder(events.append)
    reply.thought("hmm")
    reply.text("<think>x</think>Hi")
    reply.text(" there")
    assert events == []
    reply.flush()
    assert events == [ThoughtChunk("hmmx"), MessageChunk("Hi there")]
    reply.text("!")
    reply.finish("end")
    built = reply.build()
    assert events[2:] == [MessageChunk("!")]
    assert (built.text, built.finish) == ("Hi there!", "end")


def test_history_becomes_messages_by_turn_without_thoughts() -> None:
    items = [
        TextItem("user", "first"), TextItem("thought", "ponder"),
        TextItem("assistant", "Checking."),
        ToolItem("c1", "file_read", {"path": "x"}, "X", "completed"),
        ToolItem("c2", "shell", "not json", "denied: autonomy is read_only", "denied"),
        TextItem("assistant", "Done."),
        TextItem("user", "second"), TextItem("assistant", "ok"),
    ]
    first, second = history_turns(items)
    assert first == (
        UserMessage("first"),
        AssistantMessage("Checking.", (ToolCallRequest("c1", "file_read", '{"path":"x"}'),
                                       ToolCallRequest("c2", "shell", "not json"))),
        ToolResultMessage("c1", "file_read", "X", False),
        ToolResultMessage("c2", "shell", "denied: autonomy is read_only", True),
        AssistantMessage("Done."),
    )
    assert second == (UserMessage("second"), AssistantMessage("ok"))


def test_history_keeps_the_model_replies_of_a_turn_apart_even_without_text() -> None:
    read = ToolItem("c1", "file_read", {"path": "x"}, "X", "completed", step=1)
    edit = ToolItem("c2", "file_edit", {"path": "x"}, "edited", "completed", step=2)
    run = ToolItem("c3", "shell", {"command": "t"}, "ok", "completed", step=2)
    [turn] = history_turns([TextItem("user", "fix x"), read, edit, run,
                            TextItem("assistant", "Done.")])
    assert turn == (
        UserMessage("fix x"),
        AssistantMessage("", (ToolCallRequest("c1", "file_read", '{"path":"x"}'),)),
        ToolResultMessage("c1", "file_read", "X", False),
        AssistantMessage("", (ToolCallRequest("c2", "file_edit", '{"path":"x"}'),
                              ToolCallRequest("c3", "shell", '{"command":"t"}'))),
        ToolResultMessage("c2", "file_edit", "edited", False),
        ToolResultMessage("c3", "shell", "ok", False),
        AssistantMessage("Done."),
    )


def test_fit_history_drops_whole_oldest_turns() -> None:
    turns = [(UserMessage("a" * 400), AssistantMessage("b" * 400)),
             (UserMessage("c" * 40), AssistantMessage("d" * 40))]
    kept, dropped = fit_history(turns, budget=50)
    assert dropped == 1 and kept == list(turns[1])
    assert fit_history(turns, budget=10_000) == ([*turns[0], *turns[1]], 0)
    assert fit_history(turns, budget=0) == ([], 2)


def test_system_prompt_names_the_workspace_and_reads_the_persona(tmp_path) -> None:
    (tmp_path / "SOUL.md").write_text("calm")
    text = system_prompt("main", tmp_path / "project", str(tmp_path))
    assert f"Working directory: {tmp_path / 'project'}" in text
    assert "## SOUL.md\n\ncalm" in text and "IDENTITY.md" not in text


def test_every_registered_tool_has_a_schema() -> None:
    assert set(TOOL_SCHEMAS) == set(default_tools())
    for spec in model_tools():
        assert spec.parameters["type"] == "object" and spec.description


def test_sse_events_join_lines_and_skip_comments_and_event_names_cut_anywhere() -> None:
    body = (': keep-alive\r\nevent: message_start\r\ndata: {"a":\r\ndata:"\u00e9"}\r\n\r\n'
            "data: [DONE]").encode()
    for cut in range(len(body) + 1):  # also inside the two bytes of the é
        decoder = SseDecoder()
        events = decoder.feed(body[:cut]) + decoder.feed(body[cut:]) + decoder.end()
        assert events == ['{"a":\n"\u00e9"}'.encode(), b"[DONE]"], cut
    decoder = SseDecoder()  # an event is handed over as soon as its blank line is read
    assert decoder.feed(b"data: a\n\ndata: b\n") == [b"a"]
    assert decoder.feed(b"\n") == [b"b"]
    assert decoder.feed(b"data: c\r\rdata: d") == [b"c"]  # bare CR line ends too


@pytest.mark.parametrize(("config", "problem"), [
    ({"model": "m"}, "base_url is required"),
    ({"base_url": "localhost:8080", "model": "m"}, "base_url must be an http"),
    ({"base_url": "http:///v1", "model": "m"}, "base_url must be an http"),
    ({"base_url": "http://[::1/v1", "model": "m"}, "base_url must be an http"),
    ({"base_url": "http://a b/v1", "model": "m"}, "base_url must be an http"),
    ({"base_url": "http://x", "model": "m", "api_key_env": "NOPE"}, "NOPE (api_key_env)"),
    ({"base_url": "http://x", "model": "m", "temperature": "hot"}, "temperature must be"),
    ({"base_url": "http://x", "model": "m", "headers": {"a": 1}}, "headers must be"),
    ({"base_url": "http://x", "model": "m", "max_retries": -1}, "max_retries must be >= 0"),
    ({"base_url": "http://x", "model": "m", "max_turn_secs": 0}, "max_turn_secs must be"),
    ({"base_url": "http://x", "model": "m", "max_tool_calls_per_reply": 0},
     "max_tool_calls_per_reply must be >= 1"),
])
def test_config_problems_are_named(config: dict[str, object], problem: str) -> None:
    found = settings_problem({"provider": "openai", **config}, {}, needs_key=False)
    assert found is not None and problem in found
    assert settings_problem({"provider": "openai", "base_url": "http://x", "model": "m"}, {},
                            needs_key=False) is None


def test_a_key_that_cannot_be_a_header_is_refused_without_showing_it() -> None:
    config = {"provider": "openai", "base_url": "http://x", "model": "m", "api_key_env": "K"}
    problem = settings_problem(config, {"K": "sk-abc\n"}, needs_key=False)
    assert problem is not None and "control characters" in problem and "sk-abc" not in problem
    assert settings_problem(config, {"K": "sk-abc"}, needs_key=False) is None


def test_redact_hides_the_key() -> None:
    assert redact("bad key sk-123 (sk-123)", "sk-123") == "bad key *** (***)"
    assert redact("nothing", None) == "nothing"


def test_the_environment_names_the_proxy_unless_no_proxy_covers_the_host(monkeypatch) -> None:
    for name in ("http_proxy", "https_proxy", "no_proxy", "all_proxy", "HTTP_PROXY",
                 "HTTPS_PROXY", "NO_PROXY", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
    assert env_proxy("https://api.example.com/v1") is None
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.local:3128")
    monkeypatch.setenv("NO_PROXY", "localhost,.internal")
    assert env_proxy("https://api.example.com/v1") == "http://proxy.local:3128"
    assert env_proxy("http://api.example.com/v1") is None  # only https is proxied
    assert env_proxy("https://llm.internal/v1") is None


def test_a_failed_turns_error_line_reaches_the_model_as_a_plain_note() -> None:
    error = "[turn failed: model API http://x/v1 (m): the stream broke: ClientPayloadError: boom]"
    items = [TextItem(role="user", text="hi"), TextItem(role="assistant", text=f"part\n{error}"),
             TextItem(role="user", text="again"), TextItem(role="assistant", text=error),
             TextItem(role="user", text="quote"),
             TextItem(role="assistant", text="it said [turn failed: x] once")]
    turns = history_turns(items)
    assert [t[1] for t in turns] == [
        AssistantMessage(f"part\n{INTERRUPTED_NOTE}"), AssistantMessage(INTERRUPTED_NOTE),
        AssistantMessage("it said [turn failed: x] once")]
