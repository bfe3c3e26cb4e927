"""zeroclaw's own terminals for a hosted agent (:mod:`actors.worker.agents.acp_terminals`), with
real confined processes: output capped from the start, a bounded number per session,
everything killed when the session ends, refused in ``read_only``."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import psutil
import pytest

from actors.worker.agents.acp_terminals import MAX_TERMINALS, Terminals
from actors.worker.tools import PathPolicy
from ipc.errors import InternalError, InvalidParams


async def _processes(cmdline: list[str], count: int) -> list[psutil.Process]:
    """The ``count`` processes running ``cmdline``, once they all have started."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 10
    while True:
        found = [p for p in psutil.process_iter(["cmdline"]) if p.info["cmdline"] == cmdline]
        if len(found) >= count or loop.time() > deadline:
            assert len(found) == count, found
            return found
        await asyncio.sleep(0.05)


def _terminals(root: Path, mode: str = "supervised") -> Terminals:
    root = Path(os.path.realpath(root))
    return Terminals(PathPolicy.build(str(root), str(root), []), lambda: mode)


async def test_output_is_capped_from_the_start_and_the_exit_status_kept(tmp_path: Path) -> None:
    terminals = _terminals(tmp_path)
    created = await terminals.create({"command": "head -c 5000 /dev/zero | tr '\\0' a; echo z",
                                      "outputByteLimit": 100})
    ids = {"terminalId": created["terminalId"]}
    exited = await asyncio.wait_for(terminals.serve("terminal/wait_for_exit", ids), 20)
    assert exited == {"exitCode": 0, "signal": None}
    output = await terminals.serve("terminal/output", ids)
    assert output["output"] == "a" * 98 + "z\n" and output["truncated"] is True
    assert output["exitStatus"] == exited
    assert await terminals.serve("terminal/release", ids) == {}
    with pytest.raises(InvalidParams, match="no such terminal"):
        await terminals.serve("terminal/output", ids)


async def test_a_session_holds_a_bounded_number_and_its_end_kills_them(tmp_path: Path) -> None:
    terminals = _terminals(tmp_path)
    marker = "3117"
    for _ in range(MAX_TERMINALS):
        await terminals.create({"command": "sleep", "args": [marker]})
    with pytest.raises(InternalError, match="release one first"):
        await terminals.create({"command": "true"})
    sleepers = await _processes(["sleep", marker], MAX_TERMINALS)
    await asyncio.to_thread(terminals.close_all)
    _, alive = await asyncio.to_thread(psutil.wait_procs, sleepers, 10)
    assert not alive
    with pytest.raises(InternalError):
        await terminals.create({"command": "true"})


async def test_kill_ends_a_running_command_and_keeps_its_output(tmp_path: Path) -> None:
    terminals = _terminals(tmp_path)
    ids = await terminals.create({"command": "echo started; exec sleep 3118"})
    await _processes(["sleep", "3118"], 1)  # it printed first
    await terminals.serve("terminal/kill", ids)
    exited = await asyncio.wait_for(terminals.serve("terminal/wait_for_exit", ids), 20)
    assert exited["exitCode"] is None and exited["signal"] in ("SIGKILL", "SIGTERM")
    assert (await terminals.serve("terminal/output", ids))["output"] == "started\n"


async def test_read_only_and_paths_outside_the_session_are_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidParams, match="read_only"):
        await _terminals(tmp_path, "read_only").create({"command": "true"})
    with pytest.raises(InvalidParams, match="outside the allowed directories"):
        await _terminals(tmp_path / "..").create({"command": "true", "cwd": "/"})
