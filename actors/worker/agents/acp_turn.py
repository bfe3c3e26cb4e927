"""One prompt forwarded to a hosted ACP agent (:mod:`actors.worker.agents.acp`), pumped on
the session's actor thread: the agent's updates become zeroclaw events, its
permission requests are decided by the session's mode or the client, a cancel is
forwarded and given ``cancel_grace`` seconds before the turn ends without the
agent (the caller then restarts the agent process).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import queue
import time
from collections.abc import Callable, Mapping
from typing import Any

from actors.worker.agents.acp_client import CANCELLED_OUTCOME
from actors.worker.agents.acp_process import AgentProcess, SessionLink
from actors.worker.agents.acp_updates import ToolNames, events_from_updates, merged_chunks
from actors.worker.agents.base import AgentFailure, TurnContext
from ipc.jsonrpc import ConnectionLost, RemoteError

__all__ = ["AcpTurn"]

_POLL_SECS = 0.05
_STOP_REASONS = frozenset({"end_turn", "max_tokens", "max_turn_requests", "refusal", "cancelled"})
_WANTED_OPTIONS = {
    "allow_once": ("allow_once",),
    "allow_always": ("allow_always", "allow_once"),
    "reject_once": ("reject_once", "reject_always"),
}


class AcpTurn:
    """One prompt forwarded to the agent, pumped on the session's actor thread."""

    def __init__(self, process: AgentProcess, link: SessionLink, ctx: TurnContext,
                 mode: Callable[[], str], cancel_grace: float) -> None:
        self.process = process
        self.link = link
        self.ctx = ctx
        self.mode = mode
        self.cancel_grace = cancel_grace
        self.tools = ToolNames()
        self.ignored_cancel = False  # the cancel grace ran out

    def run(self, prompt: str) -> str | None:
        link = self.link
        self._answer_leftovers()  # from before this turn
        if self.ctx.cancelled.is_set():
            return None  # cancelled before it reached the agent
        link.turn_open.set()
        try:
            future = self.process.call("session/prompt", {
                "sessionId": link.agent_session_id,
                "prompt": [{"type": "text", "text": prompt}],
            })
            future.add_done_callback(lambda _f: link.inbox.put(("done", None)))
            self._pump(future)
        finally:
            link.turn_open.clear()
            self._answer_leftovers()
        return self._stop_reason(future)

    def _pump(self, future: concurrent.futures.Future[Any]) -> None:
        """Relay the agent's messages until its answer, its exit, or the cancel grace."""
        cancel_sent: float | None = None
        while self.process.alive or not self.link.inbox.empty():
            if self.ctx.cancelled.is_set() and cancel_sent is None:
                self.process.notify("session/cancel", {"sessionId": self.link.agent_session_id})
                cancel_sent = time.monotonic()
            if cancel_sent is not None and time.monotonic() - cancel_sent > self.cancel_grace:
                self.ignored_cancel = True
                future.cancel()
                return
            try:
                first = self.link.inbox.get(timeout=_POLL_SECS)
            except queue.Empty:
                continue
            if self._handle([first, *_drain(self.link.inbox)]):
                return

    def _handle(self, messages: list[tuple[str, Any]]) -> bool:
        """Relay ``messages`` (what the inbox held, oldest first) in order; True once
        the turn is over (its answer came or the agent exited). The updates among
        them go out as one run of events, their consecutive chunks merged."""
        updates: list[Any] = []
        for index, (kind, payload) in enumerate(messages):
            if kind == "update":
                updates.append(payload)
                continue
            self._relay(updates)
            updates = []
            if kind in ("done", "exited"):
                _cancel_permissions(messages[index + 1:])  # what came after the answer
                return True
            if kind == "permission":
                params, reply = payload
                reply(self._permission(params))
        self._relay(updates)
        return False

    def _relay(self, updates: list[Any]) -> None:
        """The events of ``updates``, consecutive chunks of one kind as one event."""
        if updates:
            for event in merged_chunks(events_from_updates(updates, self.tools)):
                self.ctx.emit(event)

    def _permission(self, params: Any) -> dict[str, Any]:
        """The agent's permission request, decided by the session's mode or the client."""
        options = [o for o in params.get("options") or [] if isinstance(o, Mapping)]
        mode = self.mode()
        if mode == "full":
            wanted: tuple[str, ...] = ("allow_once", "allow_always")
        elif mode == "read_only":
            wanted = ("reject_once", "reject_always")
        else:
            call = params.get("toolCall")
            call = call if isinstance(call, Mapping) else {}
            title = str(call.get("title") or "tool call")
            choice = self.ctx.ask_permission(str(call.get("toolCallId") or ""), title, title,
                                             str(call.get("kind") or "other"),
                                             call.get("rawInput"))
            wanted = _WANTED_OPTIONS.get((choice or "").replace("-", "_"), ())
        for kind in wanted:
            for option in options:
                if option.get("kind") == kind and isinstance(option.get("optionId"), str):
                    return {"outcome": {"outcome": "selected", "optionId": option["optionId"]}}
        return CANCELLED_OUTCOME

    def _answer_leftovers(self) -> None:
        """Permission requests still queued when the turn ended are answered cancelled."""
        _cancel_permissions(_drain(self.link.inbox))

    def _stop_reason(self, future: concurrent.futures.Future[Any]) -> str | None:
        if not future.done() and not self.process.alive:
            future.cancel()
            raise AgentFailure(self.process.failure_text("during the turn"))
        if future.cancelled() or not future.done():
            return None  # the cancel grace ran out: a cancelled turn
        try:
            result = future.result(0)
        except RemoteError as exc:
            if self.ctx.cancelled.is_set():
                return None
            raise AgentFailure(self.process.refusal("the prompt", exc)) from None
        except (ConnectionLost, concurrent.futures.CancelledError, asyncio.CancelledError):
            raise AgentFailure(self.process.failure_text("during the turn")) from None
        reason = result.get("stopReason") if isinstance(result, Mapping) else None
        return reason if reason in _STOP_REASONS else None


def _cancel_permissions(messages: list[tuple[str, Any]]) -> None:
    """Answer the permission requests among ``messages`` cancelled (no turn takes them)."""
    for kind, payload in messages:
        if kind == "permission":
            payload[1](CANCELLED_OUTCOME)


def _drain(inbox: queue.SimpleQueue[tuple[str, Any]]) -> list[tuple[str, Any]]:
    items = []
    while True:
        try:
            items.append(inbox.get_nowait())
        except queue.Empty:
            return items
