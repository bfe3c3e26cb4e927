"""The README's Claude Code snippet ("Hosting other ACP agents", between the
``<!-- snippet: claude-code -->`` markers) works as pasted: ``zeroclaw acp`` with that
config does the coding task of :mod:`tests.vendors.anthropic_api` against the local
Anthropic Messages API.

Its ``npx -y`` command runs as written, offline: the agent's ``workspace`` is the tools
dir where scripts/test installed the same pinned package, which npx then uses. The test
adds only what keeps Claude Code offline (``env``) and the key and base URL in
zeroclaw's own environment, which the snippet's ``pass_env`` hands on.
"""

from __future__ import annotations

import os
import re
import tomllib
from pathlib import Path

import pytest

from tests.e2e.procs import REPO_ROOT, host_argv, host_env, write_config

from .anthropic_api import ANSWER, FIXED_CALC, PROMPT, CodingTask
from .claude import FAKE_KEY, adapter, fresh_home
from .harness import EditorClient

pytestmark = pytest.mark.timeout(180)

SNIPPET = re.compile(r"<!-- snippet: claude-code[^>]*-->\s*```toml\n(.*?)```\s*"
                     r"<!-- /snippet: claude-code -->", re.S)
OFFLINE_ENV = ('env = { IS_SANDBOX = "1", CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC = "1", '
               'DISABLE_AUTOUPDATER = "1", DISABLE_TELEMETRY = "1", '
               'DISABLE_ERROR_REPORTING = "1", CLAUDE_CODE_ENABLE_PROMPT_SUGGESTION = "false", '
               'npm_config_offline = "true", npm_config_update_notifier = "false" }')


def readme_snippet() -> str:
    [snippet] = SNIPPET.findall((REPO_ROOT / "README.md").read_text(encoding="utf-8"))
    return str(snippet)


def test_the_snippet_names_the_pinned_adapter_and_passes_key_and_base_url() -> None:
    agent = tomllib.loads(readme_snippet())["agents"]["claude"]
    pinned = re.search(r'CLAUDE_ACP_VERSION="([^"]+)"', (REPO_ROOT / "scripts" / "test")
                       .read_text(encoding="utf-8"))
    assert pinned is not None
    assert agent["command"] == ["npx", "-y",
                                f"@agentclientprotocol/claude-agent-acp@{pinned[1]}"]
    assert {"ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL"} <= set(agent["pass_env"])
    assert "IS_SANDBOX" in readme_snippet()


def test_the_readme_claude_code_snippet_does_a_coding_task_through_zeroclaw(
    tmp_path: Path
) -> None:
    tools_dir = Path(adapter()).parents[2]  # .tools/node_modules/.bin/claude-agent-acp
    snippet = readme_snippet()
    assert not {"env", "workspace"} & set(tomllib.loads(snippet)["agents"]["claude"])
    workspace = Path(os.path.realpath(tmp_path)) / "ws"
    workspace.mkdir()
    task = CodingTask(workspace)
    task.reset()
    config_dir = tmp_path / "cfg"
    write_config(config_dir, f'{snippet}workspace = "{tools_dir}"\n{OFFLINE_ENV}\n'
                             "agent_start_timeout_secs = 90\n")
    server = task.start_server()
    env = host_env({"HOME": str(fresh_home(tmp_path / "home")),
                    "ANTHROPIC_API_KEY": FAKE_KEY, "ANTHROPIC_BASE_URL": server.url})
    client = EditorClient.spawn(host_argv(config_dir), env=env, cwd=workspace,
                                stderr_path=tmp_path / "zeroclaw.stderr", label="zeroclaw")
    try:
        client.initialize()
        sid = client.new_session(workspace, timeout=90)
        result = client.prompt(sid, PROMPT, timeout=120)
        assert result["stopReason"] == "end_turn", result
        assert task.calc.read_text() == FIXED_CALC
        text = "".join(r.update["content"].get("text", "") for r in client.updates()
                       if r.update.get("sessionUpdate") == "agent_message_chunk")
        assert text.endswith(ANSWER)
        assert len(client.requests("session/request_permission")) == 2
        assert any(r.headers.get("x-api-key") == FAKE_KEY for r in server.requests)
    finally:
        problems = client.close()
        server.close()
    assert not problems, problems
    assert FAKE_KEY not in (tmp_path / "zeroclaw.stderr").read_text(encoding="utf-8")
