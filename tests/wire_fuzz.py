"""Frame generators for the fuzz tests: JSON-RPC-shaped lines, byte streams, chunkings.

Two sources, used together:

- hypothesis strategies (:func:`structured_frames`): slow (about a millisecond a
  frame) but shrinkable and good at edge values; a fuzz plan draws a few as its
  vocabulary;
- :class:`FrameSource`: a seeded generator cheap enough for 100,000 frames a
  minute, mixing valid-ish requests, notifications, responses, broken envelopes,
  mutated frames, oversized lines and raw bytes (the vocabulary included).

:func:`build_stream` joins frames into an NDJSON byte stream holding exactly the
number of lines asked for (per :func:`tests.wire_model.split_lines`), and
:func:`chunked` cuts a stream at random boundaries. Pure code: any thread.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Final

from hypothesis import strategies as st

from tests.wire_model import split_lines

__all__ = [
    "CHUNKINGS",
    "FrameSource",
    "ParamsMaker",
    "build_stream",
    "chunked",
    "random_params",
    "random_value",
    "structured_frames",
]

ParamsMaker = Callable[[random.Random, str], Any]
"""``params(rng, method)``: the params of a request or notification to ``method``."""

CHUNKINGS: Final = ("whole", "lines", "small", "mixed")
_CHUNK_SIZES: Final = (1, 2, 3, 5, 8, 13, 64, 200, 1000, 4096, 20000)
_ENDINGS: Final = (b"\n", b"\n", b"\n", b"\r\n", b"\n\n", b"\r\n \t\r\n", b"\n\x0c\n")
_EXTRA_METHODS: Final = ("nope", "", "rpc.on", "initialize ", "INITIALIZE", "a" * 200)
_KEYS: Final = ("a", "", "sessionId", "prompt", "text", "cwd", "é", "id", "method", "k" * 9)
_SCALARS: Final[tuple[Any, ...]] = (
    None, True, False, 0, -1, 1, 7, 2**31, 2**53 + 1, 2**63 - 1, -(2**63), 2**63, 2**64,
    -(2**63) - 1, 10**30, 0.5, -0.0, 1e-7, 1e308, float("nan"), float("inf"),
    "", "a", "é", "zc-out-0", "\u2028", "\x00", "\ud800", "\U0001f389", "\\", '"', "\n", "{",
)
_ODD_IDS: Final[tuple[Any, ...]] = (
    None, "", 0, -1, 2**63 - 1, -(2**63), 2**63, -(2**63) - 1, 2**64, 1.0, 1.5, True, False,
    [1], {"a": 1}, "zc-out-0", "\ud800",
)


class _Absent:
    """A member left out of a generated envelope."""


_ABSENT: Final = _Absent()
_INSERTS: Final = (b'"', b"{", b"}", b",", b"\\", b"\xff", b"\r", b"\n", b" ")
_ODD_JSONRPC: Final[tuple[Any, ...]] = ("2.0", "2.0", "1.0", 2.0, 2, None, "2.0 ", "", [])


class FrameSource:
    """Seeded JSON-RPC-shaped frames. ``frame()`` costs tens of microseconds."""

    def __init__(
        self,
        rng: random.Random,
        methods: Sequence[str],
        *,
        limit: int,
        vocabulary: Sequence[bytes] = (),
        response_ids: Sequence[str] = ("zc-out-0",),
        params: ParamsMaker | None = None,
        unique_ids: bool = False,
        first_id: int = 0,
    ) -> None:
        self.rng = rng
        self.methods = [*methods, *_EXTRA_METHODS[: max(1, len(methods) // 3)]]
        self.limit = limit
        self.vocabulary = list(vocabulary)
        self.response_ids = list(response_ids)
        self._params = params or random_params
        self._unique_ids = unique_ids
        self._counter = first_id
        makers: list[tuple[float, Callable[[], bytes]]] = [
            (40, self.request),
            (10, self.notification),
            (12, self.response),
            (8, self.odd_envelope),
            (10, self.mutant),
            (5, self.garbage),
            (5, self.special),
            (1, self.long_line),
        ]
        if self.vocabulary:
            makers.append((8, lambda: rng.choice(self.vocabulary)))
        self._makers = [maker for _, maker in makers]
        self._weights = [weight for weight, _ in makers]

    def frame(self) -> bytes:
        """One line's content (no newline of its own, though garbage may hold some)."""
        return self.rng.choices(self._makers, self._weights)[0]()

    # --- well-shaped messages --------------------------------------------------

    def request_id(self) -> Any:
        self._counter += 1
        if self._unique_ids or self.rng.random() < 0.7:
            return self._counter if self._counter % 2 else f"r{self._counter}"
        return self.rng.choice(_ODD_IDS)

    def message(self, with_id: bool) -> dict[str, Any]:
        rng = self.rng
        method = rng.choice(self.methods)
        message: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
        if with_id:
            message["id"] = self.request_id()
        if rng.random() < 0.85:
            message["params"] = self._params(rng, method)
        return message

    def request(self) -> bytes:
        return self.encode(self.message(with_id=True))

    def notification(self) -> bytes:
        return self.encode(self.message(with_id=False))

    def response(self) -> bytes:
        rng = self.rng
        message: dict[str, Any] = {"jsonrpc": "2.0"}
        message["id"] = rng.choice(self.response_ids) if rng.random() < 0.8 else self.request_id()
        shape = rng.random()
        if shape < 0.5:
            message["result"] = random_value(rng)
        elif shape < 0.8:
            message["error"] = {"code": rng.choice((-32000, -32603, 1, 0)), "message": "no"}
            if rng.random() < 0.3:
                message["error"]["data"] = random_value(rng)
        elif shape < 0.9:
            message["error"] = rng.choice(({}, {"code": "1", "message": "x"}, {"code": 1}, "x"))
        elif shape < 0.95:
            message.update(result=1, error={"code": 1, "message": "both"})
        if rng.random() < 0.1:
            message["jsonrpc"] = rng.choice(_ODD_JSONRPC)
        return self.encode(message)

    def odd_envelope(self) -> bytes:
        """Each member present or not, and odd when present."""
        rng = self.rng
        message: dict[str, Any] = {}
        if rng.random() < 0.8:
            message["jsonrpc"] = rng.choice(_ODD_JSONRPC)
        if rng.random() < 0.7:
            message["id"] = rng.choice(_ODD_IDS) if rng.random() < 0.5 else self.request_id()
        if rng.random() < 0.8:
            odd = rng.random() < 0.4
            message["method"] = random_value(rng) if odd else rng.choice(self.methods)
        if rng.random() < 0.6:
            message["params"] = random_value(rng)
        for member in ("result", "error"):
            if rng.random() < 0.15:
                message[member] = random_value(rng)
        if rng.random() < 0.1:
            message[rng.choice(_KEYS)] = random_value(rng)
        return self.encode(message)

    def encode(self, message: Any) -> bytes:
        """JSON text as a peer might write it: escaped or raw UTF-8, any integer size."""
        text = json.dumps(message, ensure_ascii=self.rng.random() < 0.3)
        return text.encode("utf-8", "surrogatepass")

    # --- broken lines ----------------------------------------------------------

    def mutant(self) -> bytes:
        """A frame with a few bytes flipped, inserted, dropped or cut off."""
        rng = self.rng
        source = rng.choice(self.vocabulary) if self.vocabulary and rng.random() < 0.3 else None
        data = bytearray(source if source is not None else self.request())
        for _ in range(rng.randint(1, 3)):
            if not data:
                break
            at = rng.randrange(len(data))
            operation = rng.random()
            if operation < 0.4:
                data[at] = rng.randrange(256)
            elif operation < 0.7:
                data[at:at] = rng.choice(_INSERTS)
            elif operation < 0.9:
                del data[at : at + rng.randint(1, 8)]
            else:
                del data[at:]
        return bytes(data)

    def garbage(self) -> bytes:
        return self.rng.randbytes(self.rng.randint(0, 48))

    def special(self) -> bytes:
        """A line from the zoo of things parsers get wrong."""
        rng = self.rng
        good = self.request()
        depth = rng.choice((2, 255, 256, 1000, 5000))
        choices: tuple[bytes, ...] = (
            b"[" * depth + b"]" * depth,
            b'{"jsonrpc":"2.0","id":1,"method":"m","params":' + b"[" * depth + b"]" * depth + b"}",
            b"\xef\xbb\xbf" + good,
            good + b" x",
            good + good,
            b"[" + good + b"," + good + b"]",
            b"[]",
            b"  \t" + good + b"  ",
            b'{"jsonrpc":"2.0","id":1,"id":{},"method":"m"}',
            b'{"jsonrpc":"2.0","method":"m","method":1,"id":2}',
            b'{"jsonrpc":"2.0","id":NaN,"method":"m"}',
            b'{"jsonrpc":"2.0","id":1e400,"method":"m"}',
            b'{"jsonrpc":"2.0","id":"\\ud800","method":"m"}',
            b'{"jsonrpc":"2.0","id":"\xed\xa0\x80","method":"m"}',
            b'{"jsonrpc":"2.0","id":1,"method":"\x01"}',
            b'{"jsonrpc":"2.0","id":1,"method":"m","params":{"a":"\x1f"}}',
            b"null", b"true", b"0", b'"x"', b"{}", b"{", b"}", b'"', b"\x00", b"\x0b{}",
        )
        return rng.choice(choices)

    def long_line(self) -> bytes:
        """A request whose length is at, just past, or far past the frame limit."""
        base = self.request()
        target = self.limit + self.rng.choice((-1, 0, 1, 2, self.limit))
        pad = max(0, target - len(base) - 2)
        return base[:1] + b'"pad":"' + b"x" * pad + b'",' + base[1:] if base[:1] == b"{" else base


def random_value(rng: random.Random, depth: int = 0) -> Any:
    """A small JSON-ish value (NaN, infinities and lone surrogates included)."""
    roll = rng.random()
    if depth > 2 or roll < 0.55:
        if roll < 0.15:
            return rng.randint(-1000, 1000)
        if roll < 0.25:
            return "".join(rng.choices("ab \u00e9\u4e2d\"\\/\n", k=rng.randint(0, 6)))
        return rng.choice(_SCALARS)
    if roll < 0.75:
        return [random_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    return {rng.choice(_KEYS): random_value(rng, depth + 1) for _ in range(rng.randint(0, 3))}


def random_params(rng: random.Random, method: str) -> Any:
    """Params of any shape: mostly objects, some arrays, some scalars."""
    roll = rng.random()
    if roll < 0.6:
        return {rng.choice(_KEYS): random_value(rng) for _ in range(rng.randint(0, 3))}
    if roll < 0.85:
        return [random_value(rng) for _ in range(rng.randint(0, 3))]
    return random_value(rng)


# --- streams -----------------------------------------------------------------


def build_stream(
    frames: Callable[[], bytes], rng: random.Random, lines: int, limit: int
) -> bytes:
    """An NDJSON stream of generated frames holding exactly ``lines`` lines.

    Frames end in ``\\n`` or ``\\r\\n``, sometimes with blank lines after them; the
    last one sometimes has no line ending at all (a partial last line).
    """
    pieces: list[bytes] = []
    count = 0
    while count < lines:
        piece = frames() + rng.choice(_ENDINGS)
        added = len(split_lines(piece, limit))
        if count + added <= lines:
            pieces.append(piece)
            count += added
    stream = b"".join(pieces)
    return stream[:-1] if stream and rng.random() < 0.5 else stream


def chunked(stream: bytes, rng: random.Random, chunking: str) -> Iterator[bytes]:
    """``stream`` cut into the pieces a reader would receive, per ``chunking``."""
    if chunking == "whole":
        yield stream
        return
    if chunking == "lines":
        yield from stream.splitlines(keepends=True)
        return
    at = 0
    while at < len(stream):
        size = rng.randint(1, 16) if chunking == "small" else rng.choice(_CHUNK_SIZES)
        yield stream[at : at + size]
        at += size


# --- hypothesis strategies ---------------------------------------------------

_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=6,
)


def structured_frames(
    methods: Sequence[str], response_ids: Sequence[str]
) -> st.SearchStrategy[bytes]:
    """Hypothesis-built frames: envelopes member by member, each member valid or odd."""
    absent = st.just(_ABSENT)
    ids = absent | st.sampled_from([*response_ids, "a", "", 0, -1, 2**63, 1.5, True]) | _values
    members = {
        "jsonrpc": absent | st.sampled_from(["2.0", "2.0", "1.0", None]),
        "id": ids,
        "method": absent | st.sampled_from([*methods, "nope"]) | _values,
        "params": absent | st.dictionaries(st.text(max_size=4), _values, max_size=3) | _values,
        "result": absent | absent | _values,
        "error": absent
        | absent
        | st.fixed_dictionaries(
            {"code": st.integers(-33000, -32000), "message": st.text(max_size=8)}
        )
        | _values,
    }

    def encode(drawn: dict[str, Any]) -> bytes:
        message = {key: value for key, value in drawn.items() if value is not _ABSENT}
        return json.dumps(message).encode("utf-8", "surrogatepass")

    return st.fixed_dictionaries(members).map(encode)
