"""Tenants shared by every host of one PostgreSQL store (``shared_tenants``): two real
``zeroclaw daemon --gateway`` hosts on one database; ``zeroclaw tenant add bob`` run
against host one's configuration makes a tenant whose printed token opens a session on
host two within seconds, without a restart; bob sees only his own sessions on both;
``zeroclaw tenant remove bob`` against host two stops his token on both (his open
connection closed); the token is nowhere in the database or the hosts' logs. A name
configured in a host's ``config.toml`` wins there over a shared tenant of that name.

Runs against the throw-away cluster of ``scripts/test`` (``tests/pg_support.py``).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest
from websockets.exceptions import InvalidStatus

from tests.e2e.procs import write_config

from .gateway_helpers import GatewayDaemon, WsClient
from .helpers import DaemonProc, short_dir, until, zeroclaw_argv

Daemons = Callable[..., DaemonProc]
HostMaker = Callable[..., GatewayDaemon]
WAIT_SECS = 10.0  # every wait below ends at the event, or fails after this
ALICE = "alice-local-token-0123456789"  # in both hosts' config.toml
CAROL_LOCAL = "carol-local-token-0123456789"  # host two's own carol


def _section(name: str, token: str) -> str:
    return f'[tenants.{name}]\ntoken_sha256 = "{hashlib.sha256(token.encode()).hexdigest()}"\n'


@pytest.fixture
def hosts(daemons: Daemons, database: str) -> Iterator[HostMaker]:
    """``hosts(host_id, extra_tenants)`` starts a gateway daemon on the test's database,
    alice (and ``extra_tenants`` TOML) in its config.toml."""
    made: list[Path] = []

    def host(host_id: str, extra_tenants: str = "") -> GatewayDaemon:
        made.append(short_dir())
        write_config(made[-1], f'[store]\nurl = "{database}"\nhost_id = "{host_id}"\n'
                               "lease_ttl_secs = 6\n\n" + _section("alice", ALICE)
                     + extra_tenants)
        return GatewayDaemon(daemons(made[-1], "--gateway", "127.0.0.1:0"))

    yield host
    for directory in made:
        shutil.rmtree(directory, ignore_errors=True)


def tenant_cmd(host: GatewayDaemon, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        zeroclaw_argv("tenant", "--config-dir", str(host.daemon.config_dir), *args),
        capture_output=True, text=True, timeout=30, env=host.daemon.env)


def served(host: GatewayDaemon, count: int) -> bool:
    """Whether ``host`` serves ``count`` shared tenants (its watch logs each change, and
    the daemon what it then serves)."""
    log = host.daemon.stderr()
    found = log.rfind(f"{count} shared tenant(s) in the store")
    return found >= 0 and "shared tenants changed in the store" in log[found:]


def refused_status(url: str, token: str) -> int | None:
    """None when ``token`` opens a connection, else the HTTP status that refused it."""
    try:
        with WsClient(url, token=token):
            return None
    except InvalidStatus as refused:
        return refused.response.status_code


def dump_tables(database: str) -> str:
    """Every row of every table of the database, as text."""
    with psycopg.connect(database) as check:
        tables = [name for (name,) in check.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public'").fetchall()]
        return json.dumps({t: check.execute(f'SELECT * FROM "{t}"').fetchall()
                           for t in tables}, default=str)


def session_ids(client: WsClient) -> set[str]:
    return {s["sessionId"] for s in client.request("session/list", {})["sessions"]}


def test_a_tenant_added_on_one_host_serves_on_the_other_and_stops_on_both(
        hosts: HostMaker, database: str) -> None:
    one, two = hosts("host-one"), hosts("host-two")
    added = tenant_cmd(one, "add", "bob", "--max-sessions", "4")
    assert added.returncode == 0, added.stderr
    assert "added to the shared store" in added.stderr
    token = added.stdout.strip()
    assert len(token) >= 32 and token not in added.stderr
    assert "[tenants.bob]" not in (one.daemon.config_dir / "config.toml").read_text()
    # each host's poll logs what it found (no token tried early: failed tries are throttled)
    until(lambda: served(one, 1) and served(two, 1), "bob served on both")
    assert refused_status(f"{two.ws}/acp", token) is None
    with WsClient(f"{one.ws}/acp", token=ALICE) as alice:
        hers = alice.request("session/new", {})["sessionId"]
    with WsClient(f"{two.ws}/acp", token=token) as bob_two, \
            WsClient(f"{one.ws}/acp", token=token) as bob_one:
        on_two = bob_two.request("session/new", {})["sessionId"]
        bob_two.request("session/prompt", {"sessionId": on_two, "prompt": "bob on two"})
        on_one = bob_one.request("session/new", {})["sessionId"]
        assert session_ids(bob_two) == session_ids(bob_one) == {on_two, on_one}
        with WsClient(f"{two.ws}/acp", token=ALICE) as alice:
            assert session_ids(alice) == {hers}
        listed = tenant_cmd(two, "list", "--json")
        assert listed.returncode == 0, listed.stderr
        rows = {row["name"]: row for row in json.loads(listed.stdout)}
        assert (rows["alice"]["where"], rows["bob"]["where"]) == ("local", "shared")
        assert (rows["bob"]["maxSessions"], rows["bob"]["createdBy"]) == (4, "host-one")
        text = tenant_cmd(two, "list").stdout
        assert "bob " in text and text.splitlines()[-1].endswith(" shared")
        digest = hashlib.sha256(token.encode()).hexdigest()
        for shown in (listed.stdout, text):
            assert token not in shown and digest not in shown
        assert digest in dump_tables(database)  # its hash only
        removed = tenant_cmd(two, "remove", "bob")
        assert removed.returncode == 0, removed.stderr
        assert "removed from the shared store" in removed.stderr
        with pytest.raises(ConnectionError):  # host one closes his open connection
            bob_one.read_frame(timeout=WAIT_SECS)
        assert (bob_one.ws.close_code, bob_one.ws.close_reason) == (1008, "token revoked")
    until(lambda: "tenants revoked in the shared store" in two.daemon.stderr(),
          "host two's poll applies the revocation")
    assert refused_status(f"{one.ws}/acp", token) == 401
    assert refused_status(f"{two.ws}/acp", token) == 401
    assert refused_status(f"{two.ws}/acp", ALICE) is None  # the local tenant: served
    with psycopg.connect(database) as check:
        assert check.execute("SELECT count(*) FROM shared_tenants").fetchone() == (0,)
        assert check.execute("SELECT host_id FROM tenant_revocations").fetchall() \
            == [("host-two",)]
    assert token not in dump_tables(database)
    for host in (one, two):
        assert token not in host.daemon.stderr()
    again = tenant_cmd(one, "remove", "bob")
    assert (again.returncode, again.stderr.strip()) == (1, "zeroclaw tenant: no tenant bob")


def test_a_name_in_config_toml_wins_over_the_shared_tenant_of_that_name(
        hosts: HostMaker) -> None:
    one = hosts("host-one")
    two = hosts("host-two", _section("carol", CAROL_LOCAL))
    refused = tenant_cmd(one, "add", "alice")
    assert refused.returncode == 1 and refused.stdout == ""
    assert "configured in this host's config.toml" in refused.stderr
    added = tenant_cmd(one, "add", "carol")
    assert added.returncode == 0, added.stderr
    shared = added.stdout.strip()
    twice = tenant_cmd(two, "add", "carol")  # local on two: refused there
    assert twice.returncode == 1 and "config.toml" in twice.stderr
    taken = tenant_cmd(one, "add", "carol")
    assert taken.returncode == 1 and "already exists in the shared store" in taken.stderr
    until(lambda: served(one, 1), "carol shared on one")
    assert refused_status(f"{one.ws}/acp", shared) is None
    until(lambda: "tenant carol is both in config.toml and shared" in two.daemon.stderr(),
          "host two warns of the clash")
    assert refused_status(f"{two.ws}/acp", shared) == 401  # two serves its own carol
    assert refused_status(f"{two.ws}/acp", CAROL_LOCAL) is None
    assert [r["where"] for r in json.loads(tenant_cmd(two, "list", "--json").stdout)
            if r["name"] == "carol"] == ["local", "shadowed"]


def test_a_shared_tenant_is_checked_as_a_config_toml_section_is(
        hosts: HostMaker, database: str) -> None:
    """``add`` refuses on a shared store what it refuses in config.toml (a name that is
    no tenant name, a cap below 1), storing nothing; a malformed row another release or
    a hand edit left in the table is not served, the valid ones are."""
    one = hosts("host-one")
    for args, why in ((["add", "../x"], "tenant name"),
                      (["add", "dave", "--max-sessions", "0"], "max_sessions")):
        refused = tenant_cmd(one, *args)
        assert refused.returncode == 2 and refused.stdout == "", refused.stderr
        assert why in refused.stderr
    with psycopg.connect(database) as check:
        assert check.execute("SELECT count(*) FROM shared_tenants").fetchone() == (0,)
        check.execute(
            "INSERT INTO shared_tenants (name, tenant_id, token_sha256, admin, max_sessions,"
            " workspace_root, sandbox_network, created_at, updated_at, created_by) VALUES"
            " ('eve', 'eve-id', 'not-a-hash', false, NULL, NULL, true, 0, 0, 'by-hand')")
    added = tenant_cmd(one, "add", "frank")
    assert added.returncode == 0, added.stderr
    until(lambda: served(one, 1), "frank served on one, eve not")
    assert "shared tenant 'eve' not served" in one.daemon.stderr()
    assert refused_status(f"{one.ws}/acp", added.stdout.strip()) is None
