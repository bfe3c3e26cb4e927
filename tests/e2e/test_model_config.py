"""SPEC §7: a model agent whose config cannot work is refused at ``session/new`` with
-32602 naming the agent and the reason; the others keep working."""

from __future__ import annotations

from pathlib import Path

import pytest

from .conftest import RawHostFactory
from .procs import write_config
from .rawclient import RawError

AGENTS = """
[agents.unset_key]
provider = "openai"
base_url = "https://api.openai.com/v1"
model = "gpt-4o"
api_key_env = "ZC_TEST_UNSET_KEY"

[agents.no_model]
provider = "openai"
base_url = "http://127.0.0.1:11434/v1"

[agents.no_url]
provider = "anthropic"
model = "claude-sonnet-4-5"
api_key_env = "ZC_TEST_SET_KEY"

[agents.anthropic_keyless]
provider = "anthropic"
base_url = "https://api.anthropic.com"
model = "claude-sonnet-4-5"

[agents.bad_number]
provider = "openai"
base_url = "http://127.0.0.1:11434/v1"
model = "llama3.2"
max_tokens = "lots"

[agents.no_such_provider]
provider = "gpt"

[agents.local]
provider = "openai"
base_url = "http://127.0.0.1:11434/v1"
model = "llama3.2"

[agents.echo]
provider = "echo"
"""


@pytest.mark.parametrize(("alias", "reason"), [
    ("unset_key", "environment variable ZC_TEST_UNSET_KEY (api_key_env) is not set"),
    ("no_model", "model is required"),
    ("no_url", "base_url is required"),
    ("anthropic_keyless", "api_key_env is required"),
    ("bad_number", "max_tokens must be an integer"),
    ("no_such_provider", "unknown agent provider 'gpt'"),
])
def test_an_agent_that_cannot_work_is_refused_naming_it_and_why(
    raw_hosts: RawHostFactory, config_dir: Path, workspace: Path, alias: str, reason: str,
) -> None:
    write_config(config_dir, AGENTS)
    raw = raw_hosts(env_extra={"ZC_TEST_SET_KEY": "sk-present"})
    raw.initialize()
    with pytest.raises(RawError) as refused:
        raw.call("session/new", {"cwd": str(workspace), "agentAlias": alias})
    assert refused.value.code == -32602
    assert f"agent {alias} cannot be used" in refused.value.message
    assert reason in refused.value.message
    for usable in ("local", "echo"):  # a keyless local server is fine; the host goes on
        raw.call("session/new", {"cwd": str(workspace), "agentAlias": usable})
