"""Where a hosted ACP agent process may write, and the command line that confines it
there with the shell's backend (:mod:`actors.worker.tools.sandbox`).

A process serves several sessions, so its writable roots are what all of them share:

- a gateway tenant's process (always confined): the tenant's root (its
  ``workspace_root``, else ``<data_dir>/tenants/<tenant id>``; the host sends it in
  the session's meta), a state dir of its own as its HOME
  (``<data_dir>/agent-homes/<tenant id>/<alias>``), and a private tmp;
- the owner's process with ``[agents.NAME] sandbox = "auto"``: the user's HOME, the
  agent's workspace and the session's cwd when it is elsewhere (then its own process),
  and a private tmp. ``sandbox = "off"`` (the default for the owner) runs it unconfined.

Masked in both: the session policy's protected paths (zeroclaw's config dir with the
config file, tenants' token hashes and agents' env; its data dir with store, sockets and
logs; the sockets, TLS key) and its forbidden paths; a root the policy sanctions inside
a protected directory stays reachable. The network stays open, unless the session says
``sandbox_network = false`` (:attr:`PathPolicy.network`): then the confined process gets
a network namespace with only loopback (bubblewrap only; refused under Landlock).
Everything the agent starts (its MCP servers too) inherits the confinement.

Without a backend a tenant's process is refused, whatever ``[agents.NAME]
allow_unconfined_tenants`` says (a tenant never gets unconfined file access); the
owner's runs unconfined with a warning. Runs on a session actor's thread.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from actors.worker.agents.base import AgentFailure, SessionSetup
from actors.worker.protected import path_component
from actors.worker.sandbox import AGENT_STATE_VARIABLE, SandboxInfo, worker_sandbox_settings
from actors.worker.tools.paths import PathDenied, PathPolicy, canonical
from actors.worker.tools.sandbox import Confined, confined_argv

__all__ = [
    "SANDBOX_SETTINGS",
    "TENANT_ROOT_META_KEY",
    "AgentJail",
    "jail_for",
    "setting_problem",
    "tenant_may_use",
    "unconfined_refusal",
]

log = logging.getLogger("zeroclaw.agent")

#: The values of ``[agents.NAME] sandbox`` (for the owner's processes; tenants' are confined).
SANDBOX_SETTINGS = ("auto", "off")
#: The key of a session's open ``meta`` that carries its tenant's ``workspace_root``.
TENANT_ROOT_META_KEY = "tenantWorkspaceRoot"


@dataclass(frozen=True, slots=True)
class AgentJail:
    """How one agent process runs: ``backend`` (``none``: unconfined), ``policy`` (its
    cwd, writable roots, forbidden and protected paths), and the HOME it gets (None:
    the user's)."""

    backend: str
    info: SandboxInfo
    policy: PathPolicy
    home: Path | None = None

    @property
    def key(self) -> str:
        """What tells processes apart besides alias and tenant: their writable roots."""
        if self.backend == "none":
            return ""
        offline = "" if self.policy.network else "|offline"
        return "|" + os.pathsep.join(str(root) for root in self.policy.roots) + offline

    def command(self, argv: list[str], private_tmp: Path) -> Confined:
        """``argv`` confined (unchanged when unconfined); ``private_tmp`` the caller's."""
        if self.backend == "none":
            return Confined(list(argv))
        try:
            return confined_argv(self.info, self.policy, argv, private_tmp)
        except PathDenied as exc:
            raise AgentFailure(f"agent process refused: {exc}") from None


def setting_problem(config: Mapping[str, Any]) -> str | None:
    """What is wrong with the agent's ``sandbox`` and ``allow_unconfined_tenants``, or None."""
    if config.get("sandbox", "off") not in SANDBOX_SETTINGS:
        return f"sandbox must be one of {', '.join(SANDBOX_SETTINGS)}"
    if not isinstance(config.get("allow_unconfined_tenants", False), bool):
        return "allow_unconfined_tenants must be true or false"
    return None


def jail_for(config: Mapping[str, Any], setup: SessionSetup,
             env: Mapping[str, str] | None = None) -> AgentJail:
    """The confinement of the process that serves ``setup``'s session; AgentFailure for a
    tenant's session when no backend confines it here (and that is not allowed)."""
    env = os.environ if env is None else env
    info, _ = worker_sandbox_settings(env)
    alias = str(config.get("alias", "acp"))
    tenant = setup.meta.get("tenant")
    if isinstance(tenant, str) and tenant:
        return _tenant_jail(config, setup, info, tenant, env)
    workspace = canonical(str(config.get("workspace") or os.getcwd()))
    home = env.get("HOME")
    roots = [canonical(home)] if home and os.path.isabs(home) else []
    roots.append(workspace)
    cwd = setup.paths.cwd
    if not any(cwd.is_relative_to(root) for root in roots):
        roots.append(cwd)
    policy = setup.paths.with_roots(workspace, roots)
    if config.get("sandbox", "off") == "off":
        return AgentJail("none", info, policy)
    if not info.confines:
        log.warning("agent %s runs unconfined: no sandbox here (%s)", alias, info.reason)
        return AgentJail("none", info, policy)
    return _confined_jail(info, policy)


def _confined_jail(info: SandboxInfo, policy: PathPolicy, home: Path | None = None) -> AgentJail:
    """The jail of ``info``'s backend; AgentFailure when it cannot take the network away."""
    if not policy.network and info.backend != "bwrap":
        raise AgentFailure(f"sandbox_network = false needs the bubblewrap sandbox; agent "
                           f"processes run under {info.backend} here, which cannot take "
                           "the network away")
    return AgentJail(info.backend, info, policy, home)


def _tenant_jail(config: Mapping[str, Any], setup: SessionSetup, info: SandboxInfo,
                 tenant: str, env: Mapping[str, str]) -> AgentJail:
    alias = str(config.get("alias", "acp"))
    root_text = setup.meta.get(TENANT_ROOT_META_KEY)
    if not isinstance(root_text, str) or not os.path.isabs(root_text):
        raise AgentFailure(f"agent {alias}: the host sent no root for the tenant's session")
    root = canonical(root_text)
    state_dir = env.get(AGENT_STATE_VARIABLE) or ""
    if not os.path.isabs(state_dir):
        raise AgentFailure(f"agent {alias}: no state dir for tenants' agent processes")
    home = Path(state_dir, path_component(tenant), path_component(alias))
    home.mkdir(mode=0o700, parents=True, exist_ok=True)
    policy = setup.paths.with_roots(root, (root, canonical(str(home))))
    if info.confines:
        return _confined_jail(info, policy, home)
    raise AgentFailure(unconfined_refusal(alias, info.reason))


def unconfined_refusal(alias: str, reason: str) -> str:
    """Why a tenant's session cannot use agent ``alias`` here (no backend: ``reason``)."""
    return (f"agent {alias} cannot serve a gateway tenant here: no sandbox confines its "
            f"process ({reason or 'none available'}); install bubblewrap or use a kernel "
            "with Landlock (a tenant's agent never runs unconfined)")


def tenant_may_use(config: Mapping[str, Any], info: SandboxInfo) -> bool:
    """Whether a tenant's session may use this agent config with backend ``info``
    (``allow_unconfined_tenants`` no longer counts: a tenant is always confined)."""
    return config.get("provider") != "acp" or info.confines
