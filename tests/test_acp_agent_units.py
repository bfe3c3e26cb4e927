"""The pure parts of the ``acp`` provider: config checks, the agent's environment, and
the agent's ``session/update``s as the events that carry them on, untouched."""

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
from actors.worker.agents.acp_confine import TENANT_ROOT_META_KEY, jail_for
from actors.worker.agents.acp_process import AgentProcess, SessionLink, clean_env
from actors.worker.agents.acp_turn import AcpTurn, UpdateRelay
from actors.worker.agents.acp_updates import relayed_events
from actors.worker.agents.base import SessionSetup
from actors.worker.sandbox import AGENT_STATE_VARIABLE, SANDBOX_VARIABLE, detect
from actors.worker.tools import PathPolicy
from ipc.acp import update_of
from ipc.events import AgentUpdate, MessageChunk, ThoughtChunk
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


def test_clean_env_passes_what_reaches_the_network_unless_told_not_to() -> None:
    """Proxy and trust variables (both cases) go to the agent by default: behind a TLS
    proxy ``npx`` needs them to fetch the agent at all."""
    network = {"HTTPS_PROXY": "http://proxy:3128", "no_proxy": "localhost",
               "NODE_EXTRA_CA_CERTS": "/etc/ca.pem", "REQUESTS_CA_BUNDLE": "/etc/ca.pem",
               "SSL_CERT_DIR": "/etc/ssl/certs"}
    host = {"PATH": "/bin", "OPENAI_API_KEY": "y", **network}
    assert clean_env({}, host) == {"PATH": "/bin", **network}
    assert clean_env({}, host, network=False) == {"PATH": "/bin"}


def _text(kind: str, text: str) -> dict[str, object]:
    return {"sessionUpdate": kind, "content": {"type": "text", "text": text}}


def test_every_update_goes_on_as_the_agent_sent_it_one_event_each() -> None:
    diff = {"sessionUpdate": "tool_call_update", "toolCallId": "t1",
            "content": [{"type": "diff", "path": "/a", "oldText": "x", "newText": "y"}],
            "locations": [{"path": "/a", "line": 3}], "title": "Edit a",
            "_meta": {"vendor": {"n": 1}}, "futureField": True}  # no status: it stays so
    with_id = {**_text("agent_message_chunk", "hi"), "messageId": "m1"}
    updates: list[Any] = [_text("agent_message_chunk", "a"), _text("agent_message_chunk", "b"),
                          _text("agent_thought_chunk", "t"), diff, with_id,
                          _text("user_message_chunk", "me"), {"sessionUpdate": "plan"},
                          _text("agent_message_chunk", "")]
    events = relayed_events(updates)
    assert events == [MessageChunk("a"), MessageChunk("b"), ThoughtChunk("t"), AgentUpdate(diff),
                      AgentUpdate(with_id), AgentUpdate(_text("user_message_chunk", "me")),
                      AgentUpdate({"sessionUpdate": "plan"}), MessageChunk("")]
    assert [update_of(e) for e in events] == updates  # the same updates reach the client
    assert cast(AgentUpdate, events[3]).update is diff  # not even copied


def test_what_is_not_an_acp_update_is_left_out() -> None:
    bad: list[Any] = [None, [], "x", {"update": 1}, {"sessionUpdate": 5}]
    assert relayed_events(bad) == []


@pytest.mark.skipif(not detect("auto").confines, reason="no sandbox backend here")
def test_a_tenants_agent_state_dir_stays_one_level_below_the_state_root(tmp_path: Path) -> None:
    """Tenant names may be "." or ".." (and aliases odd): never a way out of the state dir."""
    state = tmp_path / "agent-homes"
    env = {AGENT_STATE_VARIABLE: str(state), SANDBOX_VARIABLE: "auto"}
    for tenant, alias in ((".", "a"), ("..", "sessions"), ("t", "../x")):
        setup = SessionSetup(sid="s", paths=PathPolicy.build(str(tmp_path), str(tmp_path), ()),
                             mode=lambda: "full",
                             meta={"tenant": tenant, TENANT_ROOT_META_KEY: str(tmp_path)})
        config = {"alias": alias}
        home = jail_for(config, setup, env).home
        assert home is not None and home.parent.parent == state, home


def test_the_relay_streams_bursts_and_queues_in_order_once_the_window_is_full() -> None:
    inbox: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
    stream = RecordingStream(room=1)
    relay = UpdateRelay(cast(TurnContext, stream), inbox)
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
        burst(chunk("a"), chunk("b"))  # one burst, one event each: the window is full
        assert stream.events == [MessageChunk("a"), MessageChunk("b")]
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
        assert stream.events == [MessageChunk("a"), MessageChunk("b"),
                                 MessageChunk("e")] and inbox.empty()
        relay.close()
        burst(chunk("f"))
        relay.put(("permission", ({}, replies.append)))
    finally:
        loop.close()
    assert stream.events == [MessageChunk("a"), MessageChunk("b"), MessageChunk("e")]
    assert inbox.empty()
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
