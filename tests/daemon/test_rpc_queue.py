"""SPEC §4 pieces of ``daemon.sock``: per-session prompt queues (depth 32), a client-chosen
``sessionId`` in ``session/new``, and ``elicitation/create`` (DaemonPeer.ask_user).

The queue and session-id tests run against real daemons. ``elicitation/create`` has no
trigger in a real turn yet (no agent tool asks the user), so ``DaemonPeer.ask_user`` is
tested over two real in-process :class:`ipc.jsonrpc.Endpoint` objects wired together.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import orjson
import pytest

from ipc import acp, rpc
from ipc.errors import InternalError, SessionBusy
from ipc.jsonrpc import Endpoint
from supervisor.core.ownership import Owners
from supervisor.servers.prompt_queue import PromptQueues
from supervisor.servers.rpc_server import DaemonPeer, RpcServer

from .helpers import DaemonProc, RpcClient, RpcFailure

Daemons = Callable[..., DaemonProc]
SLOW = "running\n!sleep 30\nnever said"


@pytest.fixture
def daemon(daemons: Daemons) -> Iterator[DaemonProc]:
    yield daemons()


def start_slow_turn(client: RpcClient) -> tuple[str, int]:
    """A new session with a turn that runs until cancelled; (sid, prompt request id)."""
    sid = client.request("session/new")["sessionId"]
    prompt_id = client.send("session/prompt", {"sessionId": sid, "prompt": SLOW})
    assert prompt_id is not None
    client.wait_update("agent_message_chunk")
    return sid, prompt_id


def response(client: RpcClient, request_id: int, timeout: float = 15) -> dict[str, Any]:
    """The response to ``request_id``, also when it was read while waiting for another."""
    for frame in client.frames:
        if frame.get("id") == request_id and "method" not in frame:
            return frame
    return client.wait_response(request_id, timeout)


def completed_contents(client: RpcClient, sid: str) -> list[str]:
    return [u["content"] for u in client.updates()
            if u["type"] == "turn_complete" and u["sessionId"] == sid]


def session_entry(client: RpcClient, sid: str) -> dict[str, Any]:
    [entry] = [s for s in client.request("status")["sessions"] if s["sessionId"] == sid]
    return entry


# --- the prompt queue, on a real daemon -----------------------------------------------


def test_prompts_wait_their_turn_and_run_in_arrival_order(daemon: DaemonProc) -> None:
    with daemon.client() as client:
        sid, first = start_slow_turn(client)
        queued = [client.send("session/prompt", {"sessionId": sid, "prompt": f"queued {n}"})
                  for n in range(5)]
        assert session_entry(client, sid)["state"] == "busy"
        client.send("session/cancel", {"sessionId": sid}, notify=True)
        assert response(client, first)["result"]["stopReason"] == "cancelled"
        for n, request_id in enumerate(queued):  # the cancel stopped the running turn only
            assert request_id is not None
            assert response(client, request_id)["result"] == {
                "sessionId": sid, "stopReason": "end_turn", "content": f"queued {n}"}
        contents = completed_contents(client, sid)
        assert contents[1:] == [f"queued {n}" for n in range(5)]
        assert contents[0].endswith("[turn cancelled via client]")
        assert session_entry(client, sid)["turns"] == 6


def test_the_33rd_waiting_prompt_is_refused_with_session_busy(daemon: DaemonProc) -> None:
    with daemon.client() as client:
        sid, first = start_slow_turn(client)
        queued = [client.send("session/prompt", {"sessionId": sid, "prompt": f"q{n}"})
                  for n in range(32)]
        with pytest.raises(RpcFailure) as info:
            client.request("session/prompt", {"sessionId": sid, "prompt": "one too many"})
        assert info.value.code == -32002
        for request_id in queued:  # none of the 32 was answered before the refusal
            assert not any(f.get("id") == request_id for f in client.frames)
        client.request("session/cancel", {"sessionId": sid})
        assert response(client, first)["result"]["stopReason"] == "cancelled"
        answers = [response(client, r, timeout=30)["result"]["content"]
                   for r in queued if r is not None]
        assert answers == [f"q{n}" for n in range(32)]
        assert "one too many" not in completed_contents(client, sid)
        # the line is empty again: a new prompt runs at once
        assert client.request("session/prompt", {"sessionId": sid, "prompt": "after"}) \
            == {"sessionId": sid, "stopReason": "end_turn", "content": "after"}


def test_a_client_that_leaves_drops_its_queued_prompts(daemon: DaemonProc) -> None:
    leaver = daemon.client()
    sid, _ = start_slow_turn(leaver)
    for n in range(3):
        leaver.send("session/prompt", {"sessionId": sid, "prompt": f"dropped {n}"})
    leaver.request("status")  # the three prompts reached the daemon before the close
    leaver.close()
    with daemon.client() as other:
        deadline = time.monotonic() + 15
        while True:  # the running turn is cancelled and persisted; nothing else runs
            entry = session_entry(other, sid)
            if entry["state"] == "idle" and entry["turns"] >= 1:
                break
            assert time.monotonic() < deadline, entry
            time.sleep(0.05)
        result = other.request("session/prompt", {"sessionId": sid, "prompt": "mine"})
        assert result["content"] == "mine"
        # had the dropped prompts run, they would have run before this one
        assert session_entry(other, sid)["turns"] == 2
        assert completed_contents(other, sid) == ["mine"]


def test_close_drops_the_queued_prompts(daemon: DaemonProc) -> None:
    with daemon.client() as client:
        sid, first = start_slow_turn(client)
        queued = client.send("session/prompt", {"sessionId": sid, "prompt": "never run"})
        assert queued is not None
        assert client.request("session/close", {"sessionId": sid}) == {}
        assert response(client, first)["result"]["stopReason"] == "cancelled"
        assert response(client, queued)["error"]["code"] == -32000
        assert "never run" not in completed_contents(client, sid)


def test_acp_socket_keeps_its_immediate_session_busy(daemon: DaemonProc) -> None:
    with RpcClient(daemon.socket_path.parent / "acp.sock") as editor:
        sid = editor.request("session/new", {"cwd": str(daemon.work_dir)})["sessionId"]
        first = editor.send("session/prompt", {"sessionId": sid, "prompt": SLOW})
        assert first is not None
        deadline = time.monotonic() + 10
        while not editor.updates():
            editor.read_frame(max(0.01, deadline - time.monotonic()))
        with pytest.raises(RpcFailure) as info:
            editor.request("session/prompt", {"sessionId": sid, "prompt": "second"})
        assert info.value.code == -32002
        editor.send("session/cancel", {"sessionId": sid}, notify=True)
        assert response(editor, first)["result"]["stopReason"] == "cancelled"


# --- session/new with a client-chosen sessionId ----------------------------------------


def test_session_new_accepts_a_client_chosen_uuid(daemon: DaemonProc) -> None:
    chosen = str(uuid.uuid4())
    with daemon.client() as client:
        created = client.request("session/new", {"sessionId": chosen.upper()})
        assert created["sessionId"] == chosen
        assert client.request("session/prompt", {"sessionId": chosen, "prompt": "hi"}) \
            == {"sessionId": chosen, "stopReason": "end_turn", "content": "hi"}
        with pytest.raises(RpcFailure) as info:  # live
            client.request("session/new", {"sessionId": chosen, "keep_siblings": True})
        assert info.value.code == -32602 and "already exists" in info.value.message
        client.request("session/close", {"sessionId": chosen})
        with pytest.raises(RpcFailure) as info:  # closed, but still stored
            client.request("session/new", {"session_id": chosen})
        assert info.value.code == -32602 and "session/load" in info.value.message
        assert session_entry_ids(client) == set()


def session_entry_ids(client: RpcClient) -> set[str]:
    return {s["sessionId"] for s in client.request("status")["sessions"]}


@pytest.mark.parametrize("bad", ["not-a-uuid", "", 42, ["x"],
                                 "{12345678-1234-5678-1234-567812345678}",
                                 "12345678123456781234567812345678"])
def test_session_new_refuses_a_sessionid_that_is_not_a_uuid(daemon: DaemonProc,
                                                             bad: Any) -> None:
    with daemon.client() as client:
        with pytest.raises(RpcFailure) as info:
            client.request("session/new", {"sessionId": bad})
        assert info.value.code == -32602 and "sessionId" in info.value.message
        assert session_entry_ids(client) == set()


def test_the_acp_dialect_still_picks_the_id_itself(daemon: DaemonProc) -> None:
    chosen = str(uuid.uuid4())
    assert acp.new_session_request({"sessionId": chosen}).session_id is None
    with RpcClient(daemon.socket_path.parent / "acp.sock") as editor:
        created = editor.request("session/new", {"cwd": str(daemon.work_dir),
                                                 "sessionId": chosen})
    assert created["sessionId"] != chosen
    uuid.UUID(created["sessionId"])


def test_chosen_session_id_parsing() -> None:
    value = "12345678-ABCD-5678-1234-567812345678"
    assert rpc.chosen_session_id(value) == value.lower()
    assert rpc.chosen_session_id(None) is None
    request = rpc.new_session_request({"sessionId": value.lower(), "keep_siblings": True})
    assert request.request.session_id == value.lower() and request.keep_siblings


# --- the queue itself ---------------------------------------------------------------


async def test_prompt_queues_order_depth_and_drops() -> None:
    queues = PromptQueues(depth=2)
    alice, bob = object(), object()
    head = queues.enter("s", alice)
    assert head.ready.done()
    second, third = queues.enter("s", alice), queues.enter("s", bob)
    with pytest.raises(SessionBusy):
        queues.enter("s", alice)
    assert queues.enter("other", bob).ready.done()  # lines are per session
    assert queues.waiting("s") == 2
    assert queues.drop(InternalError("gone"), owner=bob) == 1
    with pytest.raises(InternalError):
        await third.ready
    queues.leave(third)  # a dropped ticket leaving is harmless
    queues.leave(head)
    assert second.ready.done() and queues.waiting("s") == 0
    fourth = queues.enter("s", alice)
    second.ready.cancel()  # withdrawn while at the head: the next one goes
    queues.leave(second)
    assert fourth.ready.done()
    queues.leave(fourth)
    assert queues.waiting("s") == 0 and queues.enter("s", alice).ready.done()


# --- elicitation/create through DaemonPeer.ask_user (in-process endpoints) ----------


class Pair:
    """A daemon endpoint (RpcServer) and a client endpoint, frames passed via the loop."""

    def __init__(self, answer: Callable[[Any], Any]) -> None:
        self.asked: list[dict[str, Any]] = []
        self.loop = asyncio.get_running_loop()

        def elicit(params: Any, endpoint: Endpoint) -> Any:
            self.asked.append(params)
            return answer(params)

        self.client = Endpoint(self._to_server, {"elicitation/create": elicit},
                               require_initialize=False, name="client")
        self.server = RpcServer("test", self._no_sessions, Owners()).make_endpoint(self._to_client)
        self.peer: DaemonPeer = self.server.state["peer"]

    async def _no_sessions(self) -> Any:
        raise AssertionError("no session operation expected")

    def _to_server(self, frame: bytes) -> None:
        self.loop.call_soon(self.server.receive, frame.rstrip(b"\n"))

    def _to_client(self, frame: bytes) -> None:
        self.loop.call_soon(self.client.receive, frame.rstrip(b"\n"))

    def initialize(self, caps: dict[str, Any] | None) -> None:
        params: dict[str, Any] = {"protocolVersion": 1}
        if caps is not None:
            params["clientCapabilities"] = caps
        self.server.receive(orjson.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize",
                                          "params": params}))


SCHEMA = {"type": "object", "properties": {"colour": {"type": "string"}}}


async def test_ask_user_sends_elicitation_create_and_returns_the_answer() -> None:
    pair = Pair(lambda p: {"action": "accept", "content": {"colour": "blue"}})
    pair.initialize({"elicitation": {"form": {}}})
    reply = await pair.peer.ask_user("sid-1", "Favourite colour?", SCHEMA, timeout=5)
    assert reply == {"action": "accept", "content": {"colour": "blue"}}
    assert pair.asked == [{"sessionId": "sid-1", "mode": "form",
                           "message": "Favourite colour?", "requestedSchema": SCHEMA}]


async def test_ask_user_is_silent_for_clients_that_did_not_advertise() -> None:
    for caps in (None, {}, {"elicitation": False}):
        pair = Pair(lambda p: {"action": "accept", "content": {}})
        pair.initialize(caps)
        assert await pair.peer.ask_user("s", "?", SCHEMA, timeout=5) is None
        await asyncio.sleep(0)
        assert pair.asked == []


async def test_ask_user_decline_and_invalid_answers() -> None:
    pair = Pair(lambda p: {"action": "decline"})
    pair.initialize({"elicitation": True})
    assert await pair.peer.ask_user("s", "?", SCHEMA, timeout=5) == {
        "action": "decline", "content": {}}
    for nonsense in ({"action": "maybe"}, {"action": "accept", "content": "x"}, None):
        pair = Pair(lambda p, n=nonsense: n)
        pair.initialize({"elicitation": {}})
        assert await pair.peer.ask_user("s", "?", SCHEMA, timeout=5) is None
        assert len(pair.asked) == 1


async def test_ask_user_gives_up_on_timeout_and_on_disconnect() -> None:
    never = asyncio.Event()

    async def silent(params: Any) -> Any:
        await never.wait()

    pair = Pair(silent)
    pair.initialize({"elicitation": {}})
    started = time.monotonic()
    assert await pair.peer.ask_user("s", "?", SCHEMA, timeout=0.2) is None
    assert 0.15 < time.monotonic() - started < 5
    assert pair.server.pending_requests == 0

    asking = asyncio.ensure_future(pair.peer.ask_user("s", "again?", SCHEMA, timeout=30))
    while len(pair.asked) < 2:
        await asyncio.sleep(0.001)
    pair.server.receive_eof()  # the client went away
    assert await asyncio.wait_for(asking, 5) is None
    assert await pair.peer.ask_user("s", "after?", SCHEMA, timeout=5) is None
    assert len(pair.asked) == 2
    never.set()
    pair.client.close()
