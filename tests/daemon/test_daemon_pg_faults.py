"""``zeroclaw daemon`` on a PostgreSQL server that fails under it: restarted mid-turn,
down for a while, cut off from one host by a partition (``tests/pg_cluster.py``: a
cluster of each test's own, and a relay that stops passing bytes).

What must hold: a turn fails with a clear -32603 (the store is unreachable; no password
in it or in the log), nothing of it is half-written, the host goes on serving what needs
no store and reconnects by itself; and a host that cannot renew its leases stops its
turns before another host can take their sessions over.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest

from tests.e2e.procs import write_config
from tests.pg_cluster import Partition, PrivateCluster, private_cluster

from .helpers import DaemonProc, RpcClient, RpcFailure

Daemons = Callable[..., DaemonProc]

WAIT = 30.0


@pytest.fixture
def pg() -> Iterator[PrivateCluster]:
    with private_cluster() as cluster:
        yield cluster


def host_config(config_dir: Path, url: str, host_id: str, ttl: float) -> Path:
    write_config(config_dir, f'[store]\nurl = "{url}"\npassword_env = "ZC_PG_PASSWORD"\n'
                             f'host_id = "{host_id}"\nlease_ttl_secs = {ttl}\n')
    return config_dir


def refused(call: Callable[[], object]) -> RpcFailure:
    with pytest.raises(RpcFailure) as info:
        call()
    return info.value


def stored(url: str, sid: str) -> tuple[int, list[str]]:
    """The session's turn count and its stored user messages, committed data only."""
    with psycopg.connect(url) as check:
        row = check.execute("SELECT turn_count FROM sessions WHERE id = %s", (sid,)).fetchone()
        texts = check.execute("SELECT content FROM messages WHERE session_id = %s AND "
                              "role = 'user' ORDER BY turn, seq", (sid,)).fetchall()
    assert row is not None
    return int(row[0]), [str(text) for text, in texts]


def test_a_restart_and_an_outage_fail_turns_clearly_and_the_host_reconnects_by_itself(
    daemons: Daemons, pg: PrivateCluster, host_dirs: Callable[[], Path]
) -> None:
    host = daemons(host_config(host_dirs(), pg.login_url, "zc-a", ttl=30),
                   env_extra={"ZC_PG_PASSWORD": pg.password})
    with host.client() as client:
        sid = client.request("session/new")["sessionId"]
        client.request("session/prompt", {"sessionId": sid, "prompt": "before"})
        # Restarted while a turn runs: the turn commits on a new connection.
        slow = client.send("session/prompt", {"sessionId": sid,
                                              "prompt": "slow\n!sleep 1\nacross the restart"})
        assert slow is not None
        client.wait_update("agent_message_chunk")
        pg.stop()
        pg.start()
        answer = client.wait_response(slow, WAIT)
        assert "across the restart" in answer["result"]["content"]
        # Down: turns and reads fail clearly; what needs no store still answers.
        pg.stop()
        failures = [refused(lambda: client.request(
            "session/prompt", {"sessionId": sid, "prompt": "during the outage"})),
            refused(lambda: client.request("session/list")),
            refused(lambda: client.request("session/load", {"sessionId": sid}))]
        for failure in failures:
            assert failure.code == -32603
            assert failure.message.startswith(("the store is unreachable (",
                                               "store write failed: the store is unreachable ("))
            assert pg.password not in failure.message
        status = client.request("status")
        assert status["store"]["backend"] == "postgresql"
        with host.client() as other:  # a new connection initializes
            assert other.request("status")["pid"] == host.pid
        pg.start()
        # Back: the next prompt succeeds on the same host, which reconnected by itself.
        after = client.request("session/prompt", {"sessionId": sid, "prompt": "after"})
        assert after["content"] == "after"
        assert [s["sessionId"] for s in client.request("session/list")["sessions"]] == [sid]
    assert stored(pg.url.replace("/postgres", "/zc_login"), sid) == (
        3, ["before", "slow\n!sleep 1\nacross the restart", "after"])  # nothing of the outage
    assert host.terminate() == 0
    assert pg.password not in host.stderr()


def lease_left(url: str, sid: str) -> tuple[str, float]:
    """The session's owner and how long its lease lasts, in the database's clock."""
    with psycopg.connect(url) as check:
        row = check.execute("SELECT host_id, expires_at - EXTRACT(EPOCH FROM "
                            "clock_timestamp()) FROM session_leases WHERE session_id = %s",
                            (sid,)).fetchone()
    assert row is not None
    return str(row[0]), float(row[1])


def load_when_free(client: RpcClient, sid: str, timeout: float = WAIT) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            client.request("session/load", {"sessionId": sid})
            return
        except RpcFailure as failure:  # until the cut-off host's lease runs out
            assert failure.code == -32004, failure
            assert time.monotonic() < deadline, "the lease never expired"
            time.sleep(0.05)


def test_a_host_cut_off_from_the_database_stops_its_turn_before_its_lease_can_expire(
    daemons: Daemons, pg: PrivateCluster, host_dirs: Callable[[], Path]
) -> None:
    ttl = 4.0
    partition = Partition(pg.port)
    database = pg.url.replace("/postgres", "/zc_login")
    try:
        env = {"ZC_PG_PASSWORD": pg.password}
        one = daemons(host_config(host_dirs(), partition.url(pg.login_url), "one", ttl),
                      env_extra=env)
        two = daemons(host_config(host_dirs(), pg.login_url, "two", ttl), env_extra=env)
        with one.client() as client, two.client() as other:
            sid = client.request("session/new")["sessionId"]
            client.request("session/prompt", {"sessionId": sid, "prompt": "on one"})
            running = client.send("session/prompt", {
                "sessionId": sid, "prompt": "started\n!sleep 60\nnever finished"})
            assert running is not None
            client.wait_update("agent_message_chunk")
            partition.cut()  # one's connections hang: no error, no answer
            answer = client.wait_response(running, WAIT)
            owner, left = lease_left(database, sid)
            assert owner == "one" and left > 0  # stopped while its lease still held
            assert answer["error"]["code"] == -32603
            assert "stopped here before another host could take it over" in \
                answer["error"]["message"]
            load_when_free(other, sid)  # once it expired: two takes it over
            replay = [u.get("text") for u in other.updates()
                      if u["type"] == "user_message_chunk"]
            assert replay == ["on one"]  # the stopped turn is not stored
            other.request("session/prompt", {"sessionId": sid, "prompt": "on two"})
            partition.heal()
            failure = refused(lambda: client.request(
                "session/prompt", {"sessionId": sid, "prompt": "back on one?"}))
            assert failure.code == -32004 and "owned by host two" in failure.message
        assert stored(database, sid) == (2, ["on one", "on two"])
        assert lease_left(database, sid)[0] == "two"
    finally:
        partition.close()
