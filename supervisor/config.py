"""Settings: ``config.toml``, overridden by ``ZEROCLAW_<section>__<key>`` env vars, then flags.

Path rules (SPEC §1): config dir = ``--config-dir`` > ``ZEROCLAW_CONFIG_DIR`` > ``~/.zeroclaw``;
data dir = ``<config_dir>/data``, or ``ZEROCLAW_DATA_DIR`` when no config dir was given
explicitly (an explicit config dir wins, with a warning); socket = ``ZEROCLAW_SOCKET`` >
``<data_dir>/daemon.sock``; store = ``<data_dir>/sessions/acp-sessions.db``.

Loaded once on the main thread at start; :class:`Settings` is immutable afterwards and
safe to read from any thread.
"""

from __future__ import annotations

import logging
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "AUTONOMY_LEVELS",
    "AgentConfig",
    "ConfigError",
    "Settings",
    "load_settings",
    "resolve_config_dir",
    "settings_from_document",
]

log = logging.getLogger("zeroclaw.config")

AUTONOMY_LEVELS = ("read_only", "supervised", "full")
DEFAULT_AGENT_ALIAS = "default"


class ConfigError(ValueError):
    """The configuration cannot be used; the message says which key and why."""


@dataclass(frozen=True, slots=True)
class AgentConfig:
    """One ``[agents.<alias>]`` section; ``raw`` keeps every key for the agent itself."""

    alias: str
    provider: str
    model: str
    workspace: Path
    enabled: bool
    raw: Mapping[str, Any] = field(default_factory=dict)

    def to_wire(self) -> dict[str, Any]:
        """What a worker needs to build the agent (sent in ``OpenSession``)."""
        wire = {k: v for k, v in self.raw.items() if isinstance(v, str | int | float | bool)}
        wire.update(alias=self.alias, provider=self.provider, model=self.model)
        wire["workspace"] = str(self.workspace)
        return wire


@dataclass(frozen=True, slots=True)
class Settings:
    config_dir: Path
    data_dir: Path
    socket_path: Path
    store_path: Path
    default_agent: str | None
    max_sessions: int
    session_timeout_secs: float
    agents: Mapping[str, AgentConfig]
    autonomy_level: str
    forbidden_paths: tuple[str, ...]
    workers_max: int
    sessions_per_worker: int
    frame_limit: int
    log_level: str
    partial_frame_timeout_secs: float = 60.0

    @property
    def default_model(self) -> str:
        alias = self.default_agent or next(iter(self.agents), None)
        agent = self.agents.get(alias) if alias else None
        return f"{agent.provider}/{agent.model}" if agent else ""


def resolve_config_dir(flag: str | None = None, env: Mapping[str, str] | None = None) -> Path:
    env = os.environ if env is None else env
    raw = flag or env.get("ZEROCLAW_CONFIG_DIR") or "~/.zeroclaw"
    return Path(raw).expanduser().absolute()


def _resolve_data_dir(config_dir: Path, explicit_config: bool, env: Mapping[str, str]) -> Path:
    data_env = env.get("ZEROCLAW_DATA_DIR")
    if data_env and explicit_config:
        log.warning("both a config dir and ZEROCLAW_DATA_DIR are set; using %s/data", config_dir)
    elif data_env:
        return Path(data_env).expanduser().absolute()
    return config_dir / "data"


def _parse_env_value(text: str) -> Any:
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def _apply_env(doc: dict[str, Any], env: Mapping[str, str]) -> None:
    """``ZEROCLAW_acp__max_sessions=20`` sets ``doc["acp"]["max_sessions"] = 20``."""
    for name, value in env.items():
        if not name.startswith("ZEROCLAW_") or "__" not in name:
            continue
        path = name[len("ZEROCLAW_") :].split("__")
        if not all(path):
            continue
        path[0] = path[0].lower()  # sections are lower case: ZEROCLAW_ACP__X works too
        if path[0] != "agents":
            path = [part.lower() for part in path]
        node = doc
        for part in path[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                child = node[part] = {}
            node = child
        node[path[-1]] = _parse_env_value(value)


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        return {}
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from None


def _agents(doc: Mapping[str, Any], config_dir: Path) -> dict[str, AgentConfig]:
    sections = doc.get("agents") or {}
    if not isinstance(sections, Mapping):
        raise ConfigError("[agents] must be a table of [agents.<alias>] sections")
    if not sections:
        sections = {DEFAULT_AGENT_ALIAS: {"provider": "echo", "model": "echo"}}
    agents = {}
    for alias, section in sections.items():
        if not isinstance(section, Mapping):
            raise ConfigError(f"[agents.{alias}] must be a table")
        workspace = section.get("workspace") or str(config_dir / "agents" / alias / "workspace")
        agents[alias] = AgentConfig(
            alias=alias,
            provider=str(section.get("provider", "echo")),
            model=str(section.get("model", "echo")),
            workspace=Path(str(workspace)).expanduser().absolute(),
            enabled=bool(section.get("enabled", True)),
            raw=section,
        )
    return agents


def _int(section: Mapping[str, Any], key: str, default: int, minimum: int) -> int:
    value = section.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{key} must be an integer >= {minimum}, got {value!r}")
    return value


def load_settings(
    config_dir_flag: str | None = None,
    overrides: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
) -> Settings:
    """Read config.toml + env + flag ``overrides`` (keys like ``"acp.max_sessions"``)."""
    env = os.environ if env is None else env
    config_dir = resolve_config_dir(config_dir_flag, env)
    explicit = bool(config_dir_flag or env.get("ZEROCLAW_CONFIG_DIR"))
    data_dir = _resolve_data_dir(config_dir, explicit, env)
    doc = _read_toml(config_dir / "config.toml")
    _apply_env(doc, env)
    for dotted, value in (overrides or {}).items():
        if value is not None:
            section, key = dotted.split(".", 1)
            doc.setdefault(section, {})[key] = value
    return settings_from_document(doc, config_dir, data_dir, env)


def settings_from_document(
    doc: Mapping[str, Any], config_dir: Path, data_dir: Path, env: Mapping[str, str]
) -> Settings:
    """Check a parsed configuration and build :class:`Settings`; raises :class:`ConfigError`."""
    acp, autonomy, workers = (_section(doc, k) for k in ("acp", "autonomy", "workers"))
    level = str(autonomy.get("level", "supervised"))
    if level not in AUTONOMY_LEVELS:
        raise ConfigError(f"autonomy.level must be one of {', '.join(AUTONOMY_LEVELS)}")
    timeout = acp.get("session_timeout_secs", 3600)
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0:
        raise ConfigError(f"session_timeout_secs must be a positive number, got {timeout!r}")
    forbidden = autonomy.get("forbidden_paths", ["/etc", "~/.ssh"])
    if not isinstance(forbidden, list) or not all(isinstance(p, str) for p in forbidden):
        raise ConfigError("autonomy.forbidden_paths must be an array of strings")
    agents = _agents(doc, config_dir)
    default_agent = acp.get("default_agent")
    if default_agent is not None and default_agent not in agents:
        raise ConfigError(f"acp.default_agent names no configured agent: {default_agent!r}")
    return Settings(
        config_dir=config_dir,
        data_dir=data_dir,
        socket_path=Path(env.get("ZEROCLAW_SOCKET") or data_dir / "daemon.sock"),
        store_path=data_dir / "sessions" / "acp-sessions.db",
        default_agent=default_agent,
        max_sessions=_int(acp, "max_sessions", 10, 1),
        session_timeout_secs=float(timeout),
        agents=agents,
        autonomy_level=level,
        forbidden_paths=tuple(forbidden),
        workers_max=_int(workers, "max", os.cpu_count() or 2, 1),
        sessions_per_worker=_int(workers, "sessions_per_worker", 0, 0),
        frame_limit=_int(acp, "frame_limit", 32 * 1024 * 1024, 1024),
        log_level=str(env.get("ZEROCLAW_LOG") or _section(doc, "log").get("level", "warning")),
        partial_frame_timeout_secs=_seconds(acp, "partial_frame_timeout_secs", 60.0),
    )


def _seconds(section: Mapping[str, Any], key: str, default: float) -> float:
    value = section.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise ConfigError(f"{key} must be a positive number, got {value!r}")
    return float(value)


def _section(doc: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    section = doc.get(name) or {}
    if not isinstance(section, Mapping):
        raise ConfigError(f"[{name}] must be a table")
    return section
