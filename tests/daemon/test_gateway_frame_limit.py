"""The frame limit on the gateway's ``/acp`` follows ``acp.sock``'s rule: a message
over ``acp.frame_limit`` is answered -32600 (id null) and the connection goes on,
whether it came as one frame or as fragments; the host never holds it whole."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

from .gateway_helpers import TOKENS, GatewayDaemon, ManualClient, gateway_config

FRAME_LIMIT = 4096


def limited_gateway(daemons: Any, scratch_dir: Path, limit: int = FRAME_LIMIT) -> GatewayDaemon:
    gateway_config(scratch_dir, f"[acp]\nframe_limit = {limit}\n")
    return GatewayDaemon(daemons(scratch_dir, "--gateway", "127.0.0.1:0"))


def peak_rss(pid: int) -> int:
    """The process's highest resident set size so far, in bytes (Linux: ``VmHWM``)."""
    status = Path(f"/proc/{pid}/status").read_text()
    kib = next(line.split()[1] for line in status.splitlines() if line.startswith("VmHWM:"))
    return int(kib) * 1024


def assert_too_large(answer: dict[str, Any]) -> None:
    assert (answer["id"], answer["error"]["code"]) == (None, -32600), answer


def assert_serves(client: Any) -> None:
    """The connection answers ``initialize`` and ``session/new`` as usual."""
    assert client.request("initialize", {"protocolVersion": 1})["protocolVersion"] == 1
    assert client.request("session/new", {})["sessionId"]


def test_one_frame_over_the_limit_is_answered_and_the_connection_goes_on(
        daemons: Any, scratch_dir: Path) -> None:
    gateway = limited_gateway(daemons, scratch_dir)
    with gateway.client() as big, gateway.client("bob") as other:
        big.ws.send(json.dumps({"jsonrpc": "2.0", "id": 9, "method": "session/list",
                                "params": {"cwd": "/" + "x" * 8192}}))
        assert_too_large(big.read_frame())
        assert_serves(big)
        assert other.request("session/list", {}) == {"sessions": []}


def test_a_fragmented_message_over_the_limit_is_answered_and_the_connection_goes_on(
        daemons: Any, scratch_dir: Path) -> None:
    """Each fragment is under the limit; their sum is not."""
    gateway = limited_gateway(daemons, scratch_dir)
    text = json.dumps({"jsonrpc": "2.0", "id": 9, "method": "session/list",
                       "params": {"cwd": "/" + "x" * 3 * FRAME_LIMIT}})
    fragments = [text[i:i + FRAME_LIMIT // 2] for i in range(0, len(text), FRAME_LIMIT // 2)]
    with gateway.client() as big:
        big.ws.send(fragments)
        assert_too_large(big.read_frame())
        assert_serves(big)
        big.ws.send(['{"jsonrpc": "2.0", "id": 77, "method": "session/li',  # under it
                     'st", "params": {}}'])
        assert len(big.wait_response(77)["result"]["sessions"]) == 1


def test_a_huge_frame_is_skipped_as_it_arrives_not_held_in_memory(
        daemons: Any, scratch_dir: Path) -> None:
    """128 MiB in one frame, against a 1 MiB limit: the host's peak RSS grows by far
    less than the frame, then the connection answers as usual."""
    size, limit = 128 * 1024 * 1024, 1024 * 1024
    gateway = limited_gateway(daemons, scratch_dir, limit)
    client = ManualClient(f"{gateway.ws}/acp", TOKENS["alice"])
    before = peak_rss(gateway.daemon.pid)
    # a text frame's header: FIN, masked, 64-bit length, a zero mask (the payload as is)
    client.sock.sendall(bytes([0x81, 0x80 | 127]) + struct.pack("!Q", size) + bytes(4))
    chunk = b"x" * limit
    for _ in range(size // limit):
        client.sock.sendall(chunk)
    answer, _ = client.read_until(None)  # type: ignore[arg-type]
    assert_too_large(answer)
    assert peak_rss(gateway.daemon.pid) - before < size // 4
    client.send({"jsonrpc": "2.0", "id": 1, "method": "initialize",
                 "params": {"protocolVersion": 1}})
    assert client.read_until(1)[0]["result"]["protocolVersion"] == 1
    client.close()
