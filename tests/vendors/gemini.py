"""Gemini CLI (``@google/gemini-cli``, installed pinned by scripts/test:
``ZEROCLAW_GEMINI_CLI``; ``gemini --acp`` is its ACP agent) set up to run offline against
:mod:`tests.vendors.gemini_api`.

What the CLI needs: ``GOOGLE_GEMINI_BASE_URL`` (the local server; with it set the CLI
authenticates as an "AI API Gateway" and asks nobody to log in) and ``GEMINI_API_KEY``
(sent as ``x-goog-api-key``); and a ``HOME`` whose ``.gemini/settings.json`` turns off
what would call anything but the API: automatic updates and their notification, usage
statistics and telemetry. Its approval mode is left at ``default``, where it asks the
client before an edit or a command. Runs on the test's thread.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from .bench import fake_key, hosting_config, installed

__all__ = ["FAKE_KEY", "OFFLINE_SETTINGS", "PASSED_VARIABLES", "cli", "fresh_home",
           "gemini_env", "gemini_hosting"]

FAKE_KEY = fake_key("AIza")
#: The variables zeroclaw must hand the CLI (``pass_env``); PATH and HOME pass anyway.
PASSED_VARIABLES = ("GEMINI_API_KEY", "GOOGLE_GEMINI_BASE_URL")
#: ``~/.gemini/settings.json``: nothing but the API is called.
OFFLINE_SETTINGS = {
    "general": {"enableAutoUpdate": False, "enableAutoUpdateNotification": False},
    "privacy": {"usageStatisticsEnabled": False},
    "telemetry": {"enabled": False},
}


def cli() -> str:
    """The CLI's bin, or skip with scripts/test's reason."""
    return installed("ZEROCLAW_GEMINI_CLI")


def fresh_home(home: Path) -> Path:
    """``home`` emptied, with the settings that keep the CLI offline."""
    shutil.rmtree(home, ignore_errors=True)
    (home / ".gemini").mkdir(parents=True)
    (home / ".gemini" / "settings.json").write_text(json.dumps(OFFLINE_SETTINGS),
                                                     encoding="utf-8")
    return home


def gemini_env(base_url: str, home: Path) -> dict[str, str]:
    """The variables the CLI needs (see the module docstring), beside PATH, with
    ``home`` made fresh."""
    return {"PATH": os.environ["PATH"], "HOME": str(fresh_home(home)), "LANG": "C.UTF-8",
            "GOOGLE_GEMINI_BASE_URL": base_url, "GEMINI_API_KEY": FAKE_KEY}


def gemini_hosting(config_dir: Path, command: list[str], extra: str = "") -> None:
    """zeroclaw's config hosting ``command`` as agent ``gemini``, its variables passed."""
    hosting_config(config_dir, "gemini", command, PASSED_VARIABLES, extra)
