"""Load and misbehaving clients on ``daemon.sock`` (issue 3 acceptance), against a real daemon.

- 64 concurrent clients x 20 turns: every turn answered, every turn in the store,
  no leaked processes or file descriptors.
- A client that never sends, one that stalls mid-line and one that never reads
  do not slow a normal client; the one that never reads is disconnected.

Clients are blocking sockets on worker threads (one per client); the test's main
thread waits on them with bounded joins.
"""

from __future__ import annotations

import shutil
import socket
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
import pytest

from ipc.events import TextItem
from storage.store import StoreReader
from tests.e2e.procs import descendants, reap_leaks, write_config

from .helpers import DaemonProc, short_dir

Daemons = Callable[..., DaemonProc]

CLIENTS = 64
TURNS = 20
FD_MARGIN = 8
HIGH_WATER = 256 * 1024
STUCK_PROMPT_BYTES = 1024 * 1024


@pytest.fixture
def config_dir() -> Iterator[Path]:
    directory = short_dir()
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


def wait_until(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def prompt_text(client: int, turn: int) -> str:
    return f"client {client} turn {turn} says hello"


def run_turns(daemon: DaemonProc, client_no: int, turns: int,
              start: threading.Barrier | None = None) -> str:
    """One client: its own session, ``turns`` prompts checked; the session id."""
    with daemon.client() as client:
        sid: str = client.request("session/new", {"keep_siblings": True})["sessionId"]
        if start is not None:
            start.wait(timeout=30)
        for turn in range(turns):
            text = prompt_text(client_no, turn)
            result = client.request("session/prompt", {"sessionId": sid, "prompt": text},
                                    timeout=30)
            assert result == {"sessionId": sid, "stopReason": "end_turn", "content": text}
            complete = [u for u in client.updates() if u["type"] == "turn_complete"]
            assert len(complete) == turn + 1
            assert complete[-1] == {"sessionId": sid, "type": "turn_complete",
                                    "outcome": "completed", "content": text}
        return sid


def stored_user_messages(config_dir: Path, session_ids: list[str]) -> dict[str, list[str]]:
    """User prompts per session, read back through the store's read API."""
    reader = StoreReader(config_dir / "data" / "sessions" / "acp-sessions.db")
    try:
        return {sid: [i.text for i in reader.load_items(sid)
                      if isinstance(i, TextItem) and i.role == "user"] for sid in session_ids}
    finally:
        reader.close()


def worker_pids(daemon: DaemonProc) -> set[int]:
    with daemon.client() as client:
        return {w["pid"] for w in client.request("status")["workers"]}


def test_64_clients_x_20_turns_lose_nothing_and_leak_nothing(
        daemons: Daemons, config_dir: Path) -> None:
    write_config(config_dir, "[acp]\nmax_sessions = 100\n")
    daemon = daemons(config_dir)
    run_turns(daemon, -1, 1)  # warm up: workers and store are open before the baseline
    process = psutil.Process(daemon.pid)
    wait_until(lambda: worker_pids(daemon) == {p.pid for p in descendants(daemon.pid)},
               10, "the daemon's children to be its workers")
    fds_before = process.num_fds()

    start = threading.Barrier(CLIENTS)
    with ThreadPoolExecutor(CLIENTS) as pool:
        futures = [pool.submit(run_turns, daemon, n, TURNS, start) for n in range(CLIENTS)]
        sessions = {n: f.result(timeout=50) for n, f in enumerate(futures)}
    assert len(set(sessions.values())) == CLIENTS

    stored = stored_user_messages(config_dir, list(sessions.values()))
    for n, sid in sessions.items():
        assert stored.get(sid) == [prompt_text(n, t) for t in range(TURNS)], sid

    children = {p.pid for p in descendants(daemon.pid)}
    assert children == worker_pids(daemon), "the daemon's children are not just its workers"
    wait_until(lambda: process.num_fds() <= fds_before + FD_MARGIN, 10,
               f"daemon fds back near {fds_before} (now {process.num_fds()})")

    daemon.snapshot_children()
    workers = list(daemon.children)
    assert daemon.terminate() == 0
    assert reap_leaks(workers, timeout=10) == []


def connect_raw(path: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(15)
    sock.connect(str(path))
    return sock


def start_non_reader(daemon: DaemonProc) -> socket.socket:
    """Initialize, open a session, ask for a huge answer, then never read again."""
    client = daemon.client()
    client.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sid = client.request("session/new", {"keep_siblings": True})["sessionId"]
    client.send("session/prompt", {"sessionId": sid, "prompt": "x" * STUCK_PROMPT_BYTES})
    return client.sock


def disconnected(sock: socket.socket, timeout: float) -> bool:
    """Drain ``sock`` until the daemon closes it; False if it is still open at ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            if not sock.recv(1 << 20):
                return True
        except ConnectionError:
            return True
        except TimeoutError:
            return False
    return False


def timed_turns(daemon: DaemonProc, client_no: int) -> float:
    started = time.monotonic()
    run_turns(daemon, client_no, TURNS)
    return time.monotonic() - started


def test_misbehaving_clients_do_not_slow_the_others(daemons: Daemons) -> None:
    daemon = daemons(env_extra={"ZEROCLAW_WRITE_HIGH_WATER": str(HIGH_WATER),
                                "ZEROCLAW_acp__client_stall_timeout_secs": "2"})
    baseline = timed_turns(daemon, 0)

    silent = connect_raw(daemon.socket_path)
    half_line = connect_raw(daemon.socket_path)
    half_line.sendall(b'{"jsonrpc": "2.0", "id": 1, "method": "initia')
    non_reader = start_non_reader(daemon)
    try:
        elapsed = timed_turns(daemon, 1)
        assert elapsed < max(5.0, 5 * baseline), (elapsed, baseline)
        # the whole log: its tail is the huge prompt (logged by the store at debug level)
        wait_until(lambda: b"client stalled" in daemon.stderr_path.read_bytes(), 20,
                   "the non-reading client to be dropped")
        assert disconnected(non_reader, 10)
        elapsed = timed_turns(daemon, 2)
        assert elapsed < max(5.0, 5 * baseline), (elapsed, baseline)
        # the idle and the stalled client are still connected, and the host still serves
        assert not disconnected(silent, 0.1) and not disconnected(half_line, 0.1)
        with daemon.client() as client:
            assert client.request("status")["pid"] == daemon.pid
    finally:
        for sock in (silent, half_line, non_reader):
            sock.close()
    assert daemon.terminate() == 0
