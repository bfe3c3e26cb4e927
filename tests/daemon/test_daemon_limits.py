"""``zeroclaw daemon`` against resource abuse: unfinished frames, the open-file limit.

Real daemon processes; memory is the daemon's RSS and CPU its own cpu_times
(psutil), the log its stderr file.
"""

from __future__ import annotations

import errno
import resource
import socket
import time
from collections.abc import Callable
from contextlib import ExitStack, closing
from pathlib import Path

import psutil

from .helpers import DaemonProc, RpcClient

Daemons = Callable[..., DaemonProc]

MIB = 1024 * 1024


def _count(daemon: DaemonProc, text: str) -> int:
    return daemon.stderr_path.read_text(errors="replace").count(text)


def _wait_log(daemon: DaemonProc, text: str, times: int = 1, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while _count(daemon, text) < times:
        assert time.monotonic() < deadline, f"{times} x {text!r} not logged:\n{daemon.stderr()}"
        time.sleep(0.05)


def _rss(daemon: DaemonProc) -> int:
    return int(psutil.Process(daemon.pid).memory_info().rss)


def _nofile(soft: int, hard: int) -> Callable[[], None]:
    def limit() -> None:  # runs in the child, before exec
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

    return limit


def _limits(pid: int) -> tuple[int, int]:
    """(soft, hard) ``Max open files`` from ``/proc/<pid>/limits``."""
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            soft, hard = line.split()[3:5]
            return int(soft), int(hard)
    raise AssertionError("no open-files line")


# --- unfinished frames ---------------------------------------------------------------


def _unterminated_round(daemon: DaemonProc, blob: bytes, clients: int) -> None:
    """``clients`` connections (both sockets) each send ``blob`` with no newline, then close."""
    paths = [daemon.socket_path, daemon.socket_path.with_name("acp.sock")]
    with ExitStack() as stack:
        for number in range(clients):
            sock = stack.enter_context(socket.socket(socket.AF_UNIX, socket.SOCK_STREAM))
            sock.settimeout(30)
            sock.connect(str(paths[number % 2]))
            sock.sendall(blob)


def test_unfinished_frames_are_freed_when_their_connections_close(daemons: Daemons) -> None:
    """10 clients x 30 MiB without a newline, three times: the daemon's memory comes
    back each time, without waiting for a garbage collection."""
    daemon = daemons()
    with daemon.client() as client:
        client.request("status")  # the host is up
    blob = b"x" * (30 * MIB)
    closed = 1  # the probe of wait_listening
    _unterminated_round(daemon, blob, 10)  # warm-up: one-off allocations
    closed += 10 + 1
    _wait_log(daemon, " closed\n", closed)
    baseline = _rss(daemon)
    for _ in range(3):
        _unterminated_round(daemon, blob, 10)
        closed += 10
        _wait_log(daemon, " closed\n", closed)
        deadline = time.monotonic() + 5
        while _rss(daemon) > baseline + 50 * MIB and time.monotonic() < deadline:
            time.sleep(0.05)
        grown = (_rss(daemon) - baseline) / MIB
        assert grown < 50, f"RSS {grown:.0f} MiB over the baseline after the round"
    with daemon.client() as client:
        assert client.request("status")["pid"] == daemon.pid


def test_a_stalled_partial_frame_is_dropped_while_others_are_served(daemons: Daemons) -> None:
    daemon = daemons(env_extra={"ZEROCLAW_acp__partial_frame_timeout_secs": "1"})
    with daemon.client() as idle, closing(
            socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)) as staller:
        staller.connect(str(daemon.socket_path))
        started = time.monotonic()
        staller.sendall(b'{"jsonrpc":"2.0","id":1,"method":"initia')  # and nothing more
        with daemon.client() as other:  # served meanwhile
            assert other.request("status")["pid"] == daemon.pid
        staller.settimeout(20)
        assert staller.recv(100) == b"", "the stalled connection was not closed"
        assert time.monotonic() - started >= 0.9
        assert "made no progress for 1 s" in daemon.stderr()
        # a connection idle between frames is no partial frame: it stays
        assert idle.request("status")["pid"] == daemon.pid


# --- the open-file limit -----------------------------------------------------------


def test_the_soft_open_file_limit_is_raised_to_the_hard_one(daemons: Daemons) -> None:
    daemon = daemons(preexec_fn=_nofile(200, 1000))
    assert _limits(daemon.pid) == (1000, 1000)
    assert "raised the open-file limit from 200 to 1000" in daemon.stderr()


def _connect_until_refused(path: Path, into: list[socket.socket], most: int = 400) -> None:
    """Connect and keep the connections open until ``most`` are held or the daemon has
    taken none for a second (accepting stopped and its listen backlog is full)."""
    last_taken = time.monotonic()
    while len(into) < most and time.monotonic() - last_taken < 1.0:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.setblocking(False)
        if sock.connect_ex(str(path)) in (0, errno.EINPROGRESS):
            into.append(sock)
            last_taken = time.monotonic()
        else:  # EAGAIN: the backlog is full for now
            sock.close()
            time.sleep(0.01)


def _client_once_accepting(daemon: DaemonProc, timeout: float = 20.0) -> RpcClient:
    """A client, once the listen backlog has room again (the daemon drains it)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return RpcClient(daemon.socket_path)
        except BlockingIOError:  # EAGAIN: the backlog is still full
            assert time.monotonic() < deadline, f"no room for a client:\n{daemon.stderr()}"
            time.sleep(0.05)


def test_at_the_fd_limit_accepting_pauses_quietly_and_resumes(
        daemons: Daemons, flood: list[socket.socket]) -> None:
    """soft = hard = 128 (raising cannot help), clients connecting until the daemon
    stops taking them: one warning, no traceback, an idle CPU; once they close, new
    clients are served again."""
    daemon = daemons(preexec_fn=_nofile(128, 128))
    assert _limits(daemon.pid) == (128, 128)
    with daemon.client() as client:
        client.request("status")  # the host (workers, store) is up
    _connect_until_refused(daemon.socket_path, flood)
    assert len(flood) > 128, "the clients did not get past the daemon's fd limit"
    process = psutil.Process(daemon.pid)
    before = process.cpu_times()
    time.sleep(2.0)  # the window over which CPU use is measured
    after = process.cpu_times()
    busy = (after.user + after.system) - (before.user + before.system)
    assert busy < 0.2, f"the daemon used {busy:.2f} s of CPU in 2 s at its fd limit"
    log = daemon.stderr_path.read_text(errors="replace")
    assert "Traceback" not in log
    assert log.count("out of file descriptors") == 1
    assert len(log.splitlines()) < 2000, "the log grows at the fd limit"
    for sock in flood:
        sock.close()
    flood.clear()
    with _client_once_accepting(daemon) as client:
        assert client.request("status")["pid"] == daemon.pid
    assert daemon.terminate() == 0


def wait_workers(client: RpcClient, count: int, gone: int = 0) -> list[dict[str, object]]:
    """``status`` workers once ``count`` of them are responsive and pid ``gone`` is not."""
    deadline = time.monotonic() + 30
    while True:
        workers = client.request("status")["workers"]
        pids = [w["pid"] for w in workers if w["responsive"]]
        if len(pids) >= count and gone not in pids:
            return list(workers)
        assert time.monotonic() < deadline, f"workers: {workers}"
        time.sleep(0.1)


def test_at_the_fd_limit_the_host_keeps_descriptors_to_replace_a_worker(
        daemons: Daemons, flood: list[socket.socket]) -> None:
    """Connections never take the last descriptors: a worker killed while the
    daemon is at its limit is replaced, and a connected client gets a turn done."""
    daemon = daemons(preexec_fn=_nofile(128, 128))
    with daemon.client() as client:
        client.request("session/new")  # a worker runs
        workers = wait_workers(client, 1)
        _connect_until_refused(daemon.socket_path, flood)
        assert len(flood) > 128
        victim = workers[0]["pid"]
        psutil.Process(victim).kill()
        assert victim not in [w["pid"] for w in wait_workers(client, len(workers), victim)]
        sid = client.request("session/new")["sessionId"]
        result = client.request("session/prompt", {"sessionId": sid, "prompt": "still here"})
        assert result["stopReason"] == "end_turn"
    assert daemon.proc.poll() is None
