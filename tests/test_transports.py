"""Transports over real sockets and real child processes with pipes."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import stat
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from ipc.jsonrpc import Endpoint
from ipc.transports import serve_stream, serve_unix

REPO_ROOT = Path(__file__).resolve().parents[1]
MIB = 1024 * 1024


def handlers(released: asyncio.Event | None = None) -> dict[str, Any]:
    async def wait_release(params: Any, ep: Endpoint) -> str:
        assert released is not None
        await released.wait()
        return "released"

    return {
        "initialize": lambda params, ep: {"protocolVersion": 1},
        "echo": lambda params, ep: params,
        "big": lambda params, ep: "b" * MIB,
        "wait_release": wait_release,
    }


def request(request_id: Any, method: str, params: Any = None) -> bytes:
    message: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": method}
    if params is not None:
        message["params"] = params
    return orjson.dumps(message, option=orjson.OPT_APPEND_NEWLINE)


async def read_reply(reader: asyncio.StreamReader) -> dict[str, Any]:
    line = await asyncio.wait_for(reader.readline(), 10)
    assert line.endswith(b"\n"), line
    reply: dict[str, Any] = orjson.loads(line)
    return reply


class SocketPairServer:
    """serve_stream on one end of a socketpair; the test drives the other end."""

    def __init__(self, methods: dict[str, Any], frame_limit: int, high_water: int,
                 stall_timeout: float = 30.0) -> None:
        self.methods = methods
        self.frame_limit = frame_limit
        self.high_water = high_water
        self.stall_timeout = stall_timeout
        self.endpoints: list[Endpoint] = []

    def make_endpoint(self, send: Callable[[bytes], None]) -> Endpoint:
        endpoint = Endpoint(send, self.methods, name="pair")
        self.endpoints.append(endpoint)
        return endpoint

    async def start(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        ours, theirs = socket.socketpair()
        reader, writer = await asyncio.open_connection(sock=ours, limit=self.frame_limit + 1)
        self.task = asyncio.ensure_future(
            serve_stream(
                reader,
                writer,
                self.make_endpoint,
                frame_limit=self.frame_limit,
                write_high_water=self.high_water,
                stall_timeout=self.stall_timeout,
            )
        )
        return await asyncio.open_connection(sock=theirs, limit=64 * MIB)


async def start_pair(
    methods: dict[str, Any], frame_limit: int = MIB, high_water: int = 64 * MIB,
    stall_timeout: float = 30.0,
) -> tuple[SocketPairServer, asyncio.StreamReader, asyncio.StreamWriter]:
    server = SocketPairServer(methods, frame_limit, high_water, stall_timeout)
    reader, writer = await server.start()
    return server, reader, writer


async def test_socketpair_round_trips_and_gate() -> None:
    server, reader, writer = await start_pair(handlers())
    writer.write(request(1, "echo", {"a": 1}))
    writer.write(request(2, "initialize", {"protocolVersion": 1}))
    writer.write(b"\r\n\n" + request(3, "echo", {"a": 1}).replace(b"\n", b"\r\n"))
    assert (await read_reply(reader))["error"]["code"] == -32010
    assert await read_reply(reader) == {"jsonrpc": "2.0", "id": 2, "result": {"protocolVersion": 1}}
    assert await read_reply(reader) == {"jsonrpc": "2.0", "id": 3, "result": {"a": 1}}
    writer.close()
    await asyncio.wait_for(server.task, 10)
    assert server.endpoints[0].closed


async def test_in_flight_handler_finishes_after_eof() -> None:
    released = asyncio.Event()
    server, reader, writer = await start_pair(handlers(released))
    writer.write(request(1, "initialize") + request(2, "wait_release"))
    assert (await read_reply(reader))["id"] == 1
    writer.write_eof()
    await asyncio.sleep(0.05)
    assert not server.task.done(), "the server waits for the in-flight handler"
    released.set()
    assert await read_reply(reader) == {"jsonrpc": "2.0", "id": 2, "result": "released"}
    assert await asyncio.wait_for(reader.read(), 10) == b"", "then it closes the connection"
    await asyncio.wait_for(server.task, 10)
    writer.close()


async def test_oversized_frame_over_a_socket_keeps_the_connection_usable() -> None:
    server, reader, writer = await start_pair(handlers(), frame_limit=MIB)
    writer.write(request(1, "initialize"))
    writer.write(b'{"jsonrpc":"2.0","id":2,"method":"echo","params":["' + b"x" * (20 * MIB))
    writer.write(b'"]}\n' + request(3, "echo", ["small"]))
    await asyncio.wait_for(writer.drain(), 20)
    assert (await read_reply(reader))["id"] == 1
    too_large = await read_reply(reader)
    assert too_large["id"] is None and too_large["error"]["code"] == -32600
    assert too_large["error"]["message"] == "frame too large"
    assert await read_reply(reader) == {"jsonrpc": "2.0", "id": 3, "result": ["small"]}
    writer.close()
    await asyncio.wait_for(server.task, 10)


async def test_peer_that_does_not_read_is_disconnected_after_the_stall_timeout() -> None:
    server, _reader, writer = await start_pair(handlers(), high_water=256 * 1024,
                                               stall_timeout=1.0)
    writer.transport.pause_reading()  # the socket is not read at all from now on
    writer.write(request(0, "initialize"))
    for request_id in range(1, 40):  # 39 MiB of answers nobody reads
        writer.write(request(request_id, "big"))
    started = asyncio.get_running_loop().time()
    await asyncio.wait_for(server.task, 20)
    assert server.endpoints[0].closed
    assert asyncio.get_running_loop().time() - started >= 1.0
    writer.close()


async def test_peer_that_reads_slowly_past_the_high_water_mark_gets_every_answer() -> None:
    """Over the high-water mark its requests wait (memory stays bounded); it is never
    dropped while it takes bytes, however slowly."""
    server, reader, writer = await start_pair(handlers(), high_water=256 * 1024,
                                              stall_timeout=1.0)
    writer.write(request(0, "initialize"))
    for request_id in range(1, 40):
        writer.write(request(request_id, "big"))
    await writer.drain()
    await asyncio.sleep(1.5)  # behind for longer than the stall timeout, but taking bytes
    ids = []
    for _ in range(40):
        reply = await asyncio.wait_for(read_reply(reader), 20)
        ids.append(reply["id"])
        await asyncio.sleep(0.01)
    assert ids == list(range(40)) and not server.endpoints[0].closed
    writer.close()
    await asyncio.wait_for(server.task, 10)


async def test_garbage_stream_never_breaks_the_server() -> None:
    server, reader, writer = await start_pair(handlers())
    writer.write(request(1, "initialize"))
    writer.write(os.urandom(4096).replace(b"\n", b" ") + b"\n")
    writer.write(b"[" * 100_000 + b"\n")
    writer.write(b'"\xed\xa0\x80"\n')
    writer.write(request(2, "echo", [2]))
    replies = [await read_reply(reader) for _ in range(5)]
    assert [reply["id"] for reply in replies] == [1, None, None, None, 2]
    assert [reply.get("error", {}).get("code") for reply in replies[1:4]] == [-32700] * 3
    writer.close()
    await asyncio.wait_for(server.task, 10)


async def test_serve_unix_gives_each_connection_its_own_endpoint(tmp_path: Path) -> None:
    path = str(tmp_path / "t.sock")
    endpoints: list[Endpoint] = []

    def make_endpoint(send: Callable[[bytes], None]) -> Endpoint:
        endpoints.append(Endpoint(send, handlers(), name=f"unix-{len(endpoints)}"))
        return endpoints[-1]

    server = await serve_unix(path, make_endpoint, frame_limit=MIB)
    try:
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        r1, w1 = await asyncio.open_unix_connection(path)
        r2, w2 = await asyncio.open_unix_connection(path)
        w1.write(request(1, "initialize") + request(2, "echo", ["one"]))
        w2.write(request(1, "echo", ["two"]))
        assert (await read_reply(r1))["result"] == {"protocolVersion": 1}
        assert (await read_reply(r1))["result"] == ["one"]
        assert (await read_reply(r2))["error"]["code"] == -32010
        w1.close()
        w2.close()
        assert await asyncio.wait_for(r1.read(), 10) == b""
        assert await asyncio.wait_for(r2.read(), 10) == b""
        assert len(endpoints) == 2
    finally:
        server.close()
        await server.wait_closed()


# --- stdio in a real child process -------------------------------------------------

CHILD = textwrap.dedent(
    """
    import asyncio, logging, os, subprocess, sys
    from ipc.jsonrpc import Endpoint
    from ipc.transports import open_stdio, serve_stream

    logging.basicConfig(level=logging.INFO, stream=sys.stderr)

    def stray(params, ep):
        print("STRAY PRINT")
        os.write(1, b"STRAY FD WRITE\\n")
        child = subprocess.run(
            [sys.executable, "-c",
             "import sys; print('CHILD OUT'); print('child read', len(sys.stdin.read()))"],
            timeout=20,
        )
        return {"child": child.returncode}

    async def slow(params, ep):
        await asyncio.sleep(0.3)
        return "slow done"

    METHODS = {
        "initialize": lambda params, ep: {"protocolVersion": 1},
        "echo": lambda params, ep: params,
        "stray": stray,
        "slow": slow,
    }

    async def main():
        limit = int(os.environ.get("FRAME_LIMIT", str(1024 * 1024)))
        reader, writer = await open_stdio(limit)
        await serve_stream(reader, writer, lambda send: Endpoint(send, METHODS), frame_limit=limit)

    asyncio.run(main())
    """
)


def child_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO_ROOT), "PYTHONUNBUFFERED": "1"}


def parse_lines(data: bytes) -> list[dict[str, Any]]:
    lines = data.splitlines()
    return [orjson.loads(line) for line in lines]


def test_stdio_serves_and_keeps_stray_output_off_stdout() -> None:
    requests = (
        request(1, "initialize")
        + request(2, "stray")
        + request(3, "echo", {"k": "v"})
        + request(4, "slow")
    )
    done = subprocess.run(
        [sys.executable, "-c", CHILD],
        input=requests,
        capture_output=True,
        env=child_env(),
        timeout=30,
    )
    assert done.returncode == 0, done.stderr.decode()
    replies = parse_lines(done.stdout)  # every stdout line is a protocol frame
    assert [reply["id"] for reply in replies] == [1, 2, 3, 4]
    assert replies[1]["result"] == {"child": 0}
    assert replies[3]["result"] == "slow done", "in-flight handler finished after EOF"
    stderr = done.stderr.decode()
    assert "STRAY PRINT" in stderr and "STRAY FD WRITE" in stderr and "CHILD OUT" in stderr
    assert "child read 0" in stderr, "a child process cannot read the protocol input"


def test_stdio_with_regular_files(tmp_path: Path) -> None:
    requests_file = tmp_path / "in.ndjson"
    replies_file = tmp_path / "out.ndjson"
    requests_file.write_bytes(
        request(1, "initialize") + b"not json\n" + request(2, "echo", [1]) + request(3, "slow")
    )
    with requests_file.open("rb") as stdin, replies_file.open("wb") as stdout:
        done = subprocess.run(
            [sys.executable, "-c", CHILD],
            stdin=stdin,
            stdout=stdout,
            stderr=subprocess.PIPE,
            env=child_env(),
            timeout=30,
        )
    assert done.returncode == 0, done.stderr.decode()
    replies = parse_lines(replies_file.read_bytes())
    assert [(reply["id"], reply.get("result")) for reply in replies] == [
        (1, {"protocolVersion": 1}),
        (None, None),
        (2, [1]),
        (3, "slow done"),
    ]


def test_stdio_oversized_frame_through_a_pipe() -> None:
    requests = (
        request(1, "initialize")
        + b"["
        + b"1," * (3 * MIB)
        + b"1]\n"
        + request(2, "echo", ["after"])
    )
    done = subprocess.run(
        [sys.executable, "-c", CHILD],
        input=requests,
        capture_output=True,
        env={**child_env(), "FRAME_LIMIT": str(MIB)},
        timeout=30,
    )
    assert done.returncode == 0, done.stderr.decode()
    replies = parse_lines(done.stdout)
    assert [reply["id"] for reply in replies] == [1, None, 2]
    assert replies[1]["error"] == {"code": -32600, "message": "frame too large"}


def test_stdio_exits_when_the_reader_of_stdout_goes_away() -> None:
    process = subprocess.Popen(
        [sys.executable, "-c", CHILD],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=child_env(),
    )
    assert process.stdin is not None and process.stdout is not None
    try:
        process.stdin.write(request(1, "initialize"))
        process.stdin.flush()
        assert orjson.loads(process.stdout.readline())["id"] == 1
        process.stdout.close()
        try:
            for request_id in range(2, 200):
                process.stdin.write(request(request_id, "echo", ["x" * 1000]))
            process.stdin.flush()
            process.stdin.close()
        except BrokenPipeError:
            pass  # the child already noticed its broken stdout and left
        assert process.wait(timeout=30) == 0
    finally:
        with contextlib.suppress(BrokenPipeError):
            process.stdin.close()
        if process.poll() is None:
            process.kill()
            process.wait()


@pytest.mark.parametrize("count", [2000])
def test_stdio_many_pipelined_requests(count: int) -> None:
    requests = request(0, "initialize") + b"".join(request(i, "echo", [i]) for i in range(1, count))
    done = subprocess.run(
        [sys.executable, "-c", CHILD],
        input=requests,
        capture_output=True,
        env=child_env(),
        timeout=30,
    )
    assert done.returncode == 0, done.stderr.decode()
    replies = parse_lines(done.stdout)
    assert [reply["id"] for reply in replies] == list(range(count))
