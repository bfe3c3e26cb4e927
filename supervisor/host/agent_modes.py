"""A hosted ACP agent's own session modes (``provider = "acp"``), when it offers them.

Runs on the host's asyncio loop thread. The worker says when a hosted agent's
session is open, with the agent's ``modes`` from its ``session/new`` (or
``load``/``resume``) answer (:class:`ipc.worker_wire.AgentOpened`, kept on the
session's :class:`supervisor.core.routes.Route`). ``session/new``, ``load`` and
``resume`` then answer the agent's modes in place of zeroclaw's autonomy levels
(they wait for the agent's session, as long as its start may take), and
``session/set_mode`` with one of the agent's mode ids is forwarded to the agent
as its own ``session/set_mode`` (:mod:`supervisor.hosted.agent_calls`); an autonomy
level still sets zeroclaw's autonomy. A stored session that is not live (it was
evicted) is reopened for a mode that is not an autonomy level, as a prompt reopens
it, so the agent's own modes work on it too (:func:`may_be_agent_mode`). The
agent's own ``current_mode_update`` (it switched modes itself) keeps the host's
view current (the worker sends a new ``AgentOpened``). An agent that offers no
modes, or any other provider, keeps zeroclaw's autonomy levels as the session's
modes.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING, Any

from ipc import acp_handshake
from supervisor.config.config import AUTONOMY_LEVELS

if TYPE_CHECKING:
    from supervisor.core.routes import Route
    from supervisor.host.sessions import Sessions

__all__ = ["may_be_agent_mode", "session_modes", "set_agent_mode"]

_DEFAULT_START_TIMEOUT = 30.0
_OPEN_STEPS = 2  # the agent's initialize, then its session/new (or load, resume)


async def session_modes(sessions: Sessions, route: Route) -> dict[str, Any]:
    """The ``modes`` of a session answer: the hosted agent's own when it offers them,
    else zeroclaw's autonomy levels."""
    agent = sessions.settings.agents.get(route.agent_alias)
    if agent is not None and agent.provider == "acp" and not route.agent_opened.is_set():
        start = agent.raw.get("agent_start_timeout_secs", _DEFAULT_START_TIMEOUT)
        timeout = float(start) * _OPEN_STEPS + 1.0
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await route.agent_opened.wait()
    if route.agent_modes is not None:
        return route.agent_modes
    return acp_handshake.modes_state(route.mode)


def may_be_agent_mode(sessions: Sessions, sid: str, mode_id: str) -> bool:
    """Whether ``mode_id`` may be one of the own modes of stored session ``sid``'s agent:
    not an autonomy level, and the session runs on an ``acp`` agent."""
    if mode_id in AUTONOMY_LEVELS:
        return False
    info = sessions.host.reader.get_session(sid)
    if info is None or info.closed_at is not None:
        return False
    agent, _ = sessions.agent_of_stored(info)
    return agent.provider == "acp"


async def set_agent_mode(sessions: Sessions, route: Route, mode_id: str) -> bool:
    """Switch the hosted agent to its own mode ``mode_id``; False when that is not one
    of the agent's modes. The client hears of it as it would without zeroclaw: by the
    agent's own ``current_mode_update``, if it sends one (zeroclaw adds none)."""
    if mode_id not in AUTONOMY_LEVELS:
        await session_modes(sessions, route)  # the agent's session (and modes) is there
    modes = route.agent_modes
    if modes is None or mode_id not in {mode.get("id") for mode in modes["availableModes"]}:
        return False
    await sessions.host.agent_calls.call(route, "session/set_mode", {"modeId": mode_id})
    modes["currentModeId"] = mode_id
    return True
