"""Claude Code's ACP adapter (``@agentclientprotocol/claude-agent-acp``, installed pinned
by scripts/test: ``ZEROCLAW_CLAUDE_ACP``) set up to run offline against
:mod:`tests.vendors.anthropic_api`.

What the adapter needs: ``ANTHROPIC_BASE_URL`` (the local server) and an
``ANTHROPIC_API_KEY``; ``IS_SANDBOX=1`` when run as root (else the adapter offers no
``bypassPermissions`` mode: the session's mode list differs by user);
``CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC``, ``DISABLE_AUTOUPDATER``,
``DISABLE_TELEMETRY`` and ``DISABLE_ERROR_REPORTING`` so that Claude Code calls nothing
but the API; ``CLAUDE_CODE_ENABLE_PROMPT_SUGGESTION=false`` (no follow-up prediction
request after each turn); and a ``HOME`` whose ``.claude/settings.json`` sets the
permission mode ``default`` ("Manual": it asks the client before an edit or a
command; the built-in default is ``auto``, where a model classifier decides).
Runs on the test's thread.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from .bench import fake_key, hosting_config, installed

__all__ = ["FAKE_KEY", "PASSED_VARIABLES", "adapter", "claude_env", "claude_hosting",
           "fresh_home"]

FAKE_KEY = fake_key("sk-ant-api03-")
#: The variables zeroclaw must hand the adapter (``pass_env``); PATH and HOME pass anyway.
PASSED_VARIABLES = (
    "ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL", "IS_SANDBOX",
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "DISABLE_AUTOUPDATER", "DISABLE_TELEMETRY",
    "DISABLE_ERROR_REPORTING", "CLAUDE_CODE_ENABLE_PROMPT_SUGGESTION",
)


def adapter() -> str:
    """The adapter's bin, or skip with scripts/test's reason."""
    return installed("ZEROCLAW_CLAUDE_ACP")


def fresh_home(home: Path) -> Path:
    """``home`` emptied, with the user settings that make Claude Code ask permission."""
    shutil.rmtree(home, ignore_errors=True)
    (home / ".claude").mkdir(parents=True)
    settings = {"permissions": {"defaultMode": "default"}}
    (home / ".claude" / "settings.json").write_text(json.dumps(settings), encoding="utf-8")
    return home


def claude_env(base_url: str, home: Path) -> dict[str, str]:
    """The variables the adapter needs (see the module docstring), beside PATH, with
    ``home`` made fresh."""
    return {
        "PATH": os.environ["PATH"], "HOME": str(fresh_home(home)), "LANG": "C.UTF-8",
        "ANTHROPIC_BASE_URL": base_url, "ANTHROPIC_API_KEY": FAKE_KEY, "IS_SANDBOX": "1",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_AUTOUPDATER": "1",
        "DISABLE_TELEMETRY": "1", "DISABLE_ERROR_REPORTING": "1",
        "CLAUDE_CODE_ENABLE_PROMPT_SUGGESTION": "false",
    }


def claude_hosting(config_dir: Path, command: list[str]) -> None:
    """zeroclaw's config hosting ``command`` as agent ``claude``, its variables passed."""
    hosting_config(config_dir, "claude", command, PASSED_VARIABLES)
