"""Security of the tools through a real ``zeroclaw acp``: what a command may see, what a file
tool may open, what ``forbidden_paths`` means, and which mode decides a late permission answer.

Each test starts its own host (the SDK client or the raw pipe client) with its own config
dir and store, and looks at everything the host produced: frames, store files, stderr.
"""

from __future__ import annotations

import json
import secrets
import subprocess
from pathlib import Path

from tests.test_tools import Flipper

from .conftest import RawHostFactory, SdkHostFactory
from .helpers import host_status, tool
from .procs import host_argv, host_env, write_config
from .rawclient import RawHost

HOST_SECRETS = ("ZC_TEST_SECRET_API_KEY", "OPENAI_API_KEY", "AWS_SECRET_ACCESS_KEY",
                "GITHUB_TOKEN")


def files_holding(root: Path, needle: bytes) -> list[str]:
    """Every file under ``root`` whose bytes contain ``needle`` (db, WAL, shm, logs...)."""
    return [str(p) for p in sorted(root.rglob("*")) if p.is_file() and needle in p.read_bytes()]


def tool_outputs(host_wire: list[tuple[str, dict[str, object]]]) -> str:
    return "\n".join(json.dumps(frame) for _, frame in host_wire)


async def test_host_secrets_reach_no_command_client_store_log_or_status(
    sdk_hosts: SdkHostFactory, config_dir: Path, workspace: Path
) -> None:
    planted = {name: f"zc-{name.lower()}-{secrets.token_hex(12)}" for name in HOST_SECRETS}
    write_config(config_dir, '[agents.default]\nprovider = "echo"\n'
                 'env = {ZC_AGENT_VISIBLE = "agent-given"}\n[autonomy]\nlevel = "full"\n')
    prompts = [
        tool("shell", {"command": "env"}),
        tool("shell", {"command": "echo [$ZC_TEST_SECRET_API_KEY] [$GITHUB_TOKEN]"}),
        "!think about keys\nsome words\n" + tool("shell", {"command": "set"}),
        tool("file_write", {"path": "env.txt", "content": "x"}) + "\n"
        + tool("shell", {"command": "env > env.txt; cat env.txt"}),
        # the command's parent is the worker: its environment must hold no secret either
        tool("shell", {"command": "tr '\\0' '\\n' < /proc/$PPID/environ"}),
    ]
    async with sdk_hosts(config_dir, "--log-level", "debug", env_extra=planted) as host:
        await host.initialize()
        sid = await host.new_session(workspace)
        for prompt in prompts:
            assert (await host.prompt(sid, prompt)).stop_reason == "end_turn"
        env_output = json.dumps([u.raw_output for u in host.client.of(sid, "tool_call_update")])
        other = await host.new_session(workspace)
        await host.prompt(other, tool("shell", {"command": "printenv"}))
        status = json.dumps(await host_status(host))
        wire = tool_outputs(host.wire)
    stderr = host.stderr_path.read_bytes()
    for name, value in planted.items():
        assert value not in wire, f"{name} streamed to the client"
        assert value not in status, f"{name} in status"
        assert value.encode() not in stderr, f"{name} in the host's log"
        assert files_holding(config_dir, value.encode()) == [], f"{name} stored"
        assert files_holding(workspace, value.encode()) == [], f"{name} written by a command"
    assert (config_dir / "data" / "sessions" / "acp-sessions.db").stat().st_size > 0
    assert "ZC_AGENT_VISIBLE=agent-given" in env_output and "PATH=" in env_output
    assert "[] []" in env_output
    # the worker's own environment is out of sight (the sandbox's PID namespace, or
    # Landlock's ptrace scoping); the worker holds no secret either way
    assert "PYTHONPATH=" not in env_output


async def test_symlink_flips_never_let_file_tools_out_of_the_roots(
    sdk_hosts: SdkHostFactory, config_dir: Path, tmp_path: Path, workspace: Path
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("OUTSIDE-SECRET")
    (workspace / "toc.txt").write_text("inside toc")
    (workspace / "toc.swap").symlink_to(outside / "secret.txt")
    (workspace / "compdir").mkdir()
    (workspace / "compdir.swap").symlink_to(outside)
    write_config(config_dir, '[autonomy]\nlevel = "full"\n')
    reads = "\n".join(tool("file_read", {"path": "toc.txt"}) for _ in range(300))
    writes = "\n".join(tool("file_write", {"path": f"compdir/w{n}.txt", "content": "w"})
                       for n in range(300))
    async with sdk_hosts() as host:
        await host.initialize()
        sid = await host.new_session(workspace)
        with Flipper(workspace, "toc.txt", "toc.swap") as toc, \
                Flipper(workspace, "compdir", "compdir.swap") as compdir:
            for prompt in (reads, writes):
                assert (await host.prompt(sid, prompt)).stop_reason == "end_turn"
        updates = host.client.of(sid, "tool_call_update")
    assert toc.flips > 0 and compdir.flips > 0
    assert len([u for u in updates if u.status in ("completed", "failed")]) == 600
    assert "OUTSIDE-SECRET" not in json.dumps([u.raw_output for u in updates])
    assert sorted(p.name for p in outside.iterdir()) == ["secret.txt"]


async def test_forbidden_paths_with_variables_and_home_protect_what_they_name(
    sdk_hosts: SdkHostFactory, config_dir: Path, workspace: Path
) -> None:
    for name in (".aws", ".ssh", "vault"):
        (workspace / name).mkdir()
        (workspace / name / "credentials").write_text("KEY")
    write_config(config_dir, '[autonomy]\nlevel = "full"\n'
                 'forbidden_paths = ["$HOME/.aws", "~/.ssh", "${VAULT_DIR}"]\n')
    env = {"HOME": str(workspace), "VAULT_DIR": str(workspace / "vault")}
    async with sdk_hosts(env_extra=env) as host:
        await host.initialize()
        sid = await host.new_session(workspace)
        for name in (".aws", ".ssh", "vault"):
            read = tool("file_read", {"path": f"{name}/credentials"})
            assert (await host.prompt(sid, read)).stop_reason == "end_turn"
            [done] = host.client.of(sid, "tool_call_update")[-1:]
            assert done.status == "failed" and "forbidden" in json.dumps(done.raw_output), name


def test_relative_or_unset_forbidden_paths_stop_the_host_with_a_clear_message(
    config_dir: Path, tmp_path: Path
) -> None:
    cases = [('"secret-rel"', "'secret-rel' is not an absolute path"),
             ('"$ZC_TEST_UNSET_VAR/.aws"', "$ZC_TEST_UNSET_VAR is not set")]
    for entry, message in cases:
        write_config(config_dir, f"[autonomy]\nforbidden_paths = [{entry}]\n")
        done = subprocess.run(host_argv(config_dir), stdin=subprocess.DEVNULL,
                              capture_output=True, env=host_env(), timeout=30, cwd=tmp_path)
        assert done.returncode == 2, (entry, done)
        assert done.stdout == b"", "stdout carries protocol frames only"
        assert message in done.stderr.decode(), done.stderr


def test_permission_answered_after_set_mode_read_only_runs_nothing(
    raw_hosts: RawHostFactory, workspace: Path
) -> None:
    raw: RawHost = raw_hosts()
    raw.initialize()
    sid = raw.new_session(workspace)
    marker = workspace / "ran"
    raw.send({"jsonrpc": "2.0", "id": 1, "method": "session/prompt", "params": {
        "sessionId": sid, "prompt": tool("shell", {"command": f"touch {marker}"})}})
    ask = raw.next_frame()
    while ask.get("method") != "session/request_permission":
        ask = raw.next_frame()
    assert raw.call("session/set_mode", {"sessionId": sid, "modeId": "read_only"}) == {}
    allow = next(o for o in ask["params"]["options"] if o["kind"] == "allow_once")
    raw.send({"jsonrpc": "2.0", "id": ask["id"],
              "result": {"outcome": {"outcome": "selected", "optionId": allow["optionId"]}}})
    done = raw.next_response(timeout=15)
    assert done["id"] == 1 and done["result"]["stopReason"] == "end_turn"
    assert not marker.exists(), "the tool ran in read_only mode"
    updates = [n["params"]["update"] for n in raw.notifications
               if n["params"]["update"].get("sessionUpdate") == "tool_call_update"]
    assert updates[-1]["status"] == "failed"
    assert "read_only" in json.dumps(updates[-1]["rawOutput"])
