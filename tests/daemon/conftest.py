"""Fixtures for the daemon tests: started daemons are always stopped and leave no process."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from .helpers import DaemonProc


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
