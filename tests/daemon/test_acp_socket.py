"""SPEC §6: the daemon's ``acp.sock`` and ``zeroclaw acp --attach`` — many editors, one host."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import time
from pathlib import Path
from typing import Any

import psutil

from tests.e2e.procs import host_env, reap_leaks

from .helpers import RpcClient, short_dir, zeroclaw_argv


def texts(client: RpcClient, kind: str) -> list[str]:
    return [u["update"]["content"]["text"] for u in client.updates()
            if u.get("update", {}).get("sessionUpdate") == kind]


def test_two_connections_share_a_session_on_acp_sock(daemons: Any) -> None:
    daemon = daemons()
    acp_path = daemon.socket_path.parent / "acp.sock"
    assert stat.S_IMODE(os.stat(acp_path).st_mode) == 0o600
    with RpcClient(acp_path) as first, RpcClient(acp_path) as second:
        sid = first.request("session/new", {"cwd": str(daemon.config_dir)})["sessionId"]
        first.request("session/prompt", {"sessionId": sid, "prompt": "written by one"})
        loaded = second.request("session/load", {"sessionId": sid, "cwd": str(daemon.config_dir)})
        assert loaded["modes"]["currentModeId"] == "supervised"
        assert texts(second, "user_message_chunk") == ["written by one"]
        result = second.request("session/prompt", {"sessionId": sid, "prompt": "and two"})
        assert result["content"] == "and two"
    with daemon.client() as ops:
        status = ops.request("status")
    assert [(s["sessionId"], s["turns"]) for s in status["sessions"]] == [(sid, 2)]
    assert daemon.terminate() == 0
    assert not acp_path.exists()


class Editor:
    """``zeroclaw acp --attach`` as an editor spawns it, spoken to over its stdio."""

    def __init__(self, config_dir: Path, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            zeroclaw_argv("acp", "--attach", "--config-dir", str(config_dir)),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
        self.next_id = 0
        self.updates: list[dict[str, Any]] = []

    def request(self, method: str, params: Any) -> Any:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.next_id += 1
        frame = {"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params}
        self.proc.stdin.write(json.dumps(frame).encode() + b"\n")
        self.proc.stdin.flush()
        while True:
            answer = json.loads(self.proc.stdout.readline())
            if answer.get("method") == "session/update":
                self.updates.append(answer["params"]["update"])
            elif answer.get("id") == self.next_id:
                assert "error" not in answer, answer
                return answer["result"]

    def quit(self) -> int:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        return self.proc.wait(15)


def test_attach_starts_an_ephemeral_daemon_that_editors_share() -> None:
    config_dir = short_dir()
    env = host_env({"ZEROCLAW_SOCKET": str(config_dir / "d.sock")})
    one = Editor(config_dir, env)
    assert one.request("initialize", {"protocolVersion": 1})["agentInfo"]["name"] == "zeroclaw-acp"
    sid = one.request("session/new", {"cwd": str(config_dir)})["sessionId"]
    assert one.request("session/prompt", {"sessionId": sid, "prompt": "first editor"})[
        "stopReason"] == "end_turn"
    daemon_pid = int((config_dir / "d.sock.lock").read_text())
    workers = psutil.Process(daemon_pid).children(recursive=True)
    two = Editor(config_dir, env)
    two.request("initialize", {"protocolVersion": 1})
    two.request("session/load", {"sessionId": sid, "cwd": str(config_dir)})
    assert [u["content"]["text"] for u in two.updates
            if u["sessionUpdate"] == "user_message_chunk"] == ["first editor"]
    assert two.request("session/prompt", {"sessionId": sid, "prompt": "second"})[
        "content"] == "second"
    status = subprocess.run(zeroclaw_argv("status", "--json", "--config-dir", str(config_dir)),
                            capture_output=True, env=env, timeout=20)
    assert status.returncode == 0, status.stderr
    listed = json.loads(status.stdout)["sessions"]
    assert [(s["sessionId"], s["turns"]) for s in listed] == [(sid, 2)]
    assert one.quit() == 0 and two.quit() == 0
    deadline = time.monotonic() + 10
    while psutil.pid_exists(daemon_pid) and psutil.Process(daemon_pid).status() != "zombie":
        assert time.monotonic() < deadline, "the ephemeral daemon outlived its editors"
        time.sleep(0.05)
    assert not reap_leaks([w for w in workers if w.is_running()], timeout=10)
    assert not (config_dir / "d.sock").exists()
