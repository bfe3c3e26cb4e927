"""NDJSON framing on a real asyncio.StreamReader (SPEC §2: lines, limits, bounded memory)."""

from __future__ import annotations

import asyncio
import tracemalloc

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ipc.framing import (
    DEFAULT_FRAME_LIMIT,
    OVERSIZED,
    FrameReader,
    PartialFrameStalled,
    encode_frame,
    new_stream_reader,
)
from tests.wire_model import split_lines

MIB = 1024 * 1024


def fed_reader(data: bytes, limit: int = 1024, eof: bool = True) -> FrameReader:
    reader = new_stream_reader(limit)
    reader.feed_data(data)
    if eof:
        reader.feed_eof()
    return FrameReader(reader, limit)


async def read_all(frames: FrameReader) -> list[object]:
    out: list[object] = []
    while (frame := await frames.read()) is not None:
        out.append(frame)
    return out


def test_default_limit_is_32_mib() -> None:
    assert DEFAULT_FRAME_LIMIT == 32 * MIB


def test_encode_frame_is_one_line() -> None:
    frame = encode_frame({"jsonrpc": "2.0", "method": "m", "params": {"text": "a\nb"}})
    assert frame.endswith(b"\n")
    assert frame.count(b"\n") == 1
    assert orjson.loads(frame) == {"jsonrpc": "2.0", "method": "m", "params": {"text": "a\nb"}}


def test_encode_frame_rejects_unencodable() -> None:
    with pytest.raises(TypeError):
        encode_frame({"n": 2**70})


async def test_lines_split_and_newline_removed() -> None:
    frames = fed_reader(b'{"a":1}\n{"b":2}\n')
    assert await read_all(frames) == [b'{"a":1}', b'{"b":2}']


async def test_blank_lines_are_skipped() -> None:
    frames = fed_reader(b'\n\n{"a":1}\n\r\n   \n\t\r\n{"b":2}\n\n')
    assert await read_all(frames) == [b'{"a":1}', b'{"b":2}']


async def test_crlf_is_stripped() -> None:
    frames = fed_reader(b'{"a":1}\r\n{"b":2}\r\n')
    assert await read_all(frames) == [b'{"a":1}', b'{"b":2}']


async def test_partial_last_line_is_a_frame() -> None:
    frames = fed_reader(b'{"a":1}\n{"b":2}')
    assert await read_all(frames) == [b'{"a":1}', b'{"b":2}']


async def test_partial_last_line_with_cr() -> None:
    frames = fed_reader(b'{"b":2}\r')
    assert await read_all(frames) == [b'{"b":2}']


async def test_eof_on_empty_stream() -> None:
    assert await fed_reader(b"").read() is None


async def test_line_at_exactly_the_limit_is_served() -> None:
    line = b"x" * 1024
    frames = fed_reader(line + b"\n" + line + b"\r\n")
    assert await read_all(frames) == [line, line]


async def test_line_one_byte_over_the_limit_is_oversized() -> None:
    frames = fed_reader(b"x" * 1025 + b'\n{"ok":1}\n')
    assert await read_all(frames) == [OVERSIZED, b'{"ok":1}']


async def test_oversized_partial_last_line() -> None:
    frames = fed_reader(b'{"ok":1}\n' + b"y" * 5000)
    assert await read_all(frames) == [b'{"ok":1}', OVERSIZED]


async def test_frames_arrive_in_pieces() -> None:
    reader = new_stream_reader(1024)
    frames = FrameReader(reader, 1024)
    pending = asyncio.ensure_future(read_all(frames))
    for byte in b'{"a":1}\r\n\n{"b":':
        reader.feed_data(bytes([byte]))
        await asyncio.sleep(0)
    reader.feed_data(b"2}\n")
    reader.feed_eof()
    assert await asyncio.wait_for(pending, 5) == [b'{"a":1}', b'{"b":2}']


async def test_20_mb_line_with_1_mib_limit_then_normal_line_bounded_memory() -> None:
    """The over-long line is dropped chunk by chunk: peak memory stays near the limit."""
    reader = new_stream_reader(MIB)
    frames = FrameReader(reader, MIB)
    chunk = b"z" * (64 * 1024)
    tracemalloc.start()
    try:
        consumer = asyncio.ensure_future(read_all(frames))
        for _ in range(20 * MIB // len(chunk)):
            reader.feed_data(chunk)
            await asyncio.sleep(0)
        reader.feed_data(b'\n{"after":true}\n')
        reader.feed_eof()
        result = await asyncio.wait_for(consumer, 20)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert result == [OVERSIZED, b'{"after":true}']
    assert peak < 5 * MIB, f"peak {peak / MIB:.1f} MiB while discarding a 20 MB line"


async def test_oversized_line_whose_newline_is_already_buffered() -> None:
    """LimitOverrunError with the separator found beyond the limit."""
    frames = fed_reader(b"q" * 3000 + b'\n{"next":1}\n', limit=1024)
    assert await read_all(frames) == [OVERSIZED, b'{"next":1}']


async def test_several_oversized_lines_in_a_row() -> None:
    big = b"w" * 4000 + b"\n"
    frames = fed_reader(big + big + b"1\n" + big, limit=1000)
    assert await read_all(frames) == [OVERSIZED, OVERSIZED, b"1", OVERSIZED]


async def test_reader_with_larger_buffer_still_enforces_frame_limit() -> None:
    reader = new_stream_reader(10_000)
    reader.feed_data(b"a" * 200 + b"\nok\n")
    reader.feed_eof()
    assert await read_all(FrameReader(reader, 100)) == [OVERSIZED, b"ok"]


async def test_connection_error_propagates() -> None:
    reader = new_stream_reader(1024)
    reader.feed_data(b"partial")
    reader.set_exception(ConnectionResetError())
    with pytest.raises(ConnectionResetError):
        await FrameReader(reader, 1024).read()


async def test_a_partial_frame_that_stops_growing_stalls() -> None:
    reader = new_stream_reader(1024)
    frames = FrameReader(reader, 1024, stall_timeout=0.2)
    reader.feed_data(b'{"a":1}\n{"b":')
    assert await frames.read() == b'{"a":1}'
    with pytest.raises(PartialFrameStalled, match="5 bytes"):
        await asyncio.wait_for(frames.read(), 5)


async def test_a_growing_partial_frame_and_an_idle_stream_do_not_stall() -> None:
    reader = new_stream_reader(1024)
    frames = FrameReader(reader, 1024, stall_timeout=0.3)
    reading = asyncio.ensure_future(frames.read())
    await asyncio.sleep(0.5)  # idle between frames: no partial frame, no stall
    for byte in b'{"b":2}':
        reader.feed_data(bytes([byte]))
        await asyncio.sleep(0.1)  # each byte is progress
    reader.feed_data(b"\n")
    assert await asyncio.wait_for(reading, 5) == b'{"b":2}'


async def test_an_over_long_line_being_discarded_stalls_too() -> None:
    reader = new_stream_reader(10)
    frames = FrameReader(reader, 10, stall_timeout=0.2)
    reader.feed_data(b"y" * 50)
    with pytest.raises(PartialFrameStalled):
        await asyncio.wait_for(frames.read(), 5)


async def test_release_drops_the_partial_frame() -> None:
    reader = new_stream_reader(MIB)
    frames = FrameReader(reader, MIB)
    reader.feed_data(b"z" * (MIB // 2))
    reading = asyncio.ensure_future(frames.read())
    await asyncio.sleep(0.05)
    reading.cancel()
    tracemalloc.start()
    try:
        frames.release()
        current, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    reader.feed_data(b"\n")
    reader.feed_eof()
    assert current < 64 * 1024
    assert await read_all(frames) == []  # only the newline was left


async def test_whitespace_line_over_the_limit_is_oversized_however_it_ends() -> None:
    """A blank line longer than the limit counts as over-long, with or without ``\r``."""
    frames = fed_reader(b" " * 11 + b"\n" + b" " * 12 + b"\n" + b" " * 11 + b"\r\nok\n", limit=10)
    assert await read_all(frames) == [OVERSIZED, OVERSIZED, OVERSIZED, b"ok"]


async def feed_in_pieces(stream: bytes, cuts: list[int], limit: int) -> list[object]:
    """Read ``stream`` fed in pieces cut at ``cuts``, the reader running between pieces."""
    reader = new_stream_reader(limit)
    reading = asyncio.ensure_future(read_all(FrameReader(reader, limit)))
    start = 0
    for end in [*sorted(cuts), len(stream)]:
        reader.feed_data(stream[start:end])
        start = max(start, end)
        await asyncio.sleep(0)
    reader.feed_eof()
    return await asyncio.wait_for(reading, 5)


line_bytes = st.binary(max_size=24) | st.lists(
    st.sampled_from([b" ", b"\t", b"\r", b"\n", b"\r\n", b"x", b"{}", b"\x0c"]), max_size=12
).map(b"".join)


@settings(max_examples=400)
@given(
    stream=st.lists(line_bytes, max_size=12).map(b"".join),
    limit=st.integers(1, 20),
    cuts=st.lists(st.integers(0, 300), max_size=12),
)
def test_any_stream_cut_anywhere_reads_as_the_model_splits_it(
    stream: bytes, limit: int, cuts: list[int]
) -> None:
    """Lines, ``\r``, blanks, partial last lines and over-long lines, at any chunk boundary."""
    assert asyncio.run(feed_in_pieces(stream, cuts, limit)) == split_lines(stream, limit)
