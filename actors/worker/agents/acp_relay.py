"""A hosted ACP agent's requests for its client (``fs/*``, ``terminal/*``): relayed to
the client that holds the session, or served by zeroclaw itself.

One path for every method: the request goes to the host as a
:class:`ipc.worker_wire.ClientCall` (with zeroclaw's session id), and the host
decides, when it arrives, by the connection that holds the session then: one that
advertised the capability gets the request and its answer (or a clear error: it
went away, it timed out) comes back; otherwise the reply says "not relayed" and
the request is served here, by the ``local`` coroutine the caller gave
(zeroclaw's file tools under the session's path policy, zeroclaw's own
terminals). Requests about a terminal zeroclaw runs itself never leave the worker.

Runs on the agent process's loop thread (:mod:`actors.worker.agents.acp_process`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from actors.worker.agents.acp_process import SessionLink
from ipc.errors import InternalError, InvalidParams, error_for_code
from ipc.worker_wire import ClientReply, EncodeError

__all__ = ["RELAY_GRACE_SECS", "relay_or_serve"]

#: How much longer than the host's timeout the worker waits for the host's reply.
RELAY_GRACE_SECS = 5.0


async def relay_or_serve(link: SessionLink, method: str, params: Mapping[str, Any],
                         local: Callable[[], Awaitable[Any]]) -> Any:
    """The client's answer to ``method`` when the session's holder serves it, else
    ``local()``'s. Raises an :class:`ipc.errors.RpcError` for the agent's error answer."""
    reply = await _ask_client(link, method, params)
    if reply is None:
        return await local()
    if reply.error is not None:
        code, message = reply.error.get("code"), reply.error.get("message")
        raise error_for_code(code if isinstance(code, int) else -32603, str(message))
    return reply.result


async def _ask_client(link: SessionLink, method: str,
                      params: Mapping[str, Any]) -> ClientReply | None:
    """The host's relayed reply, or None when the request is to be served here."""
    channel = link.client
    if channel is None or not link.sid:
        return None
    try:
        future = channel.call(method, {**params, "sessionId": link.sid})
    except EncodeError as exc:
        raise InvalidParams(f"{method}: the request cannot be relayed: {exc}") from None
    waited = asyncio.wrap_future(future)
    timeout = channel.timeout + RELAY_GRACE_SECS
    done, _ = await asyncio.wait({waited}, timeout=timeout)
    if not done:  # the host answers every call; this is the backstop
        raise InternalError(f"{method}: no answer about the client within {timeout:g}s")
    reply = waited.result()
    if not isinstance(reply, ClientReply):
        raise InternalError(f"{method}: withdrawn (the turn was cancelled or ended)")
    return reply if reply.relayed else None
