"""Property tests: random bytes and JSON-RPC-shaped frames never knock the Endpoint over.

Invariants checked for every generated conversation:
- ``receive`` never raises and every frame sent is one well-formed JSON-RPC response line;
- each frame gets exactly the replies a small reference model of SPEC §2 predicts
  (a request: exactly one, with the right id and code; notifications and
  responses: none);
- our own outbound requests end exactly as the responses fed to them say
  (result, RemoteError, or ConnectionLost when nothing valid answered them).
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

import orjson
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from ipc.errors import InvalidParams
from ipc.jsonrpc import ConnectionLost, Endpoint, RemoteError

OUTBOUND = 3
OUTBOUND_IDS = [f"zc-out-{n}" for n in range(OUTBOUND)]
ABSENT = object()


def _initialize(params: Any, ep: Endpoint) -> Any:
    return {"protocolVersion": 1}


def _echo(params: Any, ep: Endpoint) -> Any:
    return params


async def _async_echo(params: Any, ep: Endpoint) -> Any:
    await asyncio.sleep(0)
    return params


def _refuse(params: Any, ep: Endpoint) -> Any:
    raise InvalidParams("refused")


def _crash(params: Any, ep: Endpoint) -> Any:
    raise RuntimeError("boom")


async def _async_crash(params: Any, ep: Endpoint) -> Any:
    await asyncio.sleep(0)
    raise ValueError("boom")


METHODS = {
    "initialize": _initialize,
    "echo": _echo,
    "async_echo": _async_echo,
    "refuse": _refuse,
    "crash": _crash,
    "async_crash": _async_crash,
}
EXPECTED_CODE = {"refuse": -32602, "crash": -32603, "async_crash": -32603}
SUCCESS = 0  # stands for "a result" in (id, code) pairs

# --- generators ---------------------------------------------------------------------

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=8),
)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=8,
)
maybe = st.just(ABSENT)
ids = (
    maybe
    | st.sampled_from([*OUTBOUND_IDS, "a", "", 0, 1, -1, 2**63 - 1, 2**63, 1.5, True])
    | values
)
methods = maybe | st.sampled_from([*METHODS, "nope", "session/cancel"]) | values
jsonrpc = st.sampled_from([ABSENT, "2.0", "2.0", "2.0", "1.0", 2.0, None])
params = (
    maybe | st.dictionaries(st.text(max_size=4), values, max_size=3) | st.lists(values) | values
)
good_errors = st.fixed_dictionaries(
    {"code": st.integers(-33000, -32000), "message": st.text(max_size=8)},
    optional={"data": values},
)
errors = good_errors | values


@st.composite
def rpc_frames(draw: st.DrawFn) -> bytes:
    message: dict[str, Any] = {}
    for key, strategy in (
        ("jsonrpc", jsonrpc),
        ("id", ids),
        ("method", methods),
        ("params", params),
    ):
        value = draw(strategy)
        if value is not ABSENT:
            message[key] = value
    if draw(st.integers(0, 3)) == 0:
        message["result"] = draw(values)
    if draw(st.integers(0, 3)) == 0:
        message["error"] = draw(errors)
    text = json.dumps(message)  # stdlib: writes integers of any size, as a peer might
    return text.encode("utf-8", "surrogatepass")


@st.composite
def mangled_frames(draw: st.DrawFn) -> bytes:
    data = bytearray(draw(rpc_frames()))
    for _ in range(draw(st.integers(1, 3))):
        if not data:
            break
        position = draw(st.integers(0, len(data) - 1))
        data[position] = draw(st.integers(0, 255))
    return bytes(data[: draw(st.integers(0, len(data)))])


good_ids = st.one_of(st.none(), st.text(max_size=6), st.integers(-(2**63), 2**63 - 1))


@st.composite
def likely_requests(draw: st.DrawFn) -> bytes:
    """Mostly valid requests and notifications, so dispatch paths get exercised."""
    message: dict[str, Any] = {
        "jsonrpc": "2.0",
        "method": draw(st.sampled_from([*METHODS, "nope"])),
    }
    if draw(st.booleans()):
        message["params"] = draw(st.dictionaries(st.text(max_size=4), values, max_size=3))
    if draw(st.integers(0, 4)):
        message["id"] = draw(good_ids)
    return json.dumps(message).encode()


@st.composite
def likely_responses(draw: st.DrawFn) -> bytes:
    """Answers to our outbound requests, valid or nearly so."""
    message: dict[str, Any] = {"jsonrpc": "2.0", "id": draw(st.sampled_from(OUTBOUND_IDS))}
    if draw(st.booleans()):
        message["result"] = draw(values)
    else:
        message["error"] = draw(good_errors if draw(st.integers(0, 3)) else errors)
    return json.dumps(message).encode("utf-8", "surrogatepass")


frames = st.one_of(
    likely_requests(),
    likely_requests(),
    likely_responses(),
    rpc_frames(),
    mangled_frames(),
    st.binary(max_size=64),
)

# --- reference model ------------------------------------------------------------------


def _valid_id(value: Any) -> bool:
    if value is None or type(value) is str:
        return True
    return type(value) is int and -(2**63) <= value < 2**63


def _valid_response(message: dict[str, Any]) -> bool:
    if message.get("jsonrpc") != "2.0" or "method" in message:
        return False
    if ("result" in message) == ("error" in message) or not _valid_id(message.get("id", 1.5)):
        return False
    error = message.get("error")
    if "error" in message:
        return (
            type(error) is dict
            and type(error.get("code")) is int
            and type(error.get("message")) is str
        )
    return True


@dataclass
class Model:
    """What SPEC §2 says should happen, frame by frame."""

    require_initialize: bool
    initialized: bool = False
    replies: list[tuple[str, int]] = field(default_factory=list)
    outcomes: dict[str, Any] = field(default_factory=dict)

    def reply(self, request_id: Any, code: int) -> None:
        self.replies.append((json.dumps(request_id), code))

    def feed(self, data: bytes) -> None:
        try:
            message = orjson.loads(data)
        except orjson.JSONDecodeError:
            self.reply(None, -32700)
            return
        if type(message) is not dict:
            self.reply(None, -32600)
            return
        method = message.get("method")
        if type(method) is not str:
            self._non_request(message)
            return
        if "id" not in message:
            return  # a notification: never answered
        request_id = message["id"]
        if not _valid_id(request_id):
            self.reply(None, -32600)
        elif message.get("jsonrpc") != "2.0" or (
            "params" in message and type(message["params"]) not in (dict, list)
        ):
            self.reply(request_id, -32600)
        elif self.require_initialize and not self.initialized and method != "initialize":
            self.reply(request_id, -32010)
        elif method not in METHODS:
            self.reply(request_id, -32601)
        else:
            self.initialized |= method == "initialize"
            self.reply(request_id, EXPECTED_CODE.get(method, SUCCESS))

    def _non_request(self, message: dict[str, Any]) -> None:
        if (
            "result" in message
            or "error" in message
            or ("id" in message and "method" not in message)
        ):
            if _valid_response(message) and message["id"] in OUTBOUND_IDS:
                self.outcomes.setdefault(message["id"], message)
            return
        request_id = message.get("id")
        self.reply(request_id if _valid_id(request_id) else None, -32600)


# --- the property ------------------------------------------------------------------------


def check_sent_frame(data: bytes) -> tuple[str, int]:
    assert data.endswith(b"\n") and data.count(b"\n") == 1
    reply = orjson.loads(data)
    assert type(reply) is dict and reply["jsonrpc"] == "2.0" and "method" not in reply
    assert "id" in reply and _valid_id(reply["id"])
    assert ("result" in reply) != ("error" in reply)
    if "error" in reply:
        error = reply["error"]
        assert type(error["code"]) is int and type(error["message"]) is str
        assert "Traceback" not in error["message"] and "boom" not in error["message"]
        return json.dumps(reply["id"]), error["code"]
    return json.dumps(reply["id"]), SUCCESS


async def converse(inputs: list[bytes], require_initialize: bool) -> None:
    sent: list[bytes] = []
    endpoint = Endpoint(sent.append, METHODS, require_initialize=require_initialize)
    outbound = [asyncio.ensure_future(endpoint.request("ask", [n])) for n in range(OUTBOUND)]
    await asyncio.sleep(0)
    assert len(sent) == OUTBOUND
    sent.clear()
    model = Model(require_initialize)
    try:
        for data in inputs:
            endpoint.receive(data)
            model.feed(data)
        await asyncio.wait_for(endpoint.drain(), 10)
    finally:
        endpoint.close()
        await asyncio.wait(outbound)
    assert sorted(check_sent_frame(data) for data in sent) == sorted(model.replies)
    for _, code in model.replies:
        event(f"reply code {code}")
    for request_id, future in zip(OUTBOUND_IDS, outbound, strict=True):
        expected = model.outcomes.get(request_id)
        event("outbound answered" if expected else "outbound unanswered")
        if expected is None:
            assert isinstance(future.exception(), ConnectionLost)
        elif "error" in expected:
            error = future.exception()
            assert isinstance(error, RemoteError) and error.code == expected["error"]["code"]
        else:
            assert future.result() == expected["result"]


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(inputs=st.lists(frames, max_size=12), require_initialize=st.booleans())
def test_endpoint_survives_random_frames(inputs: list[bytes], require_initialize: bool) -> None:
    asyncio.run(converse(inputs, require_initialize))


@settings(max_examples=200, deadline=None)
@given(data=st.binary(max_size=512))
def test_random_bytes_get_one_parse_or_envelope_error_at_most(data: bytes) -> None:
    sent: list[bytes] = []
    endpoint = Endpoint(sent.append, METHODS, require_initialize=False)
    endpoint.receive(data)
    assert len(sent) <= 1
    if sent:
        request_id, code = check_sent_frame(sent[0])
        assert code in (-32700, -32600) or request_id != "null"


def test_deep_nesting_variants_never_crash() -> None:
    sent: list[bytes] = []
    endpoint = Endpoint(sent.append, METHODS, require_initialize=False)
    for opener in (b"[", b'{"a":', b'{"jsonrpc":"2.0","id":1,"method":"echo","params":['):
        for depth in (1_000, 100_000, 1_000_000):
            endpoint.receive(opener * depth)
    assert len(sent) == 9
    assert all(check_sent_frame(data) == ("null", -32700) for data in sent)
