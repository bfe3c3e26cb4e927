"""acpx drives ``zeroclaw acp`` running zeroclaw's own agent on a model API (the local
model server, scripted): the model reads a file, edits it (acpx's JSON output carries
the ``diff``), runs a shell command once acpx's permission policy allows it, and
answers; a second acpx process prompts the same named session, and the model is sent
the first conversation (user message, tool calls, tool results) as context.

See :mod:`tests.e2e.test_acpx` for how acpx is set up (``ZEROCLAW_ACPX``).
"""

from __future__ import annotations

import json
import secrets
from pathlib import Path
from typing import Any

import pytest

from actors.worker.sandbox import detect

from .model_server import ModelServer
from .model_streams import openai_reply
from .procs import write_config
from .test_acpx import QUIET_TTL, Acpx, acpx, agent_text, frames_of, stop_reasons

__all__ = ["acpx"]  # the fixture, shared with test_acpx

KEY_ENV = "ZC_TEST_MODEL_KEY"
#: acpx answers by the tool call's kind: edits and commands are allowed, anything else
#: that asks is denied (reads ask nothing in supervised mode).
POLICY = json.dumps({"autoApprove": ["edit", "execute"], "defaultAction": "deny"})


def call(call_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"tool_calls": [{"index": 0, "id": call_id, "type": "function", "function": {
        "name": name, "arguments": json.dumps(arguments)}}]}


def updates_of(frames: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [f["params"]["update"] for f in frames if f.get("method") == "session/update"
            and f["params"]["update"].get("sessionUpdate") == kind]


def answer_to(frames: list[dict[str, Any]], request: dict[str, Any]) -> dict[str, Any]:
    return next(f for f in frames if f.get("id") == request["id"] and "method" not in f)


def model_config(config_dir: Path, server: ModelServer, agent_ws: Path) -> None:
    unsandboxed = "false" if detect().confines else "true"  # the shell needs one or the other
    write_config(config_dir, (
        f'[agents.main]\nprovider = "openai"\nbase_url = "{server.url}/v1"\n'
        f'model = "gpt-test"\napi_key_env = "{KEY_ENV}"\nworkspace = "{agent_ws}"\n'
        f'[autonomy]\nlevel = "supervised"\nallow_unsandboxed_shell = {unsandboxed}\n'))


def script_first_turn(server: ModelServer) -> None:
    server.script(
        openai_reply({"content": "Reading it."},
                     call("r1", "file_read", {"path": "greet.py"}), finish="tool_calls"),
        openai_reply(call("e1", "file_edit", {"path": "greet.py", "old_string": "helo",
                                              "new_string": "hello"}), finish="tool_calls"),
        openai_reply({"content": "Checking."},
                     call("s1", "shell", {"command": "cat greet.py"}), finish="tool_calls"),
        openai_reply({"content": "Fixed the "}, {"content": "typo and checked it."}),
    )


def check_first_turn(frames: list[dict[str, Any]], target: Path) -> list[str]:
    """The first turn as acpx printed it; the ACP ids of its three tool calls."""
    started = updates_of(frames, "tool_call")
    assert [(c["title"], c["kind"]) for c in started] == [
        ("Read greet.py", "read"), ("Edit greet.py", "edit"), ("shell: cat greet.py", "execute")]
    ids = [c["toolCallId"] for c in started]
    asks = [f for f in frames if f.get("method") == "session/request_permission"]
    assert [a["params"]["toolCall"]["kind"] for a in asks] == ["edit", "execute"]
    for ask in asks:
        outcome = answer_to(frames, ask)["result"]["outcome"]
        chosen = next(o for o in ask["params"]["options"]
                      if o["optionId"] == outcome["optionId"])
        assert outcome["outcome"] == "selected" and chosen["kind"] == "allow_once"
    finals = [u for u in updates_of(frames, "tool_call_update") if u["status"] != "in_progress"]
    assert [(u["toolCallId"], u["status"]) for u in finals] == [
        (call_id, "completed") for call_id in ids]
    diffs = [c for u in finals for c in u.get("content") or [] if c["type"] == "diff"]
    assert [(d["path"], d["oldText"], d["newText"]) for d in diffs] == [
        (str(target), "print('helo')\n", "print('hello')\n")]
    assert "print('hello')" in json.dumps(finals[2]["rawOutput"])  # the shell saw the edit
    assert agent_text(frames) == "Reading it.Checking.Fixed the typo and checked it."
    assert stop_reasons(frames) == ["end_turn"]
    return ids


def check_context(first_turn: dict[str, Any], body: dict[str, Any], ids: list[str]) -> None:
    """The second turn's request: the whole first turn, then the new prompt. It extends
    the first turn's last request as it was sent (the same tool call ids, arguments and
    results), so a server's prompt cache still matches it."""
    assert body["messages"][:len(first_turn["messages"])] == first_turn["messages"]
    messages = body["messages"][1:]
    assert messages[0] == {"role": "user", "content": "fix the typo in greet.py"}
    calls = [(c["id"], c["function"]["name"]) for m in messages if m["role"] == "assistant"
             for c in m.get("tool_calls") or []]
    assert calls == list(zip(ids, ["file_read", "file_edit", "shell"], strict=True))
    results = [(m["tool_call_id"], m["content"]) for m in messages if m["role"] == "tool"]
    assert [call_id for call_id, _ in results] == ids
    (_, read), (_, edit), (_, shell) = results
    assert read == "print('helo')\n"
    assert "1 replacement" in edit and "print('hello')" in shell
    assert messages[-2] == {"role": "assistant", "content": "Fixed the typo and checked it."}
    assert messages[-1] == {"role": "user", "content": "what did you change?"}


@pytest.mark.timeout(120)
def test_acpx_model_conversation_edits_runs_a_command_and_continues_in_a_new_process(
    acpx: Acpx, config_dir: Path, tmp_path: Path, workspace: Path, model_server: ModelServer,
) -> None:
    target = workspace / "greet.py"
    target.write_text("print('helo')\n")
    model_config(config_dir, model_server, tmp_path / "agent-ws")
    acpx.env[KEY_ENV] = f"zc-test-model-key-{secrets.token_hex(12)}"
    assert acpx.run("--format", "json", *QUIET_TTL, "zeroclaw", "sessions", "new",
                    "--name", "model").returncode == 0
    acpx.wait_until_idle()
    script_first_turn(model_server)
    first = acpx.run("--format", "json", "--permission-policy", POLICY, *QUIET_TTL,
                     "zeroclaw", "prompt", "-s", "model", "fix the typo in greet.py")
    assert first.returncode == 0
    ids = check_first_turn(frames_of(first.stdout), target)
    assert target.read_text() == "print('hello')\n"
    acpx.wait_until_idle()  # that acpx and its zeroclaw are gone

    model_server.script(openai_reply({"content": "I fixed helo to hello."}))
    second = acpx.run("--format", "json", "--permission-policy", POLICY, *QUIET_TTL,
                      "zeroclaw", "prompt", "-s", "model", "what did you change?")
    assert second.returncode == 0
    frames = frames_of(second.stdout)
    [reopen] = [f for f in frames if f.get("method") in ("session/resume", "session/load")]
    assert "error" not in answer_to(frames, reopen)
    assert agent_text(frames) == "I fixed helo to hello."
    requests = model_server.requests
    assert len(requests) == 5
    check_context(requests[3].body, requests[4].body, ids)
