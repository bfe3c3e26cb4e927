"""A model that streams as fast as its server can, to editors that read normally (over
``zeroclaw acp``'s stdio and over ``acp.sock``): every byte arrives, the turn ends
``end_turn``, its stored output is complete, and neither the host nor the worker holds
the stream (the worker stops reading the model's HTTP body while the client lags, so
TCP back-pressure reaches the server). A client that stops reading is still dropped,
after ``client_stall_timeout_secs``, with its turn cancelled and kept."""

from __future__ import annotations

import socket
import time
from pathlib import Path
from typing import Any

import psutil

from tests.e2e.helpers import stored_session
from tests.e2e.model_server import ModelServer, Reply
from tests.e2e.model_streams import openai_chunk, openai_reply
from tests.e2e.procs import host_env, write_config
from tests.e2e.rawclient import RawHost

from .helpers import DaemonProc, RpcClient
from .test_daemon_load import wait_until
from .test_stalled_client import wait_closed_by_daemon

DELTAS = 200_000
DELTA_TEXT = "abcdefghijklmnopqrs "  # 20 characters: 4 MB of text in ~46 MB of SSE
EXPECTED = DELTA_TEXT * DELTAS
GROWTH_BOUND = 80 * 1024 * 1024
"""Peak RSS growth of the host and of the worker over the flood turn. The raw stream
is ~46 MB; held whole (as before: the worker read it all into a queue while its
client lagged, then sent it on as one chunk) the worker grew by ~170 MiB. Bounded,
each grows by the copies of the 4 MB text that a turn holds at its end (the answer,
the record's items and updates, their encodings): ~45-60 MiB for the worker, ~35 MiB
for ``zeroclaw acp``'s host and ~42 MiB for the daemon's (which keeps freed buffers
for reuse, see :mod:`supervisor.ops.heap`; 60-100 MiB before its malloc arenas were capped)."""
CANCEL_MARKER = "[turn cancelled via client]"


def flood_reply(deltas: int = DELTAS) -> Reply:
    reply = openai_reply()
    return Reply(events=reply.events, flood=(openai_chunk({"content": DELTA_TEXT}), deltas))


def model_config(server: ModelServer, root: Path, extra: str = "") -> str:
    return (f'{extra}[agents.main]\nprovider = "openai"\nbase_url = "{server.url}/v1"\n'
            f'model = "gpt-test"\nworkspace = "{root / "aws"}"\n'
            'context_window = 4000000\n[autonomy]\nlevel = "read_only"\n')


def peak_kib(pid: int) -> int:
    """VmHWM: the process's peak resident set so far."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmHWM for {pid}")


def peaks(host_pid: int) -> dict[str, int]:
    workers = psutil.Process(host_pid).children()
    assert len(workers) >= 1, "the host has no worker"
    return {"host": peak_kib(host_pid), **{f"worker {p.pid}": peak_kib(p.pid) for p in workers}}


def assert_bounded(before: dict[str, int], after: dict[str, int]) -> None:
    for name, peak in after.items():
        grown = (peak - before.get(name, peak)) * 1024
        assert grown < GROWTH_BOUND, f"{name}'s peak RSS grew by {grown >> 20} MiB"


def chunk_text(updates: list[dict[str, Any]], sid: str) -> str:
    return "".join(u["update"]["content"]["text"] for u in updates
                   if u.get("sessionId") == sid
                   and u["update"]["sessionUpdate"] == "agent_message_chunk")


def assert_stored_whole(config_dir: Path, sid: str) -> None:
    _, items = stored_session(config_dir, sid)
    texts = [getattr(item, "text", None) for item in items]
    assert texts[-2:] == ["flood", EXPECTED]


def test_a_fast_model_streams_whole_to_a_reading_client_over_stdio(tmp_path: Path) -> None:
    server = ModelServer()
    config_dir = tmp_path / "config"
    write_config(config_dir, model_config(server, tmp_path))
    host = RawHost(config_dir, tmp_path / "host.stderr", env=host_env())
    try:
        host.initialize()
        sid = host.call("session/new", {"cwd": str(tmp_path), "mcpServers": []})["sessionId"]
        server.script(openai_reply({"content": "warm"}), flood_reply())
        assert host.call("session/prompt", {"sessionId": sid, "prompt": "warm up"})[
            "content"] == "warm"
        before = peaks(host.pid)
        result = host.call("session/prompt", {"sessionId": sid, "prompt": "flood"}, timeout=120)
        after = peaks(host.pid)
        assert result["stopReason"] == "end_turn" and result["content"] == EXPECTED
        assert chunk_text([n["params"] for n in host.notifications], sid) == "warm" + EXPECTED
        assert_bounded(before, after)
    finally:
        host.close()
        server.close()
    assert_stored_whole(config_dir, sid)


def test_a_fast_model_streams_whole_to_a_reading_client_over_the_socket(
    daemons: Any, scratch_dir: Path,
) -> None:
    server = ModelServer()
    try:
        write_config(scratch_dir, model_config(server, scratch_dir, "[workers]\nmax = 1\n"))
        daemon: DaemonProc = daemons(scratch_dir)
        with RpcClient(daemon.socket_path.parent / "acp.sock") as editor:
            sid = editor.request("session/new", {"cwd": str(daemon.work_dir),
                                                 "mcpServers": []})["sessionId"]
            server.script(openai_reply({"content": "warm"}), flood_reply())
            editor.request("session/prompt", {"sessionId": sid, "prompt": "warm up"})
            before = peaks(daemon.pid)
            result = editor.request("session/prompt", {"sessionId": sid, "prompt": "flood"},
                                    timeout=120)
            after = peaks(daemon.pid)
            assert result["stopReason"] == "end_turn" and result["content"] == EXPECTED
            assert chunk_text(editor.updates(), sid) == "warm" + EXPECTED
            assert_bounded(before, after)
    finally:
        server.close()
    assert_stored_whole(scratch_dir, sid)


def test_a_client_that_stops_reading_a_fast_model_is_dropped_after_the_stall_limit(
    daemons: Any, scratch_dir: Path,
) -> None:
    server = ModelServer()
    try:
        write_config(scratch_dir, model_config(
            server, scratch_dir, "[acp]\nclient_stall_timeout_secs = 2\n[workers]\nmax = 1\n"))
        daemon: DaemonProc = daemons(scratch_dir)
        acp_path = daemon.socket_path.parent / "acp.sock"
        with RpcClient(acp_path) as stalled:
            stalled.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sid = stalled.request("session/new", {"cwd": str(daemon.work_dir),
                                                  "mcpServers": []})["sessionId"]
            server.script(flood_reply(2_000_000))
            started = time.monotonic()
            stalled.send("session/prompt", {"sessionId": sid, "prompt": "flood"})
            wait_until(lambda: "client stalled" in daemon.stderr_path.read_text(), 30,
                       "the client that reads nothing to be given up on")
            assert time.monotonic() - started >= 2
            wait_closed_by_daemon(stalled, timeout=10)
        with RpcClient(acp_path) as editor:  # the cancelled turn is kept
            deadline = time.monotonic() + 20
            while True:
                stored = stored_session(scratch_dir, sid)[1]
                if stored or time.monotonic() > deadline:
                    break
                time.sleep(0.05)
            assert editor.request("status")["pid"] == daemon.pid
        said = getattr(stored[-1], "text", "")
        assert said.startswith(DELTA_TEXT) and said.endswith(CANCEL_MARKER)
    finally:
        server.close()
