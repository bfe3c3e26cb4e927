"""SPEC §6: the daemon's ``acp.sock`` and ``zeroclaw acp --attach`` — many editors, one host."""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.e2e.procs import host_env, reap_leaks

from .helpers import RpcClient, RpcFailure, short_dir, work_dir, zeroclaw_argv


def texts(client: RpcClient, kind: str) -> list[str]:
    return [u["update"]["content"]["text"] for u in client.updates()
            if u.get("update", {}).get("sessionUpdate") == kind]


def test_two_connections_share_a_session_on_acp_sock(daemons: Any) -> None:
    daemon = daemons()
    acp_path = daemon.socket_path.parent / "acp.sock"
    assert stat.S_IMODE(os.stat(acp_path).st_mode) == 0o600
    with RpcClient(acp_path) as first, RpcClient(acp_path) as second:
        sid = first.request("session/new", {"cwd": str(daemon.work_dir)})["sessionId"]
        first.request("session/prompt", {"sessionId": sid, "prompt": "written by one"})
        loaded = second.request("session/load", {"sessionId": sid, "cwd": str(daemon.work_dir)})
        assert loaded["modes"]["currentModeId"] == "supervised"
        assert texts(second, "user_message_chunk") == ["written by one"]
        result = second.request("session/prompt", {"sessionId": sid, "prompt": "and two"})
        assert result["content"] == "and two"
    with daemon.client() as ops:
        status = ops.request("status")
    assert [(s["sessionId"], s["turns"]) for s in status["sessions"]] == [(sid, 2)]
    assert daemon.terminate() == 0
    assert not acp_path.exists()


def refused(client: RpcClient, method: str, params: dict[str, Any]) -> Any:
    """The error code ``client`` gets for ``method`` (the request must fail)."""
    try:
        client.request(method, params)
    except RpcFailure as failure:
        return failure.code
    raise AssertionError(f"{method} succeeded")


def clients_of(daemon: Any) -> dict[str, int]:
    with daemon.client() as ops:
        return {s["sessionId"]: s["clients"] for s in ops.request("status")["sessions"]}


def test_ownership_is_one_table_for_both_sockets(daemons: Any) -> None:
    """A daemon.sock client cannot touch an acp.sock editor's session, and the reverse;
    ``session/load`` on acp.sock joins a session's holders; a gone holder frees it."""
    daemon = daemons()
    acp_path, cwd = daemon.socket_path.parent / "acp.sock", str(daemon.work_dir)
    editor = RpcClient(acp_path)
    with daemon.client() as ops:
        mine = editor.request("session/new", {"cwd": cwd})["sessionId"]
        theirs = ops.request("session/new", {"cwd": cwd})["sessionId"]
        for method in ("session/prompt", "session/cancel", "session/close"):
            params = {"sessionId": mine, "prompt": "hijack"}
            assert refused(ops, method, params) == -32003, method
        for method in ("session/prompt", "session/set_mode", "session/close", "session/delete"):
            params = {"sessionId": theirs, "prompt": "hijack", "modeId": "full"}
            assert refused(editor, method, params) == -32003, method
        assert clients_of(daemon) == {mine: 1, theirs: 1}
        editor.request("session/load", {"sessionId": theirs, "cwd": cwd})
        assert clients_of(daemon) == {mine: 1, theirs: 2}
        assert editor.request("session/prompt", {"sessionId": theirs, "prompt": "shared"})[
            "content"] == "shared"
        editor.close()
        deadline = time.monotonic() + 10
        while clients_of(daemon) != {mine: 0, theirs: 1}:
            assert time.monotonic() < deadline, clients_of(daemon)
            time.sleep(0.02)  # the daemon notices the closed connection
        assert ops.request("session/prompt", {"sessionId": mine, "prompt": "adopted"})[
            "content"] == "adopted"
        assert clients_of(daemon) == {mine: 1, theirs: 1}


def test_a_second_editor_loads_a_session_while_its_turn_runs(daemons: Any) -> None:
    """The turn goes on for the editor that prompted it; the loader gets the completed
    turns replayed, then can prompt once the turn is over."""
    daemon = daemons()
    acp_path, cwd = daemon.socket_path.parent / "acp.sock", str(daemon.work_dir)
    with RpcClient(acp_path) as first, RpcClient(acp_path) as second:
        sid = first.request("session/new", {"cwd": cwd})["sessionId"]
        first.request("session/prompt", {"sessionId": sid, "prompt": "completed turn"})
        running = first.send("session/prompt", {"sessionId": sid, "prompt":
                                                '!tool shell {"command": "echo held"}\nheld turn'})
        ask = first.read_frame()
        while ask.get("method") != "session/request_permission":
            ask = first.read_frame()
        second.request("session/load", {"sessionId": sid, "cwd": cwd})
        assert texts(second, "user_message_chunk") == ["completed turn"]
        first.sock.sendall(json.dumps({"jsonrpc": "2.0", "id": ask["id"], "result": {
            "outcome": {"outcome": "selected", "optionId": "allow-once"}}}).encode() + b"\n")
        assert running is not None
        assert first.wait_response(running)["result"]["stopReason"] == "end_turn"
        assert second.request("session/prompt", {"sessionId": sid, "prompt": "from two"})[
            "content"] == "from two"


def test_acp_sock_initialize_wants_an_integer_protocol_version(daemons: Any) -> None:
    """As on stdio: "one" is -32602 naming protocolVersion; any integer, 0 too, gets 1;
    ``sessionTimeoutSecs`` is an integer."""
    daemon = daemons()
    with RpcClient(daemon.socket_path.parent / "acp.sock", initialize=False) as editor:
        with pytest.raises(RpcFailure) as info:
            editor.request("initialize", {"protocolVersion": "one"})
        assert info.value.code == -32602 and "protocolVersion" in info.value.message
        result = editor.request("initialize", {"protocolVersion": 0})
        assert result["protocolVersion"] == 1
        assert type(result["_meta"]["zeroclaw"]["sessionTimeoutSecs"]) is int


def test_a_prompt_to_an_unknown_id_does_not_claim_it(daemons: Any) -> None:
    daemon = daemons()
    unknown = str(uuid.uuid4())
    with RpcClient(daemon.socket_path.parent / "acp.sock") as editor, daemon.client() as ops:
        assert refused(editor, "session/prompt", {"sessionId": unknown, "prompt": "x"}) == -32000
        assert ops.request("session/new", {"sessionId": unknown})["sessionId"] == unknown
        assert clients_of(daemon) == {unknown: 1}
        assert refused(editor, "session/close", {"sessionId": unknown}) == -32003


def test_two_editors_resuming_one_evicted_session_at_once_both_get_it(daemons: Any) -> None:
    """The second resume waits for the first's restore and joins it, instead of
    racing it to a second open (-32602 "already active")."""
    config_dir = short_dir()
    (config_dir / "config.toml").write_text("[acp]\nmax_sessions = 1\n")
    daemon = daemons(config_dir)
    acp_path, cwd = daemon.socket_path.parent / "acp.sock", str(work_dir(config_dir))
    with RpcClient(acp_path) as one, RpcClient(acp_path) as two, daemon.client() as ops:
        sid = ops.request("session/new", {"keep_siblings": True})["sessionId"]
        for n in range(20):  # enough history that the restore takes a moment
            ops.request("session/prompt", {"sessionId": sid, "prompt": f"turn {n} " * 200})
        ops.request("session/new", {"keep_siblings": True})  # evicts sid (max_sessions 1)
        resume = {"sessionId": sid, "cwd": cwd, "mcpServers": []}
        asked = [(client, client.send("session/resume", resume)) for client in (one, two)]
        for client, request_id in asked:
            assert request_id is not None
            assert "result" in client.wait_response(request_id), client.frames[-1]
        assert clients_of(daemon)[sid] == 3  # its creator and both editors


@pytest.mark.parametrize("socket_name", ["acp.sock", "daemon.sock"])
def test_a_client_gone_while_its_session_is_created_holds_nothing(
    daemons: Any, socket_name: str
) -> None:
    """The client sends session/new and half-closes at once (as ``--attach`` does when
    the editor's stdin ends): the answer still comes, and the session is free."""
    daemon = daemons()
    with RpcClient(daemon.socket_path.parent / socket_name) as leaving:
        request_id = leaving.send("session/new", {"cwd": str(daemon.work_dir)})
        leaving.sock.shutdown(socket.SHUT_WR)
        assert request_id is not None
        sid = leaving.wait_response(request_id)["result"]["sessionId"]
    deadline = time.monotonic() + 10
    while clients_of(daemon) != {sid: 0}:
        assert time.monotonic() < deadline, clients_of(daemon)
        time.sleep(0.02)
    with daemon.client() as ops:
        assert ops.request("session/prompt", {"sessionId": sid, "prompt": "free"})[
            "content"] == "free"


def open_descriptors(pid: int) -> list[str]:
    """What the open descriptors of ``pid`` point at (``pipe:[N]``, paths, sockets)."""
    fds = Path(f"/proc/{pid}/fd")
    return [os.readlink(fd) for fd in fds.iterdir()]


class Editor:
    """``zeroclaw acp --attach`` as an editor spawns it, spoken to over its stdio
    (``attach``: the words after ``--attach``, e.g. a gateway URL and its options)."""

    def __init__(self, config_dir: Path, env: dict[str, str], pass_fds: tuple[int, ...] = (),
                 attach: tuple[str, ...] = ()):
        self.stderr = tempfile.TemporaryFile()  # noqa: SIM115 - outlives __init__; see quit
        self.proc = subprocess.Popen(
            zeroclaw_argv("acp", "--attach", *attach, "--config-dir", str(config_dir)),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr, env=env,
            pass_fds=pass_fds)
        self.next_id = 0
        self.updates: list[dict[str, Any]] = []

    def send(self, method: str, params: Any) -> int:
        assert self.proc.stdin is not None
        self.next_id += 1
        frame = {"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params}
        self.proc.stdin.write(json.dumps(frame).encode() + b"\n")
        self.proc.stdin.flush()
        return self.next_id

    def answer(self, request_id: int) -> dict[str, Any]:
        """The response to ``request_id``; updates on the way are kept."""
        assert self.proc.stdout is not None
        while True:
            answer = json.loads(self.proc.stdout.readline())
            if answer.get("method") == "session/update":
                self.updates.append(answer["params"]["update"])
            elif answer.get("id") == request_id:
                return answer

    def request(self, method: str, params: Any) -> Any:
        answer = self.answer(self.send(method, params))
        assert "error" not in answer, answer
        return answer["result"]

    def stderr_text(self) -> str:
        self.stderr.seek(0)
        return self.stderr.read().decode("utf-8", "replace")

    def quit(self) -> int:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        code = self.proc.wait(15)
        self.stderr.close()
        return code


def test_attach_starts_an_ephemeral_daemon_that_editors_share() -> None:
    config_dir = short_dir()
    env = host_env({"ZEROCLAW_SOCKET": str(config_dir / "d.sock")})
    editor_pipe = os.pipe()  # a descriptor the editor lets --attach inherit
    one = Editor(config_dir, env, pass_fds=editor_pipe)
    assert one.request("initialize", {"protocolVersion": 1})["agentInfo"]["name"] == "zeroclaw-acp"
    sid = one.request("session/new", {"cwd": str(work_dir(config_dir))})["sessionId"]
    assert one.request("session/prompt", {"sessionId": sid, "prompt": "first editor"})[
        "stopReason"] == "end_turn"
    daemon_pid = int((config_dir / "d.sock.lock").read_text())
    assert psutil.Process(daemon_pid).ppid() != one.proc.pid  # nobody's child (double fork)
    pipe_ids = {os.readlink(f"/proc/self/fd/{fd}") for fd in editor_pipe}
    assert not pipe_ids & set(open_descriptors(daemon_pid))  # the daemon did not inherit it
    for fd in editor_pipe:
        os.close(fd)
    workers = psutil.Process(daemon_pid).children(recursive=True)
    two = Editor(config_dir, env)
    two.request("initialize", {"protocolVersion": 1})
    two.request("session/load", {"sessionId": sid, "cwd": str(work_dir(config_dir))})
    assert [u["content"]["text"] for u in two.updates
            if u["sessionUpdate"] == "user_message_chunk"] == ["first editor"]
    assert two.request("session/prompt", {"sessionId": sid, "prompt": "second"})[
        "content"] == "second"
    status = subprocess.run(zeroclaw_argv("status", "--json", "--config-dir", str(config_dir)),
                            capture_output=True, env=env, timeout=20)
    assert status.returncode == 0, status.stderr
    listed = json.loads(status.stdout)["sessions"]
    assert [(s["sessionId"], s["turns"], s["clients"]) for s in listed] == [(sid, 2, 2)]
    assert one.quit() == 0 and two.quit() == 0
    deadline = time.monotonic() + 10
    while psutil.pid_exists(daemon_pid) and psutil.Process(daemon_pid).status() != "zombie":
        assert time.monotonic() < deadline, "the ephemeral daemon outlived its editors"
        time.sleep(0.05)
    assert not reap_leaks([w for w in workers if w.is_running()], timeout=10)
    assert not (config_dir / "d.sock").exists()


def test_attach_answers_pending_requests_and_fails_when_the_daemon_dies() -> None:
    """A daemon killed mid-turn: the editor's pending prompt answers -32603, the cause
    is on stderr and ``--attach`` exits 1 (not a silent, successful end)."""
    config_dir = short_dir()
    env = host_env({"ZEROCLAW_SOCKET": str(config_dir / "d.sock")})
    editor = Editor(config_dir, env)
    editor.request("initialize", {"protocolVersion": 1})
    sid = editor.request("session/new", {"cwd": str(work_dir(config_dir))})["sessionId"]
    daemon = psutil.Process(int((config_dir / "d.sock.lock").read_text()))
    family = [daemon, *daemon.children(recursive=True)]
    prompt_id = editor.send("session/prompt", {"sessionId": sid, "prompt": "!sleep 30"})
    daemon.send_signal(signal.SIGKILL)
    answer = editor.answer(prompt_id)
    assert answer["error"]["code"] == -32603, answer
    assert "daemon went away" in answer["error"]["message"]
    assert editor.proc.wait(15) == 1
    assert "closed the connection" in editor.stderr_text()
    assert not reap_leaks([p for p in family if p.is_running()], timeout=10)


def fake_daemon(config_dir: Path) -> socket.socket:
    """A listener where ``--attach`` looks for the daemon's ``acp.sock``; the test
    plays the daemon on the connections it accepts."""
    path = config_dir / "data" / "acp.sock"
    path.parent.mkdir(mode=0o700)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen()
    listener.settimeout(20)
    return listener


def test_attach_replays_on_a_connection_dropped_before_any_answer() -> None:
    """A daemon that accepts and drops the connection before answering anything (an
    ephemeral one stopping as the editor arrives): ``--attach`` dials again and replays
    what the editor sent, so the editor never notices."""
    config_dir = short_dir()
    listener = fake_daemon(config_dir)
    editor = Editor(config_dir, host_env())
    sent_id = editor.send("initialize", {"protocolVersion": 1})
    first, _ = listener.accept()
    first.close()  # dropped without reading or answering
    second, _ = listener.accept()
    with second, second.makefile("rwb") as stream:
        request = json.loads(stream.readline())
        assert (request["method"], request["id"]) == ("initialize", sent_id)
        stream.write(json.dumps({"jsonrpc": "2.0", "id": request["id"],
                                 "result": {"protocolVersion": 1}}).encode() + b"\n")
        stream.flush()
        assert editor.answer(request["id"])["result"] == {"protocolVersion": 1}
        assert editor.proc.stdin is not None
        editor.proc.stdin.close()
        assert stream.readline() == b""  # the editor's EOF reached the new connection
    assert editor.proc.wait(15) == 0, editor.stderr_text()
    listener.close()


def test_attach_keeps_frames_whole_when_the_daemon_dies_mid_frame() -> None:
    """The daemon answered once, then died halfway through a frame: the editor gets a
    newline ending the cut-off line and then the -32603 answer, each on its own line."""
    config_dir = short_dir()
    with fake_daemon(config_dir) as listener:
        editor = Editor(config_dir, host_env())
        first = editor.send("initialize", {"protocolVersion": 1})
        connection, _ = listener.accept()
        with connection, connection.makefile("rwb") as stream:
            stream.readline()
            stream.write(json.dumps({"jsonrpc": "2.0", "id": first, "result": {}}).encode()
                         + b"\n")
            stream.flush()
            second = editor.send("session/new", {"cwd": str(work_dir(config_dir))})
            stream.readline()
            stream.write(b'{"jsonrpc":"2.0","id":2,"result":{"sessionId":"cut o')
            stream.flush()
    assert editor.answer(first)["result"] == {}
    assert editor.proc.stdout is not None
    assert editor.proc.stdout.readline().startswith(b'{"jsonrpc":"2.0","id":2,"result"')
    lost = json.loads(editor.proc.stdout.readline())
    assert (lost["id"], lost["error"]["code"]) == (second, -32603)
    assert editor.proc.wait(15) == 1


def test_attach_does_not_wait_for_an_answer_to_a_line_over_the_frame_limit() -> None:
    """The daemon answers such a line -32600 with id null (its id is never read): the
    bridge must not count it as a request still waiting, even when it came whole in
    one read, or its end would invent a -32603 for it and exit 1."""
    config_dir = short_dir()
    (config_dir / "config.toml").write_text("[acp]\nframe_limit = 4096\n")
    editor = Editor(config_dir, host_env({"ZEROCLAW_SOCKET": str(config_dir / "d.sock")}))
    assert editor.proc.stdin is not None and editor.proc.stdout is not None
    editor.proc.stdin.write(b'{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"p":"'
                            + b"x" * 10_000 + b'"}}\n')
    editor.proc.stdin.flush()
    too_large = json.loads(editor.proc.stdout.readline())
    assert (too_large["id"], too_large["error"]["code"]) == (None, -32600)
    editor.next_id = 1
    assert editor.request("initialize", {"protocolVersion": 1})["protocolVersion"] == 1
    editor.proc.stdin.close()
    assert editor.proc.stdout.read() == b""  # no -32603 made up for id 1
    assert editor.proc.wait(15) == 0
    editor.stderr.close()
