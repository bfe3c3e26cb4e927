"""What ``zeroclaw acp client``'s flags asked for, and its exit codes: made by
:mod:`supervisor.cli.acp_client_cli` on the main thread, read by the mode it runs
(:mod:`supervisor.cli.acp_client_tui`, :mod:`supervisor.cli.acp_client_json`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

__all__ = ["EXIT_PROMPT_ERROR", "EXIT_SERVER", "EXIT_USAGE", "ClientOptions"]

EXIT_PROMPT_ERROR = 1
EXIT_USAGE = 2
EXIT_SERVER = 3


@dataclass(frozen=True, slots=True)
class ClientOptions:
    """What the flags asked for. ``server``: the command to start."""

    server: list[str]
    cwd: Path
    auto_approve: bool
    json: bool
    prompts: list[str]
    approve_all: bool
