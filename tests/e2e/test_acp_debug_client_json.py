"""``zeroclaw acp client --json`` end to end: a real ``zeroclaw acp`` (the echo agent, and
the openai agent against the local model server) started by the client, every message
it received on stdout as JSON lines, and the documented exit codes."""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
from pathlib import Path
from typing import Any

from .model_server import ModelServer
from .model_streams import openai_reply
from .procs import REPO_ROOT, host_env, write_config

FIXTURE_AGENT = REPO_ROOT / "tests" / "fixtures" / "acp_fixture_agent.py"
KEY_ENV = "ZC_TEST_MODEL_KEY"
_ENTRY_POINT = "import sys; from supervisor.cli.main import main; sys.exit(main())"


def run_client(*args: str, stdin: str = "", env: dict[str, str] | None = None,
               timeout: float = 45) -> subprocess.CompletedProcess[str]:
    """``zeroclaw acp client ARGS...`` to its end (bounded)."""
    return subprocess.run([sys.executable, "-c", _ENTRY_POINT, "acp", "client", *args],
                          input=stdin, capture_output=True, text=True, timeout=timeout,
                          env=host_env(env))


def messages(out: subprocess.CompletedProcess[str]) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.stdout.splitlines()]


def updates(out: subprocess.CompletedProcess[str], kind: str) -> list[dict[str, Any]]:
    return [m["params"]["update"] for m in messages(out)
            if m.get("method") == "session/update"
            and m["params"]["update"]["sessionUpdate"] == kind]


def said(out: subprocess.CompletedProcess[str]) -> str:
    return "".join(u["content"]["text"] for u in updates(out, "agent_message_chunk"))


def test_echo_prompts_from_flags_and_stdin_are_transcribed(tmp_path: Path) -> None:
    cwd = tmp_path / "ws"
    cwd.mkdir()
    common = ("--json", "--config-dir", str(tmp_path / "cfg"), "--cwd", str(cwd))
    out = run_client(*common, "--prompt", "hello world", "--prompt", "!plan a; b")
    assert out.returncode == 0, out.stderr
    found = messages(out)
    assert found[0]["result"]["agentInfo"]["name"] == "zeroclaw-acp"  # initialize's answer
    assert found[1]["result"]["sessionId"]
    assert said(out) == "hello world"
    assert [e["content"] for e in updates(out, "plan")[0]["entries"]] == ["a", "b"]
    stops = [m["result"]["stopReason"] for m in found if "stopReason" in m.get("result", {})]
    assert stops == ["end_turn", "end_turn"]
    piped = run_client(*common, stdin="one\n\ntwo\n")
    assert piped.returncode == 0, piped.stderr
    assert said(piped) == "onetwo"


def test_a_supervised_write_is_rejected_and_approve_all_allows_it(tmp_path: Path) -> None:
    cwd = tmp_path / "ws"
    cwd.mkdir()
    common = ("--json", "--config-dir", str(tmp_path / "cfg"), "--cwd", str(cwd), "--prompt",
              '!tool file_write {"path": "x.txt", "content": "hi"}')
    out = run_client(*common)
    assert out.returncode == 0, out.stderr
    [request] = [m for m in messages(out) if m.get("method") == "session/request_permission"]
    assert request["params"]["toolCall"]["_meta"] == {"zeroclaw": {"tool": "file_write"}}
    assert updates(out, "tool_call")[0]["_meta"] == {"zeroclaw": {"tool": "file_write"}}
    assert updates(out, "tool_call_update")[-1]["status"] == "failed"
    assert "permission answered reject-once" in out.stderr
    assert not (cwd / "x.txt").exists()
    allowed = run_client(*common, "--approve-all")
    assert allowed.returncode == 0, allowed.stderr
    assert (cwd / "x.txt").read_text() == "hi"


def test_the_model_agents_scripted_write_is_asked_and_rejected(
    tmp_path: Path, model_server: ModelServer,
) -> None:
    cwd = tmp_path / "ws"
    cwd.mkdir()
    key = f"zc-test-model-key-{secrets.token_hex(8)}"
    write_config(tmp_path / "cfg", (
        f'[agents.main]\nprovider = "openai"\nbase_url = "{model_server.url}/v1"\n'
        f'model = "gpt-test"\napi_key_env = "{KEY_ENV}"\nworkspace = "{tmp_path / "aws"}"\n'
        '[autonomy]\nlevel = "supervised"\n'))
    call = {"tool_calls": [{"index": 0, "id": "w1", "function": {
        "name": "file_write", "arguments": '{"path": "no.txt", "content": "x"}'}}]}
    model_server.script(openai_reply(call, finish="tool_calls"),
                        openai_reply({"content": "Understood, not written."}))
    out = run_client("--json", "--config-dir", str(tmp_path / "cfg"), "--cwd", str(cwd),
                     "--prompt", "write no.txt", env={KEY_ENV: key})
    assert out.returncode == 0, out.stderr
    [request] = [m for m in messages(out) if m.get("method") == "session/request_permission"]
    assert request["params"]["toolCall"]["_meta"]["zeroclaw"]["tool"] == "file_write"
    assert said(out) == "Understood, not written."
    assert not (cwd / "no.txt").exists()
    result = model_server.requests[1].body["messages"][-1]
    assert result["tool_call_id"] == "w1" and "denied" in result["content"]
    assert key not in out.stdout + out.stderr


def test_a_prompt_answered_with_an_error_exits_1(tmp_path: Path) -> None:
    out = run_client("--json", "--cwd", str(tmp_path), "--server", sys.executable,
                     "--server-args", str(FIXTURE_AGENT),
                     stdin="fail -32603\nhello\n")
    assert out.returncode == 1, out.stderr
    assert "prompt failed: -32603" in out.stderr
    assert "hello" in said(out)  # the prompts after the failed one still ran


def test_a_server_that_cannot_start_or_dies_early_exits_3(tmp_path: Path) -> None:
    missing = run_client("--json", "--server", str(tmp_path / "no-such-server"),
                         "--prompt", "x")
    assert missing.returncode == 3 and "cannot start" in missing.stderr
    dies = run_client("--json", "--server", sys.executable, "--server-args", "-c",
                      "import sys; sys.stdin.readline()", "--prompt", "x")
    assert dies.returncode == 3 and "could not open a session" in dies.stderr
    usage = run_client("--json", "--approve-all", "--server")
    assert usage.returncode == 2 and "usage:" in usage.stderr


def test_help_documents_the_exit_codes() -> None:
    out = run_client("--help")
    assert out.returncode == 0
    assert "exit codes: 0" in out.stdout and "3 the server could not start" in out.stdout
