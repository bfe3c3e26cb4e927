"""``zeroclaw acp client`` as a person uses it: in a real terminal (a detached tmux
session of fixed size), keys typed with ``send-keys``, the screen read with
``capture-pane``. Every wait polls the screen with a deadline; the last screen is
printed into the test's output."""

from __future__ import annotations

import re
import secrets
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from .procs import REPO_ROOT, host_env

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None,
                                reason="tmux is not installed (scripts/test installs it)")

ASKED = "type a number to answer"  # the last line of a permission request
ASKING_AGENT = REPO_ROOT / "tests" / "fixtures" / "acp_asking_agent.py"
_ENTRY_POINT = "import sys; from supervisor.cli.main import main; sys.exit(main())"


class Terminal:
    """One tmux server of our own (its own socket), one window of 120x50."""

    def __init__(self, cwd: Path) -> None:
        self.socket = f"zc-client-test-{secrets.token_hex(6)}"
        self.cwd = cwd
        self.windows = 0

    def tmux(self, *args: str) -> str:
        return subprocess.run(["tmux", "-f", "/dev/null", "-L", self.socket, *args],
                              capture_output=True, text=True, timeout=10, check=True,
                              env=host_env({"TERM": "xterm-256color"})).stdout

    def start(self, *client_args: str) -> str:
        """Run ``zeroclaw acp client ARGS`` in a new window; its target name."""
        argv = [sys.executable, "-c", _ENTRY_POINT, "acp", "client", *client_args]
        command = f"cd {shlex.quote(str(self.cwd))} && {shlex.join(argv)}; " \
                  "echo EXIT=$?; sleep 600"
        target = f"w{self.windows}"
        self.windows += 1
        if target == "w0":
            self.tmux("new-session", "-d", "-s", "t", "-n", target, "-x", "120", "-y", "50",
                      command)
        else:
            self.tmux("new-window", "-t", "t", "-n", target, command)
        return f"t:{target}"

    def keys(self, target: str, *keys: str) -> None:
        self.tmux("send-keys", "-t", target, *keys)

    def screen(self, target: str) -> str:
        return self.tmux("capture-pane", "-p", "-J", "-S", "-200", "-t", target)

    def wait_for(self, target: str, text: str, count: int = 1, timeout: float = 20) -> str:
        """The screen once ``text`` is on it ``count`` times (polled, bounded)."""
        deadline = time.monotonic() + timeout
        while True:
            screen = self.screen(target)
            if screen.count(text) >= count:
                return screen
            if time.monotonic() > deadline:
                raise AssertionError(f"{text!r} x{count} not on the screen after {timeout}s:\n"
                                     f"{screen}")
            time.sleep(0.1)

    def close(self) -> None:
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], capture_output=True,
                       timeout=10)


@pytest.fixture
def terminal(tmp_path: Path) -> Iterator[Terminal]:
    cwd = tmp_path / "project"
    (cwd / "src").mkdir(parents=True)
    (cwd / "src" / "a.py").write_text("x = 1\n")
    term = Terminal(cwd)
    try:
        yield term
    finally:
        term.close()


def show(term: Terminal, target: str) -> None:
    """The screen into the test's output (pytest shows it with -s and on failure)."""
    print(f"\n--- screen of {target} ---\n{term.screen(target)}--- end of screen ---")


def test_prompts_stream_permissions_are_answered_cancel_and_load_work(
    terminal: Terminal, tmp_path: Path,
) -> None:
    config = ("--config-dir", str(tmp_path / "cfg"))
    win = terminal.start(*config)
    try:
        screen = terminal.wait_for(win, "connected to zeroclaw-acp")
        sid = re.search(r"session (\S+) in ", screen)
        assert sid is not None
        terminal.keys(win, "hello from tmux", "Enter")
        terminal.wait_for(win, "(turn ended: end_turn)")
        assert terminal.screen(win).count("hello from tmux") >= 2  # typed, then streamed
        terminal.keys(win, '!tool file_write {"path": "x.txt", "content": "hi"}', "Enter")
        screen = terminal.wait_for(win, ASKED)
        assert "1. Allow once (allow_once)" in screen and "  +hi" in screen
        terminal.keys(win, "1", "Enter")
        terminal.wait_for(win, "wrote 2 bytes")
        assert (terminal.cwd / "x.txt").read_text() == "hi"
        terminal.keys(win, '!tool shell {"command": "touch nope"}', "Enter")
        terminal.wait_for(win, ASKED, count=2)
        terminal.keys(win, "3", "Enter")
        terminal.wait_for(win, "denied: the user chose 'reject_once'")
        terminal.keys(win, "slow start", "M-Enter", "!sleep 60", "M-Enter", "never said",
                      "Enter")
        terminal.wait_for(win, "slow start", count=2)
        terminal.keys(win, "/cancel", "Enter")
        terminal.wait_for(win, "(turn ended: cancelled)", timeout=15)
        assert "never said" not in terminal.screen(win).split("/cancel")[-1]
        terminal.keys(win, "/mode read_only", "Enter")
        terminal.wait_for(win, "[read_only]>")
        terminal.keys(win, "/quit", "Enter")
        terminal.wait_for(win, "EXIT=0")
    finally:
        show(terminal, win)
    assert not (terminal.cwd / "nope").exists()
    again = terminal.start(*config)
    try:
        terminal.wait_for(again, "connected to zeroclaw-acp")
        terminal.keys(again, "/list", "Enter")
        terminal.wait_for(again, f"   {sid.group(1)}")
        terminal.keys(again, f"/load {sid.group(1)}", "Enter")
        screen = terminal.wait_for(again, f"loaded {sid.group(1)}")
        assert "you> hello from tmux" in screen and "[read_only]>" in screen
        terminal.keys(again, "/quit", "Enter")
        terminal.wait_for(again, "EXIT=0")
    finally:
        show(terminal, again)


def test_reads_inside_cwd_are_auto_approved_and_the_rest_is_asked(terminal: Terminal) -> None:
    win = terminal.start("--server", sys.executable, "--server-args", str(ASKING_AGENT))
    try:
        terminal.wait_for(win, "connected to asking-agent")
        terminal.keys(win, 'ask file_read read {"path": "src/a.py"}', "Enter")
        terminal.wait_for(win, "chose allow-once")
        assert "auto-approved: file_read src/a.py" in terminal.screen(win)
        terminal.keys(win, 'ask shell read {"command": "cat src/a.py"}', "Enter")
        screen = terminal.wait_for(win, ASKED)
        assert "tool shell" in screen and "(read, pending)" in screen
        terminal.keys(win, "3", "Enter")
        terminal.wait_for(win, "chose reject-once")
        terminal.keys(win, 'ask file_read read {"path": "../outside.txt"}', "Enter")
        terminal.wait_for(win, ASKED, count=2)
        terminal.keys(win, "/cancel", "Enter")
        terminal.wait_for(win, "chose cancelled")
        assert terminal.screen(win).count("auto-approved") == 1
        terminal.keys(win, "/quit", "Enter")
        terminal.wait_for(win, "EXIT=0")
    finally:
        show(terminal, win)


def test_a_server_that_dies_exits_3(terminal: Terminal) -> None:
    dies = "import sys; sys.stdin.readline()"
    win = terminal.start("--server", sys.executable, "--server-args", "-c", dies)
    try:
        terminal.wait_for(win, "EXIT=3")
        assert "the server could not open a session" in terminal.screen(win)
    finally:
        show(terminal, win)
