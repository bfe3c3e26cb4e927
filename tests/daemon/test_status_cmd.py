"""``zeroclaw status``: exit codes, the human table, ``--json`` and ``--watch``."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable

from supervisor.cli.status_cmd import EXIT_DEGRADED, EXIT_OK, exit_code, render
from tests.e2e.procs import host_env

from .helpers import DaemonProc, short_dir, zeroclaw_argv

Daemons = Callable[..., DaemonProc]


def _status(daemon_or_dir: DaemonProc | str, *args: str) -> subprocess.CompletedProcess[str]:
    if isinstance(daemon_or_dir, DaemonProc):
        config, env = str(daemon_or_dir.config_dir), daemon_or_dir.env
    else:
        config, env = daemon_or_dir, host_env()
    return subprocess.run(zeroclaw_argv("status", "--config-dir", config, *args),
                          capture_output=True, text=True, timeout=30, env=env)


def test_exit_3_when_no_daemon_runs() -> None:
    config = short_dir()
    try:
        done = _status(str(config))
        assert done.returncode == 3
        assert "not running" in done.stderr
        assert done.stdout == ""
        # a stale socket file with nobody listening is "not running" too
        (config / "data").mkdir()
        dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        dead.bind(str(config / "data" / "daemon.sock"))
        dead.close()
        assert _status(str(config), "--json").returncode == 3
    finally:
        shutil.rmtree(config, ignore_errors=True)


def test_exit_4_when_the_daemon_does_not_answer() -> None:
    config = short_dir()
    silent = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        (config / "data").mkdir()
        silent.bind(str(config / "data" / "daemon.sock"))
        silent.listen(4)  # accepts (in the backlog) but never answers
        started = time.monotonic()
        done = _status(str(config))
        assert done.returncode == 4
        assert 4.5 <= time.monotonic() - started < 20
    finally:
        silent.close()
        shutil.rmtree(config, ignore_errors=True)


def test_usage_error_is_2() -> None:
    done = subprocess.run(zeroclaw_argv("status", "--bogus"), capture_output=True, text=True,
                          timeout=30, env=host_env())
    assert done.returncode == 2


def test_running_daemon_json_and_table(daemons: Daemons) -> None:
    daemon = daemons()
    with daemon.client() as client:
        sid = client.request("session/new")["sessionId"]
        done = _status(daemon, "--json")
        assert done.returncode == 0, done.stderr
        status = json.loads(done.stdout)
        assert status["pid"] == daemon.pid
        assert [s["sessionId"] for s in status["sessions"]] == [sid]
        table = _status(daemon)
        assert table.returncode == 0
        assert sid in table.stdout and f"pid {daemon.pid}" in table.stdout
        assert "WORKER PID" in table.stdout


def test_watch_redraws_until_interrupted(daemons: Daemons) -> None:
    daemon = daemons()
    proc = subprocess.Popen(
        zeroclaw_argv("status", "--config-dir", str(daemon.config_dir), "--watch", "--json"),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=daemon.env)
    try:
        assert proc.stdout is not None
        first = json.loads(proc.stdout.readline())
        second = json.loads(proc.stdout.readline())
        assert first["pid"] == second["pid"] == daemon.pid
        assert second["uptimeSecs"] > first["uptimeSecs"]
        proc.send_signal(signal.SIGINT)
        rest, errors = proc.communicate(timeout=10)
        # A loaded machine can print a degraded status (a worker slow to answer) just
        # before the interrupt; the exit code is the one of the last status printed.
        last = json.loads(rest.splitlines()[-1]) if rest.strip() else second
        assert (proc.returncode, errors) == (exit_code(last), "")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def test_degraded_when_a_worker_does_not_respond() -> None:
    healthy = {"workers": [{"pid": 1, "rssBytes": 10, "responsive": True}]}
    hung = {"workers": [{"pid": 1, "rssBytes": 10, "responsive": True},
                        {"pid": 2, "rssBytes": 10, "responsive": False}]}
    gone = {"workers": [{"pid": 3, "rssBytes": 0, "responsive": True}]}
    assert exit_code(healthy) == EXIT_OK
    assert exit_code(hung) == EXIT_DEGRADED
    assert exit_code(gone) == EXIT_DEGRADED
    assert "UNRESPONSIVE" in render({**hung, "sessions": []})


def test_agent_processes_are_listed_under_their_worker() -> None:
    agent = {"agentAlias": "claude", "pid": 4242, "rssBytes": 50 * 2**20, "cpuPercent": 1.5,
             "sessions": 3, "restarts": 1, "sandbox": "bwrap"}
    table = render({"sessions": [], "workers": [
        {"pid": 1, "rssBytes": 10, "cpuPercent": 0, "sessions": 3, "agents": [agent]},
        {"pid": 2, "rssBytes": 10, "cpuPercent": 0, "sessions": 0, "agents": []}]})
    lines = table.splitlines()
    row = lines.index(next(line for line in lines if line.strip().startswith("1 ")))
    assert lines[row + 1].split() == ["└", "4242", "50.0", "MiB", "1.5", "3", "agent",
                                      "claude,", "restarts", "1,", "sandbox", "bwrap"]
    assert lines[row + 2].strip().startswith("2 ")


def test_a_silent_worker_is_reported_unresponsive(daemons: Daemons) -> None:
    """A stopped worker misses heartbeats: status says so before the pool replaces it."""
    daemon = daemons()
    with daemon.client() as client:
        client.request("session/new")  # so that its worker is ready (it beats)
        workers = client.request("status")["workers"]
        daemon.snapshot_children()
        victim = next(w["pid"] for w in workers if w["sessions"])
        os.kill(victim, signal.SIGSTOP)  # alive but silent
        try:
            deadline = time.monotonic() + 20
            seen = None
            while seen is None and time.monotonic() < deadline:
                status = client.request("status")
                if any(not w["responsive"] for w in status["workers"]):
                    seen = status
                else:
                    time.sleep(0.05)
            assert seen is not None, "the silent worker was never reported"
            assert exit_code(seen) == EXIT_DEGRADED
            assert "UNRESPONSIVE" in render(seen)
        finally:
            with contextlib.suppress(ProcessLookupError):  # the pool may have replaced it
                os.kill(victim, signal.SIGCONT)
