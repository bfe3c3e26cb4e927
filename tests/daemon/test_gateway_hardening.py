"""The gateway's HTTP hardening against a real daemon: every answer carries
``X-Content-Type-Options: nosniff`` (JSON, metrics, the status page, errors, the
library's own refusals, the upgrade), and the failed-login limiter counts an IPv6
client by its /64 network, tried from several real addresses of one /64 in a
network namespace of the daemon's own (so nothing is added to this machine's
interfaces), and from ``::1``."""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from .gateway_helpers import TOKENS, GatewayDaemon, gateway_config, http_get
from .helpers import FRAME_TIMEOUT, DaemonProc

LIMITS = "[gateway]\nauth_failures = 3\nauth_window_secs = 600\n"


def raw_status(host: str, port: int, request: bytes, source: str | None = None) -> tuple[int, str]:
    """The status code and the header block of the answer to one raw HTTP request."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.settimeout(FRAME_TIMEOUT)
        if source is not None:
            sock.bind((source, 0))
        sock.connect((host, port))
        sock.sendall(request)
        answer = b""
        while b"\r\n\r\n" not in answer:
            chunk = sock.recv(65536)
            if not chunk:
                break
            answer += chunk
    head = answer.split(b"\r\n\r\n", 1)[0].decode("latin-1")
    return int(head.split(" ", 2)[1]), head


def test_every_gateway_answer_says_nosniff(daemons: Any, scratch_dir: Path) -> None:
    gateway_config(scratch_dir, LIMITS)
    gateway = GatewayDaemon(daemons(scratch_dir, "--gateway", "127.0.0.1:0"))
    answers = [gateway.get("/health"), gateway.get("/status", "alice"), gateway.get("/status"),
               gateway.get("/metrics", "ops"), gateway.get("/metrics", "bob"),
               gateway.get("/"), gateway.get("/status_page.js"), gateway.get("/nowhere", "bob"),
               gateway.get("/acp", "bob")]  # a valid token but no upgrade: the library's 4xx
    assert answers[0][0] in (200, 503)  # 503 while the host's workers start
    assert [a[0] for a in answers[1:]] == [200, 401, 200, 403, 200, 200, 404, 426]
    for status, _, headers in answers:
        assert headers.get("X-Content-Type-Options") == "nosniff", status
    host, port = gateway.http.removeprefix("http://").rsplit(":", 1)
    too_long = b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 9000 + b"\r\n\r\n"
    status, head = raw_status(host, int(port), too_long)  # refused by the library itself
    assert status == 431 and "x-content-type-options: nosniff" in head.lower()
    upgrade = (b"GET /acp HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
               b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
               b"Authorization: Bearer " + TOKENS["bob"].encode() + b"\r\n\r\n")
    status, head = raw_status(host, int(port), upgrade)
    assert status == 101 and "x-content-type-options: nosniff" in head.lower()
    for _ in range(3):
        http_get(gateway.http + "/status", {"Authorization": "Bearer wrong"})
    limited = http_get(gateway.http + "/status", {"Authorization": f"Bearer {TOKENS['ops']}"})
    assert limited[0] == 429 and limited[2]["X-Content-Type-Options"] == "nosniff"


def test_the_limiter_still_blocks_an_ipv6_client(daemons: Any, scratch_dir: Path) -> None:
    gateway_config(scratch_dir, LIMITS)
    try:
        gateway = GatewayDaemon(daemons(scratch_dir, "--gateway", "[::1]:0"))
    except AssertionError as error:
        if "Cannot assign requested address" in str(error):
            pytest.skip("no IPv6 loopback here")
        raise
    wrong = {"Authorization": "Bearer wrong"}
    assert [http_get(gateway.http + "/status", wrong)[0] for _ in range(4)] == [401] * 3 + [429]
    right = {"Authorization": f"Bearer {TOKENS['alice']}"}
    assert http_get(gateway.http + "/status", right)[0] == 429


CLONE_NEWNET = 0x40000000
PREFIX = "2001:db8:7:8"  # documentation addresses, inside the daemon's namespace only


def _own_network_namespace() -> Any:
    """A ``preexec_fn``: the child gets a network namespace of its own (root only)."""
    unshare = ctypes.CDLL(None, use_errno=True).unshare

    def enter() -> None:
        if unshare(CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNET)")

    return enter


def in_namespace(pid: int, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["nsenter", f"--net=/proc/{pid}/ns/net", "--", *argv],
                          capture_output=True, text=True, timeout=FRAME_TIMEOUT, check=True)


_CLIENT = """
import json, socket, sys
port, attempts = int(sys.argv[1]), json.loads(sys.argv[2])
codes = []
for source, token in attempts:
    with socket.create_connection(("{prefix}::1", port), timeout=10,
                                  source_address=(source, 0)) as sock:
        sock.sendall(("GET /status HTTP/1.1\\r\\nHost: x\\r\\nAuthorization: Bearer "
                      + token + "\\r\\nConnection: close\\r\\n\\r\\n").encode())
        codes.append(int(sock.recv(4096).split(b" ", 2)[1]))
print(json.dumps(codes))
""".replace("{prefix}", PREFIX)


@pytest.mark.skipif(os.geteuid() != 0 or not (shutil.which("nsenter") and shutil.which("ip")),
                    reason="a network namespace needs root, nsenter and ip")
def test_failed_logins_from_one_ipv6_64_are_counted_together(
        daemons: Any, scratch_dir: Path) -> None:
    gateway_config(scratch_dir, LIMITS + "allow_plaintext = true\n")  # a namespace of its own
    daemon: DaemonProc = daemons(scratch_dir, "--gateway", "[::]:0",
                                 preexec_fn=_own_network_namespace())
    gateway = GatewayDaemon(daemon)
    port = int(gateway.http.rsplit(":", 1)[1])
    in_namespace(daemon.pid, "ip", "link", "set", "lo", "up")
    sources = [f"{PREFIX}::{n}" for n in (1, 2, 3, 4)] + [f"{PREFIX[:-1]}9::1"]
    for address in sources:
        in_namespace(daemon.pid, "ip", "-6", "addr", "add", f"{address}/64", "dev", "lo",
                     "nodad")
    attempts = [(sources[0], "wrong"), (sources[1], "wrong"), (sources[2], "wrong"),
                (sources[3], TOKENS["alice"]),  # a fourth address of that /64: blocked
                (sources[4], TOKENS["alice"])]  # the next /64: someone else
    codes = in_namespace(daemon.pid, sys.executable, "-c", _CLIENT, str(port),
                         json.dumps(attempts)).stdout
    assert json.loads(codes) == [401, 401, 401, 429, 200]
    assert f"3 wrong tokens from {PREFIX}::/64" in daemon.stderr()
