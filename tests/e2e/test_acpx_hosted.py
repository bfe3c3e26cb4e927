"""acpx (a headless ACP client CLI) drives ``zeroclaw acp`` hosting the ACP TypeScript
SDK's example agent (``provider = "acp"``, issue "Real agents 1"): a one-shot ``exec``
whose permission acpx answers, a named session across acpx processes (each one a new
zeroclaw process), and ``session/load`` of it from yet another zeroclaw process, which
replays every turn from zeroclaw's store although that agent has no ``loadSession``.

See :mod:`tests.e2e.test_acpx` for how acpx is set up (``ZEROCLAW_ACPX``) and
:mod:`tests.e2e.test_acp_hosting` for the agent (``ZEROCLAW_ACP_TS_AGENT``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from .conftest import RawHostFactory
from .test_acp_hosting import _ts_agent, acp_config
from .test_acpx import QUIET_TTL, Acpx, acpx, agent_text, frames_of, stop_reasons

__all__ = ["acpx"]  # the fixture, shared with test_acpx

PERFECT = "Perfect! I've successfully updated the configuration."
# the example agent's rawOutput of its two calls, replayed as it sent them
README_READ = {"content": "# My Project\n\nThis is a sample project..."}
CONFIG_UPDATED = {"success": True, "message": "Configuration updated"}


def answer_to(frames: list[dict[str, Any]], request: dict[str, Any]) -> dict[str, Any]:
    return next(f for f in frames if f.get("id") == request["id"] and "method" not in f)


def test_acpx_exec_answers_the_hosted_agents_permission(acpx: Acpx, config_dir: Path) -> None:
    acp_config(config_dir, list(_ts_agent()))
    done = acpx.run("--format", "json", "--approve-all", *QUIET_TTL,
                    "zeroclaw", "exec", "change the config")
    assert done.returncode == 0
    frames = frames_of(done.stdout)
    [ask] = [f for f in frames if f.get("method") == "session/request_permission"]
    assert ask["params"]["toolCall"]["toolCallId"] == "call_2"
    outcome = answer_to(frames, ask)["result"]["outcome"]
    chosen = next(o for o in ask["params"]["options"] if o["optionId"] == outcome["optionId"])
    assert outcome["outcome"] == "selected" and chosen["kind"] == "allow_once"
    assert PERFECT in agent_text(frames)
    assert stop_reasons(frames) == ["end_turn"]


@pytest.mark.timeout(120)
def test_acpx_named_session_with_the_hosted_agent_replays_every_turn_from_a_new_host(
    acpx: Acpx, raw_hosts: RawHostFactory, config_dir: Path, workspace: Path
) -> None:
    acp_config(config_dir, list(_ts_agent()))
    created = acpx.run("--format", "json", *QUIET_TTL, "zeroclaw", "sessions", "new",
                       "--name", "hosted")
    assert created.returncode == 0
    prompts = ["first hosted turn", "second hosted turn"]
    reopened = []
    for text in prompts:
        acpx.wait_until_idle()  # the previous acpx process and its zeroclaw are gone
        done = acpx.run("--format", "json", "--approve-all", *QUIET_TTL,
                        "zeroclaw", "prompt", "-s", "hosted", text)
        assert done.returncode == 0
        frames = frames_of(done.stdout)
        [reopen] = [f for f in frames if f.get("method") in ("session/resume", "session/load")]
        assert "error" not in answer_to(frames, reopen)
        reopened.append(reopen["params"]["sessionId"])
        assert PERFECT in agent_text(frames) and stop_reasons(frames) == ["end_turn"]
        [result] = [f["result"] for f in frames if "stopReason" in (f.get("result") or {})]
        if text == prompts[1]:  # a new agent process: that agent cannot reopen its session
            assert result["_meta"]["zeroclaw"]["contextRestored"] is False
    assert reopened[0] == reopened[1]
    acpx.wait_until_idle()
    raw = raw_hosts()
    raw.initialize()
    raw.call("session/load", {"sessionId": reopened[0], "cwd": str(workspace), "mcpServers": []})
    updates = [n["params"]["update"] for n in raw.notifications
               if n.get("method") == "session/update"]
    users = [u["content"]["text"].strip() for u in updates
             if u["sessionUpdate"] == "user_message_chunk"]
    assert users == prompts
    results = [(u["toolCallId"], u["status"], u["rawOutput"]) for u in updates
               if u["sessionUpdate"] == "tool_call_update"]
    assert results == [("call_1", "completed", README_READ),
                       ("call_2", "completed", CONFIG_UPDATED)] * 2
    replayed = "".join(u["content"]["text"] for u in updates
                       if u["sessionUpdate"] == "agent_message_chunk")
    assert replayed.count(PERFECT) == 2
