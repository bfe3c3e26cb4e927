"""The README's Gemini CLI snippet ("Hosting other ACP agents", between the
``<!-- snippet: gemini-cli -->`` markers) works as pasted: ``zeroclaw acp`` with that
config answers the greeting and does the coding task of :mod:`tests.vendors.gemini_api`
against the local Gemini API.

Its ``npx -y`` command runs as written, offline: the agent's ``workspace`` is the tools
dir where scripts/test installed the same pinned package, which npx then uses. The test
adds only npm's offline switches (``env``), a ``HOME`` with the settings the README
names (:func:`~tests.vendors.gemini.fresh_home`), and the key and base URL in
zeroclaw's own environment, which the snippet's ``pass_env`` hands on.
"""

from __future__ import annotations

import os
import re
import tomllib
from pathlib import Path

import pytest

from tests.e2e.procs import REPO_ROOT, host_argv, host_env, write_config

from .gemini import FAKE_KEY, OFFLINE_SETTINGS, PASSED_VARIABLES, cli, fresh_home
from .gemini_api import ANSWER, FIXED_CALC, GREETING, HELLO, PROMPT, GeminiTask
from .harness import EditorClient, said

pytestmark = pytest.mark.timeout(180)

SNIPPET = re.compile(r"<!-- snippet: gemini-cli[^>]*-->\s*```toml\n(.*?)```\s*"
                     r"<!-- /snippet: gemini-cli -->", re.S)
OFFLINE_ENV = 'env = { npm_config_offline = "true", npm_config_update_notifier = "false" }'


def readme() -> str:
    return (REPO_ROOT / "README.md").read_text(encoding="utf-8")


def readme_snippet() -> str:
    [snippet] = SNIPPET.findall(readme())
    return str(snippet)


def test_the_snippet_names_the_pinned_cli_and_passes_key_and_base_url() -> None:
    agent = tomllib.loads(readme_snippet())["agents"]["gemini"]
    pinned = re.search(r'GEMINI_CLI_VERSION="([^"]+)"', (REPO_ROOT / "scripts" / "test")
                       .read_text(encoding="utf-8"))
    assert pinned is not None
    assert agent["provider"] == "acp"
    assert agent["command"] == ["npx", "-y", f"@google/gemini-cli@{pinned[1]}", "--acp"]
    assert set(agent["pass_env"]) == set(PASSED_VARIABLES)
    assert '"--experimental-acp"' not in readme()
    for section, settings in OFFLINE_SETTINGS.items():  # the README names what the test sets
        for name in settings:
            assert f"`{section}.{name}`" in readme(), name


def test_the_readme_gemini_snippet_does_a_coding_task_through_zeroclaw(
    tmp_path: Path
) -> None:
    tools_dir = Path(cli()).parents[2]  # .tools/node_modules/.bin/gemini
    snippet = readme_snippet()
    assert not {"env", "workspace"} & set(tomllib.loads(snippet)["agents"]["gemini"])
    workspace = Path(os.path.realpath(tmp_path)) / "ws"
    workspace.mkdir()
    task = GeminiTask(workspace)
    task.reset()
    config_dir = tmp_path / "cfg"
    write_config(config_dir, f'{snippet}workspace = "{tools_dir}"\n{OFFLINE_ENV}\n'
                             "agent_start_timeout_secs = 90\n")
    server = task.start_server()
    env = host_env({"HOME": str(fresh_home(tmp_path / "home")),
                    "GEMINI_API_KEY": FAKE_KEY, "GOOGLE_GEMINI_BASE_URL": server.url})
    client = EditorClient.spawn(host_argv(config_dir), env=env, cwd=workspace,
                                stderr_path=tmp_path / "zeroclaw.stderr", label="zeroclaw")
    try:
        client.initialize()
        sid = client.new_session(workspace, timeout=90)
        for prompt in (GREETING, PROMPT):
            result = client.prompt(sid, prompt, timeout=120)
            assert result["stopReason"] == "end_turn", result
        assert task.calc.read_text() == FIXED_CALC
        text = said(client.updates())
        assert text.startswith(HELLO) and text.endswith(ANSWER), text
        assert len(client.requests("session/request_permission")) == 2
        assert server.requests and all(r.headers.get("x-goog-api-key") == FAKE_KEY
                                       for r in server.requests)
    finally:
        problems = client.close()
        server.close()
    assert not problems, problems
    assert FAKE_KEY not in (tmp_path / "zeroclaw.stderr").read_text(encoding="utf-8")
