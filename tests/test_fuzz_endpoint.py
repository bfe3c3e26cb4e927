"""Property tests: 100,000 random lines a run, through a real FrameReader into an Endpoint.

Each hypothesis example is a :class:`Plan`: a seed, a few hypothesis-built frames
(the vocabulary), a frame limit and a chunking. From it :mod:`tests.wire_fuzz`
builds a stream of exactly :data:`BATCH` lines, cut at random boundaries and fed
to an ``asyncio.StreamReader``. Checked line by line against the reference model
(:mod:`tests.wire_model`, SPEC §2) and the test's method table:

- the FrameReader yields exactly the lines the model splits out of the stream;
- ``receive`` never raises; each line gets, right away, exactly the replies the
  model predicts (a request: one, with its id, code and result; notifications and
  responses, malformed or not: none), each one well-formed line;
- replies of awaitable handlers arrive exactly once by the end;
- our own outbound requests, issued along the way, end exactly as the first valid
  response to them says (result, RemoteError, or ConnectionLost at EOF);
- no log record reports an unexpected failure, and every record formats.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import orjson
import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from ipc.errors import InvalidParams
from ipc.framing import OVERSIZED, FrameReader, new_stream_reader
from ipc.jsonrpc import ConnectionLost, Endpoint, RemoteError
from tests.wire_fuzz import CHUNKINGS, FrameSource, build_stream, chunked, structured_frames
from tests.wire_model import Line, Verdict, classify, id_key, parse_reply, split_lines

BATCH = 500
EXAMPLES = 200
FRAMES_PER_RUN = 100_000
MAX_OUTBOUND = 8
OUTBOUND_IDS = [f"zc-out-{n}" for n in range(MAX_OUTBOUND + 2)]

Reply = tuple[str, int, bytes | None]
"""(id key, error code or 0 for a result, the result's JSON or None)."""


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


async def _async_refuse(params: Any, ep: Endpoint) -> Any:
    for _ in range(3):  # answered a few lines later than the other awaited methods
        await asyncio.sleep(0)
    raise InvalidParams("refused later")


def _unserialisable(params: Any, ep: Endpoint) -> Any:
    return {"n": 2**70}


async def _async_unserialisable(params: Any, ep: Endpoint) -> Any:
    await asyncio.sleep(0)
    return {1: "non-string key"}


METHODS = {
    "initialize": _initialize,
    "echo": _echo,
    "async_echo": _async_echo,
    "refuse": _refuse,
    "crash": _crash,
    "async_crash": _async_crash,
    "async_refuse": _async_refuse,
    "unserialisable": _unserialisable,
    "async_unserialisable": _async_unserialisable,
}
ASYNC_METHODS = {"async_echo", "async_crash", "async_refuse", "async_unserialisable"}
ERROR_CODES = {
    "refuse": -32602,
    "crash": -32603,
    "async_crash": -32603,
    "async_refuse": -32602,
    "unserialisable": -32603,
    "async_unserialisable": -32603,
}


# --- the model ---------------------------------------------------------------------


@dataclass
class Model:
    """What SPEC §2 and the method table say should happen, line by line."""

    require_initialize: bool
    initialized: bool = False
    pending: set[str] = field(default_factory=set)
    outcomes: dict[str, dict[str, Any]] = field(default_factory=dict)
    later: list[Reply] = field(default_factory=list)
    later_requests: dict[str, list[str]] = field(default_factory=dict)

    def feed(self, line: Line) -> list[Reply]:
        """The replies ``line`` gets at once; awaited ones go to :attr:`later`."""
        verdict = classify(line)
        if verdict.kind == "reply":
            return [(verdict.key, verdict.code, None)]
        if verdict.kind == "response":
            request_id = verdict.message.get("id")
            if verdict.valid and request_id in self.pending:
                self.pending.discard(request_id)
                self.outcomes[request_id] = verdict.message
            return []
        if verdict.kind == "notification":
            return []
        return self._request(verdict)

    def _request(self, verdict: Verdict) -> list[Reply]:
        method = verdict.method
        if self.require_initialize and not self.initialized and method != "initialize":
            return [(verdict.key, -32010, None)]
        if method not in METHODS:
            return [(verdict.key, -32601, None)]
        self.initialized |= method == "initialize"
        code = ERROR_CODES.get(method, 0)
        result = {"protocolVersion": 1} if method == "initialize" else verdict.params
        reply = (verdict.key, code, None if code else orjson.dumps(result))
        if method in ASYNC_METHODS:
            self.later.append(reply)
            self.later_requests.setdefault(verdict.key, []).append(verdict.method)
            return []
        return [reply]


def reply_of(data: bytes) -> Reply:
    reply = parse_reply(data)
    if "error" in reply:
        assert "boom" not in reply["error"]["message"], reply
        return id_key(reply["id"]), reply["error"]["code"], None
    return id_key(reply["id"]), 0, orjson.dumps(reply["result"])


# --- one conversation --------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    """One example: the generator's seed and vocabulary, and how the endpoint is fed."""

    seed: int
    vocabulary: tuple[bytes, ...]
    require_initialize: bool
    limit: int
    chunking: str
    outbound: int


class LogCheck(logging.Handler):
    """Formats every record of ``zeroclaw.ipc``; remembers failures and unexpected errors."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.problems: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = record.getMessage()
        except Exception as error:  # a broken log call is a defect too
            self.problems.append(f"unformattable log record {record.msg!r}: {error!r}")
            return
        if "unexpected failure" in text or "callback failed" in text:
            self.problems.append(text)


@contextmanager
def checked_logs() -> Iterator[LogCheck]:
    """Route ``zeroclaw.ipc`` records (all levels) to a :class:`LogCheck` only."""
    logger = logging.getLogger("zeroclaw.ipc")
    check = LogCheck()
    saved = logger.level, logger.propagate
    logger.addHandler(check)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    try:
        yield check
    finally:
        logger.removeHandler(check)
        logger.setLevel(saved[0])
        logger.propagate = saved[1]


class Conversation:
    """One plan's stream through a FrameReader into an Endpoint (the test's loop thread)."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        rng = random.Random(plan.seed)
        source = FrameSource(
            rng, list(METHODS), limit=plan.limit, vocabulary=plan.vocabulary,
            response_ids=OUTBOUND_IDS[: plan.outbound + 2],
        )
        self.stream = build_stream(source.frame, rng, BATCH, plan.limit)
        self.chunks = list(chunked(self.stream, rng, plan.chunking))
        self.lines = split_lines(self.stream, plan.limit)
        self.issue_at = set(rng.sample(range(BATCH), plan.outbound))
        self.model = Model(plan.require_initialize)
        self.endpoint = Endpoint(self.send, METHODS, require_initialize=plan.require_initialize)
        self.now: list[bytes] | None = None
        self.later: list[bytes] = []
        self.outbound: dict[str, asyncio.Future[Any]] = {}
        self.fed = 0

    def send(self, data: bytes) -> None:
        (self.later if self.now is None else self.now).append(data)

    async def run(self) -> None:
        reader = new_stream_reader(self.plan.limit)
        reading = asyncio.ensure_future(self.read_all(FrameReader(reader, self.plan.limit)))
        for chunk in self.chunks:
            reader.feed_data(chunk)
            await asyncio.sleep(0)
        reader.feed_eof()
        try:
            await asyncio.wait_for(reading, 30)
            self.endpoint.receive_eof()
            await asyncio.wait_for(self.endpoint.drain(), 10)
        finally:
            self.endpoint.close()
            if self.outbound:
                await asyncio.wait(self.outbound.values())
        self.check_later_frames()
        self.check_outbound()

    async def read_all(self, frames: FrameReader) -> None:
        while (line := await frames.read()) is not None:
            assert self.fed < len(self.lines), f"extra line {line!r}"
            assert line == self.lines[self.fed], f"line #{self.fed}: {line!r}"
            if self.fed in self.issue_at:
                await self.issue()
            self.feed(line)
        assert self.fed == len(self.lines) == BATCH

    async def issue(self) -> None:
        request_id = f"zc-out-{len(self.outbound)}"
        self.outbound[request_id] = asyncio.ensure_future(self.endpoint.request("ask", [1]))
        await asyncio.sleep(0)  # the request task runs: its id is now pending
        assert self.endpoint.pending_requests == len(self.model.pending) + 1
        self.model.pending.add(request_id)

    def feed(self, line: Line) -> None:
        expected = self.model.feed(line)
        self.now = []
        try:
            if line is OVERSIZED:
                self.endpoint.receive_oversized()
            else:
                self.endpoint.receive(line)
            got = [reply_of(data) for data in self.now]
        finally:
            self.now = None
        assert got == expected, f"line #{self.fed} {repr(line)[:300]}"
        self.fed += 1

    def check_later_frames(self) -> None:
        replies: list[Reply] = []
        for data in self.later:
            frame = orjson.loads(data)
            if "method" in frame:
                assert frame["method"] == "ask" and frame["id"] in self.outbound, frame
            else:
                replies.append(reply_of(data))
        missing = Counter(self.model.later) - Counter(replies)
        extra = Counter(replies) - Counter(self.model.later)
        requests = {key: self.model.later_requests.get(key) for key, _, _ in missing + extra}
        assert not missing and not extra, (
            f"awaited replies: missing {missing}, extra {extra}; requests by id: {requests}"
        )

    def check_outbound(self) -> None:
        for request_id, future in self.outbound.items():
            expected = self.model.outcomes.get(request_id)
            if expected is None:
                assert isinstance(future.exception(), ConnectionLost), request_id
            elif "error" in expected:
                error = future.exception()
                assert isinstance(error, RemoteError), (request_id, error)
                sent = expected["error"]
                assert (error.code, error.message, error.data) == (
                    sent["code"], sent["message"], sent.get("data")
                ), request_id
            else:
                assert future.result() == expected["result"], request_id


# --- the properties ------------------------------------------------------------------

plans = st.builds(
    Plan,
    seed=st.integers(0, 2**32 - 1),
    vocabulary=st.lists(structured_frames(list(METHODS), OUTBOUND_IDS[:3]), max_size=4).map(tuple),
    require_initialize=st.booleans(),
    limit=st.sampled_from([256, 1024, 65536]),
    chunking=st.sampled_from(CHUNKINGS),
    outbound=st.integers(0, MAX_OUTBOUND),
)
fed_lines = Counter[str]()


@settings(max_examples=EXAMPLES, phases=[Phase.explicit, Phase.generate])
@given(plan=plans)
def converse(plan: Plan) -> None:
    """One example; not shrunk: a failure names its plan (derandomized: replayable) and line."""
    conversation = Conversation(plan)
    with checked_logs() as logs:
        asyncio.run(conversation.run())
    assert not logs.problems, logs.problems
    fed_lines["lines"] += conversation.fed


@pytest.mark.timeout(180)
def test_100k_random_lines_through_framing_and_endpoint() -> None:
    fed_lines.clear()
    converse()
    assert fed_lines["lines"] >= FRAMES_PER_RUN, fed_lines


@settings(max_examples=200)
@given(data=st.binary(max_size=512))
def test_random_bytes_get_one_parse_or_envelope_error_at_most(data: bytes) -> None:
    sent: list[bytes] = []
    endpoint = Endpoint(sent.append, METHODS, require_initialize=False)
    endpoint.receive(data)
    assert len(sent) <= 1
    if sent:
        key, code, _ = reply_of(sent[0])
        assert code in (-32700, -32600) or key != "null"


def test_deep_nesting_variants_never_crash() -> None:
    sent: list[bytes] = []
    endpoint = Endpoint(sent.append, METHODS, require_initialize=False)
    for opener in (b"[", b'{"a":', b'{"jsonrpc":"2.0","id":1,"method":"echo","params":['):
        for depth in (1_000, 100_000, 1_000_000):
            endpoint.receive(opener * depth)
    assert len(sent) == 9
    assert all(reply_of(data) == ("null", -32700, None) for data in sent)


async def test_a_peer_error_with_an_empty_message_keeps_it() -> None:
    """Found by the fuzzer: an empty ``message`` became "Internal error"."""
    endpoint = Endpoint(lambda frame: None, METHODS, require_initialize=False)
    asking = asyncio.ensure_future(endpoint.request("ask"))
    await asyncio.sleep(0)
    endpoint.receive(b'{"jsonrpc":"2.0","id":"zc-out-0","error":{"code":-32000,"message":""}}')
    with pytest.raises(RemoteError) as raised:
        await asyncio.wait_for(asking, 5)
    assert (raised.value.code, raised.value.message) == (-32000, "")
