"""``provider = "acp"``: zeroclaw hosts ACP agents nobody here wrote, driven by the
official ACP Python SDK as the client (SPEC §7, issue "Real agents 1").

Agents: the ACP Python SDK's example agent (from its sdist, see scripts/test:
``ZEROCLAW_ACP_PY_EXAMPLES``), the ACP TypeScript SDK's example agent (it streams
tool calls and asks permission; ``ZEROCLAW_ACP_TS_AGENT``, run with ``node`` from
PATH), and ``tests/fixtures/acp_fixture_agent.py`` for what they lack (fs
and terminal requests, a crash, a hang, garbage on stdout).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from .conftest import SdkHostFactory
from .helpers import split_turns, stored_session
from .procs import REPO_ROOT, reap_leaks, write_config
from .rawclient import RawHost
from .sdkhost import SdkHost, expect_error
from .test_stream_limits import answers_and_chunks, prompt_frame

FIXTURE_AGENT = REPO_ROOT / "tests" / "fixtures" / "acp_fixture_agent.py"
CANCEL_MARKER = "[turn cancelled via client]"
#: The fixture agent's stderr says which requests it got: logged at WARNING, the hosts'
#: default level (INFO by default), so the tests can read it.
LOUD_STDERR = 'stderr_log_level = "warning"'


def _py_example() -> Path:
    examples = os.environ.get("ZEROCLAW_ACP_PY_EXAMPLES")
    if not examples:
        pytest.skip(os.environ.get("ZEROCLAW_ACP_PY_EXAMPLES_SKIP")
                    or "ZEROCLAW_ACP_PY_EXAMPLES is not set (scripts/test sets it)")
    return Path(examples) / "agent.py"


def _ts_agent() -> tuple[str, str]:
    agent = os.environ.get("ZEROCLAW_ACP_TS_AGENT")
    node = shutil.which("node")
    if not agent or node is None:
        pytest.skip(os.environ.get("ZEROCLAW_ACP_TS_AGENT_SKIP")
                    or "ZEROCLAW_ACP_TS_AGENT or node is missing (scripts/test sets them)")
    return node, agent


def _toml_list(items: list[str]) -> str:
    return "[" + ", ".join(f'"{i}"' for i in items) + "]"


def acp_config(config_dir: Path, command: list[str], *, extra: str = "",
               level: str = "supervised") -> None:
    write_config(config_dir, f"""
[acp]
default_agent = "hosted"
[autonomy]
level = "{level}"
[agents.hosted]
provider = "acp"
command = {_toml_list(command)}
{extra}
""")


def fixture_command() -> list[str]:
    return [sys.executable, str(FIXTURE_AGENT)]


async def prompt_text(host: SdkHost, sid: str, text: str) -> tuple[str, Any]:
    """Prompt and return (the streamed agent text of this turn, the outcome)."""
    mark = host.client.mark()
    outcome = await host.prompt(sid, text)
    return host.client.text(sid, start=mark), outcome


# --- the Python SDK's example agent --------------------------------------------------


async def test_python_example_agent_streams_and_replays_from_a_new_host(
    sdk_hosts: SdkHostFactory, config_dir: Path, workspace: Path
) -> None:
    acp_config(config_dir, [sys.executable, str(_py_example())])
    async with sdk_hosts(None, "--log-level", "info") as host:  # its stderr logs at INFO
        await host.initialize()
        sid = await host.new_session(workspace)
        text, outcome = await prompt_text(host, sid, "hello hosted agent")
        assert text == "Client sent:hello hosted agent"
        assert outcome.stop_reason == "end_turn"
        assert outcome.content == "Client sent:hello hosted agent"
        other = await host.new_session(workspace)  # same agent process, another session
        text, _ = await prompt_text(host, other, "second session")
        assert text == "Client sent:second session"
        text, _ = await prompt_text(host, sid, "turn two")
        assert text == "Client sent:turn two"
    stderr = host.stderr_path.read_text()
    assert "INFO zeroclaw.agent: agent hosted: " in stderr
    assert "Received initialize request" in stderr
    stored, _ = stored_session(config_dir, sid)
    assert stored is not None and stored.meta == {"acpAgentSessionId": "0"}
    async with sdk_hosts() as second:
        await second.initialize()
        await second.conn.load_session(cwd=str(workspace), session_id=sid)
        turns = split_turns(second.client.of(sid))
        assert [(t.user, t.agent) for t in turns] == [
            ("hello hosted agent", "Client sent:hello hosted agent"),
            ("turn two", "Client sent:turn two"),
        ]
        text, outcome = await prompt_text(second, sid, "after load")
        assert text == "Client sent:after load"
        assert second.last_result("session/prompt", sid)["_meta"]["zeroclaw"] == {
            "contextRestored": False}


# --- the TypeScript SDK's example agent ----------------------------------------------


async def test_ts_example_agent_tool_calls_and_permission_reach_the_client(
    sdk_hosts: SdkHostFactory, config_dir: Path, workspace: Path
) -> None:
    acp_config(config_dir, list(_ts_agent()))
    async with sdk_hosts() as host:
        await host.initialize()
        sid = await host.new_session(workspace)
        text, outcome = await prompt_text(host, sid, "change the config")
        assert outcome.stop_reason == "end_turn"
        assert "Let me start by reading" in text and "Perfect!" in text
        [ask] = host.client.permission_asks
        assert ask.session_id == sid and ask.tool_call.tool_call_id == "call_2"
        finished = {u.tool_call_id: u.status for u in host.client.of(sid, "tool_call_update")}
        assert finished == {"call_1": "completed", "call_2": "completed"}
        host.client.permission_policy = "reject_once"
        text, outcome = await prompt_text(host, sid, "again")
        assert "skip the configuration update" in text
    async with sdk_hosts() as second:
        await second.initialize()
        await second.conn.load_session(cwd=str(workspace), session_id=sid)
        turns = split_turns(second.client.of(sid))
        assert [t.user for t in turns] == ["change the config", "again"]
        assert set(turns[0].tools) == {"call_1", "call_2"}
        assert "Perfect!" in turns[0].agent


async def test_ts_example_agent_cancel_is_forwarded(
    sdk_hosts: SdkHostFactory, config_dir: Path, workspace: Path
) -> None:
    acp_config(config_dir, list(_ts_agent()))
    async with sdk_hosts() as host:
        await host.initialize()
        sid = await host.new_session(workspace)
        running = asyncio.create_task(host.prompt(sid, "start and be cancelled"))
        await host.client.wait_text(sid, "Let me start by reading")
        await host.conn.cancel(session_id=sid)
        outcome = await asyncio.wait_for(running, 20)
        assert outcome.stop_reason == "cancelled"
        assert outcome.content.endswith(CANCEL_MARKER)
        assert not host.client.permission_asks
        text, outcome = await prompt_text(host, sid, "next")  # the session goes on
        assert outcome.stop_reason == "end_turn" and "Perfect!" in text


# --- the fixture agent: fs, faults -----------------------------------------------------


async def test_fs_requests_are_served_under_the_session_path_policy(
    sdk_hosts: SdkHostFactory, config_dir: Path, workspace: Path, tmp_path: Path
) -> None:
    acp_config(config_dir, fixture_command())
    (workspace / "notes.txt").write_text("inside the workspace\n")
    outside = tmp_path / "outside.txt"
    outside.write_text("secret")
    async with sdk_hosts() as host:
        await host.initialize()
        sid = await host.new_session(workspace)
        text, _ = await prompt_text(host, sid, f"read {workspace / 'notes.txt'}")
        assert text == "read: inside the workspace\n"
        text, _ = await prompt_text(host, sid, f"read {outside}")
        assert text.startswith("read: ") and "outside the allowed directories" in text
        text, _ = await prompt_text(host, sid, f"write {workspace / 'new.txt'} written-by-agent")
        assert text == "wrote"
        assert (workspace / "new.txt").read_text() == "written-by-agent"
        text, _ = await prompt_text(host, sid, f"write {outside} nope")
        assert text.startswith("write refused") and outside.read_text() == "secret"
        await host.conn.set_session_mode(session_id=sid, mode_id="read_only")
        text, _ = await prompt_text(host, sid, f"write {workspace / 'ro.txt'} nope")
        assert "read_only" in text and not (workspace / "ro.txt").exists()
    init = [f for d, f in host.wire if d == "incoming"]  # the client side saw no fs request
    assert not any(str(f.get("method", "")).startswith("fs/") for f in init)


async def test_capabilities_advertised_and_unknown_agent_requests_refused(
    sdk_hosts: SdkHostFactory, config_dir: Path, workspace: Path
) -> None:
    acp_config(config_dir, fixture_command())
    async with sdk_hosts(env_extra={"ZEROCLAW_LOG": "info"}) as host:
        await host.initialize()
        sid = await host.new_session(workspace)
        text, _ = await prompt_text(host, sid, "caps")
        assert json.loads(text) == {"fs": {"readTextFile": True, "writeTextFile": True},
                                    "terminal": True}  # zeroclaw serves both itself
        text, _ = await prompt_text(host, sid, "ask elicitation/create")
        assert text == "elicitation/create error -32601"
    stderr = host.stderr_path.read_text()
    assert "agent hosted initialized: agentCapabilities={'loadSession': False" in stderr


@pytest.mark.parametrize("per_session", [False, True])
async def test_one_agent_process_per_worker_or_per_session(
    sdk_hosts: SdkHostFactory, config_dir: Path, workspace: Path, per_session: bool
) -> None:
    extra = "per_session = true" if per_session else ""
    acp_config(config_dir, fixture_command(), extra=f"{extra}\n{LOUD_STDERR}\n[workers]\nmax = 1")
    async with sdk_hosts() as host:
        await host.initialize()
        first, second = await host.new_session(workspace), await host.new_session(workspace)
        pids = [(await prompt_text(host, sid, "pid"))[0] for sid in (first, second)]
        assert (pids[0] == pids[1]) is not per_session
        agents = [psutil.Process(int(pid)) for pid in pids]
        await host.conn.close_session(session_id=first)
        text, _ = await prompt_text(host, second, "still served")
        assert text == "still served" and agents[1].is_running()
        if per_session:  # the closed session's agent ends with it
            assert not await asyncio.to_thread(reap_leaks, agents[:1], 10.0)
        else:  # the shared agent is told (it offers session/close)
            await asyncio.to_thread(_wait_for_text, host.stderr_path, "closed fx-session-0")


def _wait_for_text(path: Path, needle: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while needle not in path.read_text():
        assert time.monotonic() < deadline, f"{needle!r} never appeared in {path}"
        time.sleep(0.05)


async def test_agent_dies_with_its_worker(
    sdk_hosts: SdkHostFactory, config_dir: Path, workspace: Path
) -> None:
    acp_config(config_dir, fixture_command())
    async with sdk_hosts() as host:
        await host.initialize()
        sid = await host.new_session(workspace)
        running = asyncio.create_task(host.prompt(sid, "wait"))
        await host.client.wait_text(sid, "pid=")
        agent = psutil.Process(int(host.client.text(sid).split("pid=")[1].split()[0]))
        launcher = agent.parent()  # the root of the agent's process tree
        worker = launcher.parent() if launcher is not None else None
        assert worker is not None and worker.ppid() == host.pid
        worker.kill()
        await expect_error(asyncio.wait_for(running, 20), -32603)
        assert not await asyncio.to_thread(reap_leaks, [agent], 10.0), "agent outlived its worker"
        text, _ = await prompt_text(host, sid, "restored on a new worker")
        assert text == "restored on a new worker"


async def test_agent_env_is_clean_and_stop_reason_is_carried(
    sdk_hosts: SdkHostFactory, config_dir: Path, workspace: Path
) -> None:
    acp_config(config_dir, fixture_command(),
               extra='env = {FIXTURE_GIVEN = "yes"}\npass_env = ["VENDOR_API_KEY"]')
    host_env = {"HOST_SECRET_TOKEN": "do-not-pass", "VENDOR_API_KEY": "passed-on"}
    async with sdk_hosts(env_extra=host_env) as host:
        await host.initialize()
        sid = await host.new_session(workspace)
        text, _ = await prompt_text(host, sid, "env")
        names = set(text.split())
        assert "FIXTURE_GIVEN" in names and "PATH" in names and "VENDOR_API_KEY" in names
        assert "HOST_SECRET_TOKEN" not in names and "PYTHONPATH" not in names
        _, outcome = await prompt_text(host, sid, "stop:max_tokens")
        assert outcome.stop_reason == "max_tokens"


@pytest.mark.parametrize("passed", [True, False])
async def test_proxy_and_trust_variables_reach_the_agent_unless_turned_off(
    sdk_hosts: SdkHostFactory, config_dir: Path, workspace: Path, passed: bool
) -> None:
    """From the host's environment through its worker to the agent, by default; none
    with ``pass_network_env = false``."""
    network = {"HTTPS_PROXY": "http://127.0.0.1:9", "no_proxy": "localhost",
               "NODE_EXTRA_CA_CERTS": "/nonexistent/ca.pem"}
    acp_config(config_dir, fixture_command(),
               extra="" if passed else "pass_network_env = false")
    async with sdk_hosts(env_extra=network) as host:
        await host.initialize()
        sid = await host.new_session(workspace)
        text, _ = await prompt_text(host, sid, "env")
    names = set(text.split())
    assert (names & set(network)) == (set(network) if passed else set()), names


async def test_agent_killed_mid_turn_fails_that_prompt_and_restarts(
    sdk_hosts: SdkHostFactory, config_dir: Path, workspace: Path
) -> None:
    acp_config(config_dir, fixture_command(), extra="[workers]\nmax = 1")  # one agent process
    async with sdk_hosts() as host:
        await host.initialize()
        sid = await host.new_session(workspace)
        other = await host.new_session(workspace)
        running = asyncio.create_task(host.prompt(sid, "wait"))
        await host.client.wait_text(sid, "pid=")
        pid = int(host.client.text(sid).split("pid=")[1].split()[0])
        os.kill(pid, signal.SIGKILL)
        exc = await expect_error(asyncio.wait_for(running, 20), -32603)
        message = str(exc.data or exc)
        assert "killed by signal 9" in message and "fixture agent starting" in message
        text, outcome = await prompt_text(host, other, "other session still works")
        assert text == "other session still works"
        assert host.last_result("session/prompt", other)["_meta"]["zeroclaw"] == {
            "contextRestored": False}
        text, outcome = await prompt_text(host, sid, "after the crash")
        assert text == "after the crash" and outcome.stop_reason == "end_turn"
        assert "contextRestored" in host.last_result("session/prompt", sid)["_meta"]["zeroclaw"]
        text, outcome = await prompt_text(host, sid, "and again")
        assert "_meta" not in host.last_result("session/prompt", sid)


async def test_garbage_on_agent_stdout_is_logged_and_survived(
    sdk_hosts: SdkHostFactory, config_dir: Path, workspace: Path
) -> None:
    acp_config(config_dir, fixture_command())
    async with sdk_hosts() as host:
        await host.initialize()
        sid = await host.new_session(workspace)
        text, outcome = await prompt_text(host, sid, "garbage")
        assert text == "survived" and outcome.stop_reason == "end_turn"
        text, _ = await prompt_text(host, sid, "still here")
        assert text == "still here"
    assert "non-JSON line on stdout" in host.stderr_path.read_text()


async def test_agent_hanging_at_initialize_fails_within_the_start_timeout(
    sdk_hosts: SdkHostFactory, config_dir: Path, workspace: Path
) -> None:
    """The error quotes the agent's last stderr lines and names (never shows) the
    variables it got, so a user can tell a missing proxy or key from a hung agent."""
    acp_config(config_dir, fixture_command(), extra='agent_start_timeout_secs = 1\n'
               'env = {FIXTURE_MODE = "hang_init", FIXTURE_SECRET = "value-not-shown"}')
    async with sdk_hosts() as host:
        await host.initialize()
        sid = await host.new_session(workspace)
        exc = await expect_error(host.prompt(sid, "hello"), -32603)
        said = str(exc.data or exc)
        assert "did not answer initialize within 1s" in said
        assert "request initialize" in said  # the fixture's stderr line
        assert "FIXTURE_SECRET" in said and "PATH" in said and "value-not-shown" not in said
        exc = await expect_error(host.prompt(sid, "hello again"), -32603)
        assert "did not answer initialize within 1s" in str(exc.data or exc)


async def test_agent_hanging_at_session_new_fails_within_the_start_timeout(
    sdk_hosts: SdkHostFactory, config_dir: Path, workspace: Path
) -> None:
    acp_config(config_dir, fixture_command(),
               extra='agent_start_timeout_secs = 1\nenv = {FIXTURE_MODE = "hang_new"}')
    async with sdk_hosts() as host:
        await host.initialize()
        sid = await host.new_session(workspace)
        exc = await expect_error(host.prompt(sid, "hello"), -32603)
        assert "did not answer session/new within 1s" in str(exc.data or exc)


async def test_agent_wanting_a_login_says_how_to_log_in(
    sdk_hosts: SdkHostFactory, config_dir: Path, workspace: Path
) -> None:
    acp_config(config_dir, fixture_command(), extra='env = {FIXTURE_MODE = "auth"}')
    async with sdk_hosts() as host:
        await host.initialize()
        sid = await host.new_session(workspace)
        exc = await expect_error(host.prompt(sid, "hello"), -32603)
        text = str(exc.data or exc)
        assert "refused session/new: -32000: Authentication required" in text
        assert "it offers: Fixture login" in text and "pass_env" in text


@pytest.mark.parametrize("code", [-32603, -32099])
async def test_an_agents_error_reaches_the_client_with_its_code_message_and_data(
    sdk_hosts: SdkHostFactory, config_dir: Path, workspace: Path, code: int
) -> None:
    acp_config(config_dir, fixture_command())
    async with sdk_hosts() as host:
        await host.initialize()
        sid = await host.new_session(workspace)
        exc = await expect_error(host.prompt(sid, f"fail {code}"), code)
        assert str(exc) == "Internal error"
        assert exc.data["message"] == "Missing environment variable: `FAKE_OPENAI_KEY`"
        assert 0 < len(exc.data["padding"]) < 20_000, "the agent's data is not bounded"
        assert (await host.prompt(sid, "after")).stop_reason == "end_turn"
    _, items = stored_session(config_dir, sid)
    texts = [getattr(item, "text", "") for item in items]
    assert any("failing" in text for text in texts), f"the failed turn's output is lost: {texts}"
    assert f"agent hosted refused the prompt: {code}: Internal error" in (
        host.stderr_path.read_text())


@pytest.mark.parametrize(("command", "reason"), [
    ('["no-such-agent-binary-zc"]', "executable 'no-such-agent-binary-zc' not found"),
    ('"a string, not a list"', "command must be a non-empty array"),
])
async def test_unusable_acp_agent_is_refused_at_session_new(
    sdk_hosts: SdkHostFactory, config_dir: Path, workspace: Path, command: str, reason: str
) -> None:
    write_config(config_dir, f"""
[agents.broken]
provider = "acp"
command = {command}
[agents.odd]
provider = "nonsense"
[agents.fine]
provider = "echo"
""")
    async with sdk_hosts() as host:
        await host.initialize()
        exc = await expect_error(host.raw("session/new", {"cwd": str(workspace),
                                                          "agentAlias": "broken"}), -32602)
        assert "agent broken cannot be used" in str(exc.data or exc) and reason in str(
            exc.data or exc)
        exc = await expect_error(host.raw("session/new", {"cwd": str(workspace),
                                                          "agentAlias": "odd"}), -32602)
        assert "unknown agent provider 'nonsense'" in str(exc.data or exc)
        fine = await host.raw("session/new", {"cwd": str(workspace), "agentAlias": "fine"})
        assert fine["sessionId"]
    stderr = host.stderr_path.read_text()
    assert "agent broken cannot be used" in stderr and "agent odd cannot be used" in stderr


# --- reopening the agent's own session; an agent that ignores cancel ---------------------


async def _stderr_says(host: SdkHost, text: str, timeout: float = 10.0) -> None:
    """Until the host's log (the agent's stderr lines in it) holds ``text``."""
    deadline = time.monotonic() + timeout
    while text not in host.stderr_path.read_text():
        assert time.monotonic() < deadline, f"the log never said {text!r}"
        await asyncio.sleep(0.02)


async def _agent_status(host: SdkHost, pid: int, timeout: float = 10.0) -> dict[str, Any]:
    """The ``status`` entry of the agent process ``pid`` (workers report them each beat)."""
    deadline = time.monotonic() + timeout
    while True:
        status = await host.raw("status", {})
        entries = [a for w in status["workers"] for a in w["agents"] if a["pid"] == pid]
        if entries:
            return dict(entries[0])
        assert time.monotonic() < deadline, f"agent {pid} not in status: {status['workers']}"
        await asyncio.sleep(0.1)


@pytest.mark.parametrize("mode", ["load", "load_late", "resume"])
async def test_agent_session_is_reopened_by_the_agents_own_load_or_resume(
    sdk_hosts: SdkHostFactory, config_dir: Path, workspace: Path, tmp_path: Path, mode: str
) -> None:
    """``load_late``: the agent replays its history after answering its load; that
    replay reaches the client no more than one sent before the answer."""
    method = mode.removesuffix("_late")
    state = tmp_path / "agent-state.json"
    acp_config(config_dir, fixture_command(),
               extra=f'env = {{FIXTURE_MODE = "{mode}", FIXTURE_STATE = "{state}"}}\n'
               + LOUD_STDERR)
    async with sdk_hosts() as host:
        await host.initialize()
        sid = await host.new_session(workspace)
        for text in ("first words", "second words"):
            await prompt_text(host, sid, text)
    stored, _ = stored_session(config_dir, sid)
    assert stored is not None
    agent_sid = stored.meta["acpAgentSessionId"]
    async with sdk_hosts() as second:
        await second.initialize()
        await second.conn.resume_session(cwd=str(workspace), session_id=sid)
        if mode == "load_late":  # its replay, done before the prompt goes
            await _stderr_says(second, "late")
        text, outcome = await prompt_text(second, sid, "recall")
        assert text == "first words | second words" and outcome.stop_reason == "end_turn"
        assert "_meta" not in second.last_result("session/prompt", sid)
        kinds = {u.session_update for u in second.client.of(sid)}
        assert "user_message_chunk" not in kinds  # the agent's replay was not passed on
        if mode == "load_late":
            return  # reopened at a prompt, a late replay is not told from the turn's output
        pid = int((await prompt_text(second, sid, "pid"))[0])
        os.kill(pid, signal.SIGKILL)  # a crashed agent's session is reopened the same way
        assert not await asyncio.to_thread(reap_leaks, [psutil.Process(pid)], 10.0)
        # once the worker has seen it die: a prompt sent before that meets the dying
        # process and fails as its turn (the race one full-suite run hit)
        await _stderr_says(second, f"(pid {pid}) ended with status")
        text, _ = await prompt_text(second, sid, "recall")
        assert text == "first words | second words | recall | pid"
        assert "_meta" not in second.last_result("session/prompt", sid)
    assert second.stderr_path.read_text().count(f"request session/{method}") == 2
    stored, _ = stored_session(config_dir, sid)
    assert stored is not None and stored.meta["acpAgentSessionId"] == agent_sid


async def test_an_agent_that_cannot_reopen_its_session_gets_a_fresh_one(
    sdk_hosts: SdkHostFactory, config_dir: Path, workspace: Path, tmp_path: Path
) -> None:
    state = tmp_path / "agent-state.json"
    acp_config(config_dir, fixture_command(),
               extra=f'env = {{FIXTURE_MODE = "load", FIXTURE_STATE = "{state}"}}')
    async with sdk_hosts() as host:
        await host.initialize()
        sid = await host.new_session(workspace)
        await prompt_text(host, sid, "remembered by nobody")
    state.unlink()  # the agent lost its sessions
    async with sdk_hosts() as second:
        await second.initialize()
        await second.conn.resume_session(cwd=str(workspace), session_id=sid)
        text, _ = await prompt_text(second, sid, "recall")
        assert text == ""
        assert second.last_result("session/prompt", sid)["_meta"]["zeroclaw"] == {
            "contextRestored": False}


async def test_agent_ignoring_cancel_ends_the_turn_after_the_grace_and_is_restarted(
    sdk_hosts: SdkHostFactory, config_dir: Path, workspace: Path
) -> None:
    acp_config(config_dir, fixture_command(), extra="cancel_grace_secs = 0.5\n[workers]\nmax = 1")
    async with sdk_hosts() as host:
        await host.initialize()
        sid = await host.new_session(workspace)
        running = asyncio.create_task(host.prompt(sid, "stubborn"))
        await host.client.wait_text(sid, "pid=")
        stubborn = psutil.Process(int(host.client.text(sid).split("pid=")[1].split()[0]))
        assert (await _agent_status(host, stubborn.pid))["restarts"] == 0
        await host.conn.cancel(session_id=sid)
        outcome = await asyncio.wait_for(running, 20)
        assert outcome.stop_reason == "cancelled"
        assert outcome.content.endswith(CANCEL_MARKER)
        assert not await asyncio.to_thread(reap_leaks, [stubborn], 10.0), "it was not stopped"
        text, outcome = await prompt_text(host, sid, "pid")
        assert outcome.stop_reason == "end_turn" and int(text) != stubborn.pid
        entry = await _agent_status(host, int(text))
        assert entry["restarts"] == 1 and entry["agentAlias"] == "hosted"
        assert entry["sessions"] == 1 and entry["rssBytes"] > 0


def test_a_long_stream_to_a_client_that_lags_arrives_whole_and_in_the_agents_order(
    raw_host: RawHost, config_dir: Path, workspace: Path, tmp_path: Path
) -> None:
    """The client reads nothing until the agent has sent its whole stream: what came in
    bursts went on merged, in the agent's order, and the answer (the kept turn) has
    all of it."""
    acp_config(config_dir, fixture_command(), level="full")
    raw_host.initialize()
    sid = raw_host.new_session(workspace)
    marker, count = tmp_path / "flooded", 60_000
    request_id = prompt_frame(raw_host, sid, f"flood {count} {marker}")
    deadline = time.monotonic() + 30
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.05)  # the agent's own progress: nothing here to wait on
    assert marker.exists()
    answers, chunks = answers_and_chunks(raw_host, {request_id}, timeout=60)
    expected = "".join(f"{number} " for number in range(count))
    assert "".join(chunks[sid]) == expected
    assert answers[request_id]["result"]["content"] == expected
    again = raw_host.call("session/prompt", {"sessionId": sid, "prompt": "after"})
    assert again["content"] == "after"


async def test_an_agent_that_gives_two_sessions_one_session_id_mixes_neither(
    sdk_hosts: SdkHostFactory, config_dir: Path, workspace: Path
) -> None:
    """The second session's agent session would be the first's: that session is refused
    (its turn fails, saying why), and the first keeps its own output."""
    acp_config(config_dir, fixture_command(),
               extra='env = {FIXTURE_MODE = "one_sid"}\n[workers]\nmax = 1')
    async with sdk_hosts() as host:
        await host.initialize()
        first = await host.new_session(workspace)
        second = await host.new_session(workspace)
        text, _ = await prompt_text(host, first, "first's own words")
        assert text == "first's own words"
        exc = await expect_error(host.prompt(second, "second's words"), -32603)
        assert "fx-session-0" in str(exc.data or exc) and "per_session" in str(exc.data or exc)
        text, _ = await prompt_text(host, first, "still the first's")
        assert text == "still the first's"
        assert "second's" not in host.client.text(first)
