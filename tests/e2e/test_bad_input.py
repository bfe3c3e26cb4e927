"""Misbehaving peers on raw pipes: SPEC §2 envelope rules against a real ``zeroclaw acp``.

After every bad frame the host must still serve a normal request, and stdout
must carry only JSON-RPC frames (checked for the whole run when the host closes).
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import psutil
import pytest

from .conftest import RawHostFactory
from .rawclient import RawHost

MiB = 1024 * 1024


def assert_error(frame: dict[str, Any], code: int, req_id: Any) -> dict[str, Any]:
    assert frame.get("jsonrpc") == "2.0", frame
    assert "result" not in frame, frame
    assert frame["id"] == req_id, frame
    assert frame["error"]["code"] == code, frame
    assert isinstance(frame["error"]["message"], str), frame
    error: dict[str, Any] = frame["error"]
    return error


def assert_no_reply(raw: RawHost, workspace: Path) -> None:
    """The next frame answers a fresh request: nothing was sent for what came before."""
    raw.assert_alive(workspace)


@pytest.fixture
def ready(raw_host: RawHost) -> RawHost:
    raw_host.initialize()
    return raw_host


def test_invalid_json_is_a_parse_error_with_null_id(ready: RawHost, workspace: Path) -> None:
    ready.send_bytes(b'{"jsonrpc": "2.0", "id": 1, "method": \n')
    assert_error(ready.next_response(), -32700, None)
    ready.assert_alive(workspace)


@pytest.mark.parametrize("line", [b"[1]", b'"x"', b"3", b"[]", b"null"])
def test_valid_json_that_is_not_an_object_is_invalid_request(
    ready: RawHost, workspace: Path, line: bytes
) -> None:
    ready.send_bytes(line + b"\n")
    assert_error(ready.next_response(), -32600, None)
    ready.assert_alive(workspace)


@pytest.mark.parametrize(
    ("frame", "req_id"),
    [
        ({"jsonrpc": "1.0", "id": 7, "method": "session/list", "params": {}}, 7),
        ({"id": 8, "method": "session/list", "params": {}}, 8),
        ({"jsonrpc": "2.0", "id": 9, "method": 5, "params": {}}, 9),
        ({"jsonrpc": "2.0", "id": 10, "method": "session/list", "params": None}, 10),
        ({"jsonrpc": "2.0", "id": 11, "method": "session/list", "params": "str"}, 11),
        ({"jsonrpc": "2.0", "id": "eleven", "method": "session/list", "params": 3}, "eleven"),
    ],
    ids=["wrong-jsonrpc", "no-jsonrpc", "method-not-string", "params-null", "params-string",
         "params-number"],
)
def test_bad_envelopes_are_invalid_request_with_their_id(
    ready: RawHost, workspace: Path, frame: dict[str, Any], req_id: Any
) -> None:
    ready.send(frame)
    assert_error(ready.next_response(), -32600, req_id)
    ready.assert_alive(workspace)


def test_blank_lines_and_crlf_are_tolerated(raw_host: RawHost, workspace: Path) -> None:
    raw_host.send_bytes(b"\n\r\n\n")
    raw_host.send_bytes(b'{"jsonrpc":"2.0","id":1,"method":"initialize",'
                        b'"params":{"protocolVersion":1}}\r\n')
    response = raw_host.next_response()
    assert response["id"] == 1 and response["result"]["protocolVersion"] == 1
    raw_host.assert_alive(workspace)


def test_requests_before_initialize_are_refused(raw_host: RawHost, workspace: Path) -> None:
    for method in ("session/new", "status", "session/list"):
        frame = raw_host.request(method, {"cwd": str(workspace)})
        assert_error(frame, -32010, frame["id"])
    raw_host.send({"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": "x"}})
    frame = raw_host.request("initialize", {"protocolVersion": 1})
    assert frame["result"]["protocolVersion"] == 1, "a notification before initialize got a reply"
    raw_host.assert_alive(workspace)


def test_a_line_over_the_frame_limit_is_discarded(ready: RawHost, workspace: Path) -> None:
    before = psutil.Process(ready.pid).memory_info().rss
    ready.send_bytes(b'{"jsonrpc":"2.0","id":5,"method":"x","params":{"pad":"'
                     + b"a" * (100 * MiB) + b'"}}\n')
    error = assert_error(ready.next_response(timeout=60), -32600, None)
    assert "frame too large" in error["message"].lower()
    grown = psutil.Process(ready.pid).memory_info().rss - before
    assert grown < 70 * MiB, f"a discarded 100 MiB line grew the host by {grown // MiB} MiB"
    ready.assert_alive(workspace)


def test_a_20_mb_frame_is_within_the_default_limit(ready: RawHost, workspace: Path) -> None:
    frame = ready.request("no/such/method", {"pad": "b" * (20 * 1000 * 1000)}, timeout=30)
    assert_error(frame, -32601, frame["id"])
    ready.assert_alive(workspace)


@pytest.mark.parametrize(
    "line",
    [
        b"[" * 100_000 + b"]" * 100_000,
        b'{"jsonrpc":"2.0","id":1,"method":"x","params":{"a":' + b"[" * 100_000
        + b"]" * 100_000 + b"}}",
        b'{"jsonrpc":"2.0","id":1,"method":"\xff\xfe"}',
        b'{"jsonrpc":"2.0","id":1,"method":"session/list","params":{"cwd":"\\ud800"}}',
    ],
    ids=["deep-array", "deep-params", "invalid-utf8", "lone-surrogate"],
)
def test_unparsable_lines_are_parse_errors(ready: RawHost, workspace: Path, line: bytes) -> None:
    ready.send_bytes(line + b"\n")
    assert_error(ready.next_response(), -32700, None)
    assert ready.proc.poll() is None, "the host died"
    ready.assert_alive(workspace)


@pytest.mark.parametrize(
    ("frame", "malformed"),
    [
        ({"jsonrpc": "2.0", "id": "zc-out-99", "result": "SECRET-MARKER", "error": {}}, True),
        ({"jsonrpc": "2.0", "id": "zc-out-98"}, True),
        ({"jsonrpc": "2.0", "id": {"SECRET-MARKER": 1}, "result": 1}, True),
        ({"jsonrpc": "2.0", "id": "zc-out-0", "result": {"note": "SECRET-MARKER"}}, False),
        ({"jsonrpc": "2.0", "id": "zc-out-7", "error": {"code": 1, "message": "x"}}, False),
    ],
    ids=["result-and-error", "neither", "object-id", "not-pending", "error-not-pending"],
)
def test_stray_or_malformed_responses_get_no_reply(
    ready: RawHost, workspace: Path, frame: dict[str, Any], malformed: bool
) -> None:
    ready.send(frame)
    assert_no_reply(ready, workspace)
    ready.close()
    stderr = ready.stderr_path.read_text(errors="replace")
    assert stderr.strip(), "the dropped frame was not logged on stderr"
    if malformed:
        assert "SECRET-MARKER" not in stderr, "the malformed frame's content was logged"


def test_unknown_method_and_unknown_notification(ready: RawHost, workspace: Path) -> None:
    frame = ready.request("x", {})
    assert assert_error(frame, -32601, frame["id"])["message"] == "Method not found: x"
    ready.send({"jsonrpc": "2.0", "method": "x/notify", "params": {}})
    assert_no_reply(ready, workspace)


def test_prompt_for_an_unknown_session(ready: RawHost, workspace: Path) -> None:
    frame = ready.request("session/prompt", {"sessionId": str(uuid.uuid4()), "prompt": "hi"})
    assert_error(frame, -32000, frame["id"])
    ready.assert_alive(workspace)


@pytest.mark.parametrize(
    ("method", "params", "name"),
    [
        ("session/prompt", {"sessionId": 5, "prompt": "hi"}, "sessionId"),
        ("session/prompt", {"prompt": "hi"}, "sessionId"),
        ("session/new", {"cwd": 5}, "cwd"),
        ("session/load", {"cwd": "/"}, "sessionId"),
        ("session/list", {"cursor": 7}, "cursor"),
        ("session/set_mode", {"sessionId": "nope"}, "modeId"),
    ],
)
def test_wrong_params_name_the_parameter(
    ready: RawHost, workspace: Path, method: str, params: dict[str, Any], name: str
) -> None:
    frame = ready.request(method, params)
    error = assert_error(frame, -32602, frame["id"])
    assert name in error["message"], error
    assert "Traceback" not in json.dumps(error)
    ready.assert_alive(workspace)


def test_same_id_in_flight_both_ways(ready: RawHost, workspace: Path) -> None:
    """Our request id ``zc-out-0`` while the host's ``zc-out-0`` waits for us."""
    sid = ready.new_session(workspace)
    ready.send({"jsonrpc": "2.0", "id": 1, "method": "session/prompt", "params": {
        "sessionId": sid, "prompt": '!tool shell {"command": "echo both-ways"}'}})
    ask = ready.next_frame()
    while ask.get("method") != "session/request_permission":
        ask = ready.next_frame()
    assert ask["id"] == "zc-out-0"
    mine = ready.request("session/list", {}, req_id="zc-out-0")
    assert "sessions" in mine["result"]
    allow = next(o for o in ask["params"]["options"] if o["kind"] == "allow_once")
    ready.send({"jsonrpc": "2.0", "id": "zc-out-0",
                "result": {"outcome": {"outcome": "selected", "optionId": allow["optionId"]}}})
    done = ready.next_response(timeout=15)
    assert done["id"] == 1 and done["result"]["stopReason"] == "end_turn"
    assert "both-ways" in json.dumps(ready.notifications)


def test_stdout_is_only_frames_and_logs_go_to_stderr(
    raw_hosts: RawHostFactory, workspace: Path
) -> None:
    raw = raw_hosts(None, env_extra={"ZEROCLAW_LOG": "debug"})
    raw.initialize()
    sid = raw.new_session(workspace)
    raw.call("session/prompt", {"sessionId": sid, "prompt": "!think quietly\nloud words"})
    raw.send_bytes(b"garbage\n")
    raw.next_response()
    raw.close()
    assert raw.unparsable == []
    assert all(json.loads(line)["jsonrpc"] == "2.0" for line in raw.stdout_lines)
    assert raw.stderr_path.read_text(errors="replace").strip(), "no logs on stderr at debug level"


@pytest.mark.parametrize("cwd", ["relative/dir", "..", "/tmp/with\u0000nul", "/no/such/dir/here"])
def test_unusable_cwd_is_invalid_params(ready: RawHost, workspace: Path, cwd: str) -> None:
    response = ready.request("session/new", {"cwd": cwd})
    assert response["error"]["code"] == -32602
    assert "cwd" in response["error"]["message"]
    ready.assert_alive(workspace)


@pytest.mark.parametrize("id_text", [b"18446744073709551616", b"-9223372036854775809",
                                     b"1" + b"0" * 30, b"1.50"])
def test_number_ids_past_64_bits_or_with_a_fraction_are_answered_with_them(
    ready: RawHost, workspace: Path, id_text: bytes
) -> None:
    """JSON-RPC allows any number as an id: served, refused or unknown, the answer
    carries the id exactly as it was written, so the client can match it."""
    for rest, code in ((b'"method":"session/list","params":{}', None),
                       (b'"method":"no/such","params":{}', -32601),
                       (b'"method":"session/list","params":null', -32600)):
        ready.send_bytes(b'{"jsonrpc":"2.0","id":' + id_text + b"," + rest + b"}\n")
        answer = ready.next_response()
        assert ready.stdout_lines[-1].startswith(b'{"jsonrpc":"2.0","id":' + id_text + b',"')
        assert answer["id"] == json.loads(id_text)
        assert (answer.get("error") or {}).get("code") == code, answer
    ready.assert_alive(workspace)


def test_error_messages_quote_client_input_cut_short(ready: RawHost, workspace: Path) -> None:
    """A 1 MB value is quoted in an error as its first 128 characters and an ellipsis."""
    huge = "s" * MiB
    for method, params, code in (
        ("session/prompt", {"sessionId": huge, "prompt": "hi"}, -32000),
        ("session/load", {"sessionId": huge, "cwd": str(workspace)}, -32000),
        ("session/new", {"cwd": "/" + huge}, -32602),
        ("session/new", {"agentAlias": huge}, -32602),
        (huge, {}, -32601),
    ):
        frame = ready.request(method, params, timeout=30)
        message = assert_error(frame, code, frame["id"])["message"]
        assert "s" * 100 in message and message.endswith("s…"), (method, message[:300])
        assert "s" * 129 not in message and len(message) < 300, (method, message[:300])
    ready.assert_alive(workspace)


@pytest.mark.parametrize("version", ["one", "1", True, [1], 1.5])
def test_initialize_with_a_version_that_is_no_integer_is_invalid_params(
    raw_host: RawHost, workspace: Path, version: Any
) -> None:
    frame = raw_host.request("initialize", {"protocolVersion": version})
    assert "protocolVersion" in assert_error(frame, -32602, frame["id"])["message"]
    refused = raw_host.request("session/list", {})  # not initialized by a refused initialize
    assert_error(refused, -32010, refused["id"])
    assert raw_host.call("initialize", {"protocolVersion": 0})["protocolVersion"] == 1
    raw_host.assert_alive(workspace)


def test_session_timeout_is_an_integer_on_the_wire(
    raw_hosts: RawHostFactory, workspace: Path
) -> None:
    """``sessionTimeoutSecs`` in initialize's ``_meta`` and in status ``limits``: clients
    read an integer (a flag or the default used to give 3600.0)."""
    for args, seconds in (((), 3600), (("--session-timeout", "120"), 120)):
        raw = raw_hosts(None, *args)
        meta = raw.initialize()["_meta"]["zeroclaw"]
        limits = raw.call("status", {})["limits"]
        for value in (meta["sessionTimeoutSecs"], limits["sessionTimeoutSecs"]):
            assert type(value) is int and value == seconds, (args, meta, limits)
        raw.close()
