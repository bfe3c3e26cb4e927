"""Fixtures for the daemon tests: started daemons are always stopped and leave no process."""

from __future__ import annotations

import shutil
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from .helpers import DaemonProc, short_dir


@pytest.fixture
def daemons() -> Iterator[Callable[..., DaemonProc]]:
    """``daemons(config_dir=None, *args, env_extra=None)`` starts a daemon, listening."""
    started: list[DaemonProc] = []

    def start(config_dir: Path | None = None, *args: str, wait: bool = True,
              **kwargs: Any) -> DaemonProc:
        daemon = DaemonProc(config_dir, *args, **kwargs)
        started.append(daemon)
        if wait:
            daemon.wait_listening(probe="--ephemeral" not in args)
        return daemon

    yield start
    leaks: list[str] = []
    for daemon in started:
        leaks += daemon.cleanup()
    assert not leaks, f"processes left behind: {leaks}"


@pytest.fixture
def scratch_dir() -> Iterator[Path]:
    """A short temp dir (socket paths under it stay within the 106-byte limit),
    removed afterwards."""
    path = short_dir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def flood() -> Iterator[list[socket.socket]]:
    """Client sockets of a test, closed afterwards."""
    socks: list[socket.socket] = []
    yield socks
    for sock in socks:
        sock.close()


@pytest.fixture
def database() -> Iterator[str]:
    """A fresh database on the test cluster of ``scripts/test`` (skipped without one)."""
    from tests.pg_support import fresh_database

    with fresh_database() as url:
        yield url


@pytest.fixture
def host_dirs() -> Iterator[Callable[[], Path]]:
    """Short config dirs for the hosts of a test (``host_dirs()`` makes one), removed
    afterwards."""
    made: list[Path] = []

    def make() -> Path:
        made.append(short_dir())
        return made[-1]

    yield make
    for directory in made:
        shutil.rmtree(directory, ignore_errors=True)
