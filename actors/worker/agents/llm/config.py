"""The settings of a model-backed agent, read from its ``[agents.<alias>]`` section.

Keys: ``base_url``, ``model``, ``api_key_env`` (the NAME of an environment variable
holding the key; the key itself is never in the config), ``headers``,
``temperature``, ``max_tokens``, ``context_window``, ``request_timeout_secs``,
``max_retries``, ``max_tool_rounds``, ``max_turn_secs`` (the longest a turn may run:
past it the turn ends ``cancelled`` with what it streamed), ``max_tool_calls_per_reply``
(the calls of one model reply that run; the others are refused); the MCP keys
``mcp_servers`` (the agent's own servers, the shape of ACP's ``McpServer`` entries),
``mcp_read_only_tools`` (prefixed tool names that run without asking: zeroclaw's
allowlist), ``mcp_client_servers`` (false: the client's ``mcpServers`` are not
used), ``mcp_start_timeout_secs`` and ``mcp_call_timeout_secs``
(:mod:`actors.worker.mcp`).

Pure functions and frozen data: safe from any thread. :func:`settings_problem`
runs on the host's loop (``session/new``) and in the worker; :func:`load_settings`
in the worker when the agent is created.
"""

from __future__ import annotations

import math
import os
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ModelSettings", "load_settings", "settings_problem"]

DEFAULT_CONTEXT_WINDOW = 128_000
DEFAULT_TIMEOUT_SECS = 120.0
DEFAULT_MAX_RETRIES = 3
DEFAULT_MAX_TOOL_ROUNDS = 20
DEFAULT_MAX_TURN_SECS = 1800.0
DEFAULT_MAX_TOOL_CALLS_PER_REPLY = 64


@dataclass(frozen=True, slots=True)
class ModelSettings:
    """What a model agent needs. ``api_key`` is the key's value (never logged or shown)."""

    alias: str
    base_url: str
    model: str
    api_key: str | None = field(repr=False)
    headers: Mapping[str, str]
    temperature: float | None
    max_tokens: int | None
    context_window: int
    request_timeout_secs: float
    max_retries: int
    max_tool_rounds: int
    workspace: str
    max_turn_secs: float = DEFAULT_MAX_TURN_SECS
    max_tool_calls_per_reply: int = DEFAULT_MAX_TOOL_CALLS_PER_REPLY


def _number(config: Mapping[str, Any], key: str, *, integer: bool, minimum: float) -> str | None:
    value = config.get(key)
    if value is None:
        return None
    wrong_kind = isinstance(value, bool) or not isinstance(value, int | float) or (
        integer and not isinstance(value, int))
    if wrong_kind or not math.isfinite(value):
        return f"{key} must be {'an integer' if integer else 'a number'}, got {value!r}"
    if value < minimum:
        return f"{key} must be >= {minimum:g}, got {value!r}"
    return None


def _usable_url(url: str) -> bool:
    try:
        parts = urllib.parse.urlsplit(url)
        _ = parts.port  # raises for a bad port
    except ValueError:
        return False
    return parts.scheme in ("http", "https") and bool(parts.hostname) and not any(
        c.isspace() for c in url)


def settings_problem(
    config: Mapping[str, Any], env: Mapping[str, str], *, needs_key: bool
) -> str | None:
    """Why this config cannot work in ``env``, or None. Never contains the key's value."""
    for key in ("base_url", "model"):
        value = config.get(key)
        if not isinstance(value, str) or not value.strip():
            return f"{key} is required for provider {config.get('provider')!r}"
    if not _usable_url(str(config["base_url"])):
        return "base_url must be an http:// or https:// URL with a host"
    key_env = config.get("api_key_env")
    if key_env is not None and (not isinstance(key_env, str) or not key_env):
        return "api_key_env must be the name of an environment variable"
    if key_env is None and needs_key:
        return "api_key_env is required (the name of the variable holding the API key)"
    if key_env is not None and not env.get(key_env):
        return f"environment variable {key_env} (api_key_env) is not set"
    if key_env is not None and any(ord(c) < 33 or ord(c) == 127 for c in env[key_env]):
        # an HTTP library would refuse the header and quote it in its error and debug log
        return f"environment variable {key_env} (api_key_env) holds spaces or control characters"
    headers = config.get("headers", {})
    if not isinstance(headers, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in headers.items()
    ):
        return "headers must be a table of strings"
    checks = (("temperature", False, 0), ("max_tokens", True, 1), ("context_window", True, 256),
              ("request_timeout_secs", False, 0.001), ("max_retries", True, 0),
              ("max_tool_rounds", True, 0), ("max_turn_secs", False, 0.001),
              ("max_tool_calls_per_reply", True, 1), ("mcp_start_timeout_secs", False, 0.001),
              ("mcp_call_timeout_secs", False, 0.001))
    for key, integer, minimum in checks:
        problem = _number(config, key, integer=integer, minimum=minimum)
        if problem is not None:
            return problem
    return _mcp_problem(config)


def _mcp_problem(config: Mapping[str, Any]) -> str | None:
    """What is wrong with the agent's MCP keys, or None."""
    from actors.worker.mcp.specs import config_problem

    allowed = config.get("mcp_read_only_tools", [])
    if not isinstance(allowed, list) or not all(isinstance(n, str) for n in allowed):
        return "mcp_read_only_tools must be a list of tool names (SERVER__tool)"
    if not isinstance(config.get("mcp_client_servers", True), bool):
        return "mcp_client_servers must be true or false"
    return config_problem(config.get("mcp_servers"))


def load_settings(
    config: Mapping[str, Any], *, default_max_tokens: int | None = None,
    env: Mapping[str, str] | None = None,
) -> ModelSettings:
    """Settings of a config that :func:`settings_problem` accepted."""
    env = os.environ if env is None else env
    key_env = config.get("api_key_env")
    max_tokens = config.get("max_tokens", default_max_tokens)
    return ModelSettings(
        alias=str(config.get("alias", "")),
        base_url=str(config["base_url"]).rstrip("/"),
        model=str(config["model"]),
        api_key=env.get(key_env) if isinstance(key_env, str) else None,
        headers=dict(config.get("headers") or {}),
        temperature=float(config["temperature"]) if "temperature" in config else None,
        max_tokens=int(max_tokens) if max_tokens is not None else None,
        context_window=int(config.get("context_window", DEFAULT_CONTEXT_WINDOW)),
        request_timeout_secs=float(config.get("request_timeout_secs", DEFAULT_TIMEOUT_SECS)),
        max_retries=int(config.get("max_retries", DEFAULT_MAX_RETRIES)),
        max_tool_rounds=int(config.get("max_tool_rounds", DEFAULT_MAX_TOOL_ROUNDS)),
        workspace=str(config.get("workspace", "")),
        max_turn_secs=float(config.get("max_turn_secs", DEFAULT_MAX_TURN_SECS)),
        max_tool_calls_per_reply=int(config.get("max_tool_calls_per_reply",
                                                DEFAULT_MAX_TOOL_CALLS_PER_REPLY)),
    )
