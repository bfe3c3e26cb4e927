"""``zeroclaw daemon`` on a PostgreSQL store (``[store] url``), end to end: a session made
and prompted, the daemon restarted, ``session/load`` replays the turn; the password of
``password_env`` shows nowhere (status, ``zeroclaw config``, the log, a worker's
environment); two hosts on one database: one owner per session (its lease), the
other refused with -32004 naming it, a killed host's sessions served by the other
after the lease TTL.

Runs against the throw-away cluster of ``scripts/test`` (``tests/pg_support.py``).
"""

from __future__ import annotations

import json
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest

from tests.e2e.procs import write_config
from tests.pg_support import password_role_login

from .helpers import FRAME_TIMEOUT, DaemonProc, RpcClient, RpcFailure, zeroclaw_argv

Daemons = Callable[..., DaemonProc]


def test_a_session_survives_a_restart_on_postgresql(daemons: Daemons, database: str) -> None:
    first = daemons(env_extra={"ZEROCLAW_store__url": database})
    with first.client() as client:
        sid = client.request("session/new")["sessionId"]
        answer = client.request("session/prompt", {"sessionId": sid,
                                                   "prompt": "kept in postgres"})
        assert answer["content"] == "kept in postgres"
        store = client.request("status")["store"]
        assert store == {**store, "backend": "postgresql", "path": database,
                         "persistent": True}
    assert first.terminate() == 0
    with psycopg.connect(database) as check:
        assert check.execute("SELECT turn_count FROM sessions WHERE id = %s",
                             (sid,)).fetchone() == (1,)
    second = daemons(first.config_dir, env_extra={"ZEROCLAW_store__url": database})
    with second.client() as client:
        listed = client.request("session/list")["sessions"]
        assert [s["sessionId"] for s in listed] == [sid]
        client.request("session/load", {"sessionId": sid})
        replay = [(u["type"], u.get("text")) for u in client.updates()]
        assert replay[0] == ("user_message_chunk", "kept in postgres")
        assert "".join(t or "" for k, t in replay if k == "agent_message_chunk") \
            == "kept in postgres"


@pytest.fixture
def password_role() -> Iterator[tuple[str, str]]:
    """See :func:`tests.pg_support.password_role_login`."""
    with password_role_login() as login:
        yield login


def test_the_store_password_shows_nowhere(
    daemons: Daemons, scratch_dir: Path, password_role: tuple[str, str]
) -> None:
    url, password = password_role
    write_config(scratch_dir, f'[store]\nurl = "{url}"\npassword_env = "ZC_STORE_PASSWORD"\n')
    daemon = daemons(scratch_dir, env_extra={"ZC_STORE_PASSWORD": password})
    with daemon.client() as client:
        sid = client.request("session/new")["sessionId"]
        client.request("session/prompt", {"sessionId": sid, "prompt": "hello"})
        status = client.request("status")
    assert status["store"]["backend"] == "postgresql" and status["store"]["path"] == url
    worker_pids = [worker["pid"] for worker in status["workers"]]
    assert worker_pids
    for pid in worker_pids:  # the daemon dropped the variable before starting any
        assert password.encode() not in Path(f"/proc/{pid}/environ").read_bytes()
    shown = subprocess.run(zeroclaw_argv("status", "--json", "--config-dir", str(scratch_dir)),
                           capture_output=True, text=True, timeout=30, env=daemon.env)
    assert shown.returncode == 0 and json.loads(shown.stdout)["store"]["path"] == url
    listed = subprocess.run(zeroclaw_argv("config", "list"), capture_output=True, text=True,
                            timeout=30,
                            env={**daemon.env, "ZEROCLAW_CONFIG_DIR": str(scratch_dir)})
    assert "ZC_STORE_PASSWORD" in listed.stdout + listed.stderr
    assert daemon.terminate() == 0
    for text in (json.dumps(status), shown.stdout, shown.stderr, listed.stdout, listed.stderr,
                 daemon.stderr()):
        assert password not in text


def test_a_wrong_password_stops_the_daemon_with_a_clear_error(
    daemons: Daemons, scratch_dir: Path, password_role: tuple[str, str]
) -> None:
    url, password = password_role
    wrong = password[::-1]
    write_config(scratch_dir, f'[store]\nurl = "{url}"\npassword_env = "ZC_STORE_PASSWORD"\n')
    daemon = daemons(scratch_dir, wait=False, env_extra={"ZC_STORE_PASSWORD": wrong})
    assert daemon.wait(30) == 1
    log = daemon.stderr()
    assert "password authentication failed" in log
    assert wrong not in log and password not in log


def _host_config(config_dir: Path, database: str, host_id: str, ttl: float = 30) -> Path:
    write_config(config_dir, f'[store]\nurl = "{database}"\nhost_id = "{host_id}"\n'
                             f"lease_ttl_secs = {ttl}\n")
    return config_dir


def _refused_by(owner: str, call: Callable[[], object]) -> None:
    with pytest.raises(RpcFailure) as info:
        call()
    assert info.value.code == -32004, info.value
    assert f"owned by host {owner}" in str(info.value)


def _leases(database: str) -> list[tuple[str, str]]:
    with psycopg.connect(database) as check:
        return [(str(sid), str(host)) for sid, host in check.execute(
            "SELECT session_id, host_id FROM session_leases ORDER BY session_id").fetchall()]


def test_two_hosts_share_sessions_and_a_lease_keeps_one_owner(
    daemons: Daemons, database: str, host_dirs: Callable[[], Path]
) -> None:
    one = daemons(_host_config(host_dirs(), database, "host-one"))
    two = daemons(_host_config(host_dirs(), database, "host-two"))
    with one.client() as client:
        sid = client.request("session/new")["sessionId"]
        client.request("session/prompt", {"sessionId": sid, "prompt": "made on one"})
        assert _leases(database) == [(sid, "host-one")]
        with two.client() as other:
            assert [s["sessionId"] for s in other.request("session/list")["sessions"]] == [sid]
            _refused_by("host-one", lambda: other.request("session/load", {"sessionId": sid}))
            _refused_by("host-one", lambda: other.request(
                "session/prompt", {"sessionId": sid, "prompt": "mine?"}))
        client.request("session/close", {"sessionId": sid})
        assert _leases(database) == []
    with two.client() as other:
        other.request("session/load", {"sessionId": sid})
        replay = [u.get("text") for u in other.updates() if u["type"] == "user_message_chunk"]
        assert replay == ["made on one"]
        other.request("session/prompt", {"sessionId": sid, "prompt": "then on two"})
        assert _leases(database) == [(sid, "host-two")]
        with one.client() as client:  # now the other way round
            _refused_by("host-two", lambda: client.request(
                "session/prompt", {"sessionId": sid, "prompt": "back on one?"}))
    assert two.terminate() == 0
    assert _leases(database) == []  # a host that stops frees its sessions


def test_a_killed_hosts_sessions_move_on_after_the_lease_ttl(
    daemons: Daemons, database: str, host_dirs: Callable[[], Path]
) -> None:
    one = daemons(_host_config(host_dirs(), database, "host-one", ttl=2))
    two = daemons(_host_config(host_dirs(), database, "host-two", ttl=2))
    with one.client() as client:
        sid = client.request("session/new")["sessionId"]
        client.request("session/prompt", {"sessionId": sid, "prompt": "before the crash"})
    one.proc.kill()
    one.wait(10)
    with two.client() as other:
        deadline = time.monotonic() + 10
        while True:
            try:
                other.request("session/load", {"sessionId": sid})
                break
            except RpcFailure as refused:  # until host-one's lease has run out
                assert refused.code == -32004 and "host-one" in str(refused)
                assert time.monotonic() < deadline, "the lease never expired"
                time.sleep(0.1)
        replay = [u.get("text") for u in other.updates() if u["type"] == "user_message_chunk"]
        assert replay == ["before the crash"]
        assert _leases(database) == [(sid, "host-two")]


class _StdioHost(RpcClient):
    """A ``zeroclaw acp`` process on ``config_dir``, its stdin and stdout one end of a
    socket pair (the editor's pipes), driven by :class:`RpcClient` on the other end."""

    def __init__(self, config_dir: Path) -> None:
        ours, theirs = socket.socketpair()
        self.proc = subprocess.Popen(zeroclaw_argv("acp", "--config-dir", str(config_dir)),
                                     stdin=theirs, stdout=theirs, stderr=subprocess.DEVNULL)
        theirs.close()
        ours.settimeout(FRAME_TIMEOUT)
        self.sock = ours
        self.notifications, self.frames = [], []
        self._buffer, self._next_id, self._sent_at = b"", 1, {}
        self.request("initialize", {"protocolVersion": 1})

    def close(self) -> None:
        self.sock.close()  # EOF: the host stops, releasing its leases
        self.proc.wait(timeout=FRAME_TIMEOUT)


def test_two_zeroclaw_acp_processes_on_one_config_are_two_hosts(
    database: str, host_dirs: Callable[[], Path]
) -> None:
    """Editors start a ``zeroclaw acp`` per window on one config: each is a host of its
    own (``<default id>:acp-<pid>``), so one never runs or frees the other's session."""
    config_dir = host_dirs()
    write_config(config_dir, f'[store]\nurl = "{database}"\n')
    with _StdioHost(config_dir) as first, _StdioHost(config_dir) as second:
        sid = first.request("session/new", {"cwd": str(config_dir.parent),
                                            "mcpServers": []})["sessionId"]
        first.request("session/prompt", {"sessionId": sid,
                                         "prompt": [{"type": "text", "text": "mine"}]})
        [(_, owner)] = _leases(database)
        assert owner.endswith(f":acp-{first.proc.pid}")
        _refused_by(owner, lambda: second.request(
            "session/load", {"sessionId": sid, "cwd": str(config_dir.parent),
                             "mcpServers": []}))
        first.close()
        assert _leases(database) == []
        second.request("session/load", {"sessionId": sid, "cwd": str(config_dir.parent),
                                        "mcpServers": []})
        [(_, owner)] = _leases(database)
        assert owner.endswith(f":acp-{second.proc.pid}")
