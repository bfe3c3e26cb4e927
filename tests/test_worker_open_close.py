"""A worker's opens and closes with and without their confirmation (actors/worker/main.py).

The host's ``session/new`` does not wait for SessionOpened and an eviction does not wait
for SessionClosed, so it asks for neither (``confirm=False``): the worker then opens and
closes the session just as a confirmed open and close do, and answers nothing.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from actors.worker.main import WorkerProcess
from ipc.worker_wire import (
    CloseSession,
    OpenFailed,
    OpenSession,
    SessionClosed,
    SessionOpened,
    decode,
)


@pytest.fixture
def worker(tmp_path: Path) -> Iterator[WorkerProcess]:
    """A worker's IO side, driven on this thread (its DEALER never connects)."""
    process = WorkerProcess(endpoint=f"ipc://{tmp_path}/none.sock", identity="w-test",
                            host_pid=os.getppid(), heartbeat=1.0)
    try:
        yield process
    finally:
        process._teardown()


WAIT = 10.0


def _open(sid: str, cwd: Path, *, confirm: bool, provider: str = "echo") -> OpenSession:
    return OpenSession(sid=sid, agent={"provider": provider, "alias": "main"},
                       workspace_dir=str(cwd), cwd=str(cwd), mode="full",
                       forbidden_paths=["/etc"], permission_timeout=WAIT, confirm=confirm)


def _open_and_close(worker: WorkerProcess, sid: str, cwd: Path,
                    confirm: bool) -> list[object]:
    """Open ``sid``, close it (its actor stopped), then close it again (unknown now):
    what the worker queued for the host meanwhile."""
    worker._dispatch(_open(sid, cwd, confirm=confirm))
    actor = worker.sessions[sid].actor
    worker._dispatch(CloseSession(sid, close_id=7, confirm=confirm))
    assert sid not in worker.sessions  # gone at once: a new open of it is taken
    worker._hand_off()
    assert actor.actor_stopped.wait(WAIT)
    worker._dispatch(CloseSession(sid, close_id=8, confirm=confirm))
    return [decode(frame) for frame in worker.outbox.take_all()]


def test_unconfirmed_opens_and_closes_do_what_confirmed_ones_do_unanswered(
    worker: WorkerProcess, tmp_path: Path,
) -> None:
    worker.outbox.take_all()  # its WorkerReady, if any
    assert _open_and_close(worker, "s1", tmp_path, confirm=True) == [
        SessionOpened(sid="s1"), SessionClosed(sid="s1", close_id=7),
        SessionClosed(sid="s1", close_id=8)]
    assert _open_and_close(worker, "s2", tmp_path, confirm=False) == []


def test_a_failed_open_is_answered_even_unconfirmed(worker: WorkerProcess,
                                                    tmp_path: Path) -> None:
    worker._dispatch(_open("s1", tmp_path, confirm=False, provider="nope"))
    taken = [decode(frame) for frame in worker.outbox.take_all()]
    assert len(taken) == 1 and isinstance(taken[0], OpenFailed)
    assert "unknown agent provider 'nope'" in taken[0].message
    assert "s1" not in worker.sessions


def test_an_open_closes_the_sessions_evicted_for_it_first_unanswered(
    worker: WorkerProcess, tmp_path: Path,
) -> None:
    """``OpenSession.evicted`` does what an unconfirmed CloseSession of each does, then
    the open: one message from the host for an eviction and the open it made room for."""
    worker._dispatch(_open("old", tmp_path, confirm=False))
    actor = worker.sessions["old"].actor
    worker._dispatch(replace(_open("new", tmp_path, confirm=False), evicted=["old", "gone"]))
    worker._hand_off()
    assert actor.actor_stopped.wait(WAIT)
    assert list(worker.sessions) == ["new"]
    assert worker.outbox.take_all() == []
