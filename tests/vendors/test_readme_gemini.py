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

import tomllib
from pathlib import Path

import pytest

from .bench import (
    ANSWER,
    FIXED_CALC,
    PROMPT,
    pinned_version,
    readme,
    readme_run,
    readme_snippet,
)
from .gemini import FAKE_KEY, OFFLINE_SETTINGS, PASSED_VARIABLES, cli, fresh_home
from .gemini_api import GREETING, HELLO, GeminiTask
from .harness import said

pytestmark = pytest.mark.timeout(180)

OFFLINE_ENV = 'env = { npm_config_offline = "true", npm_config_update_notifier = "false" }'


def test_the_snippet_names_the_pinned_cli_and_passes_key_and_base_url() -> None:
    agent = tomllib.loads(readme_snippet("gemini-cli"))["agents"]["gemini"]
    pinned = pinned_version("GEMINI_CLI_VERSION")
    assert agent["provider"] == "acp"
    assert agent["command"] == ["npx", "-y", f"@google/gemini-cli@{pinned}", "--acp"]
    assert set(agent["pass_env"]) == set(PASSED_VARIABLES)
    assert '"--experimental-acp"' not in readme()
    for section, settings in OFFLINE_SETTINGS.items():  # the README names what the test sets
        for name in settings:
            assert f"`{section}.{name}`" in readme(), name


def test_the_readme_gemini_snippet_does_a_coding_task_through_zeroclaw(
    tmp_path: Path
) -> None:
    tools_dir = Path(cli()).parents[2]  # .tools/node_modules/.bin/gemini
    snippet = readme_snippet("gemini-cli")
    assert not {"env", "workspace"} & set(tomllib.loads(snippet)["agents"]["gemini"])
    config = f'{snippet}workspace = "{tools_dir}"\n{OFFLINE_ENV}\n'
    home = fresh_home(tmp_path / "home")
    with readme_run(tmp_path, GeminiTask, config, lambda server: {
            "HOME": str(home), "GEMINI_API_KEY": FAKE_KEY,
            "GOOGLE_GEMINI_BASE_URL": server.url}, FAKE_KEY) as (client, task, server):
        sid = client.new_session(task.cwd, timeout=90)
        for prompt in (GREETING, PROMPT):
            result = client.prompt(sid, prompt, timeout=120)
            assert result["stopReason"] == "end_turn", result
        assert task.calc.read_text() == FIXED_CALC
        text = said(client.updates())
        assert text.startswith(HELLO) and text.endswith(ANSWER), text
        assert len(client.requests("session/request_permission")) == 2
        assert server.requests and all(r.headers.get("x-goog-api-key") == FAKE_KEY
                                       for r in server.requests)
