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

import tomllib
from pathlib import Path

import pytest

from .anthropic_api import CodingTask
from .bench import ANSWER, FIXED_CALC, PROMPT, pinned_version, readme_run, readme_snippet
from .claude import FAKE_KEY, adapter, fresh_home
from .harness import said

pytestmark = pytest.mark.timeout(180)

OFFLINE_ENV = ('env = { IS_SANDBOX = "1", CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC = "1", '
               'DISABLE_AUTOUPDATER = "1", DISABLE_TELEMETRY = "1", '
               'DISABLE_ERROR_REPORTING = "1", CLAUDE_CODE_ENABLE_PROMPT_SUGGESTION = "false", '
               'npm_config_offline = "true", npm_config_update_notifier = "false" }')


def test_the_snippet_names_the_pinned_adapter_and_passes_key_and_base_url() -> None:
    agent = tomllib.loads(readme_snippet("claude-code"))["agents"]["claude"]
    pinned = pinned_version("CLAUDE_ACP_VERSION")
    assert agent["command"] == ["npx", "-y", f"@agentclientprotocol/claude-agent-acp@{pinned}"]
    assert {"ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL"} <= set(agent["pass_env"])
    assert "IS_SANDBOX" in readme_snippet("claude-code")


def test_the_readme_claude_code_snippet_does_a_coding_task_through_zeroclaw(
    tmp_path: Path
) -> None:
    tools_dir = Path(adapter()).parents[2]  # .tools/node_modules/.bin/claude-agent-acp
    snippet = readme_snippet("claude-code")
    assert not {"env", "workspace"} & set(tomllib.loads(snippet)["agents"]["claude"])
    config = f'{snippet}workspace = "{tools_dir}"\n{OFFLINE_ENV}\n'
    home = fresh_home(tmp_path / "home")
    with readme_run(tmp_path, CodingTask, config, lambda server: {
            "HOME": str(home), "ANTHROPIC_API_KEY": FAKE_KEY,
            "ANTHROPIC_BASE_URL": server.url}, FAKE_KEY) as (client, task, server):
        sid = client.new_session(task.cwd, timeout=90)
        result = client.prompt(sid, PROMPT, timeout=120)
        assert result["stopReason"] == "end_turn", result
        assert task.calc.read_text() == FIXED_CALC
        assert said(client.updates()).endswith(ANSWER)
        assert len(client.requests("session/request_permission")) == 2
        assert any(r.headers.get("x-api-key") == FAKE_KEY for r in server.requests)
