"""acpx (a headless ACP client CLI nobody here wrote) with ``zeroclaw acp --session KEY``,
as OpenClaw's docs have users set it up (``acpx openclaw`` pointed at ``openclaw acp
--session agent:main:main``): every ``acpx zeroclaw exec`` opens a new session, and the
key makes each one continue the same stored conversation, from one process to the next.
``--reset-session`` then gives the key a fresh one, the old kept."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .conftest import DIAGNOSTICS, RawHostFactory
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

KEY = "agent:main:main"


def acpx_with(request: pytest.FixtureRequest, tmp_path: Path, config_dir: Path,
              workspace: Path, name: str, *flags: str) -> Acpx:
    """acpx whose ``zeroclaw`` is ``zeroclaw acp <flags>`` (its own bin dir ``name``)."""
    command = acpx_command()
    bin_dir, home = tmp_path / name, tmp_path / "home"
    home.mkdir(exist_ok=True)
    write_wrapper(bin_dir, config_dir, *flags)
    env = host_env({"HOME": str(home)})
    env["PATH"] = os.pathsep.join([str(bin_dir), str(Path(command[-1]).parent), env["PATH"]])
    if node_major(env) < 22:
        pytest.skip("acpx needs node >= 22 on PATH (or beside ZEROCLAW_ACPX)")
    runner = Acpx(command, env, workspace, config_dir, home)
    request.node.stash.setdefault(DIAGNOSTICS, []).append(lambda: "\n".join(runner.transcript))
    return runner


@pytest.fixture
def keyed(request: pytest.FixtureRequest, tmp_path: Path, config_dir: Path,
          workspace: Path) -> Iterator[Acpx]:
    runner = acpx_with(request, tmp_path, config_dir, workspace, "bin", "--session", KEY)
    yield runner
    runner.wait_until_idle()


def new_session_answer(frames: list[dict[str, Any]]) -> dict[str, Any]:
    [new] = [f for f in frames if f.get("method") == "session/new"]
    answer = next(f for f in frames if f.get("id") == new["id"] and "method" not in f)
    assert "error" not in answer, answer
    return dict(answer["result"])


def replayed_users(frames: list[dict[str, Any]], sid: str) -> list[str]:
    return [f["params"]["update"]["content"]["text"] for f in frames
            if f.get("method") == "session/update" and f["params"]["sessionId"] == sid
            and f["params"]["update"].get("sessionUpdate") == "user_message_chunk"]


def exec_turn(acpx: Acpx, text: str) -> list[dict[str, Any]]:
    acpx.wait_until_idle()  # the previous acpx process and its host are gone
    done = acpx.run("--format", "json", "--approve-all", *QUIET_TTL, "zeroclaw", "exec", text)
    assert done.returncode == 0
    frames = frames_of(done.stdout)
    assert stop_reasons(frames) == ["end_turn"]
    return frames


def test_acpx_exec_with_a_session_key_continues_one_conversation(
        keyed: Acpx, request: pytest.FixtureRequest, tmp_path: Path, config_dir: Path,
        workspace: Path, raw_hosts: RawHostFactory) -> None:
    first = exec_turn(keyed, "first keyed words")
    created = new_session_answer(first)
    sid = created["sessionId"]
    assert created["_meta"] == {"sessionKey": KEY}
    assert words(agent_text(first)) == ["first", "keyed", "words"]
    second = exec_turn(keyed, "second keyed words")
    resumed = new_session_answer(second)
    assert resumed["sessionId"] == sid
    assert resumed["_meta"] == {"sessionKey": KEY, "zeroclaw": {"resumed": True}}
    assert replayed_users(second, sid) == ["first keyed words"]  # acpx got the transcript
    assert agent_text(second) == "first keyed words" + "second keyed words"
    keyed.wait_until_idle()
    reset = acpx_with(request, tmp_path, config_dir, workspace, "bin-reset",
                      "--session", KEY, "--reset-session")
    fresh = new_session_answer(exec_turn(reset, "a fresh transcript"))
    assert fresh["sessionId"] != sid
    assert fresh["_meta"] == {"sessionKey": KEY, "zeroclaw": {"parentSessionId": sid}}
    reset.wait_until_idle()
    raw = raw_hosts()
    raw.initialize()
    listed = {s["sessionId"]: s.get("_meta") for s in raw.call("session/list", {})["sessions"]}
    assert listed == {sid: {"zeroclaw": {"formerSessionKey": KEY}},
                      fresh["sessionId"]: fresh["_meta"]}
    raw.call("session/load", {"sessionId": sid, "cwd": str(workspace), "mcpServers": []})
    old = [n["params"]["update"]["content"]["text"] for n in raw.notifications
           if n["params"]["update"].get("sessionUpdate") == "user_message_chunk"]
    assert old == ["first keyed words", "second keyed words"]
