"""Process trees (:mod:`actors.worker.process_tree`) with real processes: a tree's exit
status is its command's, and nothing the command started outlives the tree, however it
ends (the command exits, is killed, is asked to stop and takes its grace, or ignores it)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from actors.worker import process_tree

SLEEPER = Path(__file__).parent / "fixtures" / "setsid_sleeper.py"


def detached_pid(mark: Path, timeout: float = 10.0) -> int:
    deadline = time.monotonic() + timeout
    while not mark.exists():
        assert time.monotonic() < deadline, "the detached process never started"
        time.sleep(0.01)
    return int(mark.read_text())


def running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def start(script: str, grace: float = 0.0) -> subprocess.Popen[bytes]:
    return process_tree.start(["/bin/sh", "-c", script], grace=grace,
                              stdin=subprocess.DEVNULL, stdout=subprocess.PIPE)


def test_a_tree_exits_with_its_command_and_ends_what_it_left(tmp_path: Path) -> None:
    mark = tmp_path / "left.pid"
    proc = start(f"{sys.executable} {SLEEPER} {mark}; "
                 f"until [ -e {mark} ]; do sleep 0.01; done; echo done; exit 3")
    assert proc.stdout is not None
    assert proc.stdout.read() == b"done\n"  # the pipe ends with the command: no one holds it
    assert proc.wait(10) == 3
    assert not running(detached_pid(mark))  # gone before its launcher exited
    assert process_tree.end(proc) == 3


def test_a_command_killed_by_a_signal_is_reported_so(tmp_path: Path) -> None:
    proc = start("kill -KILL $$")
    assert proc.wait(10) == -signal.SIGKILL


@pytest.mark.parametrize(("script", "grace", "status"), [
    ("trap 'exit 7' TERM; sleep 100 & wait", 5.0, 7),  # ends in its grace: its own status
    ("trap '' TERM; sleep 100", 0.2, -signal.SIGTERM),  # ignores it: killed after the grace
])
def test_end_gives_the_grace_then_kills_the_tree(tmp_path: Path, script: str, grace: float,
                                                 status: int) -> None:
    mark = tmp_path / "left.pid"
    proc = start(f"{sys.executable} {SLEEPER} {mark}; {script}", grace=grace)
    pid = detached_pid(mark)
    started = time.monotonic()
    assert process_tree.end(proc, grace) == status
    assert time.monotonic() - started < grace + 1.0
    assert not running(pid)


def test_kill_tree_kills_every_descendant_even_in_another_session(tmp_path: Path) -> None:
    mark = tmp_path / "server.pid"
    proc = subprocess.Popen(["/bin/sh", "-c", f"{sys.executable} {SLEEPER} {mark} --stay"])
    pid = detached_pid(mark)
    killed = process_tree.kill_tree(proc.pid)
    assert proc.wait(10) == -signal.SIGKILL
    assert pid in killed
    deadline = time.monotonic() + 5
    while running(pid):  # re-parented to init, which reaps it
        assert time.monotonic() < deadline, "the detached child survived"
        time.sleep(0.01)
