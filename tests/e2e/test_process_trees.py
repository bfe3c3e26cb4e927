"""Every process a session starts ends with it (issue 21), even one that called ``setsid``.

Processes: a hosted agent's detached child (double fork and ``setsid``), its child
started like a stdio MCP server that detached itself (``setsid``, still the agent's
child), the detached child of a command in zeroclaw's terminal for the agent
(``terminal/create``), a shell command's detached child under each sandbox backend that works
here (``bwrap``, ``landlock``, ``none``), and the detached child of a stdio MCP server
that zeroclaw's own model agent started for the session. Each is gone within
:data:`GONE_SECS` of its worker's exit (or of ``session/close`` returning), for each
way a session ends: the session is closed; the worker is killed (SIGKILL); the host
exits on stdin EOF; the host is killed (SIGKILL: its workers notice and exit).
The processes are found by a mark in their command line (a pid inside bubblewrap's
PID namespace is not the one outside).

Also (issue 22): a hosted run where nothing died logs no "left behind by a dead
worker", and the agent's stderr is logged at INFO, or at its ``stderr_log_level``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import sys
from pathlib import Path
from typing import Any

import psutil
import pytest
from acp.schema import McpServerStdio

from actors.worker.sandbox import detect
from supervisor.host import ORPHAN_SWEEP_SECS

from .conftest import SdkHostFactory
from .helpers import tool
from .procs import REPO_ROOT, write_config
from .sdkhost import SdkHost, expect_error
from .test_acp_hosting import acp_config, fixture_command, prompt_text
from .test_crash_recovery import worker_of_the_only_session

SLEEPER = REPO_ROOT / "tests" / "fixtures" / "setsid_sleeper.py"
GONE_SECS = 2.0
START_SECS = 20.0  # for a process to start, a worker to exit after its host was killed
WAYS = ["close", "kill_worker", "eof", "kill_host"]
SOURCES = ["agent", "mcp", "shell-bwrap", "shell-landlock", "shell-none"]
MCP_FIXTURE = REPO_ROOT / "tests" / "fixtures" / "mcp_fault_server.py"


def marked(mark: Path) -> list[psutil.Process]:
    """The running processes (zombies are not) whose command line names ``mark``."""
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        if proc.info["status"] != psutil.STATUS_ZOMBIE and str(mark) in " ".join(
                proc.info["cmdline"] or []):
            found.append(proc)
    return found


async def wait_started(marks: list[Path]) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + START_SECS
    while not all(mark.exists() and marked(mark) for mark in marks):
        assert loop.time() < deadline, f"never started: {[m.name for m in marks]}"
        await asyncio.sleep(0.02)


async def wait_gone(pid: int) -> float:
    """The loop time by which ``pid`` has exited (it may not be our child)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + START_SECS
    while True:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return loop.time()
        except psutil.NoSuchProcess:
            return loop.time()
        assert loop.time() < deadline, f"pid {pid} did not exit"
        await asyncio.sleep(0.01)


async def assert_gone_by(marks: list[Path], deadline: float, what: str) -> None:
    loop = asyncio.get_running_loop()
    while left := [p.pid for mark in marks for p in marked(mark)]:
        assert loop.time() < deadline, f"still running {GONE_SECS:g}s after {what}: {left}"
        await asyncio.sleep(0.01)


async def assert_lives_on(procs: list[psutil.Process], seconds: float) -> None:
    """Each of ``procs`` keeps running for ``seconds`` (watched, not slept through)."""
    loop = asyncio.get_running_loop()
    until = loop.time() + seconds
    while loop.time() < until:
        assert procs and all(p.is_running() and p.status() != psutil.STATUS_ZOMBIE
                             for p in procs), "killed while its session lives"
        await asyncio.sleep(0.05)


def configure(config_dir: Path, source: str) -> None:
    if source == "agent":
        acp_config(config_dir, fixture_command(), extra="per_session = true", level="full")
        return
    if source == "mcp":  # its servers start with the session: no model is asked
        write_config(config_dir, '[agents.main]\nprovider = "openai"\n'
                     'base_url = "http://127.0.0.1:9/v1"\nmodel = "gpt-test"\n'
                     '[autonomy]\nlevel = "full"\n')
        return
    backend = source.removeprefix("shell-")
    if backend != "none" and detect(backend).backend != backend:
        pytest.skip(f"no {backend} sandbox here: {detect(backend).reason}")
    write_config(config_dir, f"""
[autonomy]
level = "full"
sandbox = "{backend}"
allow_unsandboxed_shell = true
""")


async def start_processes(host: SdkHost, source: str, workspace: Path
                          ) -> tuple[str, list[Path], asyncio.Task[Any] | None]:
    """The session, the marks of what it started, the turn still running (or None)."""
    python = sys.executable
    if source == "agent":
        sid = await host.new_session(workspace)
        detached, server = workspace / "agent-detached.pid", workspace / "agent-server.pid"
        await prompt_text(host, sid, f"run {python} {SLEEPER} {detached}")
        await prompt_text(host, sid, f"mcp exec {python} {SLEEPER} {server} --stay")
        terminal = workspace / "agent-terminal.pid"  # zeroclaw's own terminal (terminal/*)
        text, _ = await prompt_text(host, sid, f"keep {python} {SLEEPER} {terminal}; sleep 600")
        assert text.startswith("zc-term-"), text
        await wait_started([detached, server, terminal])
        return sid, [detached, server, terminal], None
    mark = workspace / f"{source}.pid"
    if source == "mcp":
        server = McpServerStdio(name="fx", command=python, env=[],
                                args=[str(MCP_FIXTURE), "--detach", str(mark)])
        sid = (await host.conn.new_session(cwd=str(workspace), mcp_servers=[server])).session_id
        await wait_started([mark])
        return sid, [mark], None
    sid = await host.new_session(workspace)
    command = f"{python} {SLEEPER} {mark}; sleep 600"
    turn = asyncio.create_task(host.prompt(sid, tool("shell", {"command": command,
                                                               "timeout": 600})))
    await wait_started([mark])
    return sid, [mark], turn


async def end_turn(turn: asyncio.Task[Any] | None) -> None:
    if turn is not None:
        turn.cancel()
        with contextlib.suppress(BaseException):
            await turn


@pytest.mark.parametrize("way", WAYS)
@pytest.mark.parametrize("source", SOURCES)
async def test_what_a_session_started_ends_with_it(
    sdk_hosts: SdkHostFactory, config_dir: Path, workspace: Path, source: str, way: str
) -> None:
    configure(config_dir, source)
    loop = asyncio.get_running_loop()
    async with sdk_hosts() as host:
        await host.initialize()
        sid, marks, turn = await start_processes(host, source, workspace)
        worker = await worker_of_the_only_session(host)
        if way == "close":
            await host.conn.close_session(session_id=sid)
            await assert_gone_by(marks, loop.time() + GONE_SECS, "session/close")
        elif way == "kill_worker":
            os.kill(worker, signal.SIGKILL)
            exited = await wait_gone(worker)
            await assert_gone_by(marks, exited + GONE_SECS, "its worker was killed")
        elif way == "kill_host":
            host.kill9()
            exited = await wait_gone(worker)
            await assert_gone_by(marks, exited + GONE_SECS, "its host was killed")
        watch = asyncio.create_task(wait_gone(worker))
        if way != "eof":
            await end_turn(turn)
    exited = await watch  # the host exited on stdin EOF (or was killed) by now
    await assert_gone_by(marks, exited + GONE_SECS, "its worker exited")
    await end_turn(turn)


@pytest.mark.parametrize(("setting", "log_level", "logged_at"), [
    (None, "info", "INFO"),
    ("debug", "info", None),
    ("debug", "debug", "DEBUG"),
])
async def test_a_hosted_run_logs_no_dead_worker_and_the_agents_stderr_at_its_level(
    sdk_hosts: SdkHostFactory, config_dir: Path, workspace: Path,
    setting: str | None, log_level: str, logged_at: str | None,
) -> None:
    """The agent starts a detached process (as Node-based agents do), which lives as long
    as its session (the host's orphan sweeps do not take it for a dead worker's), and
    ends with the host: no worker died, so nothing says one did; its stderr line is logged at INFO,
    or at the level its ``stderr_log_level`` says."""
    extra = f'stderr_log_level = "{setting}"' if setting else ""
    acp_config(config_dir, fixture_command(), extra=extra, level="full")
    detached = workspace / "detached.pid"
    async with sdk_hosts(None, "--log-level", log_level) as host:
        await host.initialize()
        sid = await host.new_session(workspace)
        await prompt_text(host, sid, f"run {sys.executable} {SLEEPER} {detached}")
        await wait_started([detached])
        if setting is None:  # the host's sweeps while it runs leave it alone: no worker died
            await assert_lives_on(marked(detached), 1.5 * ORPHAN_SWEEP_SECS)
        text, _ = await prompt_text(host, sid, "still here")
        assert text == "still here"
    stderr = host.stderr_path.read_text()
    assert "left behind by a dead worker" not in stderr
    assert "outlived" not in stderr
    levels = re.findall(r" (\w+) zeroclaw\.agent: agent hosted: fixture agent starting$",
                        stderr, re.MULTILINE)
    assert levels == ([logged_at] if logged_at else [])
    assert not marked(detached)


async def test_a_bad_stderr_log_level_is_refused_at_session_new(
    sdk_hosts: SdkHostFactory, config_dir: Path, workspace: Path
) -> None:
    acp_config(config_dir, fixture_command(), extra='stderr_log_level = "loud"')
    async with sdk_hosts() as host:
        await host.initialize()
        error = await expect_error(host.new_session(workspace), -32602)
        assert "stderr_log_level must be one of debug, info, warning" in str(error)
