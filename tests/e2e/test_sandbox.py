"""The shell's OS sandbox, attacked as a model would, through a real ``zeroclaw acp``.

Each backend the machine has (bubblewrap, Landlock) is forced in turn with
``[autonomy] sandbox``; the session runs in ``full`` mode, so nothing but the sandbox
and the path policy stands between a command and the machine. Secrets sit in a
forbidden directory next to the session cwd, in ``~/.ssh`` (HOME is a temporary
directory) and in the host's environment; a directory outside the roots must stay
untouched. Every attack must come back refused or contained, and the host must keep
serving. Without a backend the shell is refused unless ``allow_unsandboxed_shell``.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from actors.worker.sandbox import detect
from tests.test_tools import none_left, sleep_marker

from .conftest import SdkHostFactory
from .helpers import host_status, tool
from .procs import write_config
from .sdkhost import SdkHost

BACKENDS = [pytest.param(name, marks=pytest.mark.skipif(
    not detect(name).confines, reason=f"{name}: {detect(name).reason}")) for name in
    ("bwrap", "landlock")]


@dataclass(frozen=True)
class Layout:
    """The planted secrets and the places an attack must not reach."""

    cwd: Path
    vault: Path
    home: Path
    outside: Path
    vault_secret: str
    ssh_secret: str
    env_secret: str

    @property
    def secrets(self) -> tuple[str, ...]:
        return (self.vault_secret, self.ssh_secret, self.env_secret)


@pytest.fixture
def layout(tmp_path: Path, workspace: Path) -> Layout:
    token = secrets.token_hex(8)
    vault, home, outside = tmp_path / "vault", tmp_path / "home", tmp_path / "outside"
    for directory in (vault, home / ".ssh", outside):
        directory.mkdir(parents=True)
    found = Layout(workspace, vault, home, outside, f"VAULT-{token}", f"SSH-KEY-{token}",
                   f"ENV-SECRET-{token}")
    (vault / "secret.txt").write_text(found.vault_secret)
    (home / ".ssh" / "id_rsa").write_text(found.ssh_secret)
    (outside / "kept.txt").write_text("kept")
    (workspace / "to-vault").symlink_to(vault)  # planted: a link out of the cwd
    (workspace / "dangling").symlink_to(outside / "created-through-link.txt")
    return found


def sandbox_config(backend: str, extra: str = "") -> str:
    return ('[autonomy]\nlevel = "full"\nforbidden_paths = ["/etc", "~/.ssh", "${ZC_VAULT}"]\n'
            f'sandbox = "{backend}"\n{extra}')


def host_env_for(layout: Layout) -> dict[str, str]:
    return {"HOME": str(layout.home), "ZC_VAULT": str(layout.vault),
            "ZC_TEST_SECRET_API_KEY": layout.env_secret}


async def run_tool(host: SdkHost, sid: str, name: str, args: dict[str, Any]) -> Any:
    """Run one tool call in its own turn; its final update."""
    assert (await host.prompt(sid, tool(name, args))).stop_reason == "end_turn"
    return host.client.of(sid, "tool_call_update")[-1]


def shell_attacks(layout: Layout, marker: str) -> dict[str, str]:
    """Commands that try to read a secret or write outside the roots. Forbidden names are
    built by the shell (``$V``, ``$E``, ``$S``), so the command-line word check cannot see
    them and the sandbox must stop them."""
    parent = layout.cwd.parent
    names = "V=va; E=et; S=.ss; O=out; "
    attacks = {
        "cd / then a relative path": "cd / && cat ${E}c/passwd ${E}c/hostname",
        "absolute path": "cat /${E}c/passwd",
        "dot-dot": "cat ../${V}ult/secret.txt",
        "planted symlink out of the cwd": "cat to-${V}ult/secret.txt",
        "new symlink out of the cwd": f"ln -s {parent}/${{V}}ult v && cat v/secret.txt",
        "/proc/self/root": f"cat /proc/self/root{parent}/${{V}}ult/secret.txt",
        "/proc/1/root": "cat /proc/1/root/${E}c/passwd",
        "/proc/PPID/root": f"cat /proc/$PPID/root{parent}/${{V}}ult/secret.txt",
        "hard link": f"ln {parent}/${{V}}ult/secret.txt hl; cat hl",
        "home ssh key": "cd ~ && cat ./${S}h/id_rsa; cat ~/${S}h/id_rsa",
        "every process environment":
            "for p in /proc/[0-9]*; do tr '\\0' '\\n' < $p/environ; done 2>&1; "
            "tr '\\0' '\\n' < /proc/$PPID/environ; env",
        "write outside the roots": f"echo pwned > {parent}/${{O}}side/w.txt; mkdir "
                                   f"{parent}/${{O}}side/d; rm -f {parent}/${{O}}side/kept.txt",
        "write through a dangling symlink": "echo pwned > dangling",
        "write into the forbidden ssh dir": "echo pwned >> ~/${S}h/authorized_keys",
        "write to the root of the filesystem": f"touch /zc-{marker}; touch /usr/zc-{marker}",
        # root may write sysctls without capabilities (core_pattern runs a host program)
        "kernel settings": "cat /proc/sys/vm/swappiness > /proc/sys/vm/swappiness "
                           "&& echo SYSCTL-WRITTEN",
        "fork left running": f"sleep {marker} & setsid sleep {marker} & "
                             f"(nohup sleep {marker} >/dev/null 2>&1 &); echo forked",
    }
    return {name: names + command for name, command in attacks.items()}


@pytest.mark.parametrize("backend", BACKENDS)
async def test_escape_attempts_through_the_shell_and_file_tools_are_contained(
    sdk_hosts: SdkHostFactory, config_dir: Path, layout: Layout, backend: str
) -> None:
    write_config(config_dir, sandbox_config(backend))
    passwd_line = next(iter(Path("/etc/passwd").read_text().splitlines()), "root:x:0:0")
    marker = sleep_marker()
    outputs: dict[str, str] = {}
    async with sdk_hosts(env_extra=host_env_for(layout)) as host:
        init = await host.raw("initialize", {"protocolVersion": 1})
        assert init["_meta"]["zeroclaw"]["sandbox"]["backend"] == backend
        sid = await host.new_session(layout.cwd)
        for name, command in shell_attacks(layout, marker).items():
            done = await run_tool(host, sid, "shell", {"command": command})
            outputs[name] = json.dumps(done.raw_output)
            if name == "fork left running":
                assert "forked" in outputs[name]
                outlived = not none_left(marker)
        for path in ("../vault/secret.txt", f"/proc/self/root{layout.vault}/secret.txt",
                     "to-vault/secret.txt", str(layout.home / ".ssh" / "id_rsa"), "/etc/passwd"):
            done = await run_tool(host, sid, "file_read", {"path": path})
            assert done.status == "failed", path
            outputs[f"file_read {path}"] = json.dumps(done.raw_output)
        done = await run_tool(host, sid, "file_write", {"path": "dangling", "content": "x"})
        assert done.status == "failed"
        status = await host_status(host)
        assert status["sandbox"]["backend"] == backend
        ok = await run_tool(host, sid, "shell",
                            {"command": "echo alive > alive.txt; cat alive.txt"})
        assert ok.status == "completed" and "alive" in json.dumps(ok.raw_output)
    leaks = [name for name, output in outputs.items()
             if any(secret in output for secret in (*layout.secrets, passwd_line))]
    assert leaks == [], "secrets leaked"
    assert not outlived, "a process started by the command outlived it"
    assert "SYSCTL-WRITTEN" not in outputs["kernel settings"]
    assert sorted(p.name for p in layout.outside.iterdir()) == ["kept.txt"]
    assert sorted(p.name for p in (layout.home / ".ssh").iterdir()) == ["id_rsa"]
    assert not Path(f"/zc-{marker}").exists() and not Path(f"/usr/zc-{marker}").exists()
    assert (layout.cwd / "alive.txt").read_text() == "alive\n"


@pytest.mark.parametrize("backend", BACKENDS)
async def test_read_only_mode_runs_no_write_even_when_the_sandbox_would_allow_it(
    sdk_hosts: SdkHostFactory, config_dir: Path, layout: Layout, backend: str
) -> None:
    write_config(config_dir, sandbox_config(backend))
    async with sdk_hosts(env_extra=host_env_for(layout)) as host:
        await host.initialize()
        sid = await host.new_session(layout.cwd)
        assert await host.raw("session/set_mode", {"sessionId": sid, "modeId": "read_only"}) \
            in ({}, None)
        for name, args in (("shell", {"command": "touch made.txt"}),
                           ("file_write", {"path": "made.txt", "content": "x"})):
            done = await run_tool(host, sid, name, args)
            assert done.status == "failed" and "read_only" in json.dumps(done.raw_output)
    assert not (layout.cwd / "made.txt").exists()


async def test_without_a_sandbox_the_shell_is_refused_unless_allowed(
    sdk_hosts: SdkHostFactory, config_dir: Path, layout: Layout
) -> None:
    write_config(config_dir, sandbox_config("none"))
    async with sdk_hosts(env_extra=host_env_for(layout)) as host:
        init = await host.raw("initialize", {"protocolVersion": 1})
        assert init["_meta"]["zeroclaw"]["sandbox"]["backend"] == "none"
        sid = await host.new_session(layout.cwd)
        done = await run_tool(host, sid, "shell", {"command": "echo ran > ran.txt"})
        status = await host_status(host)
    assert done.status == "failed"
    message = json.dumps(done.raw_output)
    assert "no OS sandbox" in message and "allow_unsandboxed_shell = true" in message
    assert not (layout.cwd / "ran.txt").exists()
    assert status["sandbox"]["backend"] == "none"
    assert status["sandbox"]["allowUnsandboxedShell"] is False

    write_config(config_dir, sandbox_config("none").replace('"full"', '"supervised"'))
    async with sdk_hosts(env_extra=host_env_for(layout)) as host:
        await host.initialize()
        sid = await host.new_session(layout.cwd)
        done = await run_tool(host, sid, "shell", {"command": "echo ran > ran.txt"})
        assert host.client.permission_asks == []  # nothing to approve: it cannot run
    assert done.status == "failed" and "no OS sandbox" in json.dumps(done.raw_output)
    assert not (layout.cwd / "ran.txt").exists()

    write_config(config_dir, sandbox_config("none", "allow_unsandboxed_shell = true\n"))
    async with sdk_hosts(env_extra=host_env_for(layout)) as host:
        await host.initialize()
        sid = await host.new_session(layout.cwd)
        done = await run_tool(host, sid, "shell", {"command": "echo ran > ran.txt"})
        status = await host_status(host)
    assert done.status == "completed" and done.raw_output["sandbox"] == "none"
    assert (layout.cwd / "ran.txt").read_text() == "ran\n"
    assert status["sandbox"]["allowUnsandboxedShell"] is True


@pytest.mark.parametrize("backend", BACKENDS)
async def test_a_command_cannot_read_the_hosts_store_even_from_a_cwd_that_holds_it(
    sdk_hosts: SdkHostFactory, config_dir: Path, layout: Layout, backend: str
) -> None:
    """Another session's conversation is in the store under the host's data dir."""
    write_config(config_dir, sandbox_config(backend))
    said = f"PRIVATE-WORDS-{secrets.token_hex(8)}"
    async with sdk_hosts(env_extra=host_env_for(layout)) as host:
        await host.initialize()
        other = await host.new_session(layout.cwd)
        assert (await host.prompt(other, f"remember {said}")).stop_reason == "end_turn"
        sid = await host.new_session(config_dir.parent)
        command = (f"D=dat; grep -a -o -h 'PRIVATE-WORDS-[0-9a-f]*' {config_dir.name}/${{D}}a/"
                   f"sessions/*; ls -R {config_dir.name}")
        done = await run_tool(host, sid, "shell", {"command": command})
        (layout.cwd / "probe.txt").write_text("probe-text")
        probe = await run_tool(host, sid, "shell",
                               {"command": f"cat {layout.cwd.name}/probe.txt"})
    assert said not in json.dumps(done.raw_output)
    assert "probe-text" in json.dumps(probe.raw_output)  # the rest of the cwd is usable
