"""Settings: ``config.toml``, overridden by ``ZEROCLAW_<section>__<key>`` env vars, then flags.

Path rules (SPEC §1): config dir = ``--config-dir`` > ``ZEROCLAW_CONFIG_DIR`` > ``~/.zeroclaw``;
data dir = ``<config_dir>/data``, or ``ZEROCLAW_DATA_DIR`` when no config dir was given
explicitly (an explicit config dir wins, with a warning); socket = ``ZEROCLAW_SOCKET`` >
``<data_dir>/daemon.sock``; store = ``<data_dir>/sessions/acp-sessions.db``.

Loaded once on the main thread at start; :class:`Settings` is immutable afterwards and
safe to read from any thread.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import re
import socket
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from actors.worker.sandbox import SANDBOX_CHOICES
from ipc.modes import MODE_IDS
from supervisor.config.errors import ConfigError
from supervisor.config.gateway_config import (
    GatewayConfig,
    TenantConfig,
    gateway_from_document,
    tenants_from_document,
)

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

AUTONOMY_LEVELS = MODE_IDS  # the autonomy levels are the session modes
DEFAULT_AGENT_ALIAS = "default"


@dataclass(frozen=True, slots=True)
class AgentConfig:
    """One ``[agents.<alias>]`` section; ``raw`` keeps every key for the agent itself."""

    alias: str
    provider: str
    model: str
    workspace: Path
    enabled: bool
    raw: Mapping[str, Any] = field(default_factory=dict)
    env: Mapping[str, str] = field(default_factory=dict)
    sandbox_network: bool = True  # false: its commands get a network namespace of their own

    def to_wire(self) -> dict[str, Any]:
        """What a worker needs to build the agent (sent in ``OpenSession``)."""
        wire: dict[str, Any] = {k: v for k, v in self.raw.items()
                if isinstance(v, str | int | float | bool | list | dict)}
        wire.update(alias=self.alias, provider=self.provider, model=self.model)
        wire["workspace"] = str(self.workspace)
        wire["env"] = dict(self.env)
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
    client_stall_timeout_secs: float = 30.0
    """A client that stays behind on its updates without reading a byte this long is
    disconnected (its running turns are cancelled and kept, as when it goes away)."""
    partial_frame_timeout_secs: float = 60.0
    """A client of ``daemon.sock`` or ``acp.sock`` whose unfinished line stops growing this
    long is disconnected."""
    sandbox: str = "auto"  # [autonomy] sandbox: auto | bwrap | landlock | none
    allow_unsandboxed_shell: bool = False
    gateway: GatewayConfig | None = None  # [gateway]: see supervisor.config.gateway_config
    tenants: Mapping[str, TenantConfig] = field(default_factory=dict)  # [tenants.NAME]
    store_url: str | None = None
    """``[store] url`` when it names PostgreSQL (never holding a password); ``None``: the
    SQLite file ``store_path``."""
    store_password_env: str | None = None
    """``[store] password_env``: the variable that holds the PostgreSQL password."""
    host_id: str = ""
    """``[store] host_id``: this host's name among the hosts of one PostgreSQL store
    (default ``<hostname>:<a hash of the data dir>``, the same across restarts; a
    ``zeroclaw acp`` process adds ``:acp-<pid>``, see :meth:`as_stdio_host`)."""
    lease_ttl_secs: float = 30.0
    """``[store] lease_ttl_secs``: how long a session's lease outlives its host's last
    heartbeat (renewed every third of it)."""
    takeover: str = "expired"
    """``[store] takeover``: ``"expired"`` (a session whose owner's lease ran out moves
    to the host asked for it) or ``"never"`` (it stays refused, -32004, until its owner
    releases it or an operator frees it)."""

    def as_stdio_host(self, pid: int) -> Settings:
        """These settings for a ``zeroclaw acp`` process: a host of its own among those
        of a shared store, so its id gains ``:acp-<pid>``. Editors start one such process
        per window on one config (and a daemon may serve it too): with one id they would
        each take, renew and release the others' leases as their own."""
        return dataclasses.replace(self, host_id=f"{self.host_id}:acp-{pid}")

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
    """``ZEROCLAW_acp__max_sessions=20`` sets ``doc["acp"]["max_sessions"] = 20``.

    An empty (or blank) value counts as unset, as ``export ZEROCLAW_acp__default_agent=``
    reads: the file's value, or the default, stays."""
    for name, value in env.items():
        if not name.startswith("ZEROCLAW_") or "__" not in name or not value.strip():
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
        provider = str(section.get("provider", "echo"))
        network = section.get("sandbox_network", True)
        if not isinstance(network, bool):
            raise ConfigError(f"agents.{alias}.sandbox_network must be true or false")
        agents[alias] = AgentConfig(
            alias=alias,
            provider=provider,
            model=str(section.get("model", "echo" if provider == "echo" else "")),
            workspace=Path(str(workspace)).expanduser().absolute(),
            enabled=bool(section.get("enabled", True)),
            raw=section,
            env=_agent_env(alias, section),
            sandbox_network=network,
        )
    return agents


_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _agent_env(alias: str, section: Mapping[str, Any]) -> dict[str, str]:
    """``[agents.<alias>] env = {NAME = "value"}``: the variables its shell commands get."""
    env = section.get("env", {})
    if not isinstance(env, Mapping) or not all(
        isinstance(name, str) and _ENV_NAME.fullmatch(name)
        and isinstance(value, str) and "\x00" not in value
        for name, value in env.items()
    ):
        raise ConfigError(
            f"agents.{alias}.env must be a table of string values with variable names "
            'as keys, e.g. env = {RUST_LOG = "debug"}')
    return dict(env)


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
    forbidden = [_forbidden_path(p, env) for p in forbidden if p.strip()]
    sandbox = autonomy.get("sandbox", "auto")
    if sandbox not in SANDBOX_CHOICES:
        raise ConfigError(f"autonomy.sandbox must be one of {', '.join(SANDBOX_CHOICES)}")
    unsandboxed = autonomy.get("allow_unsandboxed_shell", False)
    if not isinstance(unsandboxed, bool):
        raise ConfigError("autonomy.allow_unsandboxed_shell must be true or false")
    agents = _agents(doc, config_dir)
    default_agent = acp.get("default_agent")
    if default_agent is not None and (
        not isinstance(default_agent, str) or default_agent not in agents
    ):
        raise ConfigError(f"acp.default_agent names no configured agent: {default_agent!r}")
    gateway = gateway_from_document(_section(doc, "gateway"))
    store_section = _section(doc, "store")
    store_path, store_url, password_env = _store(store_section, data_dir)
    return Settings(
        config_dir=config_dir,
        data_dir=data_dir,
        socket_path=Path(env.get("ZEROCLAW_SOCKET") or data_dir / "daemon.sock"),
        store_path=store_path,
        store_url=store_url,
        store_password_env=password_env,
        host_id=_host_id(store_section, data_dir),
        lease_ttl_secs=_seconds(store_section, "lease_ttl_secs", 30.0),
        takeover=_choice(store_section, "takeover", TAKEOVER_RULES),
        default_agent=default_agent,
        max_sessions=_int(acp, "max_sessions", 10, 1),
        session_timeout_secs=_whole_if_integral(timeout),
        agents=agents,
        autonomy_level=level,
        forbidden_paths=tuple(forbidden),
        workers_max=_int(workers, "max", os.cpu_count() or 2, 1),
        sessions_per_worker=_int(workers, "sessions_per_worker", 0, 0),
        frame_limit=_int(acp, "frame_limit", 32 * 1024 * 1024, 1024),
        log_level=str(env.get("ZEROCLAW_LOG") or _section(doc, "log").get("level", "warning")),
        client_stall_timeout_secs=_seconds(acp, "client_stall_timeout_secs", 30.0),
        partial_frame_timeout_secs=_seconds(acp, "partial_frame_timeout_secs", 60.0),
        sandbox=sandbox,
        allow_unsandboxed_shell=unsandboxed,
        gateway=gateway,
        tenants=tenants_from_document(doc.get("tenants"), gateway.retired_tenant_ids),
    )


def _store(section: Mapping[str, Any], data_dir: Path) -> tuple[Path, str | None, str | None]:
    """``[store]``: (the SQLite path, the PostgreSQL URL or None, password_env or None).

    ``url = "sqlite:///PATH"`` (or no url) is the SQLite file; ``postgresql://user@host:
    port/db`` is PostgreSQL, whose password must not be in the URL (it would show in
    ``zeroclaw config`` and reach every child process): ``password_env`` names the
    variable that holds it, or libpq finds it (``~/.pgpass``, a service file)."""
    default = data_dir / "sessions" / "acp-sessions.db"
    url = section.get("url")
    password_env = section.get("password_env")
    if password_env is not None and (not isinstance(password_env, str)
                                     or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", password_env)):
        raise ConfigError("store.password_env must be the name of an environment variable, "
                          'e.g. password_env = "ZEROCLAW_PG_PASSWORD"')
    if url is None or url == "":
        return default, None, password_env
    if not isinstance(url, str):
        raise ConfigError("store.url must be a string, e.g. postgresql://zeroclaw@db:5432/zeroclaw")
    parts = urlsplit(url)
    if parts.scheme == "sqlite":
        if parts.netloc or not parts.path.startswith("/"):
            raise ConfigError(f"store.url {url!r}: use sqlite:///ABSOLUTE/PATH")
        return Path(unquote(parts.path)).expanduser(), None, password_env
    if parts.scheme not in ("postgresql", "postgres"):
        raise ConfigError("store.url must start with postgresql:// or sqlite:///")
    if parts.password is not None or "password=" in parts.query:
        raise ConfigError("store.url must not hold a password: put it in the variable "
                          "named by store.password_env, or in ~/.pgpass")
    return default, url, password_env


#: ``[store] takeover``'s values, the default first.
TAKEOVER_RULES = ("expired", "never")


def _choice(section: Mapping[str, Any], key: str, choices: tuple[str, ...]) -> str:
    value = section.get(key, choices[0])
    if value not in choices:
        raise ConfigError(f"store.{key} must be one of {', '.join(map(repr, choices))}, "
                          f"got {value!r}")
    return str(value)


def _host_id(section: Mapping[str, Any], data_dir: Path) -> str:
    given = section.get("host_id")
    if given is not None:
        if not isinstance(given, str) or not given.strip():
            raise ConfigError("store.host_id must be a non-empty string")
        return given.strip()
    digest = hashlib.sha256(str(data_dir).encode()).hexdigest()[:8]
    return f"{socket.gethostname()}:{digest}"


_VARIABLE = re.compile(r"\$(?:([A-Za-z_][A-Za-z0-9_]*)|\{([^}]*)\})")


def _forbidden_path(entry: str, env: Mapping[str, str]) -> str:
    """A ``forbidden_paths`` entry with ``$VAR``/``${VAR}`` and ``~`` expanded; it must then be
    absolute (a relative one would be judged from a worker's cwd and protect nothing)."""

    def variable(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        if not env.get(name):
            raise ConfigError(
                f"autonomy.forbidden_paths entry {entry!r}: ${name} is not set (or empty)")
        return env[name]

    expanded = _VARIABLE.sub(variable, entry)
    if expanded == "~" or expanded.startswith("~/"):
        home = env.get("HOME") or os.path.expanduser("~")
        expanded = home + expanded[1:]
    expanded = os.path.expanduser(expanded)  # ~user
    if not os.path.isabs(expanded):
        raise ConfigError(
            f"autonomy.forbidden_paths entry {entry!r} is not an absolute path; write it "
            "from / (or ~ or $VAR), e.g. \"/home/me/secrets\" or \"$HOME/.aws\"")
    return os.path.normpath(expanded)


def _whole_if_integral(seconds: float) -> float:
    """3600.0 (from a flag) as 3600: clients expect an integer ``sessionTimeoutSecs``."""
    return int(seconds) if float(seconds).is_integer() else float(seconds)


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
