"""Workers killed (``kill -9``) under many clients: the store agrees with every answer.

SPEC §5: a worker that dies fails its sessions' running turns (-32603 "session
worker exited"), and a turn the client saw complete is on disk. A client that
is told a turn failed retries it, so the store must not hold that turn as
completed either; and once the host holds a turn's record and commits it, the
client gets the turn's real result.

The race is made deterministic: while another connection holds SQLite's write
lock (:func:`tests.e2e.faults.exclusive_lock`), each client's turn ends in its
worker and its record waits for the writer; then every worker is killed, and
the lock released. A second phase kills workers at random moments while the
clients prompt freely. Clients are blocking sockets; the first phase drives
them from the test's main thread, the second from one thread per client.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from ipc.events import TextItem
from storage.store import StoreReader
from tests.e2e.faults import exclusive_lock, store_path
from tests.e2e.procs import alive, descendants, write_config

from .helpers import FRAME_TIMEOUT, DaemonProc, RpcClient, short_dir

Daemons = Callable[..., DaemonProc]

CLIENTS = 16
LOCKED_ROUNDS = 4
FREE_KILLS = 6
FREE_KILL_GAP_SECS = (0.05, 0.25)
WORKER_EXITED = {"code": -32603, "message": "session worker exited"}


@pytest.fixture
def config_dir() -> Iterator[Path]:
    directory = short_dir()
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


class Ledger:
    """What each prompt was answered: the prompt texts that succeeded and failed."""

    def __init__(self) -> None:
        self.succeeded: dict[str, list[str]] = {}
        self.failed: dict[str, list[str]] = {}
        self._lock = threading.Lock()

    def record(self, sid: str, text: str, response: dict[str, Any]) -> None:
        with self._lock:
            if "result" in response:
                assert response["result"]["content"] == text, response
                self.succeeded.setdefault(sid, []).append(text)
                return
            assert response["error"] == WORKER_EXITED, response
            self.failed.setdefault(sid, []).append(text)


def send_prompt(client: RpcClient, sid: str, text: str) -> int:
    request_id = client.send("session/prompt", {"sessionId": sid, "prompt": text})
    assert request_id is not None
    return request_id


def wait_turn_ended(client: RpcClient, sid: str, word: str,
                    request_id: int) -> dict[str, Any] | None:
    """Until ``sid``'s streamed answer has reached ``word`` (the turn ended in its
    worker); or the prompt's response, when it came first (a worker that died
    just before: the session was on it), which is returned."""
    deadline = time.monotonic() + FRAME_TIMEOUT
    while True:
        frame = client.read_frame(max(0.01, deadline - time.monotonic()))
        if frame.get("id") == request_id and "method" not in frame:
            return frame
        params = frame.get("params") or {}
        if (frame.get("method") == "session/update" and params.get("sessionId") == sid
                and params.get("type") == "agent_message_chunk" and word in params["text"]):
            return None


def kill_workers(daemon: DaemonProc) -> int:
    """``kill -9`` every worker of the daemon (its children); how many."""
    workers = [p for p in descendants(daemon.pid) if alive(p)]
    for worker in workers:
        os.kill(worker.pid, signal.SIGKILL)
    return len(workers)


def wait_all_dropped(client: RpcClient) -> None:
    """Until the daemon has dropped every session of the workers killed (none is live):
    the next prompts restore them on live workers."""
    deadline = time.monotonic() + FRAME_TIMEOUT
    while client.request("status")["activeSessions"]:
        assert time.monotonic() < deadline, "sessions of killed workers still live"
        time.sleep(0.02)


def locked_round(daemon: DaemonProc, clients: dict[str, RpcClient], round_no: int,
                 ledger: Ledger) -> None:
    """Every session's turn ends in its worker while its write waits; the workers die."""
    texts = {sid: f"locked round {round_no} of {sid} zzend" for sid in clients}
    answered: dict[str, dict[str, Any]] = {}
    with exclusive_lock(store_path(daemon.config_dir)):
        asked = {sid: send_prompt(client, sid, texts[sid]) for sid, client in clients.items()}
        for sid, client in clients.items():
            early = wait_turn_ended(client, sid, "zzend", asked[sid])
            if early is not None:
                answered[sid] = early
        assert kill_workers(daemon) > 0
    for sid, client in clients.items():
        response = answered.get(sid) or client.wait_response(asked[sid], FRAME_TIMEOUT)
        ledger.record(sid, texts[sid], response)
    wait_all_dropped(next(iter(clients.values())))


def free_running(daemon: DaemonProc, clients: dict[str, RpcClient], ledger: Ledger) -> None:
    """Clients prompt in a loop (one thread each) while workers die at random moments."""
    stop = threading.Event()

    def prompt_loop(sid: str, client: RpcClient) -> None:
        turn = 0
        while not stop.is_set():
            text = f"free turn {turn} of {sid}"
            ledger.record(sid, text, client.wait_response(send_prompt(client, sid, text)))
            turn += 1

    rng = random.Random(1234)
    with ThreadPoolExecutor(len(clients)) as pool:
        loops = [pool.submit(prompt_loop, sid, client) for sid, client in clients.items()]
        try:
            for _ in range(FREE_KILLS):
                time.sleep(rng.uniform(*FREE_KILL_GAP_SECS))  # a random moment, not a wait
                kill_workers(daemon)
        finally:
            stop.set()
        for loop in loops:
            loop.result(timeout=FRAME_TIMEOUT)


def stored_user_turns(config_dir: Path, sids: list[str]) -> dict[str, list[str]]:
    reader = StoreReader(store_path(config_dir))
    try:
        return {sid: [i.text for i in reader.load_items(sid)
                      if isinstance(i, TextItem) and i.role == "user"] for sid in sids}
    finally:
        reader.close()


def test_the_store_agrees_with_every_answer_across_worker_kills(
    daemons: Daemons, config_dir: Path
) -> None:
    write_config(config_dir, "[acp]\nmax_sessions = 100\n")
    daemon = daemons(config_dir)
    ledger = Ledger()
    opened = [daemon.client() for _ in range(CLIENTS)]
    try:
        clients = {c.request("session/new", {"keep_siblings": True})["sessionId"]: c
                   for c in opened}
        for round_no in range(LOCKED_ROUNDS):
            locked_round(daemon, clients, round_no, ledger)
        free_running(daemon, clients, ledger)
    finally:
        for client in opened:
            client.close()

    stored = stored_user_turns(daemon.config_dir, list(clients))
    for sid in clients:
        failed_but_stored = set(ledger.failed.get(sid, [])) & set(stored[sid])
        assert not failed_but_stored, f"answered -32603 yet stored: {sorted(failed_but_stored)}"
        assert stored[sid] == ledger.succeeded.get(sid, []), sid
    assert daemon.terminate() == 0
