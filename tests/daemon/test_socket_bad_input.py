"""SPEC §2 on ``daemon.sock``: bad input gets its answer (or none); the next request is served."""

from __future__ import annotations

from typing import Any

import pytest

from .helpers import DaemonProc, RpcClient

MiB = 1024 * 1024

ANSWERED = [
    (b'{"jsonrpc": "2.0", "id": 1, "method": \n', -32700, None),
    (b"[1]\n", -32600, None),
    (b'"just a string"\n', -32600, None),
    (b'{"jsonrpc":"1.0","id":7,"method":"status"}\n', -32600, 7),
    (b'{"jsonrpc":"2.0","id":8,"method":5}\n', -32600, 8),
    (b'{"jsonrpc":"2.0","id":9,"method":"status","params":null}\n', -32600, 9),
    (b'{"jsonrpc":"2.0","id":10,"method":"status","params":"x"}\n', -32600, 10),
    (b"[" * 100_000 + b"]" * 100_000 + b"\n", -32700, None),
    (b'{"jsonrpc":"2.0","id":11,"method":"\xff\xfe"}\n', -32700, None),
    (b'{"jsonrpc":"2.0","id":12,"method":"\\ud800"}\n', -32700, None),
    (b'{"jsonrpc":"2.0","id":13,"method":"no/such"}\n', -32601, 13),
    (b'{"jsonrpc":"2.0","id":14,"method":"session/prompt",'
     b'"params":{"sessionId":"00000000-0000-4000-8000-000000000000","prompt":"x"}}\n', -32000, 14),
    (b'{"jsonrpc":"2.0","id":15,"method":"session/prompt","params":{"sessionId":5}}\n',
     -32602, 15),
]

UNANSWERED = [
    b'{"jsonrpc":"2.0","id":"zc-out-99","result":1,"error":{}}\n',  # malformed response
    b'{"jsonrpc":"2.0","id":"zc-out-98","result":{}}\n',  # a response nobody waits for
    b'{"jsonrpc":"2.0","method":"no/such/notification"}\n',
    b"\n\r\n",
]


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: Any) -> Any:
    proc = DaemonProc()
    proc.wait_listening()
    yield proc
    proc.terminate()
    assert not proc.cleanup()


def served(client: RpcClient) -> None:
    assert client.request("status")["protocolVersion"] == 1


@pytest.mark.parametrize(("raw", "code", "request_id"), ANSWERED)
def test_bad_frames_are_answered(daemon: DaemonProc, raw: bytes, code: int,
                                 request_id: Any) -> None:
    with daemon.client() as client:
        client.sock.sendall(raw)
        frame = client.read_frame()
        assert frame["jsonrpc"] == "2.0" and "result" not in frame
        assert frame["id"] == request_id and frame["error"]["code"] == code
        served(client)


@pytest.mark.parametrize("raw", UNANSWERED)
def test_responses_and_notifications_get_no_answer(daemon: DaemonProc, raw: bytes) -> None:
    with daemon.client() as client:
        client.sock.sendall(raw)
        request_id = client.send("status")
        assert client.read_frame()["id"] == request_id  # the very next frame


def test_a_frame_over_the_limit_is_refused_and_the_connection_lives(
    daemon: DaemonProc,
) -> None:
    with daemon.client() as client:
        client.sock.sendall(b'{"x":"' + b"a" * (33 * MiB) + b'"}\n')
        frame = client.read_frame(timeout=30)
        assert frame["id"] is None and frame["error"]["code"] == -32600
        assert "too large" in frame["error"]["message"]
        served(client)
