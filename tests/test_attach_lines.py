"""The ``--attach`` bridge's line tracking: whole lines out, oversized lines skipped."""

from __future__ import annotations

from supervisor.cli.attach import Link
from supervisor.cli.attach_channel import LineSplitter


def collect(limit: int, chunks: list[bytes]) -> tuple[list[bytes], LineSplitter]:
    lines: list[bytes] = []
    splitter = LineSplitter(lines.append, limit)
    for chunk in chunks:
        splitter.feed(chunk)
    return lines, splitter


def test_lines_split_across_chunks_come_out_whole() -> None:
    lines, splitter = collect(100, [b'{"a"', b":1}\n\n{", b'"b":2}\n{"c"'])
    assert lines == [b'{"a":1}', b'{"b":2}']
    assert splitter.mid_line


def test_a_line_over_the_limit_is_skipped_and_memory_stays_bounded() -> None:
    chunk = b"x" * 4096
    lines, splitter = collect(10_000, [b'{"id":1,"big":"', *[chunk] * 100, b'"}\n{"id":2}\n'])
    assert lines == [b'{"id":2}']
    assert not splitter.mid_line
    lines, splitter = collect(10_000, [b"y" * 50_000])
    assert lines == [] and splitter.mid_line  # still inside the skipped line
    assert len(splitter._tail) == 0  # nothing of it is kept


def test_the_id_of_an_answer_over_the_limit_is_read_from_its_head() -> None:
    link = Link(None)  # type: ignore[arg-type]  # only its id bookkeeping: no socket
    link.sent(b'{"jsonrpc":"2.0","id":7,"method":"session/prompt","params":{}}')
    link.sent(b'{"jsonrpc":"2.0","id":"s\\"8","method":"session/load","params":{}}')
    replies = LineSplitter(link.received, 100, link.received_long)
    replies.feed(b'{"jsonrpc":"2.0","id":7,"result":{"content":"' + b"x" * 500 + b'"}}\n')
    assert link.unanswered() == ['s"8']
    replies.feed(b'{"jsonrpc":"2.0","id":"s\\"8","error":{"message":"' + b"y" * 500 + b'"}}\n')
    assert link.unanswered() == []


def test_a_line_over_the_limit_that_comes_whole_in_one_read_is_skipped_too() -> None:
    skipped: list[bytes] = []
    lines: list[bytes] = []
    splitter = LineSplitter(lines.append, 100, skipped.append)
    splitter.feed(b'{"id":1,"big":"' + b"x" * 500 + b'"}\n{"id":2}\n')
    assert lines == [b'{"id":2}']
    assert [head[:8] for head in skipped] == [b'{"id":1,']
