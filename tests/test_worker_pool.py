"""The worker pool with real worker processes over a real zmq ipc socket."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import os
import signal
import stat
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pytest
import zmq

from ipc.events import ToolItem, TurnRecord, event_from_wire
from ipc.worker_wire import (
    CancelTurn,
    CloseSession,
    OpenFailed,
    OpenSession,
    PermissionAsk,
    PermissionReply,
    SessionClosed,
    SessionOpened,
    SetMode,
    StartTurn,
    TurnEnded,
    TurnEvent,
    TurnFailed,
    WorkerMessage,
    encode,
)
from supervisor.workers.workers import WorkerPool

WAIT = 10.0
BEAT = 0.2
ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Harness:
    """A started pool plus what its callbacks saw."""

    cwd: Path
    pool: WorkerPool = field(init=False)
    queue: asyncio.Queue[tuple[str, WorkerMessage]] = field(default_factory=asyncio.Queue)
    exits: list[str] = field(default_factory=list)
    exited: asyncio.Event = field(default_factory=asyncio.Event)

    def on_message(self, worker_id: str, message: WorkerMessage) -> None:
        self.queue.put_nowait((worker_id, message))

    def on_exit(self, worker_id: str) -> None:
        self.exits.append(worker_id)
        self.exited.set()

    async def next(self, predicate: Callable[[WorkerMessage], bool],
                   seen: list[WorkerMessage] | None = None) -> Any:
        async with asyncio.timeout(WAIT):
            while True:
                _, message = await self.queue.get()
                if seen is not None:
                    seen.append(message)
                if predicate(message):
                    return message

    async def open(self, worker_id: str, sid: str = "s1", mode: str = "full",
                   agent: dict[str, Any] | None = None) -> WorkerMessage:
        sent = self.pool.send(worker_id, OpenSession(
            sid=sid, agent=agent or {"provider": "echo", "alias": "main"},
            workspace_dir=str(self.cwd), cwd=str(self.cwd), mode=mode,
            forbidden_paths=["/etc"], permission_timeout=WAIT,
        ))
        assert sent
        return await self.next(lambda m: isinstance(m, SessionOpened | OpenFailed))

    async def turn(self, worker_id: str, prompt: str, turn_id: str = "t1",
                   seen: list[WorkerMessage] | None = None) -> TurnEnded | TurnFailed:
        assert self.pool.send(worker_id, StartTurn(sid="s1", turn_id=turn_id, prompt=prompt))
        end = await self.next(lambda m: isinstance(m, TurnEnded | TurnFailed), seen)
        assert isinstance(end, TurnEnded | TurnFailed)
        return end


MakePool = Callable[..., Awaitable[Harness]]


def worker_children() -> list[psutil.Process]:
    """Our worker processes, and any child left unreaped (a zombie)."""
    found = []
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess):
            if child.status() == psutil.STATUS_ZOMBIE or "actors.worker.main" in child.cmdline():
                found.append(child)
    return found


async def wait_until(condition: Callable[[], bool], timeout: float = WAIT) -> None:
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.01)


def reaped(pid: int) -> bool:
    return not psutil.pid_exists(pid)


@pytest.fixture
async def make_pool(tmp_path: Path) -> AsyncIterator[Callable[..., Awaitable[Harness]]]:
    pools: list[WorkerPool] = []
    cwd = tmp_path / "cwd"
    cwd.mkdir()

    async def make(run_dir: Path | None = None, max_workers: int = 2) -> Harness:
        harness = Harness(cwd)
        harness.pool = WorkerPool(
            run_dir=run_dir or tmp_path / "run", on_message=harness.on_message,
            on_worker_exit=harness.on_exit, max_workers=max_workers, heartbeat_secs=BEAT,
        )
        pools.append(harness.pool)
        await harness.pool.start()
        return harness

    yield make
    for pool in pools:
        await pool.close()
    assert worker_children() == []


async def test_start_returns_at_once_and_a_worker_becomes_ready(
    make_pool: MakePool, tmp_path: Path
) -> None:
    started = time.monotonic()
    harness = await make_pool()
    assert time.monotonic() - started < 0.5
    assert harness.pool.ready_workers() == []  # spawning happens in the background
    worker_id = await harness.pool.wait_ready(WAIT)
    [status] = harness.pool.info()
    assert (status.worker_id, status.ready, status.alive) == (worker_id, True, True)
    process = psutil.Process(status.pid)
    assert process.ppid() == os.getpid()
    assert "actors.worker.main" in process.cmdline()
    socket_path = Path(harness.pool.endpoint.removeprefix("ipc://"))
    assert stat.S_ISSOCK(socket_path.stat().st_mode)
    assert socket_path.parent == tmp_path / "run"
    assert stat.S_IMODE(socket_path.parent.stat().st_mode) == 0o700
    assert harness.pool.pids() == [status.pid]


async def test_a_turn_streams_events_then_ends(make_pool: MakePool) -> None:
    harness = await make_pool()
    worker_id = await harness.pool.wait_ready(WAIT)
    assert isinstance(await harness.open(worker_id), SessionOpened)
    seen: list[WorkerMessage] = []
    end = await harness.turn(worker_id, "hello world", seen=seen)
    assert isinstance(end, TurnEnded)
    events = [event_from_wire(m.event) for m in seen if isinstance(m, TurnEvent)]
    assert [e.KIND for e in events] == ["message", "message", "usage"]
    record = TurnRecord.from_wire(end.record)
    assert (record.content, record.stop_reason, record.session_id) == ("hello world", "end_turn",
                                                                       "s1")
    await wait_until(lambda: harness.pool.info()[0].sessions == 1)  # from the heartbeat


async def test_cancel_stops_a_sleeping_turn_promptly(
    make_pool: MakePool,
) -> None:
    harness = await make_pool()
    worker_id = await harness.pool.wait_ready(WAIT)
    await harness.open(worker_id)
    assert harness.pool.send(worker_id, StartTurn(sid="s1", turn_id="t1",
                                                  prompt="first\n!sleep 30\nnever"))
    await harness.next(lambda m: isinstance(m, TurnEvent) and m.event.get("text") == "first")
    cancelled_at = time.monotonic()
    assert harness.pool.send(worker_id, CancelTurn(sid="s1"))
    end = await harness.next(lambda m: isinstance(m, TurnEnded))
    assert time.monotonic() - cancelled_at < 1.0
    record = TurnRecord.from_wire(end.record)
    assert record.stop_reason == "cancelled"
    assert record.content == "first\n[turn cancelled via client]"


async def test_permission_is_asked_and_the_reply_runs_the_tool(
    make_pool: MakePool,
) -> None:
    harness = await make_pool()
    worker_id = await harness.pool.wait_ready(WAIT)
    await harness.open(worker_id, mode="supervised")
    prompt = '!tool file_write {"path": "p.txt", "content": "yes"}'
    assert harness.pool.send(worker_id, StartTurn(sid="s1", turn_id="t1", prompt=prompt))
    ask = await harness.next(lambda m: isinstance(m, PermissionAsk))
    assert (ask.turn_id, ask.tool_name, ask.kind) == ("t1", "file_write", "edit")
    assert harness.pool.send(worker_id, PermissionReply(sid="s1", request_id=ask.request_id,
                                                        option_id="allow_once"))
    end = await harness.next(lambda m: isinstance(m, TurnEnded))
    tool = TurnRecord.from_wire(end.record).items[1]
    assert isinstance(tool, ToolItem) and tool.outcome == "completed"
    assert (harness.cwd / "p.txt").read_text() == "yes"


async def test_set_mode_then_close_the_session(make_pool: MakePool) -> None:
    harness = await make_pool()
    worker_id = await harness.pool.wait_ready(WAIT)
    await harness.open(worker_id, mode="full")
    assert harness.pool.send(worker_id, SetMode(sid="s1", mode="read_only"))
    end = await harness.turn(worker_id, '!tool shell {"command": "touch x"}')
    assert isinstance(end, TurnEnded)
    tool = TurnRecord.from_wire(end.record).items[1]
    assert isinstance(tool, ToolItem) and tool.result == "denied: autonomy is read_only"
    assert harness.pool.send(worker_id, CloseSession(sid="s1"))
    await harness.next(lambda m: isinstance(m, SessionClosed) and m.sid == "s1")
    failed = await harness.turn(worker_id, "hello", "t2")
    assert isinstance(failed, TurnFailed) and "not open" in failed.message


async def test_open_failures_are_answered(make_pool: MakePool) -> None:
    harness = await make_pool()
    worker_id = await harness.pool.wait_ready(WAIT)
    failed = await harness.open(worker_id, agent={"provider": "nope"})
    assert isinstance(failed, OpenFailed) and "unknown agent provider 'nope'" in failed.message
    failed = await harness.open(worker_id, mode="yolo")
    assert isinstance(failed, OpenFailed) and "unknown mode" in failed.message
    assert isinstance(await harness.open(worker_id), SessionOpened)
    failed = await harness.open(worker_id)
    assert isinstance(failed, OpenFailed) and "already open" in failed.message


async def test_killed_worker_is_reaped_reported_once_and_replaced(
    make_pool: MakePool,
) -> None:
    harness = await make_pool()
    worker_id = await harness.pool.wait_ready(WAIT)
    pid = harness.pool.pids()[0]
    killed_at = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    async with asyncio.timeout(WAIT):
        await harness.exited.wait()
    assert time.monotonic() - killed_at < 0.5  # the pidfd, not the heartbeat
    assert harness.exits == [worker_id]
    assert reaped(pid)
    assert not harness.pool.send(worker_id, CancelTurn(sid="s1"))
    replacement = await harness.pool.wait_ready(WAIT)
    assert replacement != worker_id
    await asyncio.sleep(3 * BEAT)
    assert harness.exits == [worker_id]


async def test_stopped_worker_is_declared_hung_and_replaced(
    make_pool: MakePool,
) -> None:
    harness = await make_pool()
    worker_id = await harness.pool.wait_ready(WAIT)
    pid = harness.pool.pids()[0]
    os.kill(pid, signal.SIGSTOP)
    async with asyncio.timeout(WAIT):
        await harness.exited.wait()
    assert harness.exits == [worker_id]
    assert reaped(pid)
    assert await harness.pool.wait_ready(WAIT) != worker_id


async def test_scale_to_is_capped_by_max_workers(
    make_pool: MakePool,
) -> None:
    harness = await make_pool(max_workers=2)
    harness.pool.scale_to(5)
    await wait_until(lambda: len(harness.pool.ready_workers()) == 2)
    assert len(harness.pool.info()) == 2
    assert len(set(harness.pool.pids())) == 2


async def test_wait_ready_times_out_when_no_worker_can_start(
    make_pool: MakePool,
) -> None:
    harness = await make_pool(max_workers=0)
    with pytest.raises(TimeoutError):
        await harness.pool.wait_ready(0.3)
    assert harness.pool.info() == []
    assert not harness.pool.send("w-nobody", CancelTurn(sid="s1"))


async def test_close_while_workers_are_starting_leaves_nothing_behind(
    make_pool: MakePool, tmp_path: Path
) -> None:
    harness = await make_pool()
    harness.pool.scale_to(2)
    waiter = asyncio.ensure_future(harness.pool.wait_ready(WAIT))
    await asyncio.sleep(0)
    closing = time.monotonic()
    await harness.pool.close()
    assert time.monotonic() - closing < 1.0
    with pytest.raises(TimeoutError):
        await waiter
    assert worker_children() == []
    assert list((tmp_path / "run").iterdir()) == []


async def test_frames_from_strangers_and_garbage_are_dropped(
    make_pool: MakePool,
) -> None:
    harness = await make_pool()
    worker_id = await harness.pool.wait_ready(WAIT)
    ctx = zmq.Context()
    stranger = ctx.socket(zmq.DEALER)
    stranger.setsockopt(zmq.IDENTITY, b"intruder")
    stranger.setsockopt(zmq.LINGER, 0)
    stranger.connect(harness.pool.endpoint)
    try:
        stranger.send(b"\xff not json")
        stranger.send(encode(SessionClosed(sid="forged")))
        stranger.send_multipart([b"two", b"frames"])
        await harness.open(worker_id)
        assert isinstance(await harness.turn(worker_id, "still fine"), TurnEnded)
        assert harness.queue.empty()
    finally:
        stranger.close()
        ctx.term()


async def test_deep_run_dir_falls_back_to_a_short_private_dir(
    make_pool: MakePool, tmp_path: Path
) -> None:
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    harness = await make_pool(run_dir=deep)
    socket_path = Path(harness.pool.endpoint.removeprefix("ipc://"))
    assert len(os.fsencode(socket_path)) < 107
    assert socket_path.parent.name.startswith("zc-")
    worker_id = await harness.pool.wait_ready(WAIT)
    await harness.open(worker_id)
    assert isinstance(await harness.turn(worker_id, "deep"), TurnEnded)
    await harness.pool.close()
    assert not socket_path.parent.exists()


async def test_two_pools_share_a_run_dir_and_close_cleans_up(
    make_pool: MakePool, tmp_path: Path
) -> None:
    first, second = await make_pool(), await make_pool()
    assert first.pool.endpoint != second.pool.endpoint
    ids = [await first.pool.wait_ready(WAIT), await second.pool.wait_ready(WAIT)]
    for harness, worker_id in zip((first, second), ids, strict=True):
        await harness.open(worker_id)
        assert isinstance(await harness.turn(worker_id, "mine"), TurnEnded)
    pids = first.pool.pids()
    closing = time.monotonic()
    await first.pool.close()
    assert time.monotonic() - closing < 1.0  # the workers obeyed Shutdown: no kill was needed
    assert all(reaped(pid) for pid in pids)
    assert sorted(p.suffix for p in (tmp_path / "run").iterdir()) == [".lock", ".sock"]
    assert isinstance(await second.turn(ids[1], "still mine", "t2"), TurnEnded)


async def test_workers_ignore_packages_in_the_hosts_cwd(
    make_pool: MakePool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    project = tmp_path / "user-project"
    (project / "actors").mkdir(parents=True)
    (project / "actors" / "__init__.py").write_text("raise ImportError('wrong actors')\n")
    monkeypatch.chdir(project)
    harness = await make_pool()
    worker_id = await harness.pool.wait_ready(WAIT)
    await harness.open(worker_id)
    assert isinstance(await harness.turn(worker_id, "right package"), TurnEnded)


HOST_SCRIPT = """
import asyncio, json, sys
from pathlib import Path
from supervisor.workers.workers import WorkerPool

async def main():
    pool = WorkerPool(run_dir=Path(sys.argv[1]), on_message=lambda w, m: None,
                      on_worker_exit=lambda w: None, max_workers=2, heartbeat_secs=0.2)
    await pool.start()
    pool.scale_to(2)
    while len(pool.ready_workers()) < 2:
        await asyncio.sleep(0.01)
    print(json.dumps(pool.pids()), flush=True)
    await asyncio.sleep(60)

asyncio.run(main())
"""


@contextlib.contextmanager
def child_subreaper() -> Iterator[None]:
    """Adopt orphaned descendants (so this test can reap them: PID 1 may not)."""
    libc = ctypes.CDLL(None, use_errno=True)
    pr_set_child_subreaper = 36
    libc.prctl(pr_set_child_subreaper, 1, 0, 0, 0)
    try:
        yield
    finally:
        libc.prctl(pr_set_child_subreaper, 0, 0, 0, 0)


async def start_host(run_dir: Path) -> tuple[asyncio.subprocess.Process, list[int]]:
    """A separate host process running a pool of two workers; returns it and their pids."""
    host = await asyncio.create_subprocess_exec(
        sys.executable, "-c", HOST_SCRIPT, str(run_dir),
        env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=asyncio.subprocess.PIPE)
    assert host.stdout is not None
    try:
        pids = json.loads(await asyncio.wait_for(host.stdout.readline(), WAIT))
    except BaseException:
        host.kill()
        await host.wait()
        raise
    assert len(pids) == 2
    return host, pids


async def test_workers_exit_when_their_host_is_killed(
    make_pool: MakePool, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    with child_subreaper():
        host, pids = await start_host(run_dir)
        host.kill()
        await host.wait()
        killed_at = time.monotonic()
        await wait_until(lambda: all(_reap_adopted(pid) for pid in pids), timeout=5.0)
    assert time.monotonic() - killed_at < 3.0
    assert len(list(run_dir.glob("w-*.sock"))) == 1  # the dead host could not clean up
    harness = await make_pool(run_dir=run_dir)  # a new host sweeps the stale files
    assert [p.name for p in run_dir.glob("w-*.sock")] == [
        Path(harness.pool.endpoint).name]


async def test_workers_exit_when_their_host_stops_pinging(tmp_path: Path) -> None:
    with child_subreaper():
        host, pids = await start_host(tmp_path / "run")
        try:
            os.kill(host.pid, signal.SIGSTOP)  # alive but silent: no Ping any more
            await wait_until(lambda: all(_exited(pid) for pid in pids), timeout=5.0)
        finally:
            host.kill()
            await host.wait()
        await wait_until(lambda: all(_reap_adopted(pid) for pid in pids), timeout=5.0)


def _exited(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _reap_adopted(pid: int) -> bool:
    """True once ``pid`` has exited (reaping it if it became our child)."""
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return reaped(pid)
    return done == pid


async def test_a_worker_busy_with_a_long_burst_of_opens_still_beats(
    make_pool: MakePool,
) -> None:
    """``session/new`` does not wait for the worker, so a burst of opens can keep its
    inbox full for longer than the hung threshold (three beats); it must keep
    beating meanwhile, not be killed as hung with every session on it."""
    harness = await make_pool(max_workers=1)
    worker_id = await harness.pool.wait_ready(WAIT)
    history = [{"role": "user", "text": "earlier prompt " * 20}] * 40  # some work per open
    opens = 3000
    for n in range(opens):
        assert harness.pool.send(worker_id, OpenSession(
            sid=f"s{n}", agent={"provider": "echo", "alias": "main"},
            workspace_dir=str(harness.cwd), cwd=str(harness.cwd), mode="full",
            forbidden_paths=[], permission_timeout=WAIT, history=history,
        ))
    opened = 0
    exited = asyncio.ensure_future(harness.exited.wait())
    try:
        async with asyncio.timeout(50):
            while opened < opens:
                message = asyncio.ensure_future(harness.queue.get())
                await asyncio.wait([message, exited], return_when=asyncio.FIRST_COMPLETED)
                assert harness.exits == [], f"declared hung after {opened} opens"
                assert not isinstance(message.result()[1], OpenFailed), message.result()
                opened += isinstance(message.result()[1], SessionOpened)
    finally:
        exited.cancel()
