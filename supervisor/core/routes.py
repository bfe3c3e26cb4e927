"""What the loop needs to move one live session's frames: which worker hosts it,
who is watching it, and the turn it is running. Owned by the asyncio loop thread only.

A session's entry in :class:`supervisor.core.live.LiveTable` holds its route (once it is
open on a worker) and its running turn; the table decides their states.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import InitVar, dataclass, field
from typing import TYPE_CHECKING, Any

from ipc.events import TurnRecord
from storage.prepared_writes import title_of
from supervisor.core.peer import Peer

if TYPE_CHECKING:
    from supervisor.core.pacing import TurnStream

__all__ = ["Route", "RunningTurn"]


#: How many of a hosted agent's updates a session keeps before its id is answered.
EARLY_UPDATES = 64


@dataclass(slots=True)
class Route:
    """A live session as the loop sees it.

    ``status`` is its entry in the ``status`` answer, kept up to date as its turns
    start and end (``turns``: the completed or cancelled turns in the store;
    ``usage.totalTokens``: the store's token count of the session; ``title``: the
    store's title, the first line of its first kept prompt, None until then), so
    answering ``status`` copies no session state; only ``clients`` is filled in
    then, from the ownership table. Each change ends in :meth:`touch`, which tells
    ``on_status_change``.
    """

    sid: str
    worker_id: str
    peer: Peer
    agent_alias: str
    workspace_dir: str
    cwd: str
    mode: str
    turns: InitVar[int] = 0
    tokens: InitVar[int] = 0
    fallback_from: str | None = None  # its stored agent, disabled or removed since
    tenant: str | None = None  # the gateway tenant it belongs to (None: the host's owner)
    title: InitVar[str | None] = None
    status: dict[str, Any] = field(init=False)
    #: A hosted agent's own modes, once its session is open (:mod:`supervisor.host.agent_modes`).
    agent_modes: dict[str, Any] | None = None
    agent_opened: asyncio.Event = field(default_factory=asyncio.Event)
    #: Whether a client was answered with this session's id (``session/new``, ``load``);
    #: until then a hosted agent's updates between turns wait in ``early_updates``.
    answered: bool = True
    #: The session it was started for (a reset key's old session), or None.
    parent: str | None = None
    early_updates: list[dict[str, Any]] = field(default_factory=list)
    #: Told the session id whenever ``status`` changes (:mod:`supervisor.ops.status_book`).
    on_status_change: Callable[[str], None] | None = field(default=None, compare=False)

    def __post_init__(self, turns: int, tokens: int, title: str | None) -> None:
        self.status = {"sessionId": self.sid, "agentAlias": self.agent_alias, "state": "idle",
                       "clients": 0, "lastActivity": time.time(), "turns": turns,
                       "usage": {"totalTokens": tokens}, "cwd": self.cwd, "title": title}

    @property
    def agent_fallback(self) -> dict[str, str] | None:
        """``{from, to}`` while the session runs on another agent than its own."""
        if self.fallback_from is None:
            return None
        return {"from": self.fallback_from, "to": self.agent_alias}

    def holder_offering(self, method: str) -> Peer | None:
        """The connection that holds the session now, when it offers ``method``."""
        return self.peer if self.peer.offers(method) else None

    def hold_early(self, params: dict[str, Any]) -> bool:
        """Keep a hosted agent's update between turns until the session's id is given to
        a client (bounded); False once it was: it goes out now."""
        if self.answered:
            return False
        if len(self.early_updates) < EARLY_UPDATES:
            self.early_updates.append(params)
        return True

    def touch(self) -> None:
        """Every change of ``status`` ends here."""
        self.status["lastActivity"] = time.time()
        if self.on_status_change is not None:
            self.on_status_change(self.sid)

    def turn_started(self) -> None:
        self.status["state"] = "busy"
        self.touch()

    def turn_ended(self, turns: int | None, tokens: int = 0,
                   record: TurnRecord | None = None) -> None:
        """Idle again; ``turns``: the store's count after it, None if it was not kept;
        ``tokens``: what the kept turn added to the session's token count; ``record``:
        the kept turn, which titles an untitled session as the store does."""
        status = self.status
        status["state"] = "idle"
        if turns is not None:
            status["turns"] = turns
            status["usage"]["totalTokens"] += tokens
        if record is not None and status["title"] is None:
            status["title"] = title_of(record)
        self.touch()


@dataclass(slots=True)
class RunningTurn:
    """One prompt from the moment it arrives until its outcome is settled.

    Registered before the first ``await`` of ``session/prompt``, so a cancel or a
    close that arrives right behind the prompt always finds it. ``result`` settles
    with ``(record, completed_turns)`` once the record is committed, or with the
    error the prompt answers. Once ``recorded``, the worker's death no longer
    fails the turn: the answer is the outcome of its write, so the client and
    the store always agree.
    """

    sid: str
    turn_id: str
    peer: Peer
    result: asyncio.Future[tuple[TurnRecord, int]]
    route: Route | None = None  # the session's route once the turn holds it (BUSY)
    started: bool = False  # StartTurn went to the worker
    recorded: bool = False  # the worker's record of the turn arrived: its commit decides
    cancel_requested: bool = False
    stream: TurnStream | None = None  # its updates on their way to the peer
    failure: str | None = None  # why it fails, decided on the host (the worker cancels it)
    finished: asyncio.Event = field(default_factory=asyncio.Event)
    permission_tasks: set[asyncio.Task[Any]] = field(default_factory=set)
    #: Called (loop thread) as the last step of settling, once ``result`` is set:
    #: the prompt's answer without a task waiting on ``result`` (see Sessions.start_now).
    on_settled: Callable[[], None] | None = None
