"""A client that stops reading a long stream: its own session waits for it, the
others on the same worker go on, and past ``[acp] client_stall_timeout_secs`` it
is disconnected with its turn cancelled and stored."""

from __future__ import annotations

import socket
import time
from pathlib import Path
from typing import Any

import psutil

from tests.e2e.procs import write_config

from .helpers import RpcClient, wait_session_idle, work_dir

STALL_SECS = 2
BIG_PROMPT = "w " * 1_500_000  # 3 MB, streamed back word by word
RSS_BOUND = 256 * 1024 * 1024  # growth of the worker; unbounded it reached GBs
CANCEL_MARKER = "[turn cancelled via client]"


def only_worker(daemon_pid: int) -> psutil.Process:
    deadline = time.monotonic() + 15
    while True:
        workers = psutil.Process(daemon_pid).children()
        if len(workers) == 1:
            return workers[0]
        assert time.monotonic() < deadline, f"want one worker, have {workers}"
        time.sleep(0.05)


def wait_closed_by_daemon(client: RpcClient, timeout: float = 20.0) -> None:
    """Read (and drop) what the daemon sent until it closes the connection."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        client.sock.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            if not client.sock.recv(1 << 20):
                return
        except ConnectionResetError:
            return
    raise AssertionError("the daemon kept the stalled connection open")


def stalled_turn_replay(acp_path: Path, sid: str, cwd: str) -> list[dict[str, Any]]:
    """``session/load`` on acp.sock; the replayed updates."""
    with RpcClient(acp_path) as editor:
        editor.request("session/load", {"sessionId": sid, "cwd": cwd, "mcpServers": []},
                       timeout=30)
        return [n["params"]["update"] for n in editor.notifications
                if n.get("method") == "session/update"]


def test_a_client_that_never_reads_is_cut_off_and_nobody_else_suffers(
    daemons: Any, scratch_dir: Path
) -> None:
    write_config(scratch_dir, f"[acp]\nclient_stall_timeout_secs = {STALL_SECS}\n"
                              "[workers]\nmax = 1\n")
    daemon = daemons(scratch_dir)
    with daemon.client() as sibling, daemon.client() as stalled:
        stalled.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sib = sibling.request("session/new", {})["sessionId"]
        sid = stalled.request("session/new", {})["sessionId"]
        worker = only_worker(daemon.pid)
        baseline = worker.memory_info().rss
        started = time.monotonic()
        stalled.send("session/prompt", {"sessionId": sid, "prompt": BIG_PROMPT})
        peak = baseline
        for n in range(20):  # the sibling on the same worker keeps its pace meanwhile
            text = f"sibling turn {n}"
            assert sibling.request("session/prompt", {"sessionId": sib, "prompt": text},
                                   timeout=15)["content"] == text
            peak = max(peak, worker.memory_info().rss)
        deadline = time.monotonic() + 30
        while not [s for s in sibling.request("status")["sessions"]
                   if s["sessionId"] == sid and s["state"] == "idle" and s["turns"] == 1]:
            peak = max(peak, worker.memory_info().rss)
            assert time.monotonic() < deadline, "the stalled turn was never settled"
            time.sleep(0.05)
        assert time.monotonic() - started >= STALL_SECS
        assert peak - baseline < RSS_BOUND, f"worker grew by {(peak - baseline) >> 20} MiB"
        wait_closed_by_daemon(stalled)
        assert worker.is_running() and only_worker(daemon.pid).pid == worker.pid
        wait_session_idle(sibling, sid, 1)
        assert sibling.request("session/prompt", {"sessionId": sib, "prompt": "after"},
                               timeout=15)["content"] == "after"
    replay = stalled_turn_replay(daemon.socket_path.parent / "acp.sock", sid,
                                 str(work_dir(scratch_dir)))
    assert replay[0]["sessionUpdate"] == "user_message_chunk"
    assert replay[0]["content"]["text"] == BIG_PROMPT.strip() or \
        replay[0]["content"]["text"] == BIG_PROMPT
    said = "".join(u["content"]["text"] for u in replay
                   if u["sessionUpdate"] == "agent_message_chunk")
    assert said.endswith(CANCEL_MARKER) and said.startswith("w w")
