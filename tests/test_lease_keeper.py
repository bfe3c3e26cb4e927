"""The lease heartbeat (supervisor.host.lease_keeper.LeaseKeeper) on a real asyncio loop
with short TTLs: when it renews, how long a renewal counts for, and when and why it
stops the sessions live here.

The store is :class:`Renewals`: every renewal the keeper sends is recorded with the
moment it was sent (the keeper's last clock reading before it asked) and answered as
the test says (the live sessions, some of them, an error, or never). Tests wait on
renewals and stops arriving (queues), each wait bounded.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Collection
from dataclasses import dataclass, field

import pytest

from supervisor.host.lease_keeper import LeaseKeeper

TTL = 0.6  # period 0.2 s, margin 0.15 s
WAIT = 5.0  # for any one thing to happen
TOOK_OVER = "this host no longer owns the session: another host took it over"
BEFORE = ", so the session stopped here before another host could take it over"
NO_ANSWER = "the lease heartbeat gets no answer from the store" + BEFORE
UNREACHABLE = "the store is unreachable: this host cannot renew its leases" + BEFORE


class Clock:
    """``time.monotonic``, each reading kept."""

    def __init__(self) -> None:
        self.last = 0.0

    def __call__(self) -> float:
        self.last = time.monotonic()
        return self.last


@dataclass
class Renewal:
    live: tuple[str, ...]
    sent: float  # the keeper's clock when it asked
    valid_until: float  # the keeper's bound when it asked
    lapsed: bool  # whether the keeper was lapsed when it asked
    answer: asyncio.Future[list[str]]


@dataclass
class Stop:
    sids: list[str]
    reason: str
    at: float


Answer = Callable[[tuple[str, ...]], list[str] | BaseException | None]  # None: never


@dataclass
class Renewals:
    """The store's side: what the keeper asked, answered by :attr:`answer`."""

    clock: Clock
    answer: Answer
    delay: float = 0.0  # how long the database takes to answer
    keeper: LeaseKeeper | None = None
    asked: asyncio.Queue[Renewal] = field(default_factory=asyncio.Queue)

    def __call__(self, live: tuple[str, ...]) -> asyncio.Future[list[str]]:
        assert self.keeper is not None
        future: asyncio.Future[list[str]] = asyncio.get_running_loop().create_future()
        self.asked.put_nowait(Renewal(live, self.clock.last, self.keeper.valid_until,
                                       self.keeper.lapsed, future))
        outcome = self.answer(live)
        if outcome is not None:
            asyncio.get_running_loop().call_later(self.delay, _settle, future, outcome)
        return future

    async def next(self) -> Renewal:
        return await asyncio.wait_for(self.asked.get(), WAIT)


def _settle(future: asyncio.Future[list[str]], outcome: list[str] | BaseException) -> None:
    if future.done():
        return
    if isinstance(outcome, BaseException):
        future.set_exception(outcome)
    else:
        future.set_result(outcome)


@dataclass
class Sessions:
    """The host's side: the live sessions; a stopped one is no longer live."""

    live: list[str]
    stops: asyncio.Queue[Stop] = field(default_factory=asyncio.Queue)
    count: int = 0

    def stop(self, sids: Collection[str], reason: str) -> None:
        self.count += 1
        self.stops.put_nowait(Stop(sorted(sids), reason, time.monotonic()))
        self.live = [sid for sid in self.live if sid not in sids]

    async def next(self) -> Stop:
        return await asyncio.wait_for(self.stops.get(), WAIT)


@dataclass
class Beating:
    keeper: LeaseKeeper
    renewals: Renewals
    sessions: Sessions


def all_renewed(live: tuple[str, ...]) -> list[str]:
    return list(live)


@pytest.fixture
async def start() -> AsyncIterator[Callable[..., Beating]]:
    """Starts a keeper's heartbeat on ``live`` with ``answer``; stopped at the end."""
    tasks: list[asyncio.Task[None]] = []

    def make(live: list[str], answer: Answer, *, delay: float = 0.0,
             retry: float | None = None) -> Beating:
        clock = Clock()
        renewals = Renewals(clock, answer, delay)
        sessions = Sessions(live)
        keeper = LeaseKeeper(TTL, lambda: list(sessions.live), renewals, sessions.stop,
                             clock=clock)
        if retry is not None:
            keeper.retry = retry
        renewals.keeper = keeper
        tasks.append(asyncio.create_task(keeper.run()))
        return Beating(keeper, renewals, sessions)

    yield make
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def test_renewals_come_every_third_of_the_ttl_and_count_from_when_they_were_sent(
    start: Callable[..., Beating],
) -> None:
    """The database takes 50 ms to answer: each renewal extends the bound to its
    *sending* plus the TTL (not its answer's arrival), and the next one is sent a
    period after the answer, well before the sessions would have to stop."""
    beating = start(["a", "b"], all_renewed, delay=0.05)
    keeper = beating.keeper
    first = await beating.renewals.next()
    assert first.live == ("a", "b")
    previous = first
    for _ in range(4):
        renewal = await beating.renewals.next()
        answered = previous.answer.result()  # settled: the keeper went on after it
        assert answered == ["a", "b"]
        assert renewal.valid_until == previous.sent + TTL  # from the sending
        assert renewal.sent - previous.sent >= keeper.period + 0.05 - 0.005  # answer, pause
        assert renewal.sent < previous.sent + TTL - keeper.margin  # before a stop was due
        previous = renewal
    assert keeper.period == TTL / 3 and not keeper.lapsed
    assert beating.sessions.count == 0


async def test_a_renewal_that_hangs_stops_every_session_before_its_leases_can_run_out(
    start: Callable[..., Beating],
) -> None:
    """The first renewal gets no answer: at ``valid_until - margin`` every live session
    is stopped (while the renewal still hangs), with the reason, and ``lapsed`` is set;
    the keeper does not pile up renewals or stops behind the hung one."""
    beating = start(["a", "b"], lambda live: None)
    keeper = beating.keeper
    due = keeper.valid_until - keeper.margin  # no renewal ever succeeded
    hung = await beating.renewals.next()
    stop = await beating.sessions.next()
    assert not hung.answer.done()
    assert stop.sids == ["a", "b"]
    assert stop.reason == NO_ANSWER
    assert due - 0.005 <= stop.at <= due + keeper.margin / 2  # the loop's wake-up, at most
    assert stop.at < keeper.valid_until
    assert keeper.lapsed
    hung.answer.set_exception(ConnectionError("timed out"))  # libpq gives up at last
    retried = await beating.renewals.next()  # the next attempt, a retry later
    assert retried.sent - stop.at >= keeper.retry - 0.005
    assert beating.sessions.count == 1 and keeper.lapsed


async def test_a_failing_renewal_is_retried_and_stops_once_per_lapse(
    start: Callable[..., Beating],
) -> None:
    """Renewals fail (the store is down): they are retried every ``retry`` (here shorter
    than the period, to tell the two apart); once the bound is due the sessions stop,
    once, however many retries fail after; a renewal that succeeds clears ``lapsed``
    and counts from its sending; failing again is a new lapse with one stop of its own."""
    store_up = False

    def answer(live: tuple[str, ...]) -> list[str] | BaseException:
        return list(live) if store_up else ConnectionError("connection refused")

    beating = start(["a", "b"], answer, retry=0.03)
    keeper, sessions, renewals = beating.keeper, beating.sessions, beating.renewals
    due = keeper.valid_until - keeper.margin
    attempts = [await renewals.next()]
    while sessions.stops.empty():
        attempts.append(await renewals.next())
        gap = attempts[-1].sent - attempts[-2].sent
        assert gap < keeper.period  # a retry, not the next beat
        assert gap >= keeper.retry - 0.005 or attempts[-1].sent >= due - 0.005  # or at due
    stop = await sessions.next()
    assert stop.sids == ["a", "b"]
    assert stop.reason in (UNREACHABLE, NO_ANSWER)  # NO_ANSWER: the attempt sent at due
    assert due - 0.005 <= stop.at <= due + keeper.margin / 2 and keeper.lapsed
    for _ in range(5):  # retried on, stopped no more
        await renewals.next()
    assert sessions.count == 1 and keeper.lapsed
    sessions.live = ["c"]  # a session restored meanwhile (its lease taken by itself)
    store_up = True
    renewed = await renewals.next()
    following = await renewals.next()  # sent after the keeper took the success in
    assert not keeper.lapsed
    assert following.valid_until == renewed.sent + TTL
    assert following.sent - renewed.sent >= keeper.period - 0.005  # beats again
    store_up = False
    second = await sessions.next()
    assert second.sids == ["c"] and second.reason == stop.reason
    for _ in range(3):
        await renewals.next()
    assert sessions.count == 2


async def test_sessions_the_database_did_not_renew_are_stopped_as_taken_over(
    start: Callable[..., Beating],
) -> None:
    """The database renews ``a`` and ``c`` but not ``b`` (another host took ``b`` over
    while this one stalled): ``b`` alone is stopped, with that reason, once; the
    keeper's own bound still moves on and nothing lapses."""
    beating = start(["a", "b", "c"], lambda live: [sid for sid in live if sid != "b"])
    keeper, sessions, renewals = beating.keeper, beating.sessions, beating.renewals
    first = await renewals.next()
    stop = await sessions.next()
    assert stop.sids == ["b"] and stop.reason == TOOK_OVER
    second = await renewals.next()
    assert second.live == ("a", "c")
    assert second.valid_until == first.sent + TTL
    await renewals.next()  # the second's answer was taken in too
    assert sessions.count == 1 and not keeper.lapsed



async def test_a_renewal_answered_after_its_own_bound_is_no_recovery(
    start: Callable[..., Beating],
) -> None:
    """The renewal hangs (a frozen server), the sessions stop, and it succeeds only
    once its own bound (its sending + TTL - margin) has passed: that protects nothing,
    so the keeper stays lapsed and retries; the renewal sent afterwards clears it, and
    a session restored meanwhile (its lease taken by itself) is not stopped."""
    hang = True
    beating = start(["a", "b"], lambda live: None if hang else list(live), delay=0.01)
    keeper, sessions, renewals = beating.keeper, beating.sessions, beating.renewals
    hung = await renewals.next()
    assert (await sessions.next()).reason == NO_ANSWER and keeper.lapsed
    hang = False
    sessions.live = ["c"]
    too_late = hung.sent + TTL - keeper.margin
    await asyncio.sleep(max(0.0, too_late - time.monotonic()) + 0.01)  # a time, not an outcome
    hung.answer.set_result(["a", "b"])  # the server answers at last
    answered = time.monotonic()
    fresh = await renewals.next()
    assert fresh.lapsed and fresh.sent - answered >= keeper.retry - 0.005  # a retry
    following = await renewals.next()  # fresh's answer was taken in
    assert not following.lapsed and following.valid_until == fresh.sent + TTL
    assert sessions.count == 1  # c was never stopped


async def test_a_hung_renewal_that_succeeds_in_its_bound_stops_nothing_more(
    start: Callable[..., Beating],
) -> None:
    """The renewal hangs past the bound the keeper had (the sessions stop), then
    succeeds within its own: the keeper recovers, and the next renewal, answered in
    10 ms, stops nothing (a session restored meanwhile stays)."""
    hang = True
    beating = start(["a", "b"], lambda live: None if hang else list(live), delay=0.01)
    keeper, sessions, renewals = beating.keeper, beating.sessions, beating.renewals
    hung = await renewals.next()
    assert (await sessions.next()).reason == NO_ANSWER
    hang = False
    sessions.live = ["c"]
    assert time.monotonic() < hung.sent + TTL - keeper.margin - 0.05
    hung.answer.set_result(["a", "b"])  # within its own bound
    await renewals.next()
    await renewals.next()
    assert sessions.count == 1 and not keeper.lapsed
