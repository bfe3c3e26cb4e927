"""``elicitation/create`` (SPEC §4): the echo agent's ``!ask`` reaches a client that elicits."""

from __future__ import annotations

import json
from typing import Any

from .helpers import RpcClient


def prompt_and_answer(client: RpcClient, sid: str, answer: dict[str, Any] | None) -> Any:
    """Prompt ``!ask``; answer the one ``elicitation/create`` with ``answer``; the result."""
    request_id = client.send("session/prompt", {"sessionId": sid,
                                                "prompt": "!ask favourite colour?"})
    asked = None
    while True:
        frame = client.read_frame()
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
