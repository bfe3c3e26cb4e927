"""The shell's sandbox backends on a real kernel: limits, cleanup, rules, configuration."""

from __future__ import annotations

import socket
import threading
from pathlib import Path

import pytest

from actors.worker.sandbox import (
    SandboxInfo,
    detect,
    worker_sandbox_environment,
    worker_sandbox_settings,
)
from actors.worker.tools import PathPolicy, ShellTool, ToolEnv, ToolError
from actors.worker.tools.sandbox import landlock_rules
from supervisor.config.config import ConfigError, Settings, settings_from_document
from tests.test_tools import none_left, sleep_marker

BACKENDS = [pytest.param(name, marks=pytest.mark.skipif(
    not detect(name).confines, reason=f"{name}: {detect(name).reason}")) for name in
    ("bwrap", "landlock")]


def session(tmp_path: Path, forbidden: tuple[str, ...] = ()) -> ToolEnv:
    cwd = tmp_path / "project"
    cwd.mkdir(exist_ok=True)
    policy = PathPolicy.build(str(cwd), str(tmp_path / "no-workspace-yet"), forbidden)
    return ToolEnv(paths=policy, cancelled=threading.Event())


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_timed_out_command_leaves_nothing_running_even_in_its_own_session(
    tmp_path: Path, backend: str
) -> None:
    marker = sleep_marker()
    command = f"setsid sleep {marker} & sleep {marker} & echo begun; sleep {marker}"
    with pytest.raises(ToolError, match="timed out"):
        ShellTool(sandbox=detect(backend)).run({"command": command, "timeout": 0.5},
                                               session(tmp_path))
    assert none_left(marker)


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_private_tmp_is_writable_and_gone_after_the_call(
    tmp_path: Path, backend: str
) -> None:
    tool = ShellTool(sandbox=detect(backend))
    result = tool.run({"command": 'echo t > "$TMPDIR/t" && cat "$TMPDIR/t" && echo "$TMPDIR"'},
                      session(tmp_path))
    assert result.ok and result.text.startswith("t\n")
    private = Path(result.text.split()[1])
    if backend == "landlock":
        assert not private.exists()
    assert result.raw_output["sandbox"] == backend


@pytest.mark.parametrize("backend", BACKENDS)
def test_cwd_holding_a_forbidden_directory_keeps_it_unreadable(
    tmp_path: Path, backend: str
) -> None:
    env = session(tmp_path, forbidden=(str(tmp_path / "project" / "keys"),))
    (tmp_path / "project" / "keys").mkdir()
    (tmp_path / "project" / "keys" / "k").write_text("KEY-MATERIAL")
    (tmp_path / "project" / "notes.txt").write_text("notes")
    result = ShellTool(sandbox=detect(backend)).run(
        {"command": "K=ke; cat notes.txt; cat ${K}ys/k; echo more >> notes.txt"}, env)
    assert "notes" in result.text and "KEY-MATERIAL" not in result.text
    assert (tmp_path / "project" / "notes.txt").read_text() == "notesmore\n"


def test_landlock_rules_never_reach_beneath_a_forbidden_path(tmp_path: Path) -> None:
    (tmp_path / "cwd" / "secret").mkdir(parents=True)
    (tmp_path / "cwd" / "src").mkdir()
    (tmp_path / "cwd" / "a.txt").write_text("a")
    forbidden = tmp_path / "cwd" / "secret"
    policy = PathPolicy.build(str(tmp_path / "cwd"), str(tmp_path / "cwd"),
                              ["/etc", str(forbidden)])
    rules = landlock_rules(policy, tmp_path / "tmp", abi=3)
    paths = [Path(path) for path, _ in rules]
    assert all(not p.is_relative_to("/etc") and not p.is_relative_to(forbidden) for p in paths)
    assert Path("/usr") in paths and Path("/") not in paths and Path("/dev") not in paths
    assert {tmp_path / "cwd" / "src", tmp_path / "cwd" / "a.txt"} <= set(paths)
    assert tmp_path / "cwd" not in paths  # it holds a forbidden path: allowed entry by entry


def test_without_a_backend_the_shell_refuses_unless_allowed(tmp_path: Path) -> None:
    nothing = SandboxInfo("none", "", "none", "disabled")
    with pytest.raises(ToolError, match=r"no OS sandbox.*allow_unsandboxed_shell = true"):
        ShellTool(sandbox=nothing, allow_unsandboxed=False).run({"command": "true"},
                                                                session(tmp_path))
    result = ShellTool(sandbox=nothing, allow_unsandboxed=True).run({"command": "echo ran"},
                                                                    session(tmp_path))
    assert result.text == "ran\n" and result.raw_output["sandbox"] == "none"


def test_workers_get_the_backend_the_host_resolved() -> None:
    env = worker_sandbox_environment(detect("none"), allow_unsandboxed=True)
    info, allowed = worker_sandbox_settings(env)
    assert (info.backend, allowed) == ("none", True)
    assert detect("bogus").backend == "none" and "unknown" in detect("bogus").reason


def test_config_keys_are_checked(tmp_path: Path) -> None:
    def settings(autonomy: dict[str, object]) -> Settings:
        return settings_from_document({"autonomy": autonomy}, tmp_path, tmp_path / "data", {})

    assert settings({}).sandbox == "auto"
    assert settings({"sandbox": "landlock", "allow_unsandboxed_shell": True}) \
        .allow_unsandboxed_shell is True
    with pytest.raises(ConfigError, match=r"autonomy\.sandbox must be one of"):
        settings({"sandbox": "docker"})
    with pytest.raises(ConfigError, match="allow_unsandboxed_shell must be true or false"):
        settings({"allow_unsandboxed_shell": "yes"})


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_cwd_of_thousands_of_entries_around_a_forbidden_one_still_runs(
    tmp_path: Path, backend: str
) -> None:
    """Landlock allows such a cwd entry by entry: far more rules than one argument holds."""
    env = session(tmp_path, forbidden=(str(tmp_path / "project" / "keys"),))
    (tmp_path / "project" / "keys").mkdir()
    for n in range(2500):
        (tmp_path / "project" / f"file-with-a-rather-long-name-{n:05d}.txt").write_text("x")
    result = ShellTool(sandbox=detect(backend)).run(
        {"command": "cat file-with-a-rather-long-name-02499.txt"}, env)
    assert result.ok and result.text == "x"


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_forbidden_file_inside_a_forbidden_directory_still_lets_commands_run(
    tmp_path: Path, backend: str
) -> None:
    """The daemon hides its data dir and its socket inside it: a command must still run."""
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "daemon.sock").write_text("")
    env = session(tmp_path, forbidden=(str(tmp_path / "data"), str(tmp_path / "data" /
                                                                   "daemon.sock")))
    result = ShellTool(sandbox=detect(backend)).run({"command": "echo ran"}, env)
    assert result.ok and result.text == "ran\n"


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_command_cannot_connect_to_a_hidden_socket(tmp_path: Path, backend: str) -> None:
    """Landlock does not cover ``connect`` to a socket's path, so the daemon's socket in
    its hidden data dir was reachable from a confined command; socket pairs still work."""
    (tmp_path / "data").mkdir()
    listening = socket.socket(socket.AF_UNIX)
    listening.bind(str(tmp_path / "data" / "daemon.sock"))
    listening.listen()
    env = session(tmp_path, forbidden=(str(tmp_path / "data"),))
    dial = (f"python3 -c \"import socket; socket.socket(socket.AF_UNIX).connect("
            f"'{tmp_path / 'data' / 'daemon.sock'}')\" && echo CONNECTED; "
            "python3 -c \"import socket; socket.socketpair(); print('paired')\"")
    with listening:
        result = ShellTool(sandbox=detect(backend)).run({"command": dial}, env)
    assert "CONNECTED" not in result.text and "paired" in result.text, result.text
