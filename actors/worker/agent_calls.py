"""A client's request for a session's agent itself (an extension method ``_name``, the
agent's own ``session/set_mode``), inside a worker.

The IO thread hands an :class:`ipc.worker_wire.AgentCall` to the session's agent
(:meth:`actors.worker.agents.base.Agent.forward`, which does not block) and the
agent's answer goes back as an :class:`ipc.worker_wire.AgentReply` from whatever
thread settles it (the agent process's loop thread), through the worker's outbox.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable
from typing import Any

from actors.worker.agents.base import Agent, AgentFailure
from ipc.errors import InternalError, MethodNotFound, RpcError
from ipc.jsonrpc import ConnectionLost
from ipc.worker_wire import AgentCall, AgentReply, EncodeError, WorkerMessage

__all__ = ["forward_agent_call"]


def forward_agent_call(call: AgentCall, agent: Agent | None,
                       put: Callable[[WorkerMessage], Any]) -> None:
    """Start ``call`` on ``agent`` (None: the session is not open here); ``put`` gets
    the reply (IO thread; the reply may come from another thread later). A
    notification goes on as one; nothing answers it."""
    if call.notification:
        if agent is not None:
            agent.notify(call.method, call.params)
        return
    future = agent.forward(call.method, call.params) if agent is not None else None
    if future is None:
        missing = MethodNotFound(f"Method not found: {call.method}")
        put(AgentReply(call.sid, call.request_id, error=missing.to_error()))
        return
    future.add_done_callback(lambda done: _reply(call, done, put))


def _reply(call: AgentCall, done: concurrent.futures.Future[Any],
           put: Callable[[WorkerMessage], Any]) -> None:
    error = done.exception()
    if isinstance(error, RpcError):
        reply = AgentReply(call.sid, call.request_id, error=error.to_error())
    elif error is not None:
        reason = str(error) if isinstance(error, AgentFailure | ConnectionLost) else (
            type(error).__name__)
        reply = AgentReply(call.sid, call.request_id,
                           error=InternalError(f"{call.method}: {reason}").to_error())
    else:
        reply = AgentReply(call.sid, call.request_id, result=done.result())
    try:
        put(reply)
    except EncodeError as exc:
        failed = InternalError(f"{call.method}: the agent's answer cannot be passed on: {exc}")
        put(AgentReply(call.sid, call.request_id, error=failed.to_error()))
