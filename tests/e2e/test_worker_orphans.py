"""A worker killed while a tool's command runs leaves no process behind (SPEC §5)."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import psutil

from .helpers import tool
from .sdkhost import SdkHost, expect_error
from .test_crash_recovery import worker_of_the_only_session


def sleepers(marker: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        if marker in " ".join(proc.info["cmdline"] or []):
            found.append(proc)
    return found


async def test_shell_command_dies_with_its_killed_worker(host: SdkHost, workspace: Path) -> None:
    sid = await host.new_session(workspace)
    await host.conn.set_session_mode(session_id=sid, mode_id="full")
    marker = "7717.25"  # an unusual sleep length, to find exactly this command
    turn = asyncio.create_task(host.prompt(sid, tool("shell", {"command": f"sleep {marker}"})))
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 10
    while not sleepers(marker):
        assert loop.time() < deadline, "the shell command never started"
        await asyncio.sleep(0.05)
    os.kill(await worker_of_the_only_session(host), signal.SIGKILL)
    await expect_error(asyncio.wait_for(turn, 10), -32603)
    deadline = loop.time() + 5
    while sleepers(marker):
        assert loop.time() < deadline, (
            f"the command outlived its worker: {[p.pid for p in sleepers(marker)]}")
        await asyncio.sleep(0.05)
