"""The README's Codex snippets ("Hosting other ACP agents", between the
``<!-- snippet: codex -->`` and ``<!-- snippet: codex-config -->`` markers) work as
pasted: ``zeroclaw acp`` with that agent config, and Codex with that ``config.toml``
(its gateway's ``base_url`` swapped for the local Responses API's), does the coding task
of :mod:`tests.vendors.openai_responses`.

Its ``npx -y`` command runs as written, offline: the agent's ``workspace`` is the tools
dir where scripts/test installed the same pinned package, which npx then uses. The test
adds only what keeps npm offline (``env``) and ``sandbox_mode = "danger-full-access"``
(a container may lack Landlock); the key and ``CODEX_HOME`` are in zeroclaw's own
environment, which the snippet's ``pass_env`` hands on.
"""

from __future__ import annotations

import os
import re
import tomllib
from pathlib import Path

import pytest

from tests.e2e.procs import REPO_ROOT, host_argv, host_env, write_config

from .codex import FAKE_KEY, adapter
from .harness import EditorClient
from .openai_responses import ANSWER, FIXED_CALC, PROMPT, CodexTask, is_turn

pytestmark = pytest.mark.timeout(180)

OFFLINE_ENV = 'env = { npm_config_offline = "true", npm_config_update_notifier = "false" }'
GATEWAY_URL = "http://localhost:4000/v1"


def readme_snippet(name: str) -> str:
    pattern = re.compile(rf"<!-- snippet: {name} [^>]*-->\s*```toml\n(.*?)```\s*"
                         rf"<!-- /snippet: {name} -->", re.S)
    [snippet] = pattern.findall((REPO_ROOT / "README.md").read_text(encoding="utf-8"))
    return str(snippet)


def test_the_snippets_name_the_pinned_adapter_the_key_and_a_gateway() -> None:
    agent = tomllib.loads(readme_snippet("codex"))["agents"]["codex"]
    pinned = re.search(r'CODEX_ACP_VERSION="([^"]+)"', (REPO_ROOT / "scripts" / "test")
                       .read_text(encoding="utf-8"))
    assert pinned is not None
    assert agent["command"] == ["npx", "-y", f"@zed-industries/codex-acp@{pinned[1]}"]
    assert {"OPENAI_API_KEY", "CODEX_HOME"} <= set(agent["pass_env"])
    codex = tomllib.loads(readme_snippet("codex-config"))
    provider = codex["model_providers"][codex["model_provider"]]
    assert provider["base_url"] == GATEWAY_URL
    assert provider["env_key"] == "OPENAI_API_KEY" and provider["wire_api"] == "responses"


def test_the_readme_codex_snippets_do_a_coding_task_through_zeroclaw(tmp_path: Path) -> None:
    tools_dir = Path(adapter()).parents[4]  # .tools/node_modules/@zed-industries/*/bin/
    snippet = readme_snippet("codex")
    assert not {"env", "workspace"} & set(tomllib.loads(snippet)["agents"]["codex"])
    workspace = Path(os.path.realpath(tmp_path)) / "ws"
    workspace.mkdir()
    task = CodexTask(workspace)
    task.reset()
    config_dir = tmp_path / "cfg"
    write_config(config_dir, f'{snippet}workspace = "{tools_dir}"\n{OFFLINE_ENV}\n'
                             "agent_start_timeout_secs = 90\n")
    server = task.start_server()
    codex_home = tmp_path / "codex-home"
    codex_home.mkdir()
    codex_config = readme_snippet("codex-config").replace(GATEWAY_URL, f"{server.url}/v1")
    (codex_home / "config.toml").write_text(
        f'sandbox_mode = "danger-full-access"\n{codex_config}', encoding="utf-8")
    env = host_env({"HOME": str(tmp_path), "OPENAI_API_KEY": FAKE_KEY,
                    "CODEX_HOME": str(codex_home)})
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
        turns = [r for r in server.requests if is_turn(r)]
        assert turns and all(r.headers.get("authorization") == f"Bearer {FAKE_KEY}"
                             for r in turns)
    finally:
        problems = client.close()
        server.close()
    assert not problems, problems
    assert FAKE_KEY not in (tmp_path / "zeroclaw.stderr").read_text(encoding="utf-8")
