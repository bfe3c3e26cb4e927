"""Fuzzing a real ``zeroclaw acp``: hypothesis-planned streams on its stdin, every answer checked.

The streams mix requests to the real ACP methods with plausible and random params
(two live sessions, harmless prompts), notifications, responses (stray, malformed,
or answering the host's own requests), broken envelopes, invalid UTF-8 and raw
bytes, written in pieces cut anywhere. :class:`tests.wire_peer.PeerFuzz` checks
that every request is answered exactly once with a well-formed frame and the
right id, and nothing else is; permission requests are answered (never with an
allow). Afterwards the host still serves initialize, session/new and a prompt,
and on EOF it exits 0 leaving no process behind (the ``raw_hosts`` fixture).
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from tests.wire_fuzz import random_params
from tests.wire_peer import (
    AGENT_FAILURES,
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

from .rawclient import RawHost

STREAMS = 24
LINES = 500
PRE_INITIALIZE_LINES = 100
METHODS = frozenset({
    "initialize", "status", "session/new", "session/prompt", "session/cancel", "session/close",
    "session/stop", "session/set_mode", "session/update", "session/event", "session/load",
    "session/resume", "session/list", "session/delete",
})
CWDS: tuple[Any, ...] = (
    WORKSPACE, WORKSPACE, f"{WORKSPACE}/sub", f"{WORKSPACE}/../ws", "relative/dir",
    "/no/such/dir", "", ".", None, 5,
)
MCP: tuple[Any, ...] = ([], [], [{"name": "x", "command": "/bin/false", "args": []}], "x", None)


def acp_params(rng: random.Random, method: str) -> Any:
    """Mostly what the method wants (the test's sessions and workspace), sometimes anything."""
    if rng.random() < 0.15:
        return random_params(rng, method)
    sid = session_id_value(rng)
    params: dict[str, Any] = {"sessionId": sid}
    if method == "session/new":
        params = {"cwd": rng.choice(CWDS), "mcpServers": rng.choice(MCP)}
        if rng.random() < 0.2:
            params["agentAlias"] = rng.choice(("default", "nope", 3))
    elif method == "session/prompt":
        params["prompt"] = prompt_value(rng)
    elif method == "session/set_mode":
        params["modeId"] = rng.choice(("read_only", "supervised", "full", "nope", 1))
    elif method == "session/list":
        params = {"cwd": rng.choice(CWDS), "cursor": rng.choice((None, "x", 5))}
    elif method == "initialize":
        params = {"protocolVersion": rng.choice((1, 0, 2, "1")), "clientCapabilities": {}}
    elif method in ("session/update", "session/event"):
        params.update(type="note", update={"sessionUpdate": rng.choice(("x", 5))})
    if rng.random() < 0.15:
        params.pop(rng.choice(list(params)), None)
    if rng.random() < 0.1 and "sessionId" in params:
        params["session_id"] = params.pop("sessionId")
    return params


def answer_permission(frame: dict[str, Any], rng: random.Random) -> list[bytes]:
    """Maybe a malformed answer first; then a refusal (never an allow); maybe it twice."""
    def line(**members: Any) -> bytes:
        return json.dumps({"jsonrpc": "2.0", "id": frame["id"], **members}).encode() + b"\n"

    answers = []
    if rng.random() < 0.4:
        answers.append(rng.choice((line(), line(result=1, error={"code": 1, "message": "x"}))))
    answers.append(rng.choice((
        line(result={"outcome": {"outcome": "cancelled"}}),
        line(result={"outcome": {"outcome": "selected", "optionId": "reject-once"}}),
        line(error={"code": -32000, "message": "no"}),
        line(result=None),
    )))
    if rng.random() < 0.3:
        answers.append(answers[-1])
    return answers


ACP = Dialect(
    methods=METHODS,
    codes=frozenset({-32602, -32000, -32001, -32002, -32003}),
    weighted_methods=(*sorted(METHODS), *["session/prompt"] * 6, "session/cancel", "session/new"),
    params=acp_params,
    host_ids=tuple(f"zc-out-{n}" for n in range(4)),
    answer_request=answer_permission,
    react=lambda frame, rng: (),
    internal_ok=AGENT_FAILURES,
)


class RawWire:
    """:class:`tests.wire_peer.Wire` over a :class:`RawHost`'s pipes."""

    def __init__(self, raw: RawHost) -> None:
        self.raw = raw

    def write(self, data: bytes) -> None:
        self.raw.send_bytes(data)

    def next_frame(self, timeout: float) -> dict[str, Any]:
        return self.raw.next_frame(timeout)


def one_stream(fuzz: PeerFuzz, raw: RawHost, plan: Plan, workspace: Path) -> None:
    """Two fresh sessions (earlier ones may be closed or deleted), a prompt that asks
    permission, then the plan's stream, all of it answered."""
    sids = [raw.new_session(workspace) for _ in SESSIONS]
    ask = {"sessionId": sids[0], "prompt": '!tool shell {"command": "echo fuzz"}'}
    fuzz.send(json.dumps({"jsonrpc": "2.0", "id": f"ask-{sids[0]}", "method": "session/prompt",
                          "params": ask}).encode() + b"\n")
    fuzz.stream(plan, LINES, filler(sids, workspace))


@pytest.mark.timeout(120)
def test_fuzzed_stdin_gets_exactly_its_answers_and_the_host_lives(
    raw_host: RawHost, workspace: Path
) -> None:
    (workspace / "sub").mkdir()
    fuzz = PeerFuzz(RawWire(raw_host), ACP)
    fuzz.before_initialize(PRE_INITIALIZE_LINES)
    raw_host.initialize()
    fuzz.initialized = True
    fuzz_plans(ACP, STREAMS, lambda plan: one_stream(fuzz, raw_host, plan, workspace))
    assert fuzz.lines_sent >= STREAMS * LINES + PRE_INITIALIZE_LINES // 2
    assert fuzz.host_requests >= 1 and fuzz.notifications >= 1
    assert raw_host.proc.poll() is None, "the host died"
    assert raw_host.initialize()["protocolVersion"] == 1
    sid = raw_host.new_session(workspace)
    result = raw_host.call("session/prompt", {"sessionId": sid, "prompt": "still here"})
    assert result["stopReason"] == "end_turn" and "still here" in result["content"], result
