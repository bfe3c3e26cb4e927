"""Endpoint unit tests without sockets: every SPEC §2 envelope rule, both directions."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import orjson
import pytest

from ipc.errors import InvalidParams, SessionBusy
from ipc.extensions import ExtensionMethods
from ipc.jsonrpc import ConnectionLost, Endpoint, RemoteError, is_valid_request_id
from ipc.later import LaterAnswer


class Wire:
    """Collects what an endpoint sends, checking each write is exactly one NDJSON line."""

    def __init__(self) -> None:
        self.frames: list[dict[str, Any]] = []

    def send(self, data: bytes) -> None:
        assert data.endswith(b"\n") and data.count(b"\n") == 1
        self.frames.append(orjson.loads(data))

    def take(self) -> list[dict[str, Any]]:
        frames, self.frames = self.frames, []
        return frames


def frame(**fields: Any) -> bytes:
    return orjson.dumps({"jsonrpc": "2.0", **fields})


def echo(params: Any, endpoint: Endpoint) -> Any:
    return {"echo": params}


def initialize(params: Any, endpoint: Endpoint) -> Any:
    return {"protocolVersion": 1}


async def slow_echo(params: Any, endpoint: Endpoint) -> Any:
    await asyncio.sleep(0)
    return {"echo": params}


def make(
    require_initialize: bool = False, table: dict[str, Any] | None = None, **methods: Any
) -> tuple[Endpoint, Wire]:
    wire = Wire()
    table = {
        "initialize": initialize,
        "echo": echo,
        "slow_echo": slow_echo,
        **(table or {}),
        **methods,
    }
    return Endpoint(wire.send, table, require_initialize=require_initialize, name="t"), wire


def error_of(reply: dict[str, Any]) -> tuple[Any, int, str]:
    assert reply["jsonrpc"] == "2.0"
    assert "result" not in reply
    return reply["id"], reply["error"]["code"], reply["error"]["message"]


def only(wire: Wire) -> dict[str, Any]:
    frames = wire.take()
    assert len(frames) == 1, frames
    return frames[0]


# --- parse errors (-32700) -------------------------------------------------------

PARSE_FAILURES = [
    b"{",
    b"not json",
    b'{"jsonrpc":"2.0","id":1,"method":"echo",}',
    b"\xff\xfe\xfd",
    b'{"jsonrpc":"2.0","id":1,"method":"\xc3"}',
    b'{"jsonrpc":"2.0","id":1,"method":"echo","params":["\\ud800"]}',
    b'{"jsonrpc":"2.0","id":1,"method":"\xed\xa0\x80"}',
    b"[" * 100_000,
    b'{"a":' * 100_000,
    b"[" * 100_000 + b"]" * 100_000,
    b"NaN",
    b"1e400",
    b"",
]


@pytest.mark.parametrize("data", PARSE_FAILURES, ids=range(len(PARSE_FAILURES)))
def test_unparsable_frame_gets_parse_error_with_null_id(data: bytes) -> None:
    endpoint, wire = make()
    endpoint.receive(data)
    assert error_of(only(wire)) == (None, -32700, "Parse error")


def test_parse_error_does_not_break_the_connection() -> None:
    endpoint, wire = make()
    endpoint.receive(b"[" * 100_000)
    endpoint.receive(frame(id=1, method="echo"))
    assert [reply["id"] for reply in wire.take()] == [None, 1]


# --- invalid requests (-32600) ------------------------------------------------


@pytest.mark.parametrize("data", [b"[]", b"[1,2]", b"1", b'"s"', b"null", b"true", b"{}"])
def test_non_object_or_empty_frame_is_invalid_request(data: bytes) -> None:
    endpoint, wire = make()
    endpoint.receive(data)
    assert error_of(only(wire))[:2] == (None, -32600)


@pytest.mark.parametrize(
    "message",
    [
        {"id": 5, "method": "echo"},
        {"jsonrpc": "1.0", "id": 5, "method": "echo"},
        {"jsonrpc": 2.0, "id": 5, "method": "echo"},
        {"jsonrpc": "2.0", "id": 5, "method": 12},
        {"jsonrpc": "2.0", "id": 5, "method": None},
        {"jsonrpc": "2.0", "id": 5, "method": ["echo"]},
        {"jsonrpc": "2.0", "id": 5, "method": "echo", "params": None},
        {"jsonrpc": "2.0", "id": 5, "method": "echo", "params": "text"},
        {"jsonrpc": "2.0", "id": 5, "method": "echo", "params": 3},
        {"jsonrpc": "2.0", "id": 5, "method": "echo", "params": True},
    ],
)
def test_bad_envelope_with_recoverable_id_echoes_it(message: dict[str, Any]) -> None:
    endpoint, wire = make()
    endpoint.receive(orjson.dumps(message))
    assert error_of(only(wire))[:2] == (5, -32600)


@pytest.mark.parametrize("bad_id", [True, False, {"a": 1}, [1]])
def test_invalid_id_is_answered_with_null_id(bad_id: Any) -> None:
    endpoint, wire = make()
    endpoint.receive(_raw_with_id(bad_id))
    assert error_of(only(wire))[:2] == (None, -32600)


def _raw_with_id(value: Any) -> bytes:
    """A request frame whose id is written verbatim (orjson cannot dump 2**64 + n)."""
    id_text = str(value).encode() if type(value) is int else orjson.dumps(value)
    return b'{"jsonrpc":"2.0","method":"echo","id":' + id_text + b"}"


def test_invalid_id_and_bad_params_still_null_id() -> None:
    endpoint, wire = make()
    endpoint.receive(b'{"jsonrpc":"2.0","method":"echo","id":[2],"params":7}')
    assert error_of(only(wire))[:2] == (None, -32600)


def test_non_string_method_without_id_is_answered_with_null_id() -> None:
    endpoint, wire = make()
    endpoint.receive(b'{"jsonrpc":"2.0","method":1,"params":"bar"}')
    assert error_of(only(wire))[:2] == (None, -32600)


@pytest.mark.parametrize("good_id", ["abc", "", 0, -5, 2**63 - 1, -(2**63), 2**64 - 1, None])
def test_valid_ids_are_echoed(good_id: Any) -> None:
    endpoint, wire = make()
    endpoint.receive(_raw_with_id(good_id))
    reply = only(wire)
    assert reply == {"jsonrpc": "2.0", "id": good_id, "result": {"echo": {}}}


@pytest.mark.parametrize("id_text", [
    b"18446744073709551616", b"-9223372036854775809", b"1" + b"0" * 40, b"1.50", b"-0.0",
    b"2.5e-3", b"1E2",
])
def test_number_ids_orjson_reads_as_floats_are_echoed_as_written(id_text: bytes) -> None:
    """JSON-RPC allows any number as an id; the answer carries the very same text,
    for requests served and refused alike."""
    for request, code in ((b'"method":"echo"', None), (b'"method":"nope"', -32601),
                          (b'"method":"echo","params":7', -32600), (b'"method":3', -32600)):
        sent: list[bytes] = []
        endpoint = Endpoint(sent.append, {"echo": echo}, require_initialize=False)
        endpoint.receive(b'{"jsonrpc":"2.0","id":' + id_text + b"," + request + b"}")
        [line] = sent
        assert line.startswith(b'{"jsonrpc":"2.0","id":' + id_text + b',"'), line
        assert (orjson.loads(line).get("error") or {}).get("code") == code


def test_is_valid_request_id() -> None:
    assert is_valid_request_id("x") and is_valid_request_id(None) and is_valid_request_id(7)
    assert is_valid_request_id(1.5) and is_valid_request_id(2**63)
    assert not is_valid_request_id(True) and not is_valid_request_id([1])


def test_oversized_frame_answer() -> None:
    endpoint, wire = make()
    endpoint.receive_oversized()
    assert error_of(only(wire)) == (None, -32600, "frame too large")


# --- dispatch ---------------------------------------------------------------------


def test_params_object_array_and_absent() -> None:
    endpoint, wire = make()
    endpoint.receive(frame(id=1, method="echo", params={"a": [1, 2]}))
    endpoint.receive(frame(id=2, method="echo", params=[1, "x"]))
    endpoint.receive(frame(id=3, method="echo"))
    assert [reply["result"] for reply in wire.take()] == [
        {"echo": {"a": [1, 2]}},
        {"echo": [1, "x"]},
        {"echo": {}},
    ]


def test_unknown_method() -> None:
    endpoint, wire = make()
    endpoint.receive(frame(id="q", method="nope/such"))
    assert error_of(only(wire)) == ("q", -32601, "Method not found: nope/such")


def test_unknown_method_name_is_truncated_in_the_answer() -> None:
    endpoint, wire = make()
    endpoint.receive(frame(id=1, method="m" * 100_000))
    _, code, message = error_of(only(wire))
    assert code == -32601 and message.startswith("Method not found: mmm") and len(message) < 200


def test_result_null_is_a_success() -> None:
    endpoint, wire = make(nothing=lambda params, ep: None)
    endpoint.receive(frame(id=1, method="nothing"))
    assert only(wire) == {"jsonrpc": "2.0", "id": 1, "result": None}


def test_request_carrying_a_result_member_is_still_a_request() -> None:
    endpoint, wire = make()
    endpoint.receive(frame(id=1, method="echo", result=5))
    assert only(wire)["result"] == {"echo": {}}


# --- notifications ------------------------------------------------------------------


@pytest.mark.parametrize(
    "message",
    [
        {"jsonrpc": "2.0", "method": "nope"},
        {"jsonrpc": "2.0", "method": "echo", "params": None},
        {"jsonrpc": "2.0", "method": "echo", "params": 3},
        {"method": "echo"},
        {"jsonrpc": "1.0", "method": "echo", "params": {}},
        {"jsonrpc": "2.0", "method": "boom"},
        {"jsonrpc": "2.0", "method": "refuse"},
        {"jsonrpc": "2.0", "method": "echo"},
    ],
)
async def test_notifications_never_get_replies(message: dict[str, Any]) -> None:
    async def boom(params: Any, ep: Endpoint) -> None:
        raise RuntimeError("x")

    def refuse(params: Any, ep: Endpoint) -> None:
        raise InvalidParams("no")

    endpoint, wire = make(boom=boom, refuse=refuse)
    endpoint.receive(orjson.dumps(message))
    await endpoint.drain()
    assert wire.take() == []


async def test_method_sent_as_notification_runs_and_result_is_dropped() -> None:
    calls: list[Any] = []

    def cancel(params: Any, ep: Endpoint) -> dict[str, Any]:
        calls.append(params)
        return {}

    async def later(params: Any, ep: Endpoint) -> dict[str, Any]:
        calls.append(("later", params))
        return {"done": True}

    endpoint, wire = make(table={"session/cancel": cancel, "later": later})
    endpoint.receive(frame(method="session/cancel", params={"sessionId": "s"}))
    endpoint.receive(frame(method="later", params=[1]))
    await endpoint.drain()
    assert calls == [{"sessionId": "s"}, ("later", [1])]
    assert wire.take() == []
    endpoint.receive(frame(id=9, method="session/cancel", params={"sessionId": "s"}))
    assert only(wire) == {"jsonrpc": "2.0", "id": 9, "result": {}}


async def test_a_notification_table_takes_notifications_before_the_method_table() -> None:
    heard: list[Any] = []

    def as_request(name: str, params: Any, ep: Endpoint) -> Any:
        heard.append(("request", name))
        return {}

    def as_notification(name: str, params: Any, ep: Endpoint) -> None:
        heard.append(("notification", name))

    wire = Wire()
    endpoint = Endpoint(wire.send, ExtensionMethods({"echo": echo}, as_request),
                        require_initialize=False,
                        notifications=ExtensionMethods({}, as_notification))
    endpoint.receive(frame(method="_vendor/note", params={}))
    endpoint.receive(frame(method="echo", params={}))  # no notification handler: the method's
    endpoint.receive(frame(id=1, method="_vendor/ask", params={}))
    assert heard == [("notification", "_vendor/note"), ("request", "_vendor/ask")]
    assert only(wire) == {"jsonrpc": "2.0", "id": 1, "result": {}}


# --- the initialize gate -------------------------------------------------------


def test_requests_before_initialize_get_32010() -> None:
    endpoint, wire = make(require_initialize=True)
    endpoint.receive(frame(id=1, method="echo"))
    endpoint.receive(frame(id=2, method="no/such"))
    assert [error_of(reply) for reply in wire.take()] == [
        (1, -32010, "First request must be initialize"),
        (2, -32010, "First request must be initialize"),
    ]
    assert not endpoint.initialized


def test_notifications_before_initialize_are_ignored() -> None:
    calls: list[Any] = []
    endpoint, wire = make(require_initialize=True, note=lambda p, ep: calls.append(p))
    endpoint.receive(frame(method="note", params={}))
    endpoint.receive(frame(method="initialize", params={}))
    assert calls == [] and wire.take() == [] and not endpoint.initialized


def test_initialize_opens_the_gate() -> None:
    endpoint, wire = make(require_initialize=True)
    endpoint.receive(frame(id=1, method="initialize", params={"protocolVersion": 1}))
    endpoint.receive(frame(id=2, method="echo", params={"x": 1}))
    assert wire.take() == [
        {"jsonrpc": "2.0", "id": 1, "result": {"protocolVersion": 1}},
        {"jsonrpc": "2.0", "id": 2, "result": {"echo": {"x": 1}}},
    ]
    assert endpoint.initialized


def test_failed_initialize_keeps_the_gate_closed() -> None:
    def picky(params: Any, ep: Endpoint) -> Any:
        if params.get("protocolVersion") != 1:
            raise InvalidParams("protocolVersion must be 1")
        return {}

    endpoint, wire = make(require_initialize=True, initialize=picky)
    endpoint.receive(frame(id=1, method="initialize", params={"protocolVersion": 9}))
    endpoint.receive(frame(id=2, method="echo"))
    endpoint.receive(frame(id=3, method="initialize", params={"protocolVersion": 1}))
    endpoint.receive(frame(id=4, method="echo"))
    replies = wire.take()
    assert error_of(replies[0]) == (1, -32602, "protocolVersion must be 1")
    assert error_of(replies[1])[:2] == (2, -32010)
    assert replies[2:] == [
        {"jsonrpc": "2.0", "id": 3, "result": {}},
        {"jsonrpc": "2.0", "id": 4, "result": {"echo": {}}},
    ]


async def test_async_initialize_opens_the_gate_when_it_finishes() -> None:
    release = asyncio.Event()

    async def slow_init(params: Any, ep: Endpoint) -> Any:
        await release.wait()
        return {"ok": True}

    endpoint, wire = make(require_initialize=True, initialize=slow_init)
    endpoint.receive(frame(id=1, method="initialize"))
    endpoint.receive(frame(id=2, method="echo"))
    assert error_of(only(wire))[:2] == (2, -32010)
    release.set()
    await endpoint.drain()
    assert only(wire) == {"jsonrpc": "2.0", "id": 1, "result": {"ok": True}}
    assert endpoint.initialized


def test_without_gate_anything_goes_first() -> None:
    endpoint, wire = make(require_initialize=False)
    endpoint.receive(frame(id=1, method="echo"))
    assert only(wire)["result"] == {"echo": {}}


# --- handler errors -----------------------------------------------------------------


def test_rpc_error_from_handler_is_answered_with_its_code() -> None:
    def busy(params: Any, ep: Endpoint) -> Any:
        raise SessionBusy("Session busy", data={"sessionId": "s1"})

    endpoint, wire = make(busy=busy)
    endpoint.receive(frame(id=1, method="busy"))
    assert only(wire) == {
        "jsonrpc": "2.0",
        "id": 1,
        "error": {"code": -32002, "message": "Session busy", "data": {"sessionId": "s1"}},
    }


@pytest.mark.parametrize("asynchronous", [False, True])
async def test_unexpected_exception_is_internal_error_without_traceback(
    asynchronous: bool, caplog: pytest.LogCaptureFixture
) -> None:
    def crash(params: Any, ep: Endpoint) -> Any:
        raise KeyError("secret-detail")

    async def crash_later(params: Any, ep: Endpoint) -> Any:
        await asyncio.sleep(0)
        raise KeyError("secret-detail")

    endpoint, wire = make(crash=crash_later if asynchronous else crash)
    with caplog.at_level(logging.ERROR, logger="zeroclaw.ipc.jsonrpc"):
        endpoint.receive(frame(id=1, method="crash"))
        await endpoint.drain()
    reply = only(wire)
    assert error_of(reply) == (1, -32603, "Internal error: KeyError")
    assert "secret-detail" not in orjson.dumps(reply).decode()
    assert "Traceback" not in orjson.dumps(reply).decode()
    assert any(record.exc_info for record in caplog.records), "the traceback goes to the log"


def test_unserialisable_result_is_internal_error() -> None:
    endpoint, wire = make(bad=lambda p, ep: {"n": 2**80}, worse=lambda p, ep: {"s": {1, 2}})
    endpoint.receive(frame(id=1, method="bad"))
    endpoint.receive(frame(id=2, method="worse"))
    assert [error_of(reply)[:2] for reply in wire.take()] == [(1, -32603), (2, -32603)]


async def test_handler_whose_inner_await_is_cancelled_still_answers() -> None:
    async def inner_cancel(params: Any, ep: Endpoint) -> Any:
        future = asyncio.get_running_loop().create_future()
        future.cancel()
        return await future

    endpoint, wire = make(inner=inner_cancel)
    endpoint.receive(frame(id=1, method="inner"))
    await endpoint.drain()
    assert error_of(only(wire))[:2] == (1, -32603)


# --- concurrency -------------------------------------------------------------------


async def test_async_handlers_run_concurrently_and_answer_when_done() -> None:
    second_started = asyncio.Event()

    async def first(params: Any, ep: Endpoint) -> str:
        await second_started.wait()
        return "first"

    async def second(params: Any, ep: Endpoint) -> str:
        second_started.set()
        return "second"

    endpoint, wire = make(first=first, second=second)
    endpoint.receive(frame(id=1, method="first"))
    endpoint.receive(frame(id=2, method="second"))
    endpoint.receive(frame(id=3, method="echo"))  # sync: answered inline, first
    assert endpoint.running_handlers == 2
    await asyncio.wait_for(endpoint.drain(), 5)
    assert [(reply["id"], reply["result"]) for reply in wire.take()] == [
        (3, {"echo": {}}),
        (2, "second"),
        (1, "first"),
    ]
    assert endpoint.running_handlers == 0


async def test_sync_handlers_create_no_task() -> None:
    endpoint, wire = make()
    tasks_before = len(asyncio.all_tasks())
    endpoint.receive(frame(id=1, method="echo"))
    assert len(asyncio.all_tasks()) == tasks_before
    assert endpoint.running_handlers == 0
    assert len(wire.take()) == 1


# --- responses from the peer --------------------------------------------------------


@pytest.mark.parametrize(
    "message",
    [
        {"jsonrpc": "2.0", "id": "zc-out-0", "result": 1, "error": {"code": 1, "message": "m"}},
        {"jsonrpc": "2.0", "id": "zc-out-0"},
        {"jsonrpc": "2.0", "result": 1},
        {"jsonrpc": "2.0", "id": 1.5, "result": 1},
        {"jsonrpc": "2.0", "id": True, "result": 1},
        {"jsonrpc": "2.0", "id": {"x": 1}, "error": {"code": 1, "message": "m"}},
        {"jsonrpc": "2.0", "id": "zc-out-0", "error": "bad"},
        {"jsonrpc": "2.0", "id": "zc-out-0", "error": None},
        {"jsonrpc": "2.0", "id": "zc-out-0", "error": {"code": "1", "message": "m"}},
        {"jsonrpc": "2.0", "id": "zc-out-0", "error": {"code": True, "message": "m"}},
        {"jsonrpc": "2.0", "id": "zc-out-0", "error": {"code": 1}},
        {"jsonrpc": "2.0", "id": "zc-out-0", "error": {"code": 1, "message": 5}},
        {"jsonrpc": "2.0", "id": "zc-out-0", "method": None, "result": 1},
        {"id": "zc-out-0", "result": 1},
    ],
)
async def test_malformed_response_is_dropped_silently_and_logged_without_content(
    message: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    endpoint, wire = make()
    pending = asyncio.ensure_future(endpoint.request("ask", {"secret": "s3cr3t"}))
    await asyncio.sleep(0)
    wire.take()
    message = {**message, "padding": "TOPSECRET-CONTENT"}
    with caplog.at_level(logging.DEBUG, logger="zeroclaw.ipc.jsonrpc"):
        endpoint.receive(orjson.dumps(message))
    assert wire.take() == []
    assert not pending.done(), "a malformed response must not complete the request"
    assert caplog.records, "the drop is logged"
    assert "TOPSECRET" not in caplog.text
    endpoint.close()
    with pytest.raises(ConnectionLost):
        await pending


@pytest.mark.parametrize("response_id", ["zc-out-99", "other", 7, None])
def test_response_for_unknown_id_is_ignored(
    response_id: Any, caplog: pytest.LogCaptureFixture
) -> None:
    endpoint, wire = make()
    with caplog.at_level(logging.WARNING, logger="zeroclaw.ipc.jsonrpc"):
        endpoint.receive(frame(id=response_id, result={"x": 1}))
        endpoint.receive(frame(id=response_id, error={"code": -32603, "message": "m"}))
    assert wire.take() == []
    assert len(caplog.records) == 2


# --- outbound requests ---------------------------------------------------------------


async def test_outbound_request_success_and_numbering() -> None:
    endpoint, wire = make()
    first = asyncio.ensure_future(endpoint.request("session/request_permission", {"a": 1}))
    second = asyncio.ensure_future(endpoint.request("ping"))
    await asyncio.sleep(0)
    assert wire.take() == [
        {
            "jsonrpc": "2.0",
            "id": "zc-out-0",
            "method": "session/request_permission",
            "params": {"a": 1},
        },
        {"jsonrpc": "2.0", "id": "zc-out-1", "method": "ping"},
    ]
    assert endpoint.pending_requests == 2
    endpoint.receive(frame(id="zc-out-1", result=None))
    endpoint.receive(frame(id="zc-out-0", result={"outcome": {"outcome": "cancelled"}}))
    assert await second is None
    assert await first == {"outcome": {"outcome": "cancelled"}}
    assert endpoint.pending_requests == 0
    assert wire.take() == []


async def test_outbound_request_error_raises_remote_error() -> None:
    endpoint, wire = make()
    pending = asyncio.ensure_future(endpoint.request("x"))
    await asyncio.sleep(0)
    wire.take()
    endpoint.receive(frame(id="zc-out-0", error={"code": -32099, "message": "nope", "data": [1]}))
    with pytest.raises(RemoteError) as caught:
        await pending
    assert (caught.value.code, caught.value.message, caught.value.data) == (-32099, "nope", [1])


async def test_outbound_request_timeout_forgets_the_id(caplog: pytest.LogCaptureFixture) -> None:
    endpoint, wire = make()
    with pytest.raises(TimeoutError):
        await endpoint.request("slow", timeout=0.01)
    assert endpoint.pending_requests == 0
    with caplog.at_level(logging.WARNING, logger="zeroclaw.ipc.jsonrpc"):
        endpoint.receive(frame(id="zc-out-0", result=1))  # late answer: ignored
    assert "unknown id" in caplog.text
    assert [f["id"] for f in wire.take()] == ["zc-out-0"]


async def test_close_fails_pending_requests_and_later_requests() -> None:
    endpoint, _wire = make()
    pending = asyncio.ensure_future(endpoint.request("x"))
    await asyncio.sleep(0)
    endpoint.close()
    with pytest.raises(ConnectionLost):
        await pending
    with pytest.raises(ConnectionLost):
        await endpoint.request("y")
    assert endpoint.pending_requests == 0


async def test_receive_eof_fails_pending_requests_but_answers_still_flow() -> None:
    release = asyncio.Event()

    async def waits(params: Any, ep: Endpoint) -> str:
        await release.wait()
        return "finished"

    endpoint, wire = make(waits=waits)
    endpoint.receive(frame(id=1, method="waits"))
    pending = asyncio.ensure_future(endpoint.request("permission"))
    await asyncio.sleep(0)
    wire.take()
    endpoint.receive_eof()
    with pytest.raises(ConnectionLost):
        await pending
    with pytest.raises(ConnectionLost):
        await endpoint.request("again")
    release.set()
    await endpoint.drain()
    assert only(wire) == {"jsonrpc": "2.0", "id": 1, "result": "finished"}


async def test_same_id_text_in_flight_both_ways() -> None:
    """Our request zc-out-0 and the peer's request zc-out-0 do not meet."""
    endpoint, wire = make()
    ours = asyncio.ensure_future(endpoint.request("ask"))
    await asyncio.sleep(0)
    assert only(wire)["id"] == "zc-out-0"
    endpoint.receive(frame(id="zc-out-0", method="echo", params={"from": "peer"}))
    assert only(wire) == {"jsonrpc": "2.0", "id": "zc-out-0", "result": {"echo": {"from": "peer"}}}
    assert not ours.done()
    endpoint.receive(frame(id="zc-out-0", result="peer's answer"))
    assert await ours == "peer's answer"


async def test_outbound_prefix_is_configurable() -> None:
    wire = Wire()
    endpoint = Endpoint(wire.send, {}, outbound_prefix="srv-")
    pending = asyncio.ensure_future(endpoint.request("x", [1]))
    await asyncio.sleep(0)
    assert only(wire) == {"jsonrpc": "2.0", "id": "srv-0", "method": "x", "params": [1]}
    pending.cancel()


def test_notify() -> None:
    endpoint, wire = make()
    endpoint.notify("session/update", {"sessionId": "s"})
    endpoint.notify("ping")
    assert wire.take() == [
        {"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": "s"}},
        {"jsonrpc": "2.0", "method": "ping"},
    ]


# --- closing -----------------------------------------------------------------------


async def test_close_cancels_handlers_runs_callbacks_and_silences_sends() -> None:
    started = asyncio.Event()
    cancelled = asyncio.Event()

    async def forever(params: Any, ep: Endpoint) -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    calls: list[str] = []

    def failing_callback() -> None:
        calls.append("failing")
        raise RuntimeError("cleanup problem")

    endpoint, wire = make(forever=forever)
    endpoint.on_close.extend([failing_callback, lambda: calls.append("second")])
    endpoint.receive(frame(id=1, method="forever"))
    await started.wait()
    endpoint.close()
    endpoint.close()
    await asyncio.wait_for(cancelled.wait(), 5)
    await endpoint.drain()
    assert calls == ["failing", "second"]
    assert endpoint.closed
    endpoint.notify("late")
    endpoint.receive(frame(id=2, method="echo"))
    endpoint.receive(b"garbage")
    endpoint.receive_oversized()
    assert wire.take() == []


async def test_handler_tasks_leave_the_count_however_they_end() -> None:
    """A handler task takes itself out of ``running_handlers`` as it ends (answered,
    failed, or a notification's); one that :meth:`Endpoint.close` cancels before it
    ever ran is taken out too, so a drain after the close ends."""

    async def failing(params: Any, ep: Endpoint) -> None:
        await asyncio.sleep(0)
        raise InvalidParams("no")

    def later(params: Any, ep: Endpoint) -> asyncio.Future[None]:
        return asyncio.get_running_loop().create_future()  # never answers

    endpoint, wire = make(failing=failing, later=later)
    endpoint.receive(frame(id=1, method="slow_echo"))
    endpoint.receive(frame(id=2, method="failing"))
    endpoint.receive(frame(method="slow_echo"))  # a notification
    assert endpoint.running_handlers == 3
    await asyncio.wait_for(endpoint.drain(), 5)
    assert endpoint.running_handlers == 0
    assert sorted(reply["id"] for reply in wire.take()) == [1, 2]

    endpoint.receive(frame(id=3, method="later"))  # its task has not run yet
    endpoint.close()
    await asyncio.wait_for(endpoint.drain(), 5)
    assert endpoint.running_handlers == 0
    assert wire.take() == []


async def test_a_later_answer_is_written_when_given_like_a_handler_task_result() -> None:
    """A handler may return a LaterAnswer: the endpoint answers when it is given (a
    result, an RpcError as itself, anything else as -32603), also one given before
    the handler returned; the frames are those a handler task would write."""
    answers: dict[str, LaterAnswer] = {}

    def later(params: Any, ep: Endpoint) -> LaterAnswer:
        answers[params["name"]] = answer = LaterAnswer(lambda: None)
        if params["name"] == "early":
            answer.give({"early": True})
        return answer

    async def slow(params: Any, ep: Endpoint) -> Any:
        await asyncio.sleep(0)
        return {"ok": 1}

    endpoint, wire = make(later=later, slow=slow)
    endpoint.receive(frame(id=1, method="later", params={"name": "ok"}))
    endpoint.receive(frame(id=2, method="later", params={"name": "rpc"}))
    endpoint.receive(frame(id=3, method="later", params={"name": "bug"}))
    endpoint.receive(frame(id=4, method="later", params={"name": "early"}))
    assert wire.take() == [{"jsonrpc": "2.0", "id": 4, "result": {"early": True}}]
    assert endpoint.running_handlers == 3
    draining = asyncio.ensure_future(endpoint.drain())
    answers["ok"].give({"ok": 1})
    answers["ok"].give({"ok": 2})  # once only
    answers["rpc"].fail(InvalidParams("bad"))
    answers["bug"].fail(ValueError("secret"))
    await asyncio.wait_for(draining, 5)
    assert endpoint.running_handlers == 0
    endpoint.receive(frame(id=5, method="slow"))
    await asyncio.wait_for(endpoint.drain(), 5)
    got = wire.take()
    assert got[0] == got[3] | {"id": 1}  # as the task's answer
    assert got[1]["error"]["code"] == InvalidParams("x").code
    assert got[2]["error"] == {"code": -32603, "message": "Internal error: ValueError"}


async def test_a_later_answer_still_due_at_close_is_abandoned() -> None:
    abandoned: list[str] = []

    def later(params: Any, ep: Endpoint) -> LaterAnswer:
        return LaterAnswer(lambda: abandoned.append("gone"))

    endpoint, wire = make(later=later)
    endpoint.receive(frame(id=1, method="later"))
    endpoint.close()
    await asyncio.wait_for(endpoint.drain(), 5)
    assert abandoned == ["gone"] and endpoint.running_handlers == 0
    assert wire.take() == []


async def test_a_request_is_in_order_now_only_with_no_handler_task_yet_to_start() -> None:
    endpoint, _wire = make()
    assert endpoint.in_order_now
    endpoint.receive(frame(id=1, method="slow_echo"))
    assert not endpoint.in_order_now
    await asyncio.sleep(0)  # one pass of the loop: its first step
    assert endpoint.in_order_now
    await asyncio.wait_for(endpoint.drain(), 5)


async def test_drain_waits_for_running_handlers() -> None:
    endpoint, wire = make()
    for request_id in range(10):
        endpoint.receive(frame(id=request_id, method="slow_echo", params=[request_id]))
    assert endpoint.running_handlers == 10
    await asyncio.wait_for(endpoint.drain(), 5)
    assert sorted(reply["id"] for reply in wire.take()) == list(range(10))


def test_error_messages_quote_client_input_cut_short() -> None:
    """Every error message is bounded where errors are made (:mod:`ipc.errors`):
    a run of client input is cut to 128 characters, the whole message to 1,024."""
    endpoint, wire = make()
    endpoint.receive(frame(id=1, method="m" * 1_000_000))
    message = error_of(only(wire))[2]
    assert message == "Method not found: " + "m" * 128 + "…"
    spaced = InvalidParams("cwd is not a usable directory: " + "a b " * 100_000).message
    assert len(spaced) == 1025 and spaced.endswith("…")
    assert InvalidParams("short words stay as they are").message == "short words stay as they are"


def test_a_relayed_error_keeps_code_message_and_bounded_data() -> None:
    from ipc.errors import DATA_LIMIT, relayed_error

    small = relayed_error({"code": -32099, "message": "nope", "data": {"why": "x"}}, "fb")
    assert small.to_error() == {"code": -32099, "message": "nope", "data": {"why": "x"}}
    big = relayed_error({"code": -32603, "message": "Internal error",
                         "data": {"message": "detail", "padding": "p" * 50_000}}, "fb")
    data = big.to_error()["data"]
    assert data["message"] == "detail" and len(orjson.dumps(data)) <= DATA_LIMIT
    wide = relayed_error({"code": 1, "message": "m", "data": ["q" * 900] * 200}, "fb")
    assert isinstance(wide.data, str) and len(wide.data) <= DATA_LIMIT
    for broken in (None, {"code": "x", "message": "m"}, {"code": True, "message": "m"},
                   {"code": 5}):
        assert relayed_error(broken, "fallback").to_error() == {
            "code": -32603, "message": "fallback"}
