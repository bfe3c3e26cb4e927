"""Fuzzing a real daemon's ``daemon.sock``: hypothesis-planned streams, every answer checked.

As :mod:`tests.e2e.test_fuzz_host`, in the daemon's RPC dialect (SPEC §4): the
streams call its methods with plausible and random params, approval requests are
denied with ``session/approve`` (itself a request, answered like any other) and
``elicitation/create`` questions are cancelled or refused. Afterwards the same
connection and a new one are still served, and the daemon exits 0 on SIGTERM.
"""

from __future__ import annotations

import itertools
import json
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.wire_fuzz import random_params
from tests.wire_peer import (
    SESSIONS,
    WORKSPACE,
    Dialect,
    PeerFuzz,
    Plan,
    filler,
    fuzz_plans,
    prompt_value,
    session_id_value,
)

from .helpers import DaemonProc, RpcClient

STREAMS = 25
LINES = 500
PRE_INITIALIZE_LINES = 50
METHODS = frozenset({
    "initialize", "status", "session/new", "session/prompt", "session/cancel", "session/close",
    "session/approve",
})
CWDS: tuple[Any, ...] = (WORKSPACE, WORKSPACE, "relative/dir", "/no/such/dir", "", None, 5)
DECISIONS: tuple[Any, ...] = ("reject_once", "reject-once", "nope", 5)  # never an allow
_approvals = itertools.count()


def rpc_params(rng: random.Random, method: str) -> Any:
    """Mostly what the method wants (the test's sessions and workspace), sometimes anything."""
    if rng.random() < 0.15:
        return random_params(rng, method)
    sid = session_id_value(rng)
    params: dict[str, Any] = {"sessionId": sid}
    if method == "session/new":
        params = {"agentAlias": rng.choice(("default", "default", "nope", 3)),
                  "cwd": rng.choice(CWDS), "keep_siblings": rng.choice((True, False, "x"))}
        if rng.random() < 0.2:
            params["sessionId"] = rng.choice((sid, "not-a-uuid"))
    elif method == "session/prompt":
        params["prompt"] = prompt_value(rng)
    elif method == "session/approve":
        params.update(requestId=f"apr-{rng.randint(0, 3)}", decision=rng.choice(DECISIONS))
    elif method == "initialize":
        params = {"protocolVersion": rng.choice((1, 1, 0, 2, "1", True)),
                  "clientCapabilities": rng.choice(({}, {"elicitation": {}}, 5))}
    if rng.random() < 0.15:
        params.pop(rng.choice(list(params)), None)
    return params


def _line(message: dict[str, Any]) -> bytes:
    return json.dumps({"jsonrpc": "2.0", **message}).encode() + b"\n"


def deny_approvals(frame: dict[str, Any], rng: random.Random) -> list[bytes]:
    """An ``approval_request`` gets a ``reject_once``, sometimes after a wrong guess."""
    params = frame.get("params", {})
    if frame["method"] != "session/update" or params.get("type") != "approval_request":
        return []
    approve = {"sessionId": params["sessionId"], "requestId": params["requestId"],
               "decision": "reject_once"}
    answers = [_line({"id": f"approve-{next(_approvals)}", "method": "session/approve",
                      "params": approve})]
    if rng.random() < 0.3:
        wrong = {**approve, "requestId": "apr-999"}
        answers.insert(0, _line({"id": f"approve-{next(_approvals)}",
                                 "method": "session/approve", "params": wrong}))
    return answers


def answer_question(frame: dict[str, Any], rng: random.Random) -> list[bytes]:
    """``elicitation/create``: cancelled, declined, refused, or first answered badly."""
    answers = []
    if rng.random() < 0.3:
        answers.append(_line({"id": frame["id"], "result": {"action": "maybe"}, "error": {}}))
    answers.append(_line({"id": frame["id"], **rng.choice((
        {"result": {"action": "cancel"}},
        {"result": {"action": "decline", "content": {}}},
        {"error": {"code": -32601, "message": "no forms here"}},
    ))}))
    return answers


RPC = Dialect(
    methods=METHODS,
    codes=frozenset({-32602, -32000, -32001, -32002, -32003, -32011}),
    weighted_methods=(*sorted(METHODS), *["session/prompt"] * 4, "session/cancel"),
    params=rpc_params,
    host_ids=tuple(f"zc-out-{n}" for n in range(4)),
    answer_request=answer_question,
    react=deny_approvals,
)


class SocketWire:
    """:class:`tests.wire_peer.Wire` over an :class:`RpcClient`'s socket."""

    def __init__(self, client: RpcClient) -> None:
        self.client = client

    def write(self, data: bytes) -> None:
        self.client.sock.sendall(data)

    def next_frame(self, timeout: float) -> dict[str, Any]:
        return self.client.read_frame(timeout)


def one_stream(fuzz: PeerFuzz, client: RpcClient, plan: Plan, workspace: Path) -> None:
    """Two fresh sessions, a prompt that needs an approval, then the plan's stream."""
    sids = [client.request("session/new", {"cwd": str(workspace), "keep_siblings": True})
            ["sessionId"] for _ in SESSIONS]
    ask = {"sessionId": sids[0], "prompt": '!tool shell {"command": "echo fuzz"}'}
    fuzz.send(_line({"id": f"ask-{sids[0]}", "method": "session/prompt", "params": ask}))
    fuzz.stream(plan, LINES, filler(sids, workspace))


@pytest.mark.timeout(120)
def test_fuzzed_socket_gets_exactly_its_answers_and_the_daemon_lives(
    daemons: Callable[..., DaemonProc], tmp_path: Path
) -> None:
    daemon = daemons()
    workspace = tmp_path / "ws"
    workspace.mkdir()
    client = daemon.client(initialize=False)
    fuzz = PeerFuzz(SocketWire(client), RPC)
    fuzz.before_initialize(PRE_INITIALIZE_LINES)
    client.request("initialize", {"protocolVersion": 1,
                                  "clientCapabilities": {"elicitation": {}}})
    fuzz.initialized = True
    fuzz_plans(RPC, STREAMS, lambda plan: one_stream(fuzz, client, plan, workspace))
    assert fuzz.lines_sent >= STREAMS * LINES + PRE_INITIALIZE_LINES // 2
    assert fuzz.notifications >= 1
    for connection in (client, daemon.client()):
        assert connection.request("status")["protocolVersion"] == 1
        sid = connection.request("session/new", {"cwd": str(workspace)})["sessionId"]
        result = connection.request("session/prompt", {"sessionId": sid, "prompt": "still here"})
        assert result["stopReason"] == "end_turn" and "still here" in result["content"], result
        connection.close()
    assert daemon.terminate() == 0
