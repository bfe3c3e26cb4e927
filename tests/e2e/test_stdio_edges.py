"""``zeroclaw acp`` with stdin/stdout that are not pipes (shell redirections)."""

from __future__ import annotations

import subprocess

import orjson

from tests.e2e.procs import host_argv, host_env

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
