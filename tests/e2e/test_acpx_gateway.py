"""acpx drives ``zeroclaw acp --attach ws://…/acp?agent=default`` (issue 10's acceptance):
each acpx process spawns a bridge to a daemon's gateway, as an editor on another
machine would, and a named session made by one acpx process is continued by the next.

See :mod:`tests.e2e.test_acpx` for how acpx is set up (``ZEROCLAW_ACPX``); the daemon
and its tenants are :mod:`tests.daemon.gateway_helpers`'.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.daemon.gateway_helpers import TOKENS, GatewayDaemon, gateway_config
from tests.daemon.helpers import DaemonProc, short_dir

from .conftest import DIAGNOSTICS
from .helpers import words
from .procs import host_env
from .test_acpx import (
    QUIET_TTL,
    Acpx,
    acpx_command,
    agent_text,
    frames_of,
    node_major,
    stop_reasons,
    write_wrapper,
)


@pytest.fixture
def gateway(workspace: Path) -> Iterator[GatewayDaemon]:
    """A daemon (its own short config dir: the remote machine) with a gateway; alice's
    root is the editor's workspace (acpx opens its sessions in its cwd, and a tenant's
    cwd must be inside its root)."""
    config_dir = short_dir()
    gateway_config(config_dir, alice=f'workspace_root = "{workspace}"')
    daemon = DaemonProc(config_dir, "--gateway", "127.0.0.1:0")
    try:
        yield GatewayDaemon(daemon)
    finally:
        leaks = daemon.cleanup()
        shutil.rmtree(config_dir, ignore_errors=True)
        assert not leaks, f"processes left behind: {leaks}"


@pytest.fixture
def remote_acpx(request: pytest.FixtureRequest, tmp_path: Path, config_dir: Path,
                workspace: Path, gateway: GatewayDaemon) -> Iterator[Acpx]:
    """acpx whose ``zeroclaw`` is ``zeroclaw acp --attach <the gateway's /acp>``, with
    alice's token in a file."""
    command = acpx_command()
    token_file = tmp_path / "token"
    token_file.write_text(TOKENS["alice"] + "\n")
    token_file.chmod(0o600)
    bin_dir, home = tmp_path / "bin", tmp_path / "home"
    home.mkdir()
    write_wrapper(bin_dir, config_dir, "--attach", f"{gateway.ws}/acp?agent=default",
                  "--token-file", str(token_file))
    env = host_env({"HOME": str(home)})
    env["PATH"] = os.pathsep.join([str(bin_dir), str(Path(command[-1]).parent), env["PATH"]])
    if node_major(env) < 22:
        pytest.skip("acpx needs node >= 22 on PATH (or beside ZEROCLAW_ACPX)")
    runner = Acpx(command, env, workspace, config_dir, home, attached=True)
    request.node.stash.setdefault(DIAGNOSTICS, []).append(
        lambda: "\n".join(runner.transcript) + "\n--- daemon ---\n" + gateway.daemon.stderr())
    yield runner
    runner.wait_until_idle()


def test_acpx_named_session_continues_across_processes_over_the_gateway(
        remote_acpx: Acpx, gateway: GatewayDaemon, workspace: Path) -> None:
    created = remote_acpx.run("--format", "json", *QUIET_TTL, "zeroclaw", "sessions", "new",
                              "--name", "remote")
    assert created.returncode == 0
    prompts = ["first remote words", "second remote words"]
    reopened = []
    for text in prompts:
        remote_acpx.wait_until_idle()  # the previous acpx process and its bridge are gone
        done = remote_acpx.run("--format", "json", "--approve-all", *QUIET_TTL,
                               "zeroclaw", "prompt", "-s", "remote", text)
        assert done.returncode == 0
        frames = frames_of(done.stdout)
        [reopen] = [f for f in frames if f.get("method") in ("session/resume", "session/load")]
        answer = next(f for f in frames if f.get("id") == reopen["id"] and "method" not in f)
        assert "error" not in answer, answer
        reopened.append(reopen["params"]["sessionId"])
        assert words(agent_text(frames)) == words(text)
        assert stop_reasons(frames) == ["end_turn"]
    assert reopened[0] == reopened[1]
    remote_acpx.wait_until_idle()
    with gateway.client("alice") as alice:  # the gateway's store has both turns
        alice.request("session/load", {"sessionId": reopened[0], "cwd": str(workspace)})
        replayed = [u["update"]["content"]["text"].strip() for u in alice.updates()
                    if u["update"].get("sessionUpdate") == "user_message_chunk"]
    assert replayed == prompts
    assert "connection #1 from pid" not in gateway.daemon.stderr()  # nothing came locally
    assert TOKENS["alice"] not in gateway.daemon.stderr()
