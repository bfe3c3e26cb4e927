"""Codex's ACP adapter (``@zed-industries/codex-acp``, its native binary installed pinned
by scripts/test: ``ZEROCLAW_CODEX_ACP``) set up to run offline against
:mod:`tests.vendors.openai_responses`.

What the adapter needs: a ``CODEX_HOME`` whose ``config.toml`` names a model provider
with the local server's ``base_url`` (``wire_api = "responses"``) and ``env_key =
"OPENAI_API_KEY"`` (a provider other than the built-in ``openai`` needs no login: the
key is read from that variable for each request, sent as ``Authorization: Bearer``);
a model Codex knows (``gpt-5.3-codex``: else each turn starts with a "model metadata
not found" message); ``approval_policy = "untrusted"`` (it asks the client before an
edit or a command that is not a known-safe read) and ``sandbox_mode =
"danger-full-access"`` (no Landlock sandbox, which a container may lack).

Codex's tool calls carry its own clock and ids (``turn_id``, ``started_at_ms``, a
``process_id``, a ``duration``, an output ``Chunk ID``): :func:`comparable` replaces
their values with a placeholder before two runs are compared.

codex-acp 0.16.0 does not exit when its stdin closes (it runs until a signal):
:func:`closed_cleanly` accepts exactly that from a directly spawned adapter. Runs on
the test's thread.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .bench import fake_key, hosting_config, installed
from .harness import EditorClient, Received
from .openai_responses import MODEL

__all__ = ["FAKE_KEY", "PASSED_VARIABLES", "adapter", "closed_cleanly", "codex_env",
           "codex_hosting", "comparable", "fresh_codex_home"]

FAKE_KEY = fake_key("sk-proj-")
#: The variables zeroclaw must hand the adapter (``pass_env``); PATH and HOME pass anyway.
PASSED_VARIABLES = ("OPENAI_API_KEY", "CODEX_HOME")
#: Keys whose values are Codex's clock or process ids, not what it did.
VOLATILE_KEYS = frozenset({"turn_id", "started_at_ms", "completed_at_ms", "process_id",
                           "duration", "wall_time"})
_CHUNK_ID = re.compile(r"(Chunk ID: )[0-9a-f]+|(Wall time: )[0-9.]+( seconds)")


def adapter() -> str:
    """The adapter's native binary, or skip with scripts/test's reason."""
    return installed("ZEROCLAW_CODEX_ACP", node=False)


def provider_config(base_url: str) -> str:
    """The ``config.toml`` text pointing Codex at ``base_url`` (module docstring)."""
    return f"""model = "{MODEL}"
model_provider = "fake-openai"
approval_policy = "untrusted"
sandbox_mode = "danger-full-access"

[model_providers.fake-openai]
name = "Local Responses API"
base_url = "{base_url}/v1"
env_key = "OPENAI_API_KEY"
wire_api = "responses"
"""


def fresh_codex_home(codex_home: Path, base_url: str) -> Path:
    """``codex_home`` emptied, with the ``config.toml`` for ``base_url``."""
    shutil.rmtree(codex_home, ignore_errors=True)
    codex_home.mkdir(parents=True)
    (codex_home / "config.toml").write_text(provider_config(base_url), encoding="utf-8")
    return codex_home


def codex_env(base_url: str, home: Path, *, key: bool = True) -> dict[str, str]:
    """The variables the adapter needs, beside PATH: ``HOME`` and ``CODEX_HOME`` (fresh,
    under ``home``) and, unless ``key`` is False, ``OPENAI_API_KEY``."""
    shutil.rmtree(home, ignore_errors=True)
    codex_home = fresh_codex_home(home / ".codex", base_url)
    env = {"PATH": os.environ["PATH"], "HOME": str(home), "LANG": "C.UTF-8",
           "CODEX_HOME": str(codex_home)}
    if key:
        env["OPENAI_API_KEY"] = FAKE_KEY
    return env


def codex_hosting(config_dir: Path, command: list[str]) -> None:
    """zeroclaw's config hosting ``command`` as agent ``codex``, its variables passed."""
    hosting_config(config_dir, "codex", command, PASSED_VARIABLES)


def _masked(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: "<volatile>" if k in VOLATILE_KEYS else _masked(v)
                for k, v in value.items()}
    if isinstance(value, list):
        return [_masked(v) for v in value]
    if isinstance(value, str):
        return _CHUNK_ID.sub(lambda m: f"{m[1] or m[2]}<volatile>{m[3] or ''}", value)
    return value


def comparable(records: Iterable[Received]) -> list[Received]:
    """``records`` with Codex's volatile values (:data:`VOLATILE_KEYS`, an output's
    ``Chunk ID`` and ``Wall time``) replaced by ``<volatile>``."""
    return [dataclasses.replace(r, params=_masked(r.params)) for r in records]


def closed_cleanly(*clients: EditorClient) -> None:
    """Close ``clients``; no problems but a directly spawned adapter's not exiting on EOF
    (module docstring: it is then killed, and what it left behind still counts)."""
    problems = []
    for client in clients:
        direct = client.label.startswith("direct")
        timeout = 5.0 if direct else 15.0
        stays = f"{client.label} pid {client.pid} did not exit within {timeout}s of EOF"
        problems += [p for p in client.close(timeout) if not (direct and p == stays)]
    assert not problems, "\n".join(problems)
