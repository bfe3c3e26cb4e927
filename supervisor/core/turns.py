"""The running turns of one host, keyed by session id.

Runs on the asyncio loop thread. The host, not the request that started a turn,
owns its ending: a turn that ends is persisted and settled here even when the
client that asked for it is gone, so a completed or cancelled turn is never lost.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Callable, Coroutine
from functools import partial
from typing import Any, Protocol, TypeVar

from actors.persistence import StoreWrite, WriteTurn
from ipc.errors import InternalError, RpcError
from ipc.events import CANCEL_MARKER, TextItem, TurnRecord
from ipc.worker_wire import CancelTurn, HostMessage
from supervisor.core.live import LiveTable
from supervisor.core.peer import Peer
from supervisor.core.routes import RunningTurn
from supervisor.core.turn_stats import TurnStats
from supervisor.core.usage import UsageTotals

__all__ = ["TurnBook", "TurnHost"]

log = logging.getLogger("zeroclaw.turns")

R = TypeVar("R")

_TURN_IDS = itertools.count(1)


class WorkerSender(Protocol):
    def send(self, worker_id: str, message: HostMessage) -> bool:
        """Queue ``message`` for a worker; False if it could not be sent."""


class TurnHost(Protocol):
    """What a :class:`TurnBook` needs of its host (:class:`supervisor.host.host.Host`)."""

    @property
    def pool(self) -> WorkerSender: ...

    @property
    def usage(self) -> UsageTotals: ...

    @property
    def turn_stats(self) -> TurnStats: ...

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]: ...

    def persist(self, write: StoreWrite[R]) -> asyncio.Future[R]: ...

    def persist_then(self, write: StoreWrite[R],
                     then: Callable[[BaseException | None, R], None]) -> None: ...

    async def evict(self, sid: str) -> bool: ...


class TurnBook:
    """Lifecycle of running turns (one per session at most, kept on its entry in
    the live-session table)."""

    def __init__(self, host: TurnHost, live: LiveTable) -> None:
        self.host = host
        self.live = live

    def begin(self, sid: str, peer: Peer) -> RunningTurn:
        """Register a new turn now (no await); -32002 when one is already running,
        -32000 while the session is being closed."""
        future: asyncio.Future[tuple[TurnRecord, int]] = asyncio.get_running_loop().create_future()
        turn = RunningTurn(sid, f"t{next(_TURN_IDS)}", peer, future)
        self.live.attach_turn(turn)
        return turn

    def get(self, sid: str, turn_id: str | None = None) -> RunningTurn | None:
        entry = self.live.get(sid)
        turn = entry.turn if entry is not None else None
        if turn is None or (turn_id is not None and turn.turn_id != turn_id):
            return None
        return turn

    def cancel(self, sid: str) -> bool:
        """Stop the turn of ``sid`` (also one not yet started); withdraw its permission asks."""
        turn = self.get(sid)
        if turn is None:
            return False
        turn.cancel_requested = True
        if turn.started and turn.route is not None:
            self.host.pool.send(turn.route.worker_id, CancelTurn(sid))
        for task in list(turn.permission_tasks):
            task.cancel()
        return True

    def fail(self, turn: RunningTurn, reason: str) -> None:
        """The host cannot carry the turn on (e.g. an update it cannot encode): the
        worker cancels it, and its prompt then answers -32603 with ``reason``
        (nothing of it is kept)."""
        if turn.failure is None:
            turn.failure = reason
            log.warning("turn of %s fails: %s", turn.sid, reason)
        self.cancel(turn.sid)

    def cancel_all(self, peer: Peer | None = None) -> None:
        for turn in self.live.turns():
            if peer is None or turn.peer is peer:
                self.cancel(turn.sid)

    async def wait_all(self, timeout: float) -> bool:
        """Wait (bounded) for every running turn to settle; False on timeout."""
        waits = [turn.finished.wait() for turn in self.live.turns()]
        if not waits:
            return True
        try:
            await asyncio.wait_for(asyncio.gather(*waits), timeout)
        except TimeoutError:
            log.warning("%d turn(s) did not end in %.0f s", len(waits), timeout)
            return False
        return True

    # --- endings ------------------------------------------------------------------

    def ended(self, turn: RunningTurn, record: TurnRecord) -> None:
        """The worker sent the turn's record: from now on its commit decides the answer."""
        turn.recorded = True
        self.commit(turn, record)

    def failed(self, turn: RunningTurn, error: RpcError, record: TurnRecord | None) -> None:
        """The worker failed the turn (answered with ``error``); ``record``, what it
        streamed before, is committed first, like any turn's record."""
        if record is None:
            self.settle(turn, error=error)
            return
        turn.recorded = True
        self.host.spawn(self._keep_failed(turn, record, error))

    async def _keep_failed(self, turn: RunningTurn, record: TurnRecord, error: RpcError) -> None:
        kept = None
        try:
            turns: int = await self.host.persist(WriteTurn(record))
            kept = (turns, record.tokens)
            self.host.usage.add_turn(record.tokens)
        except Exception as exc:
            log.error("failed turn of %s not persisted: %s", turn.sid, exc)
            self._forget_unstored(turn)
        self.settle(turn, error=error, kept=kept)

    def worker_exited(self, turn: RunningTurn) -> bool:
        """The turn's worker died: fail the turn (-32603) unless its record arrived
        first, in which case the pending write answers it. True when it was failed."""
        if not turn.started or turn.recorded:
            return False
        self.settle(turn, error=InternalError("session worker exited"))
        return True

    async def complete(self, turn: RunningTurn, record: TurnRecord) -> None:
        """Commit the turn's record, then settle it; returns once it is settled."""
        self.commit(turn, record)
        await turn.finished.wait()

    def commit(self, turn: RunningTurn, record: TurnRecord) -> None:
        """Have the turn's record committed, then settle the turn (also when its client
        is gone). Returns at once: the commit's reply settles it, by a plain callback
        on the loop (no task per turn)."""
        if turn.failure is not None:  # failed on the host: the record is not kept
            self._forget_unstored(turn)
            self.settle(turn, error=InternalError(turn.failure))
            return
        self.host.persist_then(WriteTurn(record), partial(self._committed, turn, record))

    def _committed(self, turn: RunningTurn, record: TurnRecord,
                   error: BaseException | None, turns: int) -> None:
        """The commit of ``record`` replied (loop thread): settle the turn."""
        if error is not None:
            log.error("turn of %s not persisted: %s", turn.sid, error)
            self._forget_unstored(turn)  # its first step runs before the client can answer
            self.settle(turn, error=InternalError(str(error)))
            return
        self.host.usage.add_turn(record.tokens)
        self.host.turn_stats.record(record.stop_reason, record.finished_at - record.started_at,
                                    turn.route.tenant if turn.route is not None else None)
        self.settle(turn, value=(record, turns))

    def _forget_unstored(self, turn: RunningTurn) -> None:
        """The session's worker remembers a turn the store does not have and the client
        was told failed: drop the live session (an eviction), so the next prompt
        restores it from the store, with exactly the turns that were kept."""
        route = turn.route
        if route is not None and self.live.route(turn.sid) is route:
            self.host.spawn(self.host.evict(turn.sid))

    async def complete_unstarted(self, turn: RunningTurn, prompt: str) -> None:
        """A turn cancelled before it reached the worker: kept as a cancelled turn."""
        now = time.time()
        record = TurnRecord(
            session_id=turn.sid,
            items=(TextItem("user", prompt), TextItem("assistant", CANCEL_MARKER)),
            stop_reason="cancelled", content=CANCEL_MARKER, started_at=now, finished_at=now,
        )
        await self.complete(turn, record)

    def settle(
        self,
        turn: RunningTurn,
        *,
        value: tuple[TurnRecord, int] | None = None,
        error: RpcError | None = None,
        kept: tuple[int, int] | None = None,
    ) -> None:
        """End the turn exactly once: free the session, then answer the prompt.

        ``kept`` (the store's turn count, tokens added) is for a failed turn whose
        partial output was stored."""
        if turn.finished.is_set():
            return
        if turn.stream is not None:  # its last updates go before its answer
            turn.stream.flush(grant=False)
            turn.stream.close()
        if turn.failure is not None and value is not None:
            value, error = None, InternalError(turn.failure)
        self.live.detach_turn(turn)
        if turn.route is not None:
            if value is None:
                turn.route.turn_ended(*(kept or (None,)))
            else:
                turn.route.turn_ended(value[1], value[0].tokens, value[0])
        for task in list(turn.permission_tasks):
            task.cancel()
        if not turn.result.done():
            if value is not None:
                turn.result.set_result(value)
            else:
                turn.result.set_exception(error or InternalError("turn ended without a result"))
                turn.result.exception()  # its client may be gone: never "unretrieved"
        turn.finished.set()
        if turn.on_settled is not None:
            turn.on_settled()
