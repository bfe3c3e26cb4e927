"""acpx (a headless ACP client CLI) drives ``zeroclaw acp`` as a user would.

acpx knows ZeroClaw as a built-in agent (``acpx zeroclaw ...`` runs ``zeroclaw acp``),
so the test puts a ``zeroclaw`` wrapper for this source tree first on PATH. Set
``ZEROCLAW_ACPX`` to the acpx executable (scripts/test installs it under node 24);
the node beside it (acpx needs node >= 22) is preferred. HOME is a temp dir so
acpx's own session records stay inside the test.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pytest

from .conftest import DIAGNOSTICS, RawHostFactory
from .helpers import words
from .procs import alive, describe, host_argv, host_env, reap_leaks

ACPX_ENV = "ZEROCLAW_ACPX"
QUIET_TTL = ["--ttl", "1"]  # acpx's queue owner (and our host) exit 1 s after going idle


@dataclass
class Acpx:
    """Runs acpx commands in ``workspace`` and keeps a transcript for failure reports."""

    command: list[str]
    env: dict[str, str]
    workspace: Path
    config_dir: Path
    home: Path
    attached: bool = False  # zeroclaw is ``zeroclaw acp --attach``
    transcript: list[str] = field(default_factory=list)

    def run(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        argv = [*self.command, *args]
        done = subprocess.run(argv, cwd=self.workspace, env=self.env, capture_output=True,
                              text=True, timeout=timeout, check=False)
        self.transcript.append(
            f"$ {shlex.join(['acpx', *args])}\n(exit {done.returncode})\n"
            f"--- stdout ---\n{done.stdout}\n--- stderr ---\n{done.stderr}"
        )
        return done

    def ours(self, proc: psutil.Process) -> bool:
        """A zeroclaw process of this test, or acpx's queue owner started with our HOME."""
        try:
            if str(self.config_dir) in " ".join(proc.cmdline()):
                return True
            return "__queue-owner" in proc.cmdline() and proc.environ().get("HOME") == str(
                self.home)
        except psutil.Error:
            return False

    def wait_until_idle(self, timeout: float = 20) -> None:
        """Every process acpx started for us exits on its own (TTL), leaving nothing behind."""
        deadline = time.monotonic() + timeout
        while True:
            left = [p for p in psutil.process_iter() if alive(p) and self.ours(p)]
            if not left:
                return
            if time.monotonic() > deadline:
                leaks = [describe(p) for p in left]
                reap_leaks(left, 0)
                raise AssertionError(f"processes still running {timeout:.0f}s after acpx: {leaks}")
            time.sleep(0.2)


def acpx_command() -> list[str]:
    raw = os.environ.get(ACPX_ENV)
    if not raw:
        why = os.environ.get(f"{ACPX_ENV}_SKIP") or "path to the acpx CLI; scripts/test installs it"
        pytest.skip(f"{ACPX_ENV} is not set ({why})")
    path = Path(raw)
    if not path.exists():
        pytest.skip(f"{ACPX_ENV}={raw} does not exist")
    return ["node", str(path)] if path.suffix in (".js", ".mjs") else [str(path)]


def node_major(env: dict[str, str]) -> int:
    try:
        out = subprocess.run(["node", "--version"], env=env, capture_output=True, text=True,
                             timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    return int(out.strip().lstrip("v").split(".")[0] or 0)


def write_wrapper(bin_dir: Path, config_dir: Path, *extra: str) -> None:
    """``zeroclaw`` on PATH that runs this tree's ``zeroclaw acp --config-dir <ours>``."""
    bin_dir.mkdir()
    argv = host_argv(config_dir, *extra)
    entry, flags = argv[:3], argv[4:]  # drop "acp": acpx passes it
    script = bin_dir / "zeroclaw"
    script.write_text(f'#!/bin/sh\nexec {shlex.join(entry)} "$@" {shlex.join(flags)}\n')
    script.chmod(0o755)


@pytest.fixture(params=[False], ids=["embedded"])
def acpx(request: pytest.FixtureRequest, tmp_path: Path, config_dir: Path,
         workspace: Path) -> Iterator[Acpx]:
    """acpx with ``zeroclaw`` = ``zeroclaw acp``, or ``zeroclaw acp --attach`` when the
    test is parametrized indirectly with True (editors sharing one daemon)."""
    command = acpx_command()
    bin_dir, home = tmp_path / "bin", tmp_path / "home"
    home.mkdir()
    write_wrapper(bin_dir, config_dir, *(["--attach"] if request.param else []))
    env = host_env({"HOME": str(home)})
    env["PATH"] = os.pathsep.join([str(bin_dir), str(Path(command[-1]).parent), env["PATH"]])
    if node_major(env) < 22:
        pytest.skip("acpx needs node >= 22 on PATH (or beside ZEROCLAW_ACPX)")
    runner = Acpx(command, env, workspace, config_dir, home, attached=request.param)
    request.node.stash.setdefault(DIAGNOSTICS, []).append(lambda: "\n".join(runner.transcript))
    yield runner
    runner.wait_until_idle()


def frames_of(stdout: str) -> list[dict[str, Any]]:
    """acpx ``--format json`` prints one JSON object per line (the ACP traffic, or a summary)."""
    return [json.loads(line) for line in stdout.splitlines() if line.strip()]


def agent_text(frames: list[dict[str, Any]]) -> str:
    return "".join(
        f["params"]["update"]["content"]["text"] for f in frames
        if f.get("method") == "session/update"
        and f["params"]["update"].get("sessionUpdate") == "agent_message_chunk"
    )


def stop_reasons(frames: list[dict[str, Any]]) -> list[str]:
    return [f["result"]["stopReason"] for f in frames
            if isinstance(f.get("result"), dict) and "stopReason" in f["result"]]


def test_acpx_exec_one_shot(acpx: Acpx) -> None:
    done = acpx.run("--format", "json", "--approve-all", *QUIET_TTL,
                    "zeroclaw", "exec", "hello from acpx exec")
    assert done.returncode == 0
    frames = frames_of(done.stdout)
    assert words(agent_text(frames)) == ["hello", "from", "acpx", "exec"]
    assert stop_reasons(frames) == ["end_turn"]
    plain = acpx.run("--approve-all", *QUIET_TTL, "zeroclaw", "exec", "plain text output")
    assert plain.returncode == 0
    assert "plain text output" in plain.stdout and "end_turn" in plain.stdout


@pytest.mark.parametrize("acpx", [False, True], ids=["embedded", "attached"], indirect=True)
def test_acpx_named_session_continues_across_processes(
    acpx: Acpx, raw_hosts: RawHostFactory, workspace: Path
) -> None:
    """Embedded: each acpx process spawns its own host. Attached: each spawns
    ``zeroclaw acp --attach``, which shares (or starts) an ephemeral daemon; it
    exits with its last editor (``wait_until_idle`` checks nothing is left)."""
    created = acpx.run("--format", "json", *QUIET_TTL, "zeroclaw", "sessions", "new",
                       "--name", "e2e")
    assert created.returncode == 0
    prompts = ["first persistent words", "second persistent words"]
    resumed_ids = []
    for text in prompts:
        acpx.wait_until_idle()  # the previous acpx process and its host are gone
        done = acpx.run("--format", "json", "--approve-all", *QUIET_TTL,
                        "zeroclaw", "prompt", "-s", "e2e", text)
        assert done.returncode == 0
        frames = frames_of(done.stdout)
        [reopen] = [f for f in frames if f.get("method") in ("session/resume", "session/load")]
        answer = next(f for f in frames if f.get("id") == reopen["id"] and "method" not in f)
        assert "error" not in answer, answer
        resumed_ids.append(reopen["params"]["sessionId"])
        assert words(agent_text(frames)) == words(text)
        assert stop_reasons(frames) == ["end_turn"]
    assert resumed_ids[0] == resumed_ids[1]
    acpx.wait_until_idle()
    if acpx.attached:  # the editors went through a daemon, which ended on its own:
        daemon_log = (acpx.config_dir / "data" / "daemon.log").read_text()  # not killed
        assert "connection #1 from pid" in daemon_log  # with acpx's process tree
        assert "last client left" in daemon_log and "SIGTERM" not in daemon_log

    listed = acpx.run(*QUIET_TTL, "zeroclaw", "sessions", "list")
    assert resumed_ids[0] in listed.stdout
    acpx.wait_until_idle()
    raw = raw_hosts()
    raw.initialize()
    raw.call("session/load", {"sessionId": resumed_ids[0], "cwd": str(workspace),
                              "mcpServers": []})
    replayed = [
        n["params"]["update"]["content"]["text"].strip() for n in raw.notifications
        if n["params"]["update"].get("sessionUpdate") == "user_message_chunk"
    ]
    assert replayed == prompts
