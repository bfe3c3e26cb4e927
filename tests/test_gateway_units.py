"""Units of the gateway: its configuration, the login limiter, tokens (no sockets), and
how it sets up an accepted connection (one loopback socket pair)."""

from __future__ import annotations

import asyncio
import hashlib
import socket
from pathlib import Path

import pytest

from supervisor.config.config import ConfigError
from supervisor.config.gateway_config import (
    exposure_problem,
    gateway_from_document,
    parse_listen,
    tenants_from_document,
)
from supervisor.host.tenants import tenant_of_token
from supervisor.servers.gateway import (
    AuthLimiter,
    _connect_accepted,
    _listening_socket,
    limiter_key,
)


@pytest.mark.parametrize(("text", "expected"), [
    ("127.0.0.1:8080", ("127.0.0.1", 8080)), ("[::1]:0", ("::1", 0)),
    ("localhost:9", ("localhost", 9)), (" 0.0.0.0:443 ", ("0.0.0.0", 443)),
])
def test_listen_addresses(text: str, expected: tuple[str, int]) -> None:
    assert parse_listen(text) == expected


@pytest.mark.parametrize("text", ["8080", "host", "1.2.3.4:99999", "::1:80", "a b:1", ""])
def test_bad_listen_addresses(text: str) -> None:
    with pytest.raises(ConfigError, match=r"gateway\.listen"):
        parse_listen(text)


@pytest.mark.parametrize(("section", "refused"), [
    ({"listen": "127.0.0.1:1"}, False), ({"listen": "[::1]:1"}, False),
    ({"listen": "localhost:1"}, False), ({"listen": "0.0.0.0:1"}, True),
    ({"listen": "example.com:1"}, True),
    ({"listen": "0.0.0.0:1", "allow_plaintext": True}, False),
    ({"listen": "0.0.0.0:1", "tls_cert": "/c.pem", "tls_key": "/k.pem"}, False),
])
def test_plain_http_only_on_loopback(section: dict[str, object], refused: bool) -> None:
    assert (exposure_problem(gateway_from_document(section)) is not None) == refused


@pytest.mark.parametrize(("section", "words"), [
    ({"tls_cert": "/c.pem"}, "go together"), ({"allow_plaintext": "yes"}, "true or false"),
    ({"auth_failures": 0}, "auth_failures"), ({"auth_window_secs": -1}, "auth_window_secs"),
    ({"listen": 8080}, "HOST:PORT"), ({"auth_ipv6_prefix": 0}, "auth_ipv6_prefix"),
    ({"auth_ipv6_prefix": 129}, "1 to 128"), ({"auth_ipv6_prefix": True}, "auth_ipv6_prefix"),
    ({"auth_ipv6_prefix": "64"}, "auth_ipv6_prefix"),
])
def test_bad_gateway_sections(section: dict[str, object], words: str) -> None:
    with pytest.raises(ConfigError, match=words):
        gateway_from_document(section)


def test_tenants_keep_hashes_and_check_their_keys() -> None:
    digest = hashlib.sha256(b"secret").hexdigest()
    tenants = tenants_from_document({"a": {"token_sha256": digest.upper(), "admin": True,
                                           "max_sessions": 2, "workspace_root": "/srv/a"}})
    assert tenants["a"].token_sha256 == digest and tenants["a"].admin
    assert tenants["a"].workspace_root == Path("/srv/a")
    assert tenant_of_token("secret", tenants) is tenants["a"]
    assert tenant_of_token("Secret", tenants) is None
    for bad, words in [({"token_sha256": "abc"}, "64 hex"),
                       ({"token_sha256": digest, "max_sessions": 0}, "max_sessions"),
                       ({"token_sha256": digest, "workspace_root": "rel"}, "absolute")]:
        with pytest.raises(ConfigError, match=words):
            tenants_from_document({"a": bad})
    with pytest.raises(ConfigError, match="tenant name"):
        tenants_from_document({"a b": {"token_sha256": digest}})


def test_the_limiter_blocks_within_its_window_and_forgets_after_it() -> None:
    now = [100.0]
    limiter = AuthLimiter(limit=2, window=10, clock=lambda: now[0])
    limiter.failed("a")
    assert limiter.blocked("a") == 0
    now[0] += 1
    limiter.failed("a")
    assert limiter.blocked("a") == pytest.approx(9.0)
    assert limiter.blocked("b") == 0  # per address
    now[0] += 9.5  # the first failure left the window
    assert limiter.blocked("a") == 0


@pytest.mark.parametrize(("address", "prefix", "key"), [
    ("192.0.2.7", 64, "192.0.2.7"),
    ("::ffff:192.0.2.7", 64, "192.0.2.7"),  # a dual-stack socket's IPv4 client
    ("2001:db8:1:2:aaaa::1", 64, "2001:db8:1:2::/64"),
    ("2001:db8:1:2:ffff:ffff:ffff:ffff", 64, "2001:db8:1:2::/64"),
    ("2001:db8:1:3::1", 64, "2001:db8:1:3::/64"),
    ("2001:db8:1:2:aaaa::1", 48, "2001:db8:1::/48"),
    ("2001:db8::1", 128, "2001:db8::1/128"),
    ("fe80::1:2%lo", 64, "fe80::/64"),
    ("::1", 64, "::/64"),
    ("unknown", 64, "unknown"),
])
def test_failed_logins_count_by_ipv4_address_and_ipv6_prefix(
        address: str, prefix: int, key: str) -> None:
    assert limiter_key(address, prefix) == key


def test_the_limiter_blocks_a_whole_ipv6_prefix_but_not_its_neighbours() -> None:
    limiter = AuthLimiter(limit=3, window=60, ipv6_prefix=64)
    for host in ("1", "2", "ff:0:3"):  # three addresses of one /64: one client
        limiter.failed(f"2001:db8:0:1::{host}")
    assert limiter.blocked("2001:db8:0:1:abcd::99") > 0
    assert limiter.blocked("2001:db8:0:2::1") == 0  # the next /64 is someone else
    limiter.failed("::ffff:198.51.100.1")
    limiter.failed("198.51.100.1")
    assert limiter.blocked("198.51.100.1") == 0
    limiter.failed("198.51.100.1")  # the mapped form counted as the same address
    assert limiter.blocked("::ffff:198.51.100.1") > 0
    assert limiter.blocked("198.51.100.2") == 0  # IPv4: per address
    narrow = AuthLimiter(limit=1, window=60, ipv6_prefix=128)
    narrow.failed("2001:db8::1")
    assert narrow.blocked("2001:db8::1") > 0 and narrow.blocked("2001:db8::2") == 0


def test_the_limiter_sweeps_old_addresses_when_many_fail(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [0.0]
    limiter = AuthLimiter(limit=3, window=1, clock=lambda: now[0])
    monkeypatch.setattr(AuthLimiter, "_SWEEP_AT", 100)
    for n in range(100):
        limiter.failed(f"10.0.0.{n}")
    now[0] = 5
    limiter.failed("10.0.1.1")
    assert list(limiter._failures) == ["10.0.1.1"]


def test_accepted_connections_send_without_waiting_for_acks() -> None:
    """Nagle's algorithm is off on an accepted connection's transport: with it on, a
    small frame written while the previous one is unacknowledged waits for the
    client's delayed ACK (about 40 ms), between a turn's first update and the rest."""

    async def accepted_nodelay() -> int:
        loop = asyncio.get_running_loop()
        with _listening_socket("127.0.0.1", 0) as listening:
            listening.setblocking(False)
            client = socket.create_connection(listening.getsockname()[:2], timeout=5)
            conn, _ = await asyncio.wait_for(loop.sock_accept(listening), 5)
            transport, _ = await _connect_accepted(asyncio.Protocol, conn, None)
            try:
                sock = transport.get_extra_info("socket")
                return int(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            finally:
                transport.close()
                client.close()

    assert asyncio.run(accepted_nodelay()) != 0
