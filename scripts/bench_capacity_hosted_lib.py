"""Hosted agents shared, for ``scripts/bench_capacity``: :data:`SESSIONS` sessions of Claude
Code's ACP adapter (``@agentclientprotocol/claude-agent-acp``, installed pinned by
``scripts/test`` under ``.tools/``) hosted by one ``zeroclaw acp``, which shares one
adapter process per worker among its sessions, against as many editors each running
the adapter directly.

Runs on the bench process's asyncio loop thread; the local Anthropic Messages API
(:class:`tests.e2e.model_server.ModelServer`, the vendor tests' server) answers on its
own threads: every turn gets a short streamed text answer, Claude Code's side requests
(the session title, ``count_tokens``) their documented shapes. Each side opens its
sessions, runs :data:`TURNS` turns in each (all sessions at once), and is measured with
every process still up: the RSS of its whole process tree (zeroclaw's host, workers,
adapters and the Claude Code processes they start; or the 20 adapters and theirs) and
its CPU per turn.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import psutil
from bench_lib import progress
from bench_rpc_lib import RpcPeer

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.e2e.model_server import ModelServer, Recorded, Reply  # noqa: E402
from tests.e2e.model_streams import anthropic_reply, anthropic_text  # noqa: E402
from tests.vendors.anthropic_api import kind_of  # noqa: E402
from tests.vendors.claude import PASSED_VARIABLES, claude_env  # noqa: E402

__all__ = ["SESSIONS", "TURNS", "adapter_path", "hosted_rss"]

SESSIONS = 20
TURNS = 3
Sessions = list[tuple[RpcPeer, str]]
"""Each session with the connection it lives on."""
_ADAPTER = REPO / ".tools" / "node_modules" / ".bin" / "claude-agent-acp"
_NODE_BIN = REPO / ".tools" / "node_modules" / "node" / "bin"


def adapter_path() -> Path | None:
    """The adapter scripts/test installed, if it did."""
    return _ADAPTER if _ADAPTER.exists() and _NODE_BIN.is_dir() else None


def _answer(recorded: Recorded) -> Reply:
    """Runs on a server thread: the reply to one of Claude Code's requests."""
    kind = kind_of(recorded)
    if kind == "count_tokens":
        return Reply(body=b'{"input_tokens": 512}')
    if kind == "title":
        return anthropic_reply(anthropic_text(0, json.dumps({"title": "Bench"})))
    if recorded.method != "POST":
        return Reply(status=404, body=b'{"type": "error", "error": {"type": "not_found_error"}}')
    return anthropic_reply(anthropic_text(0, "Done: ", "nothing to change."))


def _tree(root: psutil.Process) -> list[psutil.Process]:
    with contextlib.suppress(psutil.Error):
        return [root, *root.children(recursive=True)]
    return []


def _role(process: psutil.Process) -> str:
    """``zeroclaw`` (host, workers), ``adapter`` (the ACP adapter's node process) or
    ``claude`` (what the adapter starts: a Claude Code process per session)."""
    with contextlib.suppress(psutil.Error):
        command = " ".join(process.cmdline())
        if "supervisor.cli.main" in command or "actors.worker" in command or "zeroclaw" in command:
            return "zeroclaw"
        if "claude-agent-acp" in command:
            return "adapter"
    return "claude"


def _tree_costs(roots: list[psutil.Process]) -> tuple[dict[str, float], float]:
    """RSS (MiB) by role (see :func:`_role`) and CPU seconds of every process under ``roots``."""
    rss: dict[str, float] = {}
    cpu = 0.0
    for process in (p for root in roots for p in _tree(root)):
        with contextlib.suppress(psutil.Error):
            role = _role(process)
            rss[role] = rss.get(role, 0.0) + process.memory_info().rss / 2**20
            times = process.cpu_times()
            cpu += times.user + times.system
    return rss, cpu


async def _open(peer: RpcPeer, cwd: Path, sessions: int) -> list[str]:
    await peer.request("initialize", {"protocolVersion": 1, "clientCapabilities": {}})
    return [(await peer.request("session/new", {"cwd": str(cwd), "mcpServers": []}))["sessionId"]
            for _ in range(sessions)]


async def _turns(peer: RpcPeer, sid: str) -> None:
    for turn in range(TURNS):
        result = await peer.request("session/prompt", {
            "sessionId": sid, "prompt": [{"type": "text", "text": f"look at turn {turn}"}]})
        if result.get("stopReason") != "end_turn":
            raise RuntimeError(f"a turn ended {result.get('stopReason')!r}")


@contextlib.asynccontextmanager
async def _direct(env: dict[str, str], cwd: Path, work: Path) -> AsyncIterator[Sessions]:
    peers: list[RpcPeer] = []
    try:
        for number in range(SESSIONS):
            home = work / f"direct-{number}"
            home.mkdir()
            peers.append(await RpcPeer.spawn([str(_ADAPTER)], home, env))
        sids = await asyncio.gather(*(_open(peer, cwd, 1) for peer in peers))
        yield [(peer, ids[0]) for peer, ids in zip(peers, sids, strict=True)]
    finally:
        await asyncio.gather(*(peer.close() for peer in peers))


@contextlib.asynccontextmanager
async def _hosted(env: dict[str, str], cwd: Path, work: Path) -> AsyncIterator[Sessions]:
    config = work / "zeroclaw"
    config.mkdir()
    (config / "config.toml").write_text(
        f'[acp]\ndefault_agent = "claude"\nmax_sessions = {2 * SESSIONS}\n'
        f'[agents.claude]\nprovider = "acp"\ncommand = {json.dumps([str(_ADAPTER)])}\n'
        f"pass_env = {json.dumps(list(PASSED_VARIABLES))}\nagent_start_timeout_secs = 60\n",
        encoding="utf-8")
    zeroclaw = Path(sys.prefix) / "bin" / "zeroclaw"
    peer = await RpcPeer.spawn([str(zeroclaw), "acp", "--config-dir", str(config)], work, env)
    try:
        sids = await _open(peer, cwd, SESSIONS)
        yield [(peer, sid) for sid in sids]
    finally:
        await peer.close()


async def _measure(name: str, side: Any, env: dict[str, str], cwd: Path,
                   work: Path) -> dict[str, float]:
    async with side(env, cwd, work) as sessions:
        roots = [psutil.Process(p.process.pid) for p in {id(p): p for p, _ in sessions}.values()
                 if p.process is not None]
        _, cpu_before = _tree_costs(roots)
        await asyncio.gather(*(_turns(peer, sid) for peer, sid in sessions))
        rss, cpu_after = _tree_costs(roots)
        processes = sum(len(_tree(root)) for root in roots)
    result = {"rss_mib": round(sum(rss.values()), 1), "processes": processes,
              **{f"rss_mib_{role}": round(mib, 1) for role, mib in sorted(rss.items())},
              "cpu_ms_per_turn": round((cpu_after - cpu_before) * 1000 / (SESSIONS * TURNS), 1)}
    progress(f"hosted agents, {name}: {result}")
    return result


async def hosted_rss() -> dict[str, Any]:
    """Both sides, direct first; the ratio of their RSS (zeroclaw / direct)."""
    server = ModelServer(_answer)
    try:
        with tempfile.TemporaryDirectory(prefix="zcch", dir="/tmp") as temp:
            work, cwd = Path(temp), Path(temp) / "project"
            cwd.mkdir()
            env = claude_env(f"{server.url}", work / "home")
            env["PATH"] = f"{_NODE_BIN}{os.pathsep}{env['PATH']}"
            (work / "d").mkdir()
            (work / "h").mkdir()
            direct = await _measure("direct", _direct, env, cwd, work / "d")
            hosted = await _measure("zeroclaw", _hosted, env, cwd, work / "h")
    finally:
        server.close()
    # what no host can save: one adapter and each session's Claude Code process (the
    # adapter starts one per session; the smaller of the two sides' totals)
    floor = direct["rss_mib_adapter"] / SESSIONS + min(direct.get("rss_mib_claude", 0.0),
                                                       hosted.get("rss_mib_claude", 0.0))
    return {"sessions": SESSIONS, "turns_each": TURNS, "direct": direct, "zeroclaw": hosted,
            "rss_ratio": round(hosted["rss_mib"] / direct["rss_mib"], 3),
            "floor_rss_ratio": round(floor / direct["rss_mib"], 3)}
