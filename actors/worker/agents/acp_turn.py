"""One prompt forwarded to a hosted ACP agent (:mod:`actors.worker.agents.acp`), pumped on
the session's actor thread: the agent's updates go on as it sent them (one event
each, :mod:`actors.worker.agents.acp_updates`), its permission requests are decided
by the session's mode or go to the client as the agent made them (its tool call,
its options), a cancel is forwarded and given ``cancel_grace`` seconds before the
turn ends without the agent (the caller then restarts the agent process).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import logging
import queue
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import orjson

from actors.worker.agents.acp_client import CANCELLED_OUTCOME
from actors.worker.agents.acp_process import AgentProcess, SessionLink
from actors.worker.agents.acp_updates import relayed_events
from actors.worker.agents.base import AgentFailure, AgentRefused, TurnContext
from actors.worker.cancel import call_on_cancel
from ipc.errors import bounded_data
from ipc.jsonrpc import ConnectionLost, RemoteError

__all__ = ["AcpTurn"]

log = logging.getLogger("zeroclaw.agent")

#: How often a turn looks at a cancel flag that cannot wake it (a plain Event).
_POLL_SECS = 0.05
#: Put in the session's inbox by the turn's cancel: the turn's wait ends at once.
_CANCEL_WAKE: tuple[str, Any] = ("cancel", None)
#: After a turn's first burst, the agent's updates are gathered this long at most
#: before they go on: a streaming agent costs the host an update per millisecond at
#: most, not one per chunk, and its first chunk is not held back.
GATHER_SECS = 0.001
#: What may queue for a turn's thread while its stream window is used up (the encoded
#: size of the agent's updates) before its agent's output is no longer read.
QUEUED_LIMIT = 8 * 1024 * 1024
#: How long a turn whose agent exited waits for the loop thread to settle its answer.
_ANSWER_AFTER_EXIT_SECS = 1.0
_STOP_REASONS = frozenset({"end_turn", "max_tokens", "max_turn_requests", "refusal", "cancelled"})
_REJECTING = ("reject_once", "reject_always")
_WANTED_OPTIONS = {  # a client's choice by kind (zeroclaw's daemon dialect answers so)
    "allow_once": ("allow_once", "allow_always"),
    "allow_always": ("allow_always", "allow_once"),
    "reject_once": _REJECTING,
    "reject_always": ("reject_always", "reject_once"),
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
        self.ignored_cancel = False  # the cancel grace ran out

    def run(self, prompt: str) -> str | None:
        link = self.link
        self._answer_leftovers()  # from before this turn
        if self.ctx.cancelled.is_set():
            return None  # cancelled before it reached the agent
        link.replayed = False  # what the agent sends now is this turn's
        relay = link.turn = UpdateRelay(self.ctx, link.inbox,
                                        functools.partial(self.process.hold_reading,
                                                          link.agent_session_id))
        try:
            future = self.process.call("session/prompt", {
                "sessionId": link.agent_session_id,
                "prompt": [{"type": "text", "text": prompt}],
            })
            future.add_done_callback(lambda _f: relay.put(("done", None)))
            self._pump(future, relay)
        finally:
            link.turn = None
            relay.close()  # the record is this thread's from now on
            self._answer_leftovers()
        return self._stop_reason(future)

    def _pump(self, future: concurrent.futures.Future[Any], relay: UpdateRelay) -> None:
        """Relay the agent's messages until its answer, its exit, or the cancel grace.
        Event-driven: the turn's cancel puts :data:`_CANCEL_WAKE` in the inbox (the
        agent's exit and answer reach it anyway); a plain Event is polled."""
        unhook = call_on_cancel(self.ctx.cancelled,
                                functools.partial(self.link.inbox.put, _CANCEL_WAKE))
        try:
            self._relay_until_over(future, relay, polled=unhook is None)
        finally:
            if unhook is not None:
                unhook()

    def _relay_until_over(self, future: concurrent.futures.Future[Any], relay: UpdateRelay,
                          polled: bool) -> None:
        """The loop of :meth:`_pump`: the wait is bounded only by the cancel grace once
        a cancel was sent, and by :data:`_POLL_SECS` when the cancel is ``polled``."""
        grace_ends: float | None = None
        while self._agent_may_speak(future):
            if self.ctx.cancelled.is_set() and grace_ends is None:
                self.process.notify("session/cancel", {"sessionId": self.link.agent_session_id})
                grace_ends = time.monotonic() + self.cancel_grace
            timeout = None if grace_ends is None else grace_ends - time.monotonic()
            if timeout is not None and timeout <= 0:
                self.ignored_cancel = True
                future.cancel()
                return
            if polled:
                timeout = _POLL_SECS if timeout is None else min(timeout, _POLL_SECS)
            try:
                first = self.link.inbox.get(timeout=timeout)
            except queue.Empty:
                continue
            messages = [m for m in relay.take(first) if m is not _CANCEL_WAKE]
            if self._handle(messages):
                return
            relay.caught_up()

    def _agent_may_speak(self, future: concurrent.futures.Future[Any]) -> bool:
        """Whether the turn waits on: the agent runs, or what it sent is still queued.
        Once it has exited, its answer may still be on its way: the loop thread marks the
        process exited at the end of its stdout, a few loop steps before it settles an
        answer read just before (or fails it, unanswered); that is waited for (bounded)."""
        if self.process.alive or not self.link.inbox.empty():
            return True
        concurrent.futures.wait([future], timeout=_ANSWER_AFTER_EXIT_SECS)
        return not self.link.inbox.empty()

    def _handle(self, messages: list[tuple[str, Any]]) -> bool:
        """Relay ``messages`` (what the inbox held, oldest first) in order; True once
        the turn is over (its answer came or the agent exited). The updates among
        them go out in order, one event each."""
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
            if kind == "aborted":  # the loop thread could not stream an update
                _cancel_permissions(messages[index + 1:])
                raise AgentFailure(str(payload))
            if kind == "permission":
                params, reply = payload
                reply(self._permission(params))
        self._relay(updates)
        return False

    def _relay(self, updates: list[Any]) -> None:
        for event in relayed_events(updates):
            self.ctx.emit(event)

    def _permission(self, params: Any) -> dict[str, Any]:
        """The agent's permission request, decided by the session's mode or the client.
        The client sees the agent's own request (its tool call, its options) and its
        choice goes back as it is; where zeroclaw answers itself (read-only mode, no
        answer in time, the client gone) it picks the agent's reject option, and a
        cancelled turn's request is answered cancelled, as ACP asks."""
        options = [o for o in params.get("options") or [] if isinstance(o, Mapping)]
        mode = self.mode()
        if mode == "full":
            return _option_of(options, ("allow_once", "allow_always"))
        if mode == "read_only":
            return _option_of(options, _REJECTING)
        call = params.get("toolCall")
        call = call if isinstance(call, Mapping) else {}
        title = str(call.get("title") or "tool call")
        choice = self.ctx.ask_permission(
            str(call.get("toolCallId") or ""), title, title, str(call.get("kind") or "other"),
            call.get("rawInput"),
            request={k: v for k, v in params.items() if k != "sessionId"})
        if choice is None:
            return CANCELLED_OUTCOME if self.ctx.cancelled.is_set() else _option_of(
                options, _REJECTING)
        if any(option.get("optionId") == choice for option in options):
            return _selected(choice)  # the client chose one of the agent's own options
        return _option_of(options, _WANTED_OPTIONS.get(choice.replace("-", "_"), _REJECTING))

    def _answer_leftovers(self) -> None:
        """Permission requests still queued when the turn ended are answered cancelled."""
        _cancel_permissions(_drain(self.link.inbox))

    def _stop_reason(self, future: concurrent.futures.Future[Any]) -> str | None:
        if not future.done() and not self.process.alive:
            future.cancel()
            raise AgentFailure(self.process.failure_text("during the turn"))
        if future.cancelled() and not self.ignored_cancel and not self.ctx.cancelled.is_set():
            # not this turn's cancel: the agent's loop ended under it (the agent was
            # stopped before the end of its output was read)
            raise AgentFailure(self.process.failure_text("during the turn"))
        if future.cancelled() or not future.done():
            return None  # the cancel grace ran out: a cancelled turn
        try:
            result = future.result(0)
        except RemoteError as exc:
            if self.ctx.cancelled.is_set():
                return None
            raise self._refused(exc) from None
        except (ConnectionLost, concurrent.futures.CancelledError, asyncio.CancelledError):
            raise AgentFailure(self.process.failure_text("during the turn")) from None
        reason = result.get("stopReason") if isinstance(result, Mapping) else None
        return reason if reason in _STOP_REASONS else None

    def _refused(self, error: RemoteError) -> AgentRefused:
        """The agent's error for the client as it sent it; the log names the agent."""
        text = self.process.refusal("the prompt", error)
        log.warning("%s", text)
        return AgentRefused(text, _agent_error(error))


def _option_of(options: list[Mapping[str, Any]], kinds: tuple[str, ...]) -> dict[str, Any]:
    """The answer selecting the first of ``options`` of the first of ``kinds`` that has
    one; cancelled when none has."""
    for kind in kinds:
        for option in options:
            if option.get("kind") == kind and isinstance(option.get("optionId"), str):
                return _selected(option["optionId"])
    return CANCELLED_OUTCOME


def _selected(option_id: str) -> dict[str, Any]:
    return {"outcome": {"outcome": "selected", "optionId": option_id}}


def _agent_error(error: RemoteError) -> dict[str, Any]:
    """The JSON-RPC error object the agent sent, its ``data`` bounded for the client."""
    wire: dict[str, Any] = {"code": error.code, "message": error.message}
    if error.data is not None:
        wire["data"] = bounded_data(error.data)
    return wire


class UpdateRelay:
    """A turn's updates as events, relayed on the agent process's loop thread (no hop
    through the session's thread): the first burst of updates that arrived together
    goes out once the loop has read it (at once when handed over as the run of one
    read, :meth:`updates`), later ones gathered for :data:`GATHER_SECS` (one event
    each still, sent on together); a message for the turn's thread (the answer, a
    permission request) takes what was gathered along first. While the stream window
    has room; once a burst used it up, updates queue in the session's inbox for the
    turn's thread, which waits for credit, until that thread has caught up
    (:meth:`caught_up`). The window is thus overrun by one burst at most. While
    more than :data:`QUEUED_LIMIT` is queued, the agent's output is not read (it
    waits, and with it its other sessions): a lagging client never makes the
    worker hold more than that (and what its turn's thread took) for a turn.

    Thread-safe: one lock orders the loop thread's relaying, the queueing, and the
    turn's end (:meth:`close`), after which the turn's record is its thread's alone.
    """

    def __init__(self, ctx: TurnContext, inbox: queue.SimpleQueue[tuple[str, Any]],
                 hold: Callable[[bool], None] | None = None) -> None:
        """``hold(True)``: the agent's output is not to be read until ``hold(False)``
        (any thread)."""
        self._ctx = ctx
        self._inbox = inbox
        self._lock = threading.Lock()
        self._burst: list[Any] = []  # updates read but not relayed yet
        self._queued = False  # the turn's thread relays (the window was used up)
        self._open = True
        self._gather = 0.0  # the first burst goes at once
        self._hold = hold
        self._queued_size = 0  # the encoded size of the updates queued for the thread
        self._holding = False  # the agent's output is not read meanwhile

    def update(self, update: Any) -> None:
        """One update of the agent (the loop thread): relayed with its burst."""
        with self._lock:
            if not self._open:
                return
            if self._queued:
                self._queue([update])
                return
            self._burst.append(update)
            if len(self._burst) == 1:  # at least once the loop read what is there
                asyncio.get_running_loop().call_later(self._gather, self.flush)
                self._gather = GATHER_SECS

    def updates(self, updates: list[Any]) -> bool:
        """The agent's updates of one read (the loop thread): the turn's first ones
        relayed at once, later ones with their burst. Whether the turn streams on
        (these were not its first): its agent's output may then be read a little
        later, in longer reads."""
        with self._lock:
            if not self._open:
                return False
            if self._queued:
                self._queue(updates)
                return True
            waiting = bool(self._burst)  # a flush is already due
            self._burst += updates
            if not self._gather:
                self._gather = GATHER_SECS
                self._flush()
                return False
            if not waiting:
                asyncio.get_running_loop().call_later(self._gather, self.flush)
            return True

    def flush(self) -> None:
        """Relay the burst (the loop thread), or queue it behind what is queued."""
        with self._lock:
            self._flush()

    def put(self, message: tuple[str, Any]) -> None:
        """``message`` for the turn's thread, behind the updates before it (any thread);
        the updates after it queue behind it. A permission request that comes after
        the turn is answered cancelled."""
        with self._lock:
            if not self._open:
                _cancel_permissions([message])
                return
            self._flush()
            self._queued = self._queued or message[0] == "permission"
            self._inbox.put(message)

    def caught_up(self) -> None:
        """The turn's thread relayed what was queued (and the window has room again):
        the loop thread relays from now on, unless more was queued meanwhile."""
        with self._lock:
            if self._queued and self._inbox.empty():
                self._queued = False

    def take(self, first: tuple[str, Any]) -> list[tuple[str, Any]]:
        """``first`` and what else the inbox holds, oldest first (the turn's thread,
        which got ``first`` from it): the agent's output is read again if it was
        held for what queued."""
        with self._lock:
            messages = [first, *_drain(self._inbox)]
            self._queued_size = 0
            self._hold_reading(False)
        return messages

    def close(self) -> None:
        """The turn ended (its thread): later updates are dropped."""
        with self._lock:
            self._open = False
            self._burst = []
            self._hold_reading(False)

    def _queue(self, updates: list[Any]) -> None:
        """``updates`` for the turn's thread; once more than :data:`QUEUED_LIMIT` waits
        for it, the agent's output is no longer read until that thread takes them."""
        for update in updates:
            self._inbox.put(("update", update))
            self._queued_size += len(orjson.dumps(update))
        if self._queued_size > QUEUED_LIMIT:
            self._hold_reading(True)

    def _hold_reading(self, held: bool) -> None:
        if held != self._holding and self._hold is not None:
            self._holding = held
            self._hold(held)

    def _flush(self) -> None:
        burst, self._burst = self._burst, []
        if not burst or not self._open:
            return
        if self._queued:
            self._queue(burst)
            return
        try:
            room = self._ctx.emit_all_nowait(relayed_events(burst))
        except AgentFailure as exc:  # it cannot be streamed: the turn fails on it
            self._open = False
            self._inbox.put(("aborted", str(exc)))
            return
        self._queued = not room


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
