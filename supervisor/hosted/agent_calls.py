"""Clients' extension requests (ACP ``_``-prefixed methods) forwarded to a session's
hosted agent.

Runs on the host's asyncio loop thread. An ACP client's ``_name`` request that
names a session (``sessionId``) goes to the worker holding it as an
:class:`ipc.worker_wire.AgentCall` (the session is restored first when it was
evicted), and the agent's answer, or its error, comes back as the request's
answer; the agent sees its own session id. The same rules as a permission
request bound the wait: ``session_timeout_secs``, and -32603 when the worker
exits meanwhile. An agent that takes no extension requests (every provider but
``acp``) answers -32601. A client's extension notification goes on as a
notification (:meth:`AgentCalls.notify`): nothing answers it.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import TYPE_CHECKING, Any

from ipc.errors import InternalError, InvalidParams, error_for_code
from ipc.worker_wire import AgentCall, AgentReply, EncodeError
from supervisor.hosted.relay_host import RelayHost

if TYPE_CHECKING:
    from supervisor.core.routes import Route

__all__ = ["AgentCalls"]


class AgentCalls:
    """The extension requests waiting for a hosted agent's answer (loop thread)."""

    def __init__(self, host: RelayHost) -> None:
        self.host = host
        self._numbers = itertools.count(1)
        self._pending: dict[str, tuple[str, asyncio.Future[AgentReply]]] = {}

    async def call(self, route: Route, method: str, params: dict[str, Any]) -> Any:
        """Forward ``method`` to ``route``'s agent; its result (or its error, raised)."""
        request_id = f"ext-{next(self._numbers)}"
        future: asyncio.Future[AgentReply] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = (route.worker_id, future)
        timeout = self.host.settings.session_timeout_secs
        try:
            try:
                sent = self.host.pool.send(route.worker_id, AgentCall(
                    route.sid, request_id, method, {**params, "sessionId": route.sid}))
            except EncodeError as exc:
                raise InvalidParams(f"{method}: cannot be forwarded: {exc}") from None
            if not sent:
                raise InternalError("session worker exited")
            async with asyncio.timeout(timeout):
                reply = await future
        except TimeoutError:
            raise InternalError(f"{method}: the agent did not answer within "
                                f"{timeout:g}s") from None
        finally:
            self._pending.pop(request_id, None)
        if reply.error is not None:
            code = reply.error.get("code")
            raise error_for_code(code if isinstance(code, int) else -32603,
                                 str(reply.error.get("message")))
        return reply.result

    def notify(self, route: Route, method: str, params: dict[str, Any]) -> None:
        """Pass a client's extension notification on to ``route``'s agent, as a
        notification: nothing answers it, so nothing waits."""
        try:
            sent = self.host.pool.send(route.worker_id, AgentCall(
                route.sid, "", method, {**params, "sessionId": route.sid}, notification=True))
        except EncodeError as exc:
            raise InvalidParams(f"{method}: cannot be forwarded: {exc}") from None
        if not sent:
            raise InternalError("session worker exited")

    def settle(self, reply: AgentReply) -> None:
        """The worker's answer to one of ours (late ones are dropped)."""
        pending = self._pending.get(reply.request_id)
        if pending is not None and not pending[1].done():
            pending[1].set_result(reply)

    def worker_gone(self, worker_id: str) -> None:
        """Fail the requests waiting on a worker that exited."""
        for owner, future in list(self._pending.values()):
            if owner == worker_id and not future.done():
                future.set_exception(InternalError("session worker exited"))
