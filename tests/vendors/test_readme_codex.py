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

import tomllib
from pathlib import Path

import pytest

from tests.e2e.model_server import ModelServer

from .bench import ANSWER, FIXED_CALC, PROMPT, pinned_version, readme_run, readme_snippet
from .codex import FAKE_KEY, adapter
from .harness import said
from .openai_responses import CodexTask, is_turn

pytestmark = pytest.mark.timeout(180)

OFFLINE_ENV = 'env = { npm_config_offline = "true", npm_config_update_notifier = "false" }'
GATEWAY_URL = "http://localhost:4000/v1"


def test_the_snippets_name_the_pinned_adapter_the_key_and_a_gateway() -> None:
    agent = tomllib.loads(readme_snippet("codex"))["agents"]["codex"]
    pinned = pinned_version("CODEX_ACP_VERSION")
    assert agent["command"] == ["npx", "-y", f"@zed-industries/codex-acp@{pinned}"]
    assert {"OPENAI_API_KEY", "CODEX_HOME"} <= set(agent["pass_env"])
    codex = tomllib.loads(readme_snippet("codex-config"))
    provider = codex["model_providers"][codex["model_provider"]]
    assert provider["base_url"] == GATEWAY_URL
    assert provider["env_key"] == "OPENAI_API_KEY" and provider["wire_api"] == "responses"


def test_the_readme_codex_snippets_do_a_coding_task_through_zeroclaw(tmp_path: Path) -> None:
    tools_dir = Path(adapter()).parents[4]  # .tools/node_modules/@zed-industries/*/bin/
    snippet = readme_snippet("codex")
    assert not {"env", "workspace"} & set(tomllib.loads(snippet)["agents"]["codex"])
    config = f'{snippet}workspace = "{tools_dir}"\n{OFFLINE_ENV}\n'
    codex_home = tmp_path / "codex-home"
    codex_home.mkdir()

    def env(server: ModelServer) -> dict[str, str]:
        """The key and a CODEX_HOME whose config.toml is the README's, at ``server``."""
        codex_config = readme_snippet("codex-config").replace(GATEWAY_URL,
                                                              f"{server.url}/v1")
        (codex_home / "config.toml").write_text(
            f'sandbox_mode = "danger-full-access"\n{codex_config}', encoding="utf-8")
        return {"HOME": str(tmp_path), "OPENAI_API_KEY": FAKE_KEY,
                "CODEX_HOME": str(codex_home)}

    with readme_run(tmp_path, CodexTask, config, env, FAKE_KEY) as (client, task, server):
        sid = client.new_session(task.cwd, timeout=90)
        result = client.prompt(sid, PROMPT, timeout=120)
        assert result["stopReason"] == "end_turn", result
        assert task.calc.read_text() == FIXED_CALC
        assert said(client.updates()).endswith(ANSWER)
        assert len(client.requests("session/request_permission")) == 2
        turns = [r for r in server.requests if is_turn(r)]
        assert turns and all(r.headers.get("authorization") == f"Bearer {FAKE_KEY}"
                             for r in turns)
