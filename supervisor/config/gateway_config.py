"""The ``[gateway]`` and ``[tenants.NAME]`` sections of ``config.toml``.

Parsed once on the main thread with the rest of the settings (:mod:`supervisor.config.config`);
the records are immutable afterwards and safe to read from any thread. Only the
shape of each value is checked here (a malformed one is a configuration error,
like any other key's). Whether a listen address may be used without TLS is judged
when the daemon starts the gateway (:func:`exposure_problem`): a daemon-only
choice must not stop ``zeroclaw acp``, which has no gateway.

```toml
[gateway]
listen = "127.0.0.1:8080"     # or --gateway HOST:PORT; port 0 picks a free one
tls_cert = "/path/cert.pem"   # both or neither; required off loopback ...
tls_key = "/path/key.pem"
allow_plaintext = false       # ... unless this says plain HTTP is wanted there
auth_failures = 10            # failed logins per address within auth_window_secs,
auth_window_secs = 60         # after which it gets 429 until the window passes
auth_ipv6_prefix = 64         # an IPv6 client counts as its /64 network (1..128);
                              # IPv4 (and IPv4-mapped IPv6) as its own address
retired_tenant_ids = ["…"]    # ids of removed tenants (zeroclaw tenant remove adds them)

[tenants.alice]
id = "…"                      # stable id (uuid4 hex, zeroclaw tenant add writes it)
token_sha256 = "…"            # hex SHA-256 of the token (zeroclaw tenant add prints it once)
admin = false                 # sees every session in status, /status and /metrics
max_sessions = 5              # live sessions of this tenant (optional)
workspace_root = "/srv/alice" # session cwds must be under it (optional; default
                              # <data_dir>/tenants/<id>)
sandbox_network = true        # false: its commands get a network namespace of their own
```

A tenant's sessions belong to its ``id``, not its name: a tenant removed and added
again under the same name gets a new id, and none of the old one's sessions. A
tenant written by an earlier release has no ``id``: its id is its name, so its
sessions stay its own. An id in ``gateway.retired_tenant_ids`` is refused (a
tenant hand-written again under a removed name must be given a new id).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from supervisor.config.errors import ConfigError

__all__ = [
    "GatewayConfig",
    "TenantConfig",
    "exposure_problem",
    "gateway_from_document",
    "parse_listen",
    "tenant_caps",
    "tenant_from_section",
    "tenants_from_document",
]

_HEX_SHA256 = re.compile(r"[0-9a-f]{64}")
_TENANT_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
_TENANT_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")


@dataclass(frozen=True, slots=True)
class GatewayConfig:
    """Where and how the gateway listens (``listen`` None: no gateway)."""

    listen: str | None = None
    host: str = "127.0.0.1"
    port: int = 8080
    tls_cert: Path | None = None
    tls_key: Path | None = None
    allow_plaintext: bool = False
    auth_failures: int = 10
    auth_window_secs: float = 60.0
    auth_ipv6_prefix: int = 64
    retired_tenant_ids: frozenset[str] = frozenset()

    @property
    def tls(self) -> bool:
        return self.tls_cert is not None


@dataclass(frozen=True, slots=True)
class TenantConfig:
    """One ``[tenants.NAME]`` section; the token itself is never kept, only its hash.
    ``id`` is what owns sessions (its name when the section has none)."""

    name: str
    token_sha256: str
    id: str
    admin: bool = False
    max_sessions: int | None = None
    workspace_root: Path | None = None
    sandbox_network: bool = True


def tenant_caps(tenants: Mapping[str, TenantConfig]) -> dict[str, int]:
    """The ``max_sessions`` of each tenant that has one, by tenant id (the host's admission
    keeps every tenant under its own cap: :attr:`supervisor.core.live.LiveTable.tenant_caps`)."""
    return {t.id: t.max_sessions for t in tenants.values() if t.max_sessions is not None}


def parse_listen(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:8080`` for IPv6) → ``(host, port)``; ConfigError if malformed."""
    match = re.fullmatch(r"\[([0-9A-Fa-f:.]+)\]:(\d{1,5})|([^:\[\]\s]+):(\d{1,5})", text.strip())
    if match is None:
        raise ConfigError(f"gateway.listen must be HOST:PORT (e.g. 127.0.0.1:8080), got {text!r}")
    host = match.group(1) or match.group(3)
    port = int(match.group(2) or match.group(4))
    if port > 65535:
        raise ConfigError(f"gateway.listen: port {port} is out of range")
    return host, port


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    import ipaddress  # only with a gateway configured: off the way to initialize

    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to anything


def exposure_problem(config: GatewayConfig) -> str | None:
    """Why the gateway must not start as configured (None: it may)."""
    if config.tls or config.allow_plaintext or is_loopback(config.host):
        return None
    return (f"the gateway would listen on {config.host}, which is not a loopback address, "
            "without TLS: set gateway.tls_cert and gateway.tls_key, or set "
            "gateway.allow_plaintext = true if plain HTTP there is really wanted "
            "(tokens then cross the network in clear)")


def gateway_from_document(section: Mapping[str, Any]) -> GatewayConfig:
    listen = section.get("listen")
    if listen is not None and not isinstance(listen, str):
        raise ConfigError("gateway.listen must be a string HOST:PORT")
    host, port = parse_listen(listen) if listen else ("127.0.0.1", 8080)
    cert, key = (_path(section, k) for k in ("tls_cert", "tls_key"))
    if (cert is None) != (key is None):
        raise ConfigError("gateway.tls_cert and gateway.tls_key go together: set both or neither")
    plaintext = section.get("allow_plaintext", False)
    if not isinstance(plaintext, bool):
        raise ConfigError("gateway.allow_plaintext must be true or false")
    failures = section.get("auth_failures", 10)
    window = section.get("auth_window_secs", 60)
    if isinstance(failures, bool) or not isinstance(failures, int) or failures < 1:
        raise ConfigError(f"gateway.auth_failures must be an integer >= 1, got {failures!r}")
    if isinstance(window, bool) or not isinstance(window, int | float) or window <= 0:
        raise ConfigError(f"gateway.auth_window_secs must be a positive number, got {window!r}")
    prefix = section.get("auth_ipv6_prefix", 64)
    if isinstance(prefix, bool) or not isinstance(prefix, int) or not 1 <= prefix <= 128:
        raise ConfigError(f"gateway.auth_ipv6_prefix must be an integer from 1 to 128, "
                          f"got {prefix!r}")
    return GatewayConfig(listen=listen or None, host=host, port=port, tls_cert=cert, tls_key=key,
                         allow_plaintext=plaintext, auth_failures=failures,
                         auth_window_secs=float(window), auth_ipv6_prefix=prefix,
                         retired_tenant_ids=retired_ids(section))


def retired_ids(section: Mapping[str, Any]) -> frozenset[str]:
    """``gateway.retired_tenant_ids``: the ids of removed tenants."""
    retired = section.get("retired_tenant_ids", [])
    if not isinstance(retired, list) or not all(isinstance(i, str) for i in retired):
        raise ConfigError("gateway.retired_tenant_ids must be an array of strings")
    return frozenset(retired)


def tenants_from_document(sections: Any,
                          retired: frozenset[str] = frozenset()) -> dict[str, TenantConfig]:
    """The tenants; ConfigError for a malformed one, two with one id, or a retired id."""
    if sections is None:
        return {}
    if not isinstance(sections, Mapping):
        raise ConfigError("[tenants] must be a table of [tenants.<name>] sections")
    tenants = {name: tenant_from_section(name, section) for name, section in sections.items()}
    seen: dict[str, str] = {}
    for tenant in tenants.values():
        if tenant.id in retired:
            raise ConfigError(f"tenants.{tenant.name}: id {tenant.id!r} belonged to a removed "
                              "tenant (gateway.retired_tenant_ids); give this tenant an id of "
                              "its own (zeroclaw tenant add writes one)")
        if tenant.id in seen:
            raise ConfigError(f"tenants.{tenant.name} and tenants.{seen[tenant.id]} have the "
                              f"same id {tenant.id!r}")
        seen[tenant.id] = tenant.name
    return tenants


def tenant_from_section(name: str, section: Any) -> TenantConfig:
    """One ``[tenants.NAME]`` section (or a shared tenant's row as one); ConfigError
    for a malformed one."""
    if not _TENANT_NAME.fullmatch(name):
        raise ConfigError(f"tenant name {name!r}: use letters, digits, '_', '-' or '.'")
    if not isinstance(section, Mapping):
        raise ConfigError(f"[tenants.{name}] must be a table")
    digest = section.get("token_sha256")
    if not isinstance(digest, str) or not _HEX_SHA256.fullmatch(digest.lower()):
        raise ConfigError(f"tenants.{name}.token_sha256 must be 64 hex digits "
                          "(zeroclaw tenant add writes it)")
    admin = section.get("admin", False)
    if not isinstance(admin, bool):
        raise ConfigError(f"tenants.{name}.admin must be true or false")
    cap = section.get("max_sessions")
    if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or cap < 1):
        raise ConfigError(f"tenants.{name}.max_sessions must be an integer >= 1")
    root = _path(section, "workspace_root", f"tenants.{name}.")
    if root is not None and not root.is_absolute():
        raise ConfigError(f"tenants.{name}.workspace_root must be an absolute path")
    tenant_id = section.get("id", name)
    if not isinstance(tenant_id, str) or not (tenant_id == name or _TENANT_ID.fullmatch(tenant_id)):
        raise ConfigError(f"tenants.{name}.id must be letters, digits, '_' or '-' "
                          "(zeroclaw tenant add writes one)")
    network = section.get("sandbox_network", True)
    if not isinstance(network, bool):
        raise ConfigError(f"tenants.{name}.sandbox_network must be true or false")
    return TenantConfig(name=name, token_sha256=digest.lower(), admin=admin, max_sessions=cap,
                        workspace_root=root, id=tenant_id, sandbox_network=network)


def _path(section: Mapping[str, Any], key: str, prefix: str = "gateway.") -> Path | None:
    value = section.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{prefix}{key} must be a path")
    return Path(value).expanduser()
