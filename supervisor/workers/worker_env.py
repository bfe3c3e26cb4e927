"""The environment a worker process starts with: what it needs, and no host secrets.

A worker runs model-driven tools, so whatever is in its environment can be read by
a command it runs (``/proc/$PPID/environ``), not only by the worker. It gets the
variables a shell command may see (:func:`actors.worker.tools.shell.command_environment`),
the interpreter's and zeroclaw's own (``PYTHON*``, ``ZEROCLAW_*``), the user's base
directories (``XDG_*``), proxy and certificate settings for model APIs, and the
variables an agent names (``api_key_env``, ``pass_env``): never the rest of the host's (cloud
keys, tokens) that no agent asked for.

Pure functions; called on the asyncio loop thread when a worker is spawned.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from actors.worker.agents.acp_process import NETWORK_ENV
from actors.worker.tools.shell import command_environment
from supervisor.config.config import AgentConfig

__all__ = ["agent_variables", "worker_environment"]

_KEPT_PREFIXES = ("PYTHON", "ZEROCLAW_", "XDG_")
_NETWORK_VARIABLES = frozenset(NETWORK_ENV)


def agent_variables(agents: Iterable[AgentConfig]) -> frozenset[str]:
    """The host variables agents name: a model agent's ``api_key_env``, and the
    ``pass_env`` list of a hosted ACP agent (e.g. its vendor's API key)."""
    names: list[object] = []
    for agent in agents:
        names.append(agent.raw.get("api_key_env"))
        passed = agent.raw.get("pass_env")
        names.extend(passed if isinstance(passed, list) else ())
    return frozenset(name for name in names if isinstance(name, str) and name)


def worker_environment(host_env: Mapping[str, str], wanted: Iterable[str]) -> dict[str, str]:
    """A worker's environment drawn from ``host_env``: the kept variables plus ``wanted``."""
    wanted = frozenset(wanted)
    environment = command_environment({}, host_env)
    for name, value in host_env.items():
        if name in wanted or name in _NETWORK_VARIABLES or name.startswith(_KEPT_PREFIXES):
            environment[name] = value
    return environment
