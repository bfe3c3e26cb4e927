"""Session keys and labels in the daemon's RPC dialect (``daemon.sock``): plain params
on ``session/new`` and flat fields in its answer and in ``session/list``, by the rules
of the ACP dialect; and one key shared with ``acp.sock`` (both are the host owner's).
Against a real daemon, through its sockets."""

from __future__ import annotations

from typing import Any

import pytest

from .helpers import RpcClient, RpcFailure
from .test_acp_socket import Editor

KEY = "agent:main:main"


def replayed(client: RpcClient, sid: str) -> list[str]:
    return [u["text"] for u in client.updates()
            if u["sessionId"] == sid and u["type"] == "user_message_chunk"]


def keyed_turn(daemon: Any, text: str, **names: Any) -> tuple[dict[str, Any], list[str]]:
    """A new connection's named ``session/new`` and one prompt: the answer and the user
    turns replayed to it before the answer."""
    with daemon.client() as client:
        answer = client.request("session/new", {"cwd": str(daemon.work_dir), **names})
        before = replayed(client, answer["sessionId"])
        client.request("session/prompt", {"sessionId": answer["sessionId"], "prompt": text})
        return answer, before


def test_a_key_names_one_session_and_a_reset_keeps_the_old_one_listed(daemons: Any) -> None:
    daemon = daemons()
    first, before = keyed_turn(daemon, "one", sessionKey=KEY)
    sid = first["sessionId"]
    assert (first["sessionKey"], before, "resumed" in first) == (KEY, [], False)
    again, before = keyed_turn(daemon, "two", session_key=KEY)  # the snake_case alias
    assert (again["sessionId"], again["resumed"], before) == (sid, True, ["one"])
    fresh, before = keyed_turn(daemon, "three", sessionKey=KEY, resetSession=True)
    assert fresh["sessionId"] != sid and before == []
    assert fresh["parentSessionId"] == sid and "resumed" not in fresh
    with daemon.client() as client:
        listed = {s["sessionId"]: s for s in client.request("session/list")["sessions"]}
        loaded = client.request("session/load", {"sessionId": sid})  # the old one loads
    assert loaded["sessionId"] == sid
    assert listed[fresh["sessionId"]]["sessionKey"] == KEY
    assert listed[fresh["sessionId"]]["parentSessionId"] == sid
    assert listed[sid]["formerSessionKey"] == KEY and "sessionKey" not in listed[sid]


def test_labels_require_existing_and_bad_names_are_clear_errors(daemons: Any) -> None:
    daemon = daemons()
    labelled, _ = keyed_turn(daemon, "hi", sessionKey=KEY, sessionLabel="inbox")
    found, before = keyed_turn(daemon, "again", sessionLabel="inbox")
    assert found["sessionId"] == labelled["sessionId"] and before == ["hi"]
    with daemon.client() as client:
        cwd = str(daemon.work_dir)
        cases = [({"sessionLabel": "nobody"}, "no session is labelled"),
                 ({"sessionKey": "unused", "requireExisting": True}, "no session has the key"),
                 ({"sessionKey": ""}, "sessionKey must be a non-empty string"),
                 ({"sessionKey": KEY, "resetSession": "yes"}, "resetSession must be a boolean"),
                 ({"resetSession": True}, "need sessionKey or sessionLabel")]
        for names, message in cases:
            with pytest.raises(RpcFailure) as refused:
                client.request("session/new", {"cwd": cwd, **names})
            assert refused.value.code == -32602 and message in refused.value.message, names
        listed = client.request("session/list")["sessions"]
        assert [(s["sessionId"], s.get("sessionLabel")) for s in listed] == [
            (labelled["sessionId"], "inbox")]  # nothing was created by the refusals


def test_a_key_from_daemon_sock_is_the_same_on_acp_sock(daemons: Any) -> None:
    daemon = daemons()
    first, _ = keyed_turn(daemon, "from rpc", sessionKey=KEY)
    editor = Editor(daemon.config_dir, daemon.env, attach=("--session", KEY))
    try:
        editor.request("initialize", {"protocolVersion": 1})
        answer = editor.request("session/new", {"cwd": str(daemon.work_dir)})
        editor.request("session/prompt", {"sessionId": answer["sessionId"], "prompt": "acp"})
    finally:
        assert editor.quit() == 0
    assert answer["sessionId"] == first["sessionId"]
    assert [u["content"]["text"] for u in editor.updates
            if u["sessionUpdate"] == "user_message_chunk"] == ["from rpc"]


def test_set_label_labels_removes_and_refuses_a_taken_label(daemons: Any) -> None:
    daemon = daemons()
    with daemon.client() as client:
        cwd = str(daemon.work_dir)
        one = client.request("session/new", {"cwd": cwd, "keep_siblings": True})["sessionId"]
        two = client.request("session/new", {"cwd": cwd, "keep_siblings": True})["sessionId"]
        assert client.request("session/set_label", {"sessionId": one, "sessionLabel": "a"}) == {
            "sessionId": one, "sessionLabel": "a"}
        with pytest.raises(RpcFailure) as taken:
            client.request("session/set_label", {"sessionId": two, "sessionLabel": "a"})
        assert taken.value.code == -32602 and "already labels" in taken.value.message
        with pytest.raises(RpcFailure) as missing:
            client.request("session/set_label", {"sessionId": two})
        assert missing.value.code == -32602
        with daemon.client() as other:  # another connection's session: -32003
            with pytest.raises(RpcFailure) as foreign:
                other.request("session/set_label", {"sessionId": one, "sessionLabel": "b"})
            assert foreign.value.code == -32003
        client.request("session/set_label", {"sessionId": one, "session_label": None})
        client.request("session/set_label", {"sessionId": two, "sessionLabel": "a"})
        labels = {s["sessionId"]: s.get("sessionLabel")
                  for s in client.request("session/list")["sessions"]}
    assert labels == {one: None, two: "a"}
