"""The tools on real files and a real shell: path confinement, file I/O, shell limits."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from actors.worker.sandbox import detect
from actors.worker.tools import (
    FileReadTool,
    FileWriteTool,
    PathDenied,
    PathPolicy,
    ShellTool,
    ToolEnv,
    ToolError,
    default_tools,
)


@pytest.fixture
def dirs(tmp_path: Path) -> tuple[Path, Path]:
    cwd = tmp_path / "project"
    workspace = tmp_path / "workspace"
    cwd.mkdir()
    workspace.mkdir()
    return cwd, workspace


def make_env(cwd: Path, workspace: Path, forbidden: tuple[str, ...] = ()) -> ToolEnv:
    policy = PathPolicy.build(str(cwd), str(workspace), forbidden)
    return ToolEnv(paths=policy, cancelled=threading.Event())


def gone(pid: int, timeout: float = 3.0) -> bool:
    """Not running any more within ``timeout`` (an orphan may stay a zombie until init reaps it)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)


def sleep_marker() -> str:
    """A ``sleep`` argument no other process uses: ``3000.<random digits>`` seconds."""
    return f"3000.{int.from_bytes(os.urandom(4), 'big')}"


def running_with(marker: str) -> list[int]:
    """Live (not zombie) processes whose command line holds ``marker``."""
    found = []
    for process in psutil.process_iter(["cmdline", "status"]):
        if process.info["status"] != psutil.STATUS_ZOMBIE and marker in (
                process.info["cmdline"] or []):
            found.append(process.pid)
    return found


def none_left(marker: str, timeout: float = 3.0) -> bool:
    """No process holding ``marker`` within ``timeout`` (a sandbox hides their pids)."""
    deadline = time.monotonic() + timeout
    while running_with(marker):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


# --- path confinement ------------------------------------------------------------------------


def test_relative_paths_start_at_cwd_and_may_not_escape(dirs: tuple[Path, Path]) -> None:
    cwd, workspace = dirs
    policy = PathPolicy.build(str(cwd), str(workspace), [])
    assert policy.resolve("notes/a.txt") == cwd.resolve() / "notes" / "a.txt"
    assert policy.resolve(str(workspace / "w.txt")) == workspace.resolve() / "w.txt"
    with pytest.raises(PathDenied, match="outside the allowed directories"):
        policy.resolve("../elsewhere.txt")
    with pytest.raises(PathDenied, match="outside"):
        policy.resolve("/etc/hostname")
    with pytest.raises(PathDenied, match="non-empty"):
        policy.resolve("")


def test_symlink_out_of_the_roots_is_judged_by_its_target(dirs: tuple[Path, Path],
                                                           tmp_path: Path) -> None:
    cwd, workspace = dirs
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("s")
    (cwd / "link").symlink_to(outside)
    policy = PathPolicy.build(str(cwd), str(workspace), [])
    with pytest.raises(PathDenied, match="outside"):
        policy.resolve("link/secret.txt")


def test_forbidden_paths_win_over_roots_and_expand_home(
    dirs: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    cwd, workspace = dirs
    monkeypatch.setenv("HOME", str(cwd))
    (cwd / ".ssh").mkdir()
    policy = PathPolicy.build(str(cwd), str(workspace), ["~/.ssh", "/etc"])
    with pytest.raises(PathDenied, match="forbidden"):
        policy.resolve(".ssh/id_rsa")
    assert policy.resolve("src/main.py") == cwd.resolve() / "src" / "main.py"
    with pytest.raises(PathDenied, match="forbidden"):
        policy.check_command("cat ~/.ssh/id_rsa")
    with pytest.raises(PathDenied, match="forbidden"):
        policy.check_command("ls -la /etc/")
    policy.check_command("ls -la src && echo done")


# --- files ----------------------------------------------------------------------------------


def test_file_write_then_read_round_trip(dirs: tuple[Path, Path]) -> None:
    cwd, workspace = dirs
    env = make_env(cwd, workspace)
    written = FileWriteTool().run({"path": "sub/dir/hello.txt", "content": "héllo\n"}, env)
    target = cwd / "sub" / "dir" / "hello.txt"
    assert target.read_text(encoding="utf-8") == "héllo\n"
    assert written.raw_output == {"path": str(target.resolve()), "bytes": 7}
    read = FileReadTool().run({"path": str(target)}, env)
    assert read.text == "héllo\n"
    assert read.raw_output["truncated"] is False
    assert [p.name for p in target.parent.iterdir()] == ["hello.txt"]  # no temp files left


def test_file_write_keeps_the_mode_of_an_existing_file(dirs: tuple[Path, Path]) -> None:
    cwd, workspace = dirs
    script = cwd / "run.sh"
    script.write_text("old")
    script.chmod(0o755)
    FileWriteTool().run({"path": "run.sh", "content": "new"}, make_env(cwd, workspace))
    assert script.read_text() == "new"
    assert script.stat().st_mode & 0o777 == 0o755


def test_file_tools_fail_clearly(dirs: tuple[Path, Path]) -> None:
    cwd, workspace = dirs
    env = make_env(cwd, workspace, ("/etc",))
    with pytest.raises(ToolError, match="no such file"):
        FileReadTool().run({"path": "missing.txt"}, env)
    with pytest.raises(ToolError, match="is a directory"):
        FileReadTool().run({"path": "."}, env)
    with pytest.raises(ToolError, match="outside"):
        FileWriteTool().run({"path": "/tmp/../var/x", "content": "x"}, env)
    with pytest.raises(ToolError, match="'content' is required"):
        FileWriteTool().run({"path": "a.txt"}, env)
    with pytest.raises(ToolError, match="'path' is required"):
        FileReadTool().run({}, env)


def test_file_read_is_capped(dirs: tuple[Path, Path]) -> None:
    cwd, workspace = dirs
    (cwd / "big.txt").write_text("x" * 100)
    result = FileReadTool(max_bytes=10).run({"path": "big.txt"}, make_env(cwd, workspace))
    assert result.raw_output["content"] == "x" * 10
    assert result.raw_output["truncated"] is True
    assert "truncated at 10 bytes" in result.text


# --- shell ----------------------------------------------------------------------------------


def test_shell_runs_in_the_session_cwd_and_merges_stderr(dirs: tuple[Path, Path]) -> None:
    cwd, workspace = dirs
    result = ShellTool().run({"command": "pwd; echo oops >&2"}, make_env(cwd, workspace))
    assert result.ok
    assert result.text == f"{cwd.resolve()}\noops\n"
    assert result.raw_output == {"exit_code": 0, "output": result.text, "truncated": False,
                                 "sandbox": detect().backend}


def test_shell_nonzero_exit_is_a_failed_result(dirs: tuple[Path, Path]) -> None:
    result = ShellTool().run({"command": "echo no; exit 3"}, make_env(*dirs))
    assert not result.ok
    assert result.raw_output["exit_code"] == 3
    assert result.text == "no\n\n[exit code 3]"


def test_shell_output_is_capped(dirs: tuple[Path, Path]) -> None:
    result = ShellTool(max_output=1000).run({"command": "yes | head -c 50000"}, make_env(*dirs))
    assert result.raw_output["truncated"] is True
    assert len(result.raw_output["output"].split("\n[output truncated")[0]) == 1000
    assert "50000 bytes" in result.text


def test_shell_timeout_kills_the_command(dirs: tuple[Path, Path]) -> None:
    started = time.monotonic()
    with pytest.raises(ToolError, match=r"timed out after 0\.3s"):
        ShellTool().run({"command": "echo begun; sleep 30", "timeout": 0.3}, make_env(*dirs))
    assert time.monotonic() - started < 3


def test_shell_cancel_kills_the_whole_process_group_promptly(dirs: tuple[Path, Path]) -> None:
    env = make_env(*dirs)
    marker = sleep_marker()
    command = f"sleep {marker} & echo started > started.txt; wait"
    errors: list[str] = []

    def run() -> None:
        try:
            ShellTool().run({"command": command}, env)
        except ToolError as exc:
            errors.append(str(exc))

    thread = threading.Thread(target=run)
    thread.start()
    deadline = time.monotonic() + 5
    while not (dirs[0] / "started.txt").exists() or not running_with(marker):
        assert time.monotonic() < deadline, "the command never started"
        time.sleep(0.01)
    cancelled_at = time.monotonic()
    env.cancelled.set()
    thread.join(timeout=5)
    assert not thread.is_alive()
    assert time.monotonic() - cancelled_at < 1.0
    assert errors and errors[0].startswith("cancelled")
    assert none_left(marker)


def test_shell_returns_when_the_shell_exits_despite_background_jobs(
    dirs: tuple[Path, Path],
) -> None:
    started = time.monotonic()
    marker = sleep_marker()
    ShellTool().run({"command": f"sleep {marker} & setsid sleep {marker} & echo $!"},
                    make_env(*dirs))
    assert time.monotonic() - started < 3
    assert none_left(marker)  # what it left behind was killed, even in its own session


def test_shell_refuses_forbidden_paths_and_bad_arguments(dirs: tuple[Path, Path]) -> None:
    env = make_env(*dirs, forbidden=("/etc",))
    with pytest.raises(ToolError, match="forbidden"):
        ShellTool().run({"command": "cat /etc/passwd"}, env)
    with pytest.raises(ToolError, match="'command' is required"):
        ShellTool().run({}, env)
    with pytest.raises(ToolError, match="positive number"):
        ShellTool().run({"command": "true", "timeout": -1}, env)
    env.cancelled.set()
    with pytest.raises(ToolError, match="cancelled before"):
        ShellTool().run({"command": "true"}, env)


def test_default_tools_kinds_and_mutation() -> None:
    tools = default_tools()
    assert {n: (t.kind, t.mutating) for n, t in tools.items()} == {
        "shell": ("execute", True),
        "file_read": ("read", False),
        "file_write": ("edit", True),
        "file_edit": ("edit", True),
        "file_list": ("search", False),
        "search": ("search", False),
        "ask_user": ("other", False),
        "deliver_file": ("read", False),
    }
    assert os.path.basename(tools["shell"].title({"command": "ls"})) == "shell: ls"


def test_file_read_refuses_a_fifo_instead_of_blocking(dirs: tuple[Path, Path]) -> None:
    cwd, workspace = dirs
    os.mkfifo(cwd / "pipe")
    started = time.monotonic()
    with pytest.raises(ToolError, match="not a regular file"):
        FileReadTool().run({"path": "pipe"}, make_env(cwd, workspace))
    assert time.monotonic() - started < 2
    with pytest.raises(ToolError, match="is a directory"):
        FileReadTool().run({"path": "."}, make_env(cwd, workspace))


# --- check-then-open races ------------------------------------------------------------------

#: Swaps two names atomically (renameat2 RENAME_EXCHANGE: never a moment without either)
#: in a tight loop, in its own process so that it really runs alongside the tool calls,
#: until stdin closes; then prints how many swaps it made.
_FLIP_SCRIPT = """
import ctypes, os, sys, threading
directory, a, b = sys.argv[1:4]
libc = ctypes.CDLL(None, use_errno=True)
fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
stop = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
flips = 0
print("ready", flush=True)
while not stop.is_set():
    if libc.renameat2(fd, a.encode(), fd, b.encode(), 2) != 0:
        sys.exit(f"renameat2: {os.strerror(ctypes.get_errno())}")
    flips += 1
print(flips, flush=True)
"""


class Flipper:
    """A process swapping ``name`` and ``swap`` in ``directory`` while the block runs."""

    def __init__(self, directory: Path, name: str, swap: str) -> None:
        self.flips = 0
        self._argv = [sys.executable, "-c", _FLIP_SCRIPT, str(directory), name, swap]

    def __enter__(self) -> Flipper:
        self._proc = subprocess.Popen(self._argv, stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, text=True)
        assert self._proc.stdout is not None
        assert self._proc.stdout.readline().strip() == "ready"
        return self

    def __exit__(self, *exc: object) -> None:
        out, _ = self._proc.communicate(timeout=10)
        assert self._proc.returncode == 0, out
        self.flips = int(out.strip())


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    path = tmp_path / "outside"
    path.mkdir()
    (path / "secret.txt").write_text("OUTSIDE-SECRET")
    return path


def test_file_read_never_returns_a_file_swapped_in_for_a_symlink(
    dirs: tuple[Path, Path], outside: Path
) -> None:
    cwd, workspace = dirs
    (cwd / "toc.txt").write_text("inside")
    (cwd / "toc.swap").symlink_to(outside / "secret.txt")
    env, tool = make_env(cwd, workspace), FileReadTool()
    assert tool.run({"path": "toc.txt"}, env).text == "inside"
    outcomes: dict[str, int] = {}
    with Flipper(cwd, "toc.txt", "toc.swap") as flipper:
        for _ in range(2000):
            try:
                text = tool.run({"path": "toc.txt"}, env).text
            except ToolError as exc:
                text = "refused" if "OUTSIDE" not in str(exc) else str(exc)
            outcomes[text] = outcomes.get(text, 0) + 1
    assert flipper.flips > 0
    assert set(outcomes) <= {"inside", "refused"}, outcomes


def test_file_write_never_lands_in_a_directory_swapped_for_a_symlink(
    dirs: tuple[Path, Path], outside: Path
) -> None:
    cwd, workspace = dirs
    (cwd / "compdir").mkdir()
    (cwd / "compdir.swap").symlink_to(outside)
    env, tool = make_env(cwd, workspace), FileWriteTool()
    tool.run({"path": "compdir/first.txt", "content": "x"}, env)
    with Flipper(cwd, "compdir", "compdir.swap") as flipper:
        for n in range(2000):
            with contextlib.suppress(ToolError):
                tool.run({"path": f"compdir/w{n}.txt", "content": "x"}, env)
    assert flipper.flips > 0
    assert sorted(p.name for p in outside.iterdir()) == ["secret.txt"]


def test_dotdot_and_links_inside_the_roots(dirs: tuple[Path, Path], outside: Path) -> None:
    cwd, workspace = dirs
    (cwd / "real").mkdir()
    (cwd / "real" / "a.txt").write_text("via link")
    (cwd / "alias").symlink_to(cwd / "real")
    env = make_env(cwd, workspace)
    assert FileReadTool().run({"path": "alias/a.txt"}, env).text == "via link"
    FileWriteTool().run({"path": "alias/new/b.txt", "content": "b"}, env)
    assert (cwd / "real" / "new" / "b.txt").read_text() == "b"
    assert FileReadTool().run({"path": "real/../real/a.txt"}, env).text == "via link"
    with pytest.raises(ToolError, match="outside"):
        FileReadTool().run({"path": "real/../../outside/secret.txt"}, env)


def test_forbidden_directory_is_refused_under_another_name(
    dirs: tuple[Path, Path], tmp_path: Path
) -> None:
    """A hard link or bind mount gives a forbidden file or directory a second name
    inside the roots; what is opened is compared by device and inode."""
    cwd, workspace = dirs
    secret_dir = cwd / "keys"
    secret_dir.mkdir()
    (secret_dir / "id").write_text("KEY")
    os.link(secret_dir / "id", cwd / "id-copy")
    env = make_env(cwd, workspace, forbidden=(str(secret_dir / "id"),))
    with pytest.raises(ToolError, match="forbidden"):
        FileReadTool().run({"path": "id-copy"}, env)
    with pytest.raises(ToolError, match="forbidden"):
        FileWriteTool().run({"path": "id-copy", "content": "x"}, env)
    assert (secret_dir / "id").read_text() == "KEY"


def test_relative_forbidden_entries_are_refused() -> None:
    with pytest.raises(ValueError, match="not absolute"):
        PathPolicy.build("/", "/", ["secret-rel"])


# --- the shell's environment ----------------------------------------------------------------


def test_shell_gets_no_host_secrets_only_allowed_variables_and_the_agent_env(
    dirs: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ZC_TEST_SECRET_API_KEY", "sk-unit-secret")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "aws-unit-secret")
    monkeypatch.setenv("LC_TIME", "C")
    monkeypatch.setenv("LANG", "C.UTF-8")
    policy = PathPolicy.build(str(dirs[0]), str(dirs[1]), ())
    env = ToolEnv(paths=policy, cancelled=threading.Event(),
                  agent_env={"RUST_LOG": "debug", "LANG": "en_US.UTF-8"})
    result = ShellTool().run({"command": "env"}, env)
    seen = dict(line.split("=", 1) for line in result.text.splitlines() if "=" in line)
    assert "unit-secret" not in result.text
    assert seen["RUST_LOG"] == "debug" and seen["LANG"] == "en_US.UTF-8"
    assert seen["LC_TIME"] == "C" and seen["PATH"] == os.environ["PATH"]
    assert set(seen) <= {"PATH", "HOME", "LANG", "TERM", "USER", "LOGNAME", "SHELL", "TMPDIR",
                         "TZ", "LC_TIME", "LC_ALL", "LC_CTYPE", "RUST_LOG", "PWD", "SHLVL", "_",
                         "OLDPWD", "LANGUAGE"}, sorted(seen)
