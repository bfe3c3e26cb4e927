"""``zeroclaw acp`` with stdin/stdout that are not pipes (shell redirections, one socket
for both as ``socat EXEC:``, inetd and systemd socket units give)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess

import orjson

from ipc.events import TextItem
from tests.e2e.helpers import CANCEL_MARKER, stored_session
from tests.e2e.procs import descendants, host_argv, host_env

INIT = b'{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":1}}\n'


def test_stdin_from_dev_null_exits_at_once(tmp_path):
    done = subprocess.run(host_argv(tmp_path), stdin=subprocess.DEVNULL,
                          capture_output=True, env=host_env(), timeout=20)
    assert done.returncode == 0
    assert done.stdout == b""


def test_requests_from_a_file_answers_to_a_file(tmp_path):
    requests = tmp_path / "in.ndjson"
    requests.write_bytes(INIT + b'{"jsonrpc":"2.0","id":2,"method":"session/list","params":{}}\n')
    answers = tmp_path / "out.ndjson"
    with requests.open("rb") as stdin, answers.open("wb") as stdout:
        done = subprocess.run(host_argv(tmp_path / "cfg"), stdin=stdin, stdout=stdout,
                              stderr=subprocess.PIPE, env=host_env(), timeout=20)
    assert done.returncode == 0
    frames = [orjson.loads(line) for line in answers.read_bytes().splitlines()]
    assert [f["id"] for f in frames] == [1, 2]
    assert frames[1]["result"] == {"sessions": []}


def test_one_socket_for_stdin_and_stdout_serves_every_request(tmp_path, workspace):
    """asyncio's pipe transport takes a readable stdout for a closed one: with one
    socket for both, the second request used to end the connection."""
    ours, theirs = socket.socketpair()
    proc = subprocess.Popen(host_argv(tmp_path / "cfg"), stdin=theirs, stdout=theirs,
                            stderr=subprocess.PIPE, env=host_env())
    theirs.close()
    ours.settimeout(20)
    lines = ours.makefile("rb")

    def call(request_id: int, method: str, params: dict[str, object]) -> dict[str, object]:
        ours.sendall(orjson.dumps({"jsonrpc": "2.0", "id": request_id, "method": method,
                                   "params": params}) + b"\n")
        while True:
            frame = orjson.loads(lines.readline())
            if frame.get("id") == request_id and "method" not in frame:
                return dict(frame["result"])

    try:
        call(1, "initialize", {"protocolVersion": 1})
        sid = call(2, "session/new", {"cwd": str(workspace), "mcpServers": []})["sessionId"]
        for turn in range(3):
            answer = call(3 + turn, "session/prompt", {
                "sessionId": sid, "prompt": [{"type": "text", "text": f"turn {turn}"}]})
            assert answer["content"] == f"turn {turn}"
        ours.shutdown(socket.SHUT_WR)  # the client is done: EOF on stdin
        assert proc.wait(timeout=20) == 0
    finally:
        ours.close()
        if proc.poll() is None:
            proc.kill()
        assert proc.stderr is not None
        proc.stderr.close()
        proc.wait()


def test_stdout_to_dev_null_still_serves(tmp_path):
    done = subprocess.run(host_argv(tmp_path), input=INIT, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, env=host_env(), timeout=20)
    assert done.returncode == 0


def test_ask_directive_gets_no_answer_over_acp(raw_host, workspace):
    """ACP v1 has no question request for agents: ``!ask`` answers at once, unanswered."""
    raw_host.initialize()
    sid = raw_host.new_session(workspace)
    result = raw_host.call("session/prompt", {"sessionId": sid, "prompt": "!ask anyone?"})
    assert result == {"sessionId": sid, "stopReason": "end_turn", "content": "(no answer)"}


def test_sighup_mid_turn_ends_the_input_like_eof(raw_host, workspace, config_dir):
    """The editor's terminal went away: the running turn is cancelled, answered and
    stored, and ``zeroclaw acp`` exits 0 (the fixture checks nothing is left behind)."""
    raw_host.initialize()
    sid = raw_host.new_session(workspace)
    prompt_id = raw_host.new_id()
    raw_host.send({"jsonrpc": "2.0", "id": prompt_id, "method": "session/prompt",
                   "params": {"sessionId": sid, "prompt": "before\n!sleep 30\nafter"}})
    while raw_host.next_frame().get("method") != "session/update":
        pass  # the turn is running
    raw_host.children_snapshot = descendants(raw_host.pid)
    os.kill(raw_host.pid, signal.SIGHUP)
    response = raw_host.next_response()
    assert response["id"] == prompt_id
    assert response["result"]["stopReason"] == "cancelled"
    assert raw_host.proc.wait(20) == 0
    session, items = stored_session(config_dir, sid)
    assert session is not None and session.turn_count == 1
    assert isinstance(items[-1], TextItem) and items[-1].text.endswith(CANCEL_MARKER)
