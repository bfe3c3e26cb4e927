"""Every fenced block of README.md and docs/*.md is run, or says why not.

A block is marked by an HTML comment in the run of comment lines right above its
fence: ``<!-- test: KIND [OPTION...] [(note)] -->``. The kinds:

- ``config``: a ``config.toml`` of zeroclaw's; it goes through the real loader
  (``supervisor.config.load_settings``) and every agent in it through the check the
  host makes at ``session/new`` (``agent_config_problem``), with fake values for the
  key variables it names. Option ``absent-command``: the agent's program is not
  installed here (goose), so the one problem allowed is that it is not found.
- ``toml`` / ``json``: another program's file (Codex's config, Zed's settings); it must parse.
- ``shell``: run with bash (``-euo pipefail``) in a scratch directory, with a fresh
  ``ZEROCLAW_CONFIG_DIR`` and ``HOME``, this checkout's ``zeroclaw`` first on
  ``PATH`` and ``/path/to/zeroclaw`` meaning this checkout; it must exit 0.
  Option ``daemon``: a ``zeroclaw daemon --gateway`` runs on that config dir
  meanwhile (``127.0.0.1:8080`` in the block is its real address) and must stop
  cleanly after (``localhost:8443`` too). Option ``acpx``: needs the pinned acpx of
  ``scripts/test``. Option ``continues``: runs after the page's shell block before
  it, in the same directories (a setup, then its use). Option ``postgresql``: the
  block's ``postgresql://zeroclaw@db.internal:5432/zeroclaw`` is a fresh database of
  the test cluster of ``scripts/test`` (skipped without one), and
  ``ZEROCLAW_PG_PASSWORD`` is set (the cluster trusts loopback logins).
- ``daemon``: one ``zeroclaw daemon ...`` command line; it is started (port 8080
  becomes a free one), must answer ``zeroclaw status`` and exit 0 on SIGTERM.
- ``unit``: the text of ``docs/zeroclaw.service``, which is checked on its own below.
- ``prometheus``: a Prometheus scrape config; parsed, then its scrape is done against
  a real gateway with the admin token at its ``credentials_file``.
- ``skip (reason)``: not run; the reason is required.

Runs on the test's main thread; every subprocess is bounded by a timeout.
"""

from __future__ import annotations

import configparser
import json
import os
import re
import shlex
import shutil
import signal
import ssl
import subprocess
import sys
import time
import tomllib
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from actors.worker.agents import agent_config_problem
from supervisor.config import load_settings
from tests.daemon.gateway_helpers import GatewayDaemon
from tests.daemon.helpers import DaemonProc, short_dir
from tests.e2e.procs import host_env

REPO_ROOT = Path(__file__).resolve().parents[1]
DOCS = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]
UNIT = REPO_ROOT / "docs" / "zeroclaw.service"
KINDS = {"config", "toml", "json", "shell", "daemon", "unit", "prometheus", "skip"}
SHELL_TIMEOUT = 120.0
FENCE = re.compile(r"^\s*(```+|~~~+)\s*(\S*).*$")  # any info string, indented too
MARKER = re.compile(r"^<!--\s*test:\s*([\w-]+)((?:\s+[\w-]+)*)\s*(?:\((.*)\))?\s*-->$")


@dataclass(frozen=True, slots=True)
class Block:
    path: Path
    line: int  # of the opening fence, from 1
    language: str
    kind: str | None  # None: no marker
    options: tuple[str, ...]
    note: str
    text: str

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(REPO_ROOT)}:{self.line}"


def _marker(lines: list[str], fence: int) -> tuple[str | None, tuple[str, ...], str]:
    """The ``test:`` comment among the comment lines right above line ``fence``."""
    above = fence - 1
    while above >= 0 and lines[above].strip().startswith("<!--"):
        found = MARKER.match(lines[above].strip())
        if found:
            return found[1], tuple(found[2].split()), (found[3] or "").strip()
        above -= 1
    return None, (), ""


def blocks_of(path: Path) -> list[Block]:
    lines = path.read_text(encoding="utf-8").split("\n")
    found, index = [], 0
    while index < len(lines):
        opening = FENCE.match(lines[index])
        if not opening:
            index += 1
            continue
        end = next(i for i in range(index + 1, len(lines))
                   if lines[i].strip().startswith(opening[1]))
        kind, options, note = _marker(lines, index)
        found.append(Block(path, index + 1, opening[2], kind, options, note,
                           "\n".join(lines[index + 1:end]) + "\n"))
        index = end + 1
    return found


ALL = [block for path in DOCS for block in blocks_of(path)]


def of_kind(kind: str) -> list[pytest.param]:
    return [pytest.param(b, id=b.where) for b in ALL if b.kind == kind]


def test_every_block_is_marked_with_a_known_kind() -> None:
    unmarked = [b.where for b in ALL if b.kind is None]
    assert not unmarked, f"blocks with no <!-- test: KIND --> comment: {unmarked}"
    unknown = [f"{b.where} {b.kind}" for b in ALL if b.kind not in KINDS]
    assert not unknown, f"unknown kinds: {unknown}"
    silent = [b.where for b in ALL if b.kind == "skip" and not b.note]
    assert not silent, f"skips without a (reason): {silent}"
    assert len(ALL) >= 30 and sum(b.kind != "skip" for b in ALL) >= 25  # the parser found them


# --- config -------------------------------------------------------------------------


def _fake_keys(text: str) -> dict[str, str]:
    """A fake value for every variable a config names for a key (api_key_env, pass_env)."""
    names = re.findall(r'api_key_env\s*=\s*"(\w+)"', text)
    return {name: f"fake-{name.lower()}" for name in names}


@pytest.mark.parametrize("block", of_kind("config"))
def test_config_block_loads_and_its_agents_pass_the_hosts_check(
        block: Block, tmp_path: Path) -> None:
    config_dir = tmp_path / "cfg"
    config_dir.mkdir()
    (config_dir / "config.toml").write_text(block.text, encoding="utf-8")
    env = {"HOME": str(tmp_path), "PATH": os.environ.get("PATH", os.defpath),
           **_fake_keys(block.text)}
    settings = load_settings(str(config_dir), env=env)
    assert settings.agents, block.where
    for agent in settings.agents.values():
        problem = agent_config_problem(agent.to_wire(), env)
        if problem is not None and "absent-command" in block.options:
            command = agent.raw.get("command")
            assert isinstance(command, list) and shutil.which(command[0]) is None, problem
            assert problem.startswith("executable "), problem
            continue
        assert problem is None, f"{block.where}: agents.{agent.alias}: {problem}"


@pytest.mark.parametrize("block", of_kind("toml"))
def test_toml_block_parses(block: Block) -> None:
    assert tomllib.loads(block.text), block.where


@pytest.mark.parametrize("block", of_kind("json"))
def test_json_block_parses(block: Block) -> None:
    assert json.loads(block.text), block.where


# --- shell and daemon ---------------------------------------------------------------


def _shell_env(config_dir: Path, home: Path, extra_path: str = "") -> dict[str, str]:
    path = os.pathsep.join(p for p in (extra_path, str(Path(sys.executable).parent),
                                       os.environ.get("PATH", os.defpath)) if p)
    return host_env({"ZEROCLAW_CONFIG_DIR": str(config_dir), "HOME": str(home),
                     "PATH": path})


def _run_shell(text: str, env: dict[str, str], cwd: Path) -> None:
    text = text.replace("/path/to/zeroclaw", str(REPO_ROOT))
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", text], cwd=cwd, env=env,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=SHELL_TIMEOUT)
    assert done.returncode == 0, (
        f"exit {done.returncode}\n--- stdout\n{done.stdout}\n--- stderr\n{done.stderr}")


def _started_gateway(daemon: DaemonProc, timeout: float = 30.0) -> str:
    """The gateway's ``HOST:PORT`` once ``/health`` answers 200 (the host has started).
    The probe trusts any certificate: it only waits; the blocks verify for themselves."""
    daemon.wait_listening()
    url = GatewayDaemon(daemon).http
    probe = ssl.create_default_context()
    probe.check_hostname, probe.verify_mode = False, ssl.CERT_NONE
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=10, context=probe) as answer:
                if answer.status == 200:
                    return url.split("://", 1)[1]
        except urllib.error.HTTPError as error:
            assert time.monotonic() < deadline, f"{error.code}\n{daemon.stderr()}"
        time.sleep(0.05)


def _acpx_dir() -> str:
    acpx = os.environ.get("ZEROCLAW_ACPX")
    if not acpx:
        pytest.skip(os.environ.get("ZEROCLAW_ACPX_SKIP", "no acpx: run through scripts/test"))
    link = Path(acpx).parent / "acpx"
    if not link.exists():
        link = Path(short_dir()) / "acpx"
        link.symlink_to(acpx)
    return str(link.parent)


def shell_chains() -> list[pytest.param]:
    """Each shell block, with the ``continues`` blocks after it on its page (they run in
    the same scratch and config dirs, in order)."""
    chains: list[list[Block]] = []
    for block in (b for b in ALL if b.kind == "shell"):
        if "continues" in block.options:
            assert chains and chains[-1][0].path == block.path, block.where
            chains[-1].append(block)
        else:
            chains.append([block])
    return [pytest.param(chain, id=chain[0].where) for chain in chains]


@pytest.mark.parametrize("chain", shell_chains())
def test_shell_blocks_run(chain: list[Block], tmp_path: Path) -> None:
    config_dir, home, work = short_dir(), tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    try:
        for block in chain:
            extra = _acpx_dir() if "acpx" in block.options else ""
            env = _shell_env(config_dir, home, extra)
            if "daemon" in block.options:
                _run_beside_a_daemon(block, env, config_dir, home, work)
            elif "postgresql" in block.options:
                _run_on_postgresql(block, env, work)
            else:
                _run_shell(block.text, env, work)
    finally:
        shutil.rmtree(config_dir, ignore_errors=True)


DOCS_PG_URL = "postgresql://zeroclaw@db.internal:5432/zeroclaw"


def _run_on_postgresql(block: Block, env: dict[str, str], work: Path) -> None:
    """``block`` with :data:`DOCS_PG_URL` a fresh database of the test cluster."""
    from tests.pg_support import fresh_database

    with fresh_database() as url:
        _run_shell(block.text.replace(DOCS_PG_URL, url),
                   {**env, "ZEROCLAW_PG_PASSWORD": "unused-by-the-test-cluster"}, work)


def _run_beside_a_daemon(block: Block, env: dict[str, str], config_dir: Path, home: Path,
                         work: Path) -> None:
    """``block`` while a gateway daemon serves ``config_dir``; ``127.0.0.1:8080`` or
    ``localhost:8443`` in it is the daemon's real port."""
    daemon = DaemonProc(config_dir, "--gateway", "127.0.0.1:0", env_extra={"HOME": str(home)})
    try:
        port = _started_gateway(daemon).rsplit(":", 1)[1]
        text = re.sub(r"\b(127\.0\.0\.1|localhost):(8080|8443)\b", rf"\1:{port}", block.text)
        _run_shell(text, env, work)
        assert daemon.terminate() == 0, daemon.stderr()
    finally:
        assert not daemon.cleanup()


@pytest.mark.parametrize("block", of_kind("daemon"))
def test_daemon_block_serves_and_stops(block: Block, tmp_path: Path) -> None:
    [command] = [line for line in block.text.splitlines() if line.strip()]
    argv = shlex.split(command.split(" #")[0].replace(":8080", ":0"))
    assert argv[:2] == ["zeroclaw", "daemon"], block.where
    config_dir, home = short_dir(), tmp_path / "home"
    home.mkdir()
    daemon = DaemonProc(config_dir, *argv[2:], env_extra={"HOME": str(home)})
    try:
        daemon.wait_listening()
        status = subprocess.run(["zeroclaw", "status"], env=_shell_env(config_dir, home),
                                capture_output=True, text=True, timeout=30)
        assert status.returncode == 0, status.stderr
        assert daemon.terminate() == 0, daemon.stderr()
    finally:
        assert not daemon.cleanup()
        shutil.rmtree(config_dir, ignore_errors=True)


# --- the systemd unit and the Prometheus scrape ---------------------------------------


@pytest.mark.parametrize("block", of_kind("unit"))
def test_unit_block_is_the_shipped_unit_file(block: Block) -> None:
    assert block.text == UNIT.read_text(encoding="utf-8"), block.where


def test_the_unit_file_starts_a_zeroclaw_daemon_and_verifies(tmp_path: Path) -> None:
    unit = configparser.ConfigParser(interpolation=None, strict=False)
    unit.optionxform = str  # type: ignore[assignment,method-assign]
    unit.read_string(UNIT.read_text(encoding="utf-8"))
    argv = shlex.split(unit["Service"]["ExecStart"].replace("/path/to/zeroclaw",
                                                             str(REPO_ROOT)))
    assert Path(argv[0]).name == "zeroclaw" and argv[1] == "daemon", argv
    parsed = subprocess.run([argv[0], "daemon", "--help"], capture_output=True, text=True,
                            timeout=30)
    assert parsed.returncode == 0 and all(
        flag in parsed.stdout for flag in argv[2:] if flag.startswith("--")), parsed
    verifier = shutil.which("systemd-analyze")
    if verifier is None:
        return  # parsed and its command checked above: what can be done without systemd
    checked = tmp_path / "zeroclaw.service"
    checked.write_text(UNIT.read_text(encoding="utf-8").replace("/path/to/zeroclaw",
                                                                 str(REPO_ROOT)))
    verified = subprocess.run([verifier, "verify", str(checked)], capture_output=True,
                              text=True, timeout=60)
    assert verified.returncode == 0 and "zeroclaw.service" not in verified.stderr, (
        verified.stderr)


@pytest.mark.parametrize("block", of_kind("prometheus"))
def test_prometheus_scrape_config_scrapes_the_gateway(block: Block, tmp_path: Path) -> None:
    [job] = yaml.safe_load(block.text)["scrape_configs"]
    [target] = job["static_configs"][0]["targets"]
    token_file = Path(job["authorization"]["credentials_file"])
    config_dir, home = short_dir(), tmp_path / "home"
    home.mkdir()
    env = _shell_env(config_dir, home)
    token = subprocess.run(["zeroclaw", "tenant", "add", "prometheus", "--admin"], env=env,
                           capture_output=True, text=True, timeout=30, check=True).stdout
    daemon = DaemonProc(config_dir, "--gateway", "127.0.0.1:0", env_extra={"HOME": str(home)})
    try:
        address = _started_gateway(daemon)
        assert target == "127.0.0.1:8080" and token_file.is_absolute(), job
        request = urllib.request.Request(
            f"{job.get('scheme', 'http')}://{address}{job['metrics_path']}",
            headers={"Authorization": f"Bearer {token.strip()}"})
        with urllib.request.urlopen(request, timeout=10) as answer:
            assert "zeroclaw_uptime_seconds" in answer.read().decode()
        daemon.proc.send_signal(signal.SIGTERM)
        assert daemon.wait(20) == 0
    finally:
        assert not daemon.cleanup()
        shutil.rmtree(config_dir, ignore_errors=True)


# --- links between the pages ----------------------------------------------------------

LINK = re.compile(r"\]\(((?:\.\./|[\w./-]*?)?(?:[\w-]+\.(?:md|service))?)(?:#([\w-]+))?\)")


def _anchors(path: Path) -> set[str]:
    """GitHub's heading anchors of one page: lower case, punctuation dropped, spaces as -."""
    headings = re.findall(r"^#+ (.+)$", path.read_text(encoding="utf-8"), flags=re.M)
    return {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in headings}


@pytest.mark.parametrize("page", DOCS, ids=lambda p: str(p.relative_to(REPO_ROOT)))
def test_every_link_between_the_pages_lands_on_a_file_and_heading(page: Path) -> None:
    broken, checked = [], 0
    for target, anchor in LINK.findall(page.read_text(encoding="utf-8")):
        if not target and not anchor:
            continue
        linked = (page.parent / target).resolve() if target else page
        heading_found = not anchor or linked.suffix != ".md" or anchor in _anchors(linked)
        if not (linked.is_file() and heading_found):
            broken.append(f"{target}#{anchor}")
        checked += 1
    assert not broken, broken
    assert checked, "no links found: the pattern is broken"
