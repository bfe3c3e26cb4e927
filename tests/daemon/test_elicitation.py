"""``elicitation/create`` (SPEC §4): the echo agent's ``!ask`` reaches a client that elicits."""

from __future__ import annotations

import json
from typing import Any

from .helpers import RpcClient


def prompt_and_answer(client: RpcClient, sid: str, answer: dict[str, Any] | None,
                      prompt: str = "!ask favourite colour?",
                      seen: list[dict[str, Any]] | None = None) -> Any:
    """Prompt ``!ask``; answer the one ``elicitation/create`` with ``answer``; the result.
    Every frame read is added to ``seen``."""
    request_id = client.send("session/prompt", {"sessionId": sid, "prompt": prompt})
    asked = None
    while True:
        frame = client.read_frame()
        if seen is not None:
            seen.append(frame)
        if frame.get("method") == "elicitation/create":
            asked = frame
            assert answer is not None, "a client without the capability was asked"
            reply = {"jsonrpc": "2.0", "id": frame["id"], "result": answer}
            client.sock.sendall(json.dumps(reply).encode() + b"\n")
        elif frame.get("id") == request_id and "method" not in frame:
            return asked, frame["result"]


def test_a_client_that_elicits_is_asked_and_the_agent_gets_the_answer(daemons: Any) -> None:
    daemon = daemons()
    with RpcClient(daemon.socket_path, initialize=False) as client:
        client.request("initialize", {"protocolVersion": 1,
                                      "clientCapabilities": {"elicitation": {}}})
        sid = client.request("session/new")["sessionId"]
        asked, result = prompt_and_answer(
            client, sid, {"action": "accept", "content": {"answer": "blue"}})
        assert str(asked["id"]).startswith("zc-out-")
        params = asked["params"]
        assert params["sessionId"] == sid and params["mode"] == "form"
        assert params["message"] == "favourite colour?"
        assert params["requestedSchema"]["properties"]["answer"]["type"] == "string"
        assert result["stopReason"] == "end_turn" and result["content"] == "blue"
        _, declined = prompt_and_answer(client, sid, {"action": "decline"})
        assert declined["content"] == "(decline)"


def test_a_client_that_does_not_elicit_is_never_asked(daemons: Any) -> None:
    daemon = daemons()
    with daemon.client() as client:
        sid = client.request("session/new")["sessionId"]
        _, result = prompt_and_answer(client, sid, None)
        assert result["content"] == "(no answer)"


def test_the_ask_user_tool_elicits_its_choices_as_an_enum(daemons: Any) -> None:
    daemon = daemons()
    with RpcClient(daemon.socket_path, initialize=False) as client:
        client.request("initialize", {"protocolVersion": 1,
                                      "clientCapabilities": {"elicitation": {}}})
        sid = client.request("session/new")["sessionId"]
        args = {"question": "Which branch?", "choices": ["main", "dev"]}
        seen: list[dict[str, Any]] = []
        asked, result = prompt_and_answer(
            client, sid, {"action": "accept", "content": {"answer": "dev"}},
            prompt=f"!tool ask_user {json.dumps(args)}", seen=seen)
        assert asked["params"]["message"] == "Which branch?"
        assert asked["params"]["requestedSchema"]["properties"]["answer"]["enum"] == [
            "main", "dev"]
        assert result["stopReason"] == "end_turn"
        [tool_result] = [f["params"] for f in seen if f.get("method") == "session/update"
                         and f["params"].get("type") == "tool_result"]
        assert tool_result["rawOutput"] == {"action": "accept", "answer": "dev"}
