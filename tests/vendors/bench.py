"""What every vendor test shares (Claude Code, Codex, Gemini CLI): the coding task's
workspace, the bench one module's runs share (one adapter, one model server, one cwd
path, one HOME), the runs themselves (direct, through ``zeroclaw acp``, a reload in a new
``zeroclaw acp``, two editors on the daemon's ``acp.sock``), the hosting config and the
README snippet runs. Each vendor's module says only what differs: its server's
script, its environment, its prompts. Runs on the test's thread.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.daemon.helpers import DaemonProc, short_dir
from tests.e2e.model_server import ModelServer, Recorded, Reply
from tests.e2e.procs import REPO_ROOT, host_argv, host_env, write_config

from .harness import EditorClient, Received, closed_cleanly, live_as_replayed, replayed

__all__ = ["ANSWER", "BUGGY_CALC", "FIXED_CALC", "PROMPT", "Bench", "CalcTask", "Hosted", "Run",
           "fake_key", "hosting_config", "installed", "on_the_daemon", "open_bench",
           "pinned_version", "readme", "readme_run", "readme_snippet", "reloaded",
           "replay_differences", "two_editors"]

TURN_WAIT = 120.0
BUGGY_CALC = 'def add(a, b):\n    return a - b\n\n\nprint("add(2, 3) =", add(2, 3))\n'
FIXED_CALC = BUGGY_CALC.replace("a - b", "a + b")
PROMPT = "calc.py prints the wrong sum: read it, fix the bug, run it and tell me the result."
ANSWER = ("Fixed: `add` subtracted instead of adding. `python3 calc.py` now prints "
          "add(2, 3) = 5.")


def installed(variable: str, *, node: bool = True) -> str:
    """The path scripts/test put in ``variable`` (an adapter it installed), or skip with
    its reason (``<variable>_SKIP``); ``node``: the adapter also needs node on PATH."""
    found = os.environ.get(variable)
    if not found or (node and shutil.which("node") is None):
        pytest.skip(os.environ.get(f"{variable}_SKIP")
                    or f"{variable}{' or node' if node else ''} is missing "
                    "(scripts/test sets it)")
    return found


def fake_key(prefix: str) -> str:
    """An API key of a vendor's shape, made anew for each test run (no key in the repo)."""
    return f"{prefix}{secrets.token_hex(16)}"


@dataclass(frozen=True)
class CalcTask:
    """The coding task on ``cwd/calc.py``; a vendor's subclass answers its server
    (:meth:`responder`, on a server thread)."""

    cwd: Path

    @property
    def calc(self) -> Path:
        return self.cwd / "calc.py"

    def reset(self) -> None:
        """The workspace as the task starts: the buggy ``calc.py`` only."""
        self.calc.write_text(BUGGY_CALC, encoding="utf-8")
        for extra in self.cwd.iterdir():
            if extra.name != "calc.py":
                shutil.rmtree(extra) if extra.is_dir() else extra.unlink()

    def start_server(self) -> ModelServer:
        return ModelServer(self.responder)

    def responder(self, recorded: Recorded) -> Reply:
        raise NotImplementedError


@dataclass(frozen=True)
class Run:
    session_id: str
    records: list[Received]
    calc_after: str
    model_requests: list[Recorded]


@dataclass(frozen=True)
class Hosted:
    run: Run
    config_dir: Path
    env: dict[str, str]


def _all(records: list[Received]) -> list[Received]:
    return records


@dataclass
class Bench:
    """What every run of one vendor module shares. ``env(base_url, home, **options)``
    makes the adapter's variables with ``home`` fresh; ``config(config_dir)`` writes
    zeroclaw's config hosting it; ``prompts`` are the task's, in order; ``comparable``
    masks what differs between two runs of the same agent; ``close`` closes clients."""

    command: list[str]
    root: Path
    task: CalcTask
    server: ModelServer
    env: Callable[..., dict[str, str]]
    config: Callable[[Path], None]
    prompts: Sequence[str]
    comparable: Callable[[list[Received]], list[Received]] = _all
    close: Callable[..., None] = closed_cleanly
    settled: Callable[[list[Received]], bool] | None = field(default=None)

    @property
    def home(self) -> Path:
        return self.root / "home"

    def reset(self, **options: Any) -> dict[str, str]:
        """The files as the task starts and a fresh HOME; the adapter's variables."""
        self.task.reset()
        return self.env(self.server.url, self.home, **options)

    def run_task(self, client: EditorClient) -> Run:
        """The prompts in a new session of ``client`` (then what :attr:`settled` waits
        for, bounded: an update that may come after the turn)."""
        before = len(self.server.requests)
        client.initialize(timeout=60)
        sid = client.new_session(self.task.cwd, timeout=60)
        for prompt in self.prompts:
            result = client.prompt(sid, prompt, timeout=TURN_WAIT)
            assert result["stopReason"] == "end_turn", result
        if self.settled is not None:
            client.settle(self.settled)
        return Run(sid, self.comparable(client.records), self.task.calc.read_text(),
                   self.server.requests[before:])

    def spawn(self, env: dict[str, str], label: str = "direct") -> EditorClient:
        """The adapter itself, driven by the editor client."""
        return EditorClient.spawn(self.command, env=env, cwd=self.task.cwd,
                                  stderr_path=self.root / f"{label}.stderr", label=label)

    def zeroclaw(self, config_dir: Path, env: dict[str, str], label: str) -> EditorClient:
        """``zeroclaw acp`` on ``config_dir``, driven by the editor client."""
        return EditorClient.spawn(host_argv(config_dir), env=host_env(env),
                                  cwd=self.task.cwd,
                                  stderr_path=self.root / f"{label}.stderr", label=label)

    def direct(self) -> Run:
        """The task with the adapter driven directly."""
        client = self.spawn(self.reset())
        try:
            return self.run_task(client)
        finally:
            self.close(client)

    def hosted(self) -> Hosted:
        """The task through ``zeroclaw acp``."""
        env = self.reset()
        config_dir = self.root / "cfg"
        self.config(config_dir)
        client = self.zeroclaw(config_dir, env, "hosted")
        try:
            return Hosted(self.run_task(client), config_dir, env)
        finally:
            self.close(client)


def open_bench(root: Path, task: CalcTask, **parts: Any) -> Iterator[Bench]:
    """A module's bench on ``task`` (its cwd under ``root``), its server closed after."""
    server = task.start_server()
    try:
        yield Bench(root=root, task=task, server=server, **parts)
    finally:
        server.close()


def replay_differences(direct: Run, records: list[Received], label: str) -> tuple[str, str]:
    """What a ``session/load`` replayed (``records``): the user's text, and how the
    rest differs from what the direct run's editor saw live ("" when it does not)."""
    user, replay = replayed(records)
    return user, live_as_replayed(direct.records).diff(replay, ("direct live", label))


def reloaded(bench: Bench, hosted: Hosted) -> list[Received]:
    """What a new ``zeroclaw acp`` on the hosted run's store replays on ``session/load``."""
    client = bench.zeroclaw(hosted.config_dir, hosted.env, "reloaded")
    try:
        client.initialize(timeout=60)
        client.load_session(hosted.run.session_id, bench.task.cwd, timeout=60)
        return bench.comparable(client.records)
    finally:
        bench.close(client)


@contextlib.contextmanager
def on_the_daemon(bench: Bench) -> Iterator[Path]:
    """A daemon hosting the adapter (a fresh task); its ``acp.sock``. It must leave no
    process behind."""
    env = bench.reset()
    config_dir = short_dir()
    bench.config(config_dir)
    daemon = DaemonProc(config_dir, env_extra=env)
    try:
        daemon.wait_listening()
        yield daemon.socket_path.parent / "acp.sock"
    finally:
        daemon.terminate()
        leaks = daemon.cleanup()
        shutil.rmtree(config_dir, ignore_errors=True)
        assert not leaks, leaks


def two_editors(bench: Bench, check: Callable[[Run], None]) -> tuple[Run, list[Received]]:
    """The task by a first editor on the daemon's ``acp.sock`` (``check`` ed), then a
    second editor's ``session/load`` of it: the run and what the second one got."""
    first = second = None
    with on_the_daemon(bench) as acp_sock:
        try:
            first = EditorClient.connect(acp_sock, label="editor-1")
            run = bench.run_task(first)
            check(run)
            second = EditorClient.connect(acp_sock, label="editor-2")
            second.initialize()
            second.load_session(run.session_id, bench.task.cwd, timeout=60)
            return run, bench.comparable(second.records)
        finally:
            bench.close(*(c for c in (first, second) if c is not None))


def hosting_config(config_dir: Path, alias: str, command: list[str],
                   passed: Sequence[str], extra: str = "") -> None:
    """``config_dir/config.toml`` hosting ``command`` as agent ``alias`` (the default),
    ``passed`` handed on from zeroclaw's environment."""
    write_config(config_dir, f"""
[acp]
default_agent = "{alias}"
[agents.{alias}]
provider = "acp"
command = {json.dumps(command)}
pass_env = {json.dumps(list(passed))}
agent_start_timeout_secs = 60
{extra}
""")


def readme() -> str:
    return (REPO_ROOT / "docs" / "agents.md").read_text(encoding="utf-8")


def readme_snippet(name: str) -> str:
    """The README's TOML between ``<!-- snippet: NAME -->`` and its end marker."""
    marker = re.escape(name)
    pattern = re.compile(rf"<!-- snippet: {marker}(?: [^>]*)?-->\s*```toml\n(.*?)```"
                         rf"\s*<!-- /snippet: {marker} -->", re.S)
    [snippet] = pattern.findall(readme())
    return str(snippet)


def pinned_version(variable: str) -> str:
    """A version scripts/test pins (``NAME_VERSION="..."``)."""
    found = re.search(rf'{variable}="([^"]+)"',
                      (REPO_ROOT / "scripts" / "test").read_text(encoding="utf-8"))
    assert found is not None, variable
    return found[1]


@contextlib.contextmanager
def readme_run(tmp_path: Path, task_class: type[CalcTask], config: str,
               env: Callable[[ModelServer], dict[str, str]], secret: str
               ) -> Iterator[tuple[EditorClient, CalcTask, ModelServer]]:
    """``zeroclaw acp`` with ``config`` (a README snippet and what keeps the agent
    offline) on a fresh ``task_class`` task, its variables ``env(server)``, opened and
    initialized; it must close cleanly and its log must not hold ``secret``."""
    workspace = Path(os.path.realpath(tmp_path)) / "ws"
    workspace.mkdir()
    task = task_class(workspace)
    task.reset()
    config_dir = tmp_path / "cfg"
    write_config(config_dir, f"{config}agent_start_timeout_secs = 90\n")
    server = task.start_server()
    client = EditorClient.spawn(host_argv(config_dir), env=host_env(env(server)),
                                cwd=workspace, stderr_path=tmp_path / "zeroclaw.stderr",
                                label="zeroclaw")
    try:
        client.initialize()
        yield client, task, server
    finally:
        problems = client.close()
        server.close()
    assert not problems, problems
    assert secret not in (tmp_path / "zeroclaw.stderr").read_text(encoding="utf-8")
