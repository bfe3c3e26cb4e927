"""Two real ``zeroclaw daemon --gateway`` hosts on one PostgreSQL store know each other
only through it: ``status`` (daemon socket, ``zeroclaw status --json``, the gateway's
``/status``) shows this host's id and, to an admin, every host with its live sessions
and last heartbeat, ``/metrics`` the same as gauges; a tenant sees neither the other
hosts nor the other tenants' sessions of any host; a tenant removed on one host
(``zeroclaw tenant remove``) is refused by the other within seconds, its open
connection there closed.

Runs against the throw-away cluster of ``scripts/test`` (``tests/pg_support.py``).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from websockets.exceptions import InvalidStatus

from .gateway_helpers import TOKENS, GatewayDaemon, WsClient, gateway_config
from .helpers import DaemonProc, RpcFailure, short_dir, until, zeroclaw_argv

Daemons = Callable[..., DaemonProc]
WAIT_SECS = 10.0  # every wait below ends at the event, or fails after this


HostMaker = Callable[[str], GatewayDaemon]


@pytest.fixture
def hosts(daemons: Daemons, database: str) -> Iterator[HostMaker]:
    """``hosts(host_id)`` starts a gateway daemon on the test's database."""
    made: list[Path] = []

    def host(host_id: str) -> GatewayDaemon:
        made.append(short_dir())
        gateway_config(made[-1], f'[store]\nurl = "{database}"\nhost_id = "{host_id}"\n'
                                 "lease_ttl_secs = 6\n")
        return GatewayDaemon(daemons(made[-1], "--gateway", "127.0.0.1:0"))

    yield host
    for directory in made:
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def two_hosts(hosts: HostMaker) -> tuple[GatewayDaemon, GatewayDaemon]:
    return hosts("host-one"), hosts("host-two")


def status_of(gateway: GatewayDaemon, tenant: str) -> dict[str, Any]:
    code, body, _ = gateway.get("/status", tenant)
    assert code == 200, body
    answer: dict[str, Any] = json.loads(body)
    return answer


def live_by_host(status: dict[str, Any]) -> dict[str, int]:
    return {h["hostId"]: h["liveSessions"] for h in status.get("hosts", []) if h["alive"]}


def _with_live(status: dict[str, Any], wanted: dict[str, int]) -> dict[str, Any] | None:
    return status if live_by_host(status) == wanted else None


def test_status_and_metrics_show_every_host_to_an_admin_only(
        two_hosts: tuple[GatewayDaemon, GatewayDaemon]) -> None:
    one, two = two_hosts
    with one.client("alice") as alice, two.client("bob") as bob:
        alice.request("session/new", {})
        bob.request("session/new", {})
        bob.request("session/new", {})
        seen = until(lambda: _with_live(status_of(one, "ops"), {"host-one": 1, "host-two": 2}),
                     "both hosts' sessions")
        assert seen["hostId"] == "host-one"
        mine = [h for h in seen["hosts"] if h["self"]]
        assert [h["hostId"] for h in mine] == ["host-one"]
        assert all(0 <= h["lastHeartbeatSecsAgo"] < 6 for h in seen["hosts"])

        tenant_view = status_of(two, "alice")
        assert "hostId" not in tenant_view and "hosts" not in tenant_view
        assert tenant_view["sessions"] == []  # bob's two live sessions there are not hers

        code, metrics, _ = one.get("/metrics", "ops")
        assert code == 200
        assert 'zeroclaw_store_hosts{state="alive"} 2.0' in metrics
        assert 'zeroclaw_store_host_live_sessions{host_id="host-two"} 2.0' in metrics
        assert 'zeroclaw_store_host_heartbeat_age_seconds{host_id="host-one"}' in metrics
        assert one.get("/metrics", "alice")[0] == 403

        shown = subprocess.run(
            zeroclaw_argv("status", "--json", "--config-dir", str(two.daemon.config_dir)),
            capture_output=True, text=True, timeout=30, env=two.daemon.env)
        local = json.loads(shown.stdout)
        assert local["hostId"] == "host-two"
        assert {h["hostId"] for h in local["hosts"]} == {"host-one", "host-two"}
        text = subprocess.run(
            zeroclaw_argv("status", "--config-dir", str(two.daemon.config_dir)),
            capture_output=True, text=True, timeout=30, env=two.daemon.env).stdout
        assert "host: host-two" in text and "host-one: 1 live session(s)" in text

    assert two.daemon.terminate() == 0  # a host that stops leaves the list
    until(lambda: [h["hostId"] for h in status_of(one, "ops")["hosts"]] == ["host-one"],
          "host-two gone from the list")


def test_tenants_see_their_own_sessions_of_every_host_only(
        two_hosts: tuple[GatewayDaemon, GatewayDaemon]) -> None:
    one, two = two_hosts
    with one.client("alice") as alice, one.client("bob") as bob:
        hers = alice.request("session/new", {})["sessionId"]
        alice.request("session/prompt", {"sessionId": hers, "prompt": "alice on one"})
        his = bob.request("session/new", {})["sessionId"]
        bob.request("session/prompt", {"sessionId": his, "prompt": "bob on one"})
    with two.client("alice") as alice, two.client("bob") as bob:
        assert [s["sessionId"] for s in alice.request("session/list", {})["sessions"]] == [hers]
        assert [s["sessionId"] for s in bob.request("session/list", {})["sessions"]] == [his]
        for method in ("session/load", "session/resume"):
            with pytest.raises(RpcFailure) as refused:  # not "owned by host-one": unknown
                alice.request(method, {"sessionId": his})
            assert refused.value.code == -32000 and "host-one" not in str(refused.value)
        with pytest.raises(RpcFailure) as refused:
            alice.request("session/prompt", {"sessionId": his, "prompt": "mine?"})
        assert refused.value.code == -32000
    with two.daemon.client() as owner:  # the host's own socket lists every tenant's
        listed = {s["sessionId"] for s in owner.request("session/list")["sessions"]}
    assert listed == {hers, his}


def refused_status(url: str, token: str) -> int | None:
    try:
        with WsClient(url, token=token):
            return None
    except InvalidStatus as refused:
        return refused.response.status_code


def test_a_tenant_removed_on_one_host_is_refused_on_the_other_within_seconds(
        two_hosts: tuple[GatewayDaemon, GatewayDaemon], hosts: HostMaker,
        database: str) -> None:
    one, two = two_hosts
    with one.client("alice") as on_one:
        assert on_one.request("session/list", {}) == {"sessions": []}
    with two.client("alice") as on_two, two.client("bob") as bob:
        assert on_two.request("session/list", {}) == {"sessions": []}
        removed = subprocess.run(
            zeroclaw_argv("tenant", "--config-dir", str(one.daemon.config_dir), "remove",
                          "alice"), capture_output=True, text=True, timeout=30,
            env=one.daemon.env)
        assert removed.returncode == 0, removed.stderr
        assert "revoked in the shared store" in removed.stderr
        started = time.monotonic()
        with pytest.raises(ConnectionError):  # host-two closes her open connection
            on_two.read_frame(timeout=WAIT_SECS)
        assert time.monotonic() - started < 5
        assert (on_two.ws.close_code, on_two.ws.close_reason) == (1008, "token revoked")
        assert refused_status(f"{two.ws}/acp", TOKENS["alice"]) == 401
        assert refused_status(f"{one.ws}/acp", TOKENS["alice"]) == 401
        assert bob.request("session/list", {}) == {"sessions": []}  # another tenant: served
    late = hosts("host-three")  # its config.toml still has alice: the log wins
    until(lambda: late.get("/health")[0] == 200, "host-three up")
    assert refused_status(f"{late.ws}/acp", TOKENS["alice"]) == 401
    with late.client("bob") as bob:
        assert bob.request("session/list", {}) == {"sessions": []}
    with psycopg.connect(database) as check:
        logged = check.execute("SELECT tenant_id, host_id, token_sha256 "
                               "FROM tenant_revocations").fetchall()
    assert [(t, h) for t, h, _ in logged] == [("alice", "host-one")]
    assert TOKENS["alice"] not in json.dumps(logged)  # its hash only
    for host in (one, two):
        assert TOKENS["alice"] not in host.daemon.stderr()
