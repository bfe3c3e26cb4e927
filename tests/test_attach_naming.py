"""The attach bridge's naming of ``session/new`` (:mod:`supervisor.cli.attach_naming`),
without processes: what passes byte for byte and what gains ``_meta``."""

from __future__ import annotations

import orjson

from ipc.session_names import SessionNaming
from supervisor.cli.attach_naming import RequestRewriter

NEW = b'{"jsonrpc":"2.0","id":2,"method":"session/new","params":{"cwd":"/w"}}\n'


def frames(data: bytes) -> list[dict[str, object]]:
    return [orjson.loads(line) for line in data.splitlines() if line.strip()]


def test_a_session_new_gains_the_flags_meta_and_other_lines_pass_as_they_are() -> None:
    rewriter = RequestRewriter(SessionNaming("k", None, False, True), 1 << 20)
    other = b'{"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}}\n'
    out = rewriter.feed(other + NEW)
    assert out.startswith(other)
    [_, new] = frames(out)
    assert new["params"] == {"cwd": "/w", "_meta": {"sessionKey": "k",
                                                    "zeroclaw": {"requireExisting": True}}}


def test_a_line_split_across_reads_is_named_once_whole() -> None:
    rewriter = RequestRewriter(SessionNaming("k"), 1 << 20)
    assert rewriter.feed(NEW[:20]) == b""
    [new] = frames(rewriter.feed(NEW[20:]))
    assert new["params"]["_meta"] == {"sessionKey": "k"}


def test_the_editors_own_key_wins_and_reset_is_for_the_first_session_new() -> None:
    rewriter = RequestRewriter(SessionNaming("k", reset=True), 1 << 20)
    own = (b'{"jsonrpc":"2.0","id":3,"method":"session/new","params":{"cwd":"/w",'
           b'"_meta":{"sessionKey":"mine"}}}\n')
    assert rewriter.feed(own) == own
    [first] = frames(rewriter.feed(NEW))
    [second] = frames(rewriter.feed(NEW))
    assert first["params"]["_meta"] == {"sessionKey": "k", "resetSession": True}
    assert second["params"]["_meta"] == {"sessionKey": "k"}


def test_bad_input_and_over_long_lines_pass_byte_for_byte() -> None:
    rewriter = RequestRewriter(SessionNaming("k"), 64)
    for line in (b'{"method":"session/new", oops\n',
                 b'{"jsonrpc":"2.0","id":4,"method":"session/new","params":[1]}\n',
                 b'{"jsonrpc":"2.0","method":"session/new","params":{}}\n'):
        assert rewriter.feed(line) == line
    long = b'{"jsonrpc":"2.0","id":5,"method":"session/new","params":{"cwd":"' + b"x" * 100
    assert rewriter.feed(long) == long  # not held back: the host answers -32600
    assert rewriter.feed(b'"}}\n' + NEW[:10]) == b'"}}\n'
    assert rewriter.flush() == NEW[:10]


def test_initialize_asks_for_the_provenance_mode_unless_it_asks_itself() -> None:
    import socket

    rewriter = RequestRewriter(SessionNaming(), 1 << 20, "meta+receipt")
    init = b'{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":1}}\n'
    [frame] = frames(rewriter.feed(init))
    assert frame["params"]["_meta"] == {"zeroclaw": {"provenance": "meta+receipt",
                                                     "originHost": socket.gethostname()}}
    own = (b'{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":1,'
           b'"_meta":{"zeroclaw":{"provenance":"off"}}}}\n')
    assert rewriter.feed(own) == own
    assert rewriter.feed(NEW) == NEW  # no naming: session/new passes as it is
