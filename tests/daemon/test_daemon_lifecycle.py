"""``zeroclaw daemon``: socket claim, permissions, second daemon, stale sockets, SIGTERM,
and the ephemeral lifetime. Real daemon processes in short temporary config dirs."""

from __future__ import annotations

import os
import signal
import socket
import stat
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from .helpers import DaemonProc, zeroclaw_argv

Daemons = Callable[..., DaemonProc]


def _mode(path: os.PathLike[str] | str) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_socket_is_0600_in_a_0700_dir_and_the_lock_names_the_pid(daemons: Daemons) -> None:
    daemon = daemons()
    assert stat.S_ISSOCK(os.lstat(daemon.socket_path).st_mode)
    assert _mode(daemon.socket_path) == 0o600
    assert _mode(daemon.socket_path.parent) == 0o700
    lock = daemon.socket_path.with_name("daemon.sock.lock")
    assert lock.read_text().strip() == str(daemon.pid)


def test_existing_data_dir_is_tightened_to_0700(daemons: Daemons, scratch_dir: Path) -> None:
    config = scratch_dir
    (config / "data").mkdir(mode=0o755)
    os.chmod(config / "data", 0o755)
    daemon = daemons(config)
    assert _mode(daemon.socket_path.parent) == 0o700


def test_zeroclaw_socket_env_creates_a_private_dir(daemons: Daemons, scratch_dir: Path) -> None:
    base = scratch_dir
    path = base / "sub" / "d.sock"
    daemon = daemons(None, env_extra={"ZEROCLAW_SOCKET": str(path)})
    assert daemon.socket_path == path
    assert _mode(path) == 0o600
    assert _mode(path.parent) == 0o700
    with daemon.client() as client:
        assert client.request("status")["pid"] == daemon.pid
    assert daemon.terminate() == 0
    assert not path.exists()


def test_a_socket_in_a_sticky_shared_dir_is_warned_about(
        daemons: Daemons, scratch_dir: Path) -> None:
    """Like /tmp (1777): the sticky bit does not make a directory private."""
    shared = scratch_dir / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    daemon = daemons(None, env_extra={"ZEROCLAW_SOCKET": str(shared / "d.sock")})
    assert f"{shared} is accessible to other users (mode 1777)" in daemon.stderr()
    assert _mode(shared) == 0o1777  # not ours to tighten
    assert _mode(shared / "d.sock") == 0o600


def test_second_daemon_is_refused_with_the_owner_pid(daemons: Daemons) -> None:
    first = daemons()
    second = daemons(first.config_dir, wait=False)
    assert second.wait(20) == 1
    assert f"pid {first.pid}" in second.stderr()
    # the first one is untouched and still serving
    with first.client() as client:
        assert client.request("status")["pid"] == first.pid
    assert first.socket_path.exists()


def test_stale_socket_is_replaced(daemons: Daemons, scratch_dir: Path) -> None:
    config = scratch_dir
    path = config / "data" / "daemon.sock"
    path.parent.mkdir(mode=0o700)
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(str(path))  # bound, never listening: nothing answers
    dead.close()
    daemon = daemons(config)
    with daemon.client() as client:
        assert client.request("status")["pid"] == daemon.pid
    assert "removing stale socket" in daemon.stderr()
    assert _mode(path) == 0o600


def test_a_file_in_the_way_is_left_alone(daemons: Daemons, scratch_dir: Path) -> None:
    config = scratch_dir
    path = config / "data" / "daemon.sock"
    path.parent.mkdir(mode=0o700)
    path.write_text("not a socket")
    daemon = daemons(config, wait=False)
    assert daemon.wait(20) == 1
    assert "not a socket" in daemon.stderr()
    assert path.read_text() == "not a socket"


def test_a_lock_file_that_is_a_symlink_is_not_followed(
    daemons: Daemons, scratch_dir: Path
) -> None:
    config = scratch_dir
    data = config / "data"
    data.mkdir(mode=0o700)
    victim = config / "victim"
    victim.write_text("precious")
    (data / "daemon.sock.lock").symlink_to(victim)
    daemon = daemons(config, wait=False)
    assert daemon.wait(20) == 1
    assert "symbolic link" in daemon.stderr()
    assert victim.read_text() == "precious"


def test_a_socket_path_over_the_limit_fails_clearly(daemons: Daemons, scratch_dir: Path) -> None:
    base = scratch_dir
    long_path = base / ("x" * 120) / "d.sock"
    daemon = daemons(None, env_extra={"ZEROCLAW_SOCKET": str(long_path)}, wait=False)
    assert daemon.wait(20) == 1
    assert "106-byte limit" in daemon.stderr()


def test_sigterm_cancels_the_running_turn_answers_it_and_exits_0(daemons: Daemons) -> None:
    daemon = daemons()
    with daemon.client() as client:
        sid = client.request("session/new")["sessionId"]
        prompt_id = client.send("session/prompt", {"sessionId": sid,
                                                   "prompt": "before\n!sleep 30\nafter"})
        client.wait_update("agent_message_chunk")
        daemon.snapshot_children()
        daemon.proc.send_signal(15)
        response = client.wait_response(prompt_id)
        assert response["result"]["stopReason"] == "cancelled"
        assert response["result"]["content"].endswith("[turn cancelled via client]")
        assert daemon.wait(20) == 0
    assert not daemon.socket_path.exists()
    # the cancelled turn was persisted: a new daemon restores it and prompts on
    again = daemons(daemon.config_dir)
    with again.client() as client:
        result = client.request("session/prompt", {"sessionId": sid, "prompt": "more"})
        assert result["stopReason"] == "end_turn"
        status = client.request("status")
        assert [s["turns"] for s in status["sessions"] if s["sessionId"] == sid] == [2]


def test_sighup_mid_turn_stops_cleanly_like_sigterm(daemons: Daemons) -> None:
    """A hang-up of the daemon's terminal reaches its whole process group (the workers
    too): the running turn is cancelled, answered and stored, both sockets go, exit 0."""
    daemon = daemons(preexec_fn=os.setpgrp)
    acp_socket = daemon.socket_path.with_name("acp.sock")
    with daemon.client() as client:
        sid = client.request("session/new")["sessionId"]
        prompt_id = client.send("session/prompt", {"sessionId": sid,
                                                   "prompt": "before\n!sleep 30\nafter"})
        client.wait_update("agent_message_chunk")
        daemon.snapshot_children()
        os.killpg(daemon.pid, signal.SIGHUP)
        response = client.wait_response(prompt_id)
        assert response["result"]["stopReason"] == "cancelled"
        assert daemon.wait(20) == 0
    assert "received SIGHUP: stopping" in daemon.stderr()
    assert not daemon.socket_path.exists() and not acp_socket.exists()
    again = daemons(daemon.config_dir)
    with again.client() as client:
        result = client.request("session/prompt", {"sessionId": sid, "prompt": "more"})
        assert result["stopReason"] == "end_turn"
        status = client.request("status")
        assert [s["turns"] for s in status["sessions"] if s["sessionId"] == sid] == [2]


def test_sigint_exits_0_and_removes_the_socket(daemons: Daemons) -> None:
    daemon = daemons()
    daemon.snapshot_children()
    daemon.proc.send_signal(2)
    assert daemon.wait(20) == 0
    assert not daemon.socket_path.exists()


def test_a_replaced_socket_is_not_removed_at_exit(daemons: Daemons) -> None:
    daemon = daemons()
    daemon.socket_path.unlink()
    squatter = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        squatter.bind(str(daemon.socket_path))
        assert daemon.terminate() == 0
        assert daemon.socket_path.exists()
    finally:
        squatter.close()


# --- ephemeral -----------------------------------------------------------------


def test_ephemeral_waits_for_a_first_client_then_exits_after_the_last(
    daemons: Daemons,
) -> None:
    daemon = daemons(None, "--ephemeral")
    with pytest.raises(subprocess.TimeoutExpired):
        daemon.proc.wait(2.0)  # nobody has connected yet: it stays
    client = daemon.client()
    client.request("session/new")
    daemon.snapshot_children()
    client.close()
    left = time.monotonic()
    assert daemon.wait(10) == 0
    elapsed = time.monotonic() - left
    assert 0.8 <= elapsed <= 2.5, elapsed
    assert not daemon.socket_path.exists()


def test_ephemeral_survives_a_reconnect_within_the_grace_second(daemons: Daemons) -> None:
    daemon = daemons(None, "--ephemeral")
    first = daemon.client()
    daemon.snapshot_children()
    first.close()
    time.sleep(0.3)  # inside the grace second, deliberately
    second = daemon.client()
    with pytest.raises(subprocess.TimeoutExpired):
        daemon.proc.wait(1.5)  # the pending exit was cancelled
    assert second.request("status")["pid"] == daemon.pid
    second.close()
    assert daemon.wait(10) == 0


def test_status_command_sees_no_daemon_after_exit(daemons: Daemons) -> None:
    daemon = daemons()
    assert daemon.terminate() == 0
    done = subprocess.run(zeroclaw_argv("status", "--config-dir", str(daemon.config_dir)),
                          capture_output=True, timeout=30, env=daemon.env)
    assert done.returncode == 3
