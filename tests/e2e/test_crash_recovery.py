"""``kill -9`` of the host or of a worker: SPEC §5 persistence and worker isolation.

The host is driven by the official ACP SDK; processes are found and killed with
psutil/signals, and the fixtures check that no worker outlives its host.
"""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

from .conftest import SdkHostFactory
from .helpers import host_status, split_turns, words
from .procs import alive, descendants
from .sdkhost import SdkHost, expect_error


async def load_turns(host: SdkHost, session_id: str, cwd: Path) -> list[tuple[str, list[str]]]:
    """``session/load`` and return the replay as (user text, agent words) per turn."""
    mark = host.client.mark()
    await host.conn.load_session(cwd=str(cwd), session_id=session_id)
    return [(t.user.strip(), words(t.agent))
            for t in split_turns(host.client.of(session_id, start=mark))]


async def test_host_killed_after_five_turns_keeps_them_all(
    sdk_hosts: SdkHostFactory, workspace: Path
) -> None:
    prompts = [f"turn number {n} words" for n in range(1, 6)]
    async with sdk_hosts() as first:
        await first.initialize()
        sid = await first.new_session(workspace)
        for text in prompts:
            assert (await first.prompt(sid, text)).stop_reason == "end_turn"
        first.kill9()
        assert await asyncio.wait_for(first.process.wait(), 5) == -signal.SIGKILL
    async with sdk_hosts() as second:
        await second.initialize()
        assert await load_turns(second, sid, workspace) == [(p, words(p)) for p in prompts]


async def test_host_killed_mid_turn_keeps_the_completed_turns(
    sdk_hosts: SdkHostFactory, workspace: Path
) -> None:
    async with sdk_hosts() as first:
        await first.initialize()
        sid = await first.new_session(workspace)
        await first.prompt(sid, "one done")
        await first.prompt(sid, "two done")
        turn = asyncio.create_task(first.prompt(sid, "three running\n!sleep 30"))
        await first.client.wait_text(sid, "running")
        first.kill9()
        await asyncio.wait_for(first.process.wait(), 5)
        turn.cancel()
        await asyncio.gather(turn, return_exceptions=True)
    async with sdk_hosts() as second:
        await second.initialize()
        replay = await load_turns(second, sid, workspace)
        assert replay == [("one done", ["one", "done"]), ("two done", ["two", "done"])]


async def worker_of_the_only_session(host: SdkHost) -> int:
    """The pid of the one worker that hosts a session, from ``status`` (SPEC §4)."""
    workers = (await host_status(host))["workers"]
    busy = [w["pid"] for w in workers
            if (w["sessions"] if isinstance(w["sessions"], int) else len(w["sessions"])) > 0]
    assert len(busy) == 1, f"expected exactly one worker with a session: {workers}"
    assert busy[0] in {p.pid for p in descendants(host.pid)}, "status names a non-child worker"
    return int(busy[0])


async def wait_for_new_worker(host: SdkHost, known: set[int], dead: int) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 10
    while True:
        pids = {p.pid for p in descendants(host.pid) if alive(p)}
        if pids - known and dead not in pids:
            return
        assert loop.time() < deadline, f"no replacement worker: before {known}, now {pids}"
        await asyncio.sleep(0.1)


async def test_killed_worker_fails_only_its_running_turn(host: SdkHost, workspace: Path) -> None:
    alpha = await host.new_session(workspace)
    assert (await host.prompt(alpha, "alpha completed turn")).stop_reason == "end_turn"
    turn = asyncio.create_task(host.prompt(alpha, "alpha sleeping\n!sleep 30"))
    await host.client.wait_text(alpha, "sleeping")
    worker = await worker_of_the_only_session(host)
    beta = await host.new_session(workspace)
    assert (await host.prompt(beta, "beta before")).stop_reason == "end_turn"
    known = {p.pid for p in descendants(host.pid)}

    os.kill(worker, signal.SIGKILL)
    exc = await expect_error(asyncio.wait_for(turn, 10), -32603)
    assert "session worker exited" in str(exc)

    out = await host.prompt(beta, "beta after")
    assert out.stop_reason == "end_turn" and words(out.content) == ["beta", "after"]
    await wait_for_new_worker(host, known, worker)
    replay = await load_turns(host, alpha, workspace)
    assert replay[0] == ("alpha completed turn", ["alpha", "completed", "turn"])
    out = await host.prompt(alpha, "alpha again")
    assert out.stop_reason == "end_turn" and words(out.content) == ["alpha", "again"]


async def test_a_new_session_is_on_disk_before_its_reply(
    sdk_hosts: SdkHostFactory, workspace: Path
) -> None:
    async with sdk_hosts() as first:
        await first.initialize()
        sid = await first.new_session(workspace)
        first.kill9()
        await asyncio.wait_for(first.process.wait(), 5)
    async with sdk_hosts() as second:
        await second.initialize()
        assert await load_turns(second, sid, workspace) == []
        out = await second.prompt(sid, "first words after the crash")
        assert out.stop_reason == "end_turn"
