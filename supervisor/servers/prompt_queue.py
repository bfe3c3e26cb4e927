"""Per-session prompt queues of the daemon dialect (SPEC §4: depth 32, full → -32002).

Runs on the asyncio loop thread only. A ``session/prompt`` on ``daemon.sock`` takes
a :class:`Ticket` for its session (synchronously, before its handler first awaits,
so tickets follow the order in which the prompts arrived), waits until the ticket
is at the head of its line, runs its turn, and leaves the line, which lets the
next ticket go. One ticket runs per session; at most ``depth`` more wait.

Cancelling a turn does not touch the line: the tickets behind it still run.
Dropping (a client that went away, a closed session, a stopping daemon) fails
the matching waiting tickets with an error; a ticket that already runs is not
affected (its turn is cancelled by other means).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

from ipc.errors import RpcError, SessionBusy

__all__ = ["QUEUE_DEPTH", "PromptQueues", "Ticket"]

QUEUE_DEPTH: Final = 32


@dataclass(eq=False, slots=True)
class Ticket:
    """One prompt's place in its session's line; ``ready`` resolves at the head."""

    sid: str
    owner: object
    ready: asyncio.Future[None] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future())

    def __post_init__(self) -> None:
        self.ready.add_done_callback(_retrieve)  # a dropped ticket's owner may be gone


@dataclass(slots=True)
class _Line:
    head: Ticket | None = None
    waiting: deque[Ticket] = field(default_factory=deque)


class PromptQueues:
    """Every session's line of prompts (only sessions with a ticket have a line)."""

    def __init__(self, depth: int = QUEUE_DEPTH) -> None:
        self.depth = depth
        self._lines: dict[str, _Line] = {}

    def waiting(self, sid: str) -> int:
        """How many prompts of ``sid`` wait behind the running one."""
        line = self._lines.get(sid)
        return len(line.waiting) if line is not None else 0

    def enter(self, sid: str, owner: object) -> Ticket:
        """A ticket for ``sid`` (no await); -32002 when ``depth`` prompts already wait."""
        line = self._lines.setdefault(sid, _Line())
        ticket = Ticket(sid, owner)
        if line.head is None and not line.waiting:
            line.head = ticket
            ticket.ready.set_result(None)
        elif len(line.waiting) >= self.depth:
            raise SessionBusy(
                f"Session busy: {len(line.waiting)} prompts already queued for {sid}")
        else:
            line.waiting.append(ticket)
        return ticket

    def leave(self, ticket: Ticket) -> None:
        """The ticket's prompt is over (answered, failed or withdrawn): let the next go."""
        line = self._lines.get(ticket.sid)
        if line is None:
            return
        if line.head is ticket:
            line.head = None
            self._advance(line)
        elif ticket in line.waiting:
            line.waiting.remove(ticket)
        if line.head is None and not line.waiting:
            del self._lines[ticket.sid]

    def drop(self, error: RpcError, *, sid: str | None = None,
             owner: object | None = None) -> int:
        """Fail the waiting tickets of ``sid`` and/or ``owner`` (all when both are None)."""
        def matches(ticket: Ticket) -> bool:
            return (sid is None or ticket.sid == sid) and (owner is None or ticket.owner is owner)

        dropped = 0
        for key in [sid] if sid is not None else list(self._lines):
            line = self._lines.get(key)
            if line is None:
                continue
            dropped += _fail(line, matches, error)
            if line.head is None and not line.waiting:
                del self._lines[key]
        return dropped

    def _advance(self, line: _Line) -> None:
        while line.waiting:
            ticket = line.waiting.popleft()
            if not ticket.ready.done():  # a withdrawn waiter is skipped
                line.head = ticket
                ticket.ready.set_result(None)
                return


def _fail(line: _Line, matches: Callable[[Ticket], bool], error: RpcError) -> int:
    doomed = [t for t in line.waiting if matches(t)]
    for ticket in doomed:
        line.waiting.remove(ticket)
        if not ticket.ready.done():
            ticket.ready.set_exception(error)
    return len(doomed)


def _retrieve(future: asyncio.Future[None]) -> None:
    if not future.cancelled():
        future.exception()
