"""One session's MCP servers without a host (:class:`actors.worker.mcp.SessionMcp`): a
real fixture server process (tests/fixtures/mcp_fault_server.py), a closed port."""

from __future__ import annotations

import socket
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from actors.worker.mcp.session_servers import SessionMcp
from actors.worker.tools import PathPolicy, ToolEnv, ToolError

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "mcp_fault_server.py"


def servers(tmp_path: Path, entries: list[dict[str, object]], **config: object) -> SessionMcp:
    paths = PathPolicy.build(str(tmp_path), str(tmp_path), [])
    found = SessionMcp.from_config(
        {"env": {"AGENT_VAR": "a"}, "allow": True, **config}, entries, paths)
    assert found is not None
    return found


def gone(pid: int, timeout: float = 10.0) -> bool:
    try:
        psutil.Process(pid).wait(timeout)
    except psutil.NoSuchProcess:
        return True
    except psutil.TimeoutExpired:
        return False
    return True


def test_a_server_runs_answers_and_its_tree_is_gone_after_stop(tmp_path: Path) -> None:
    mcp = servers(tmp_path, [{"name": "fx", "command": sys.executable, "args": [str(FIXTURE)],
                              "env": [{"name": "MINE", "value": "m"}]}])
    mcp.start()
    assert mcp.ready() == []
    [status] = mcp.status()
    assert status["state"] == "running" and status["tools"] == 5
    tools = mcp.tools(["shell"])
    env = ToolEnv(paths=mcp.paths, cancelled=threading.Event())
    assert tools["fx__echo"].run({"text": "x"}, env).text == "echo: x"
    seen = tools["fx__env"].run({}, env).text
    assert "MINE" in seen and "AGENT_VAR" in seen
    launcher = mcp.connections[0].launcher_pid
    assert launcher is not None and status["pid"] in [
        p.pid for p in psutil.Process(launcher).children(recursive=True)]
    started = time.monotonic()
    mcp.stop()
    assert gone(launcher) and gone(status["pid"])
    assert time.monotonic() - started < 5
    assert mcp.status()[0]["state"] == "stopped"


def test_a_call_past_mcp_call_timeout_secs_fails_and_the_server_still_serves(
        tmp_path: Path) -> None:
    mcp = servers(tmp_path, [{"name": "fx", "command": sys.executable, "args": [str(FIXTURE)]}],
                  mcp_call_timeout_secs=0.5)
    mcp.start()
    assert mcp.ready() == []
    tools = mcp.tools(())
    env = ToolEnv(paths=mcp.paths, cancelled=threading.Event())
    try:
        with pytest.raises(ToolError, match=r"did not answer within 0.5 s"):
            tools["fx__slow"].run({"seconds": 5}, env)
        assert tools["fx__echo"].run({"text": "y"}, env).text == "echo: y"
    finally:
        mcp.stop()


def test_an_http_server_that_is_not_there_is_a_clear_start_failure(tmp_path: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # closed again: nothing listens there
    mcp = servers(tmp_path, [{"name": "web", "type": "http",
                              "url": f"http://127.0.0.1:{port}/mcp"}],
                  mcp_start_timeout_secs=5)
    mcp.start()
    [notice] = mcp.ready()
    assert notice.startswith("MCP server 'web' could not start"), notice
    assert mcp.tools(()) == {}
    mcp.stop()


def exited_within(mcp: SessionMcp, seen: threading.Event, timeout: float = 10.0) -> bool:
    """The server's death was reported (``on_change``) and status says so."""
    return seen.wait(timeout) and mcp.status()[0]["state"] == "exited"


def test_a_server_killed_while_idle_is_reported_at_once_and_starts_again(
        tmp_path: Path) -> None:
    mcp = servers(tmp_path, [{"name": "fx", "command": sys.executable, "args": [str(FIXTURE)]}])
    seen = threading.Event()
    mcp.on_change = seen.set
    mcp.start()
    try:
        assert mcp.ready() == []
        [before] = mcp.status()
        psutil.Process(before["pid"]).kill()
        assert exited_within(mcp, seen), mcp.status()
        assert "exited" in mcp.status()[0].get("problem", "")
        changed, notices = mcp.revive()
        assert changed and notices == []
        [after] = mcp.status()
        assert after["state"] == "running" and after["pid"] != before["pid"]
        assert after["restarts"] == 1
        env = ToolEnv(paths=mcp.paths, cancelled=threading.Event())
        assert mcp.tools(())["fx__echo"].run({"text": "back"}, env).text == "echo: back"
        assert mcp.revive() == (False, [])  # nothing died since
    finally:
        mcp.stop()
    assert gone(after["pid"])


def test_a_server_that_cannot_start_again_is_given_up_with_a_reason(tmp_path: Path) -> None:
    marker = tmp_path / "started-once"
    mcp = servers(tmp_path, [{"name": "fx", "command": sys.executable,
                              "args": [str(FIXTURE), "--once", str(marker)]}])
    seen = threading.Event()
    mcp.on_change = seen.set
    mcp.start()
    try:
        assert mcp.ready() == []
        psutil.Process(mcp.status()[0]["pid"]).kill()
        assert exited_within(mcp, seen)
        started = time.monotonic()
        changed, [notice] = mcp.revive()
        assert changed and time.monotonic() - started < 20
        assert "MCP server 'fx' exited" in notice
        assert "could not be started again (3 attempts)" in notice
        assert "refusing to start" in notice  # the last attempt's stderr
        [entry] = mcp.status()
        assert entry["state"] == "failed" and "could not start" in entry["problem"]
        assert mcp.tools(()) == {}
        assert mcp.revive() == (False, [])  # given up: not tried at every turn
    finally:
        mcp.stop()
