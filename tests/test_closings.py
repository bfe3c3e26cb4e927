"""Close confirmations reach exactly the close that asked (supervisor/core/closings.py)."""

from __future__ import annotations

from supervisor.core.closings import Closings


async def test_each_confirmation_releases_its_own_close_only() -> None:
    closings = Closings()
    first, second = closings.number(), closings.number()
    first_wait = closings.sent(first, "w1", wait=True)
    second_wait = closings.sent(second, "w1", wait=True)
    assert first_wait is not None and second_wait is not None
    closings.confirmed(second)  # the later close is confirmed first (its session was unknown)
    assert second_wait.done() and not first_wait.done()
    closings.confirmed(first)
    assert first_wait.done()


async def test_a_dead_worker_releases_its_closes_and_late_answers_are_ignored() -> None:
    closings = Closings()
    on_dead, elsewhere, given_up = (closings.number() for _ in range(3))
    dead_wait = closings.sent(on_dead, "w1", wait=True)
    other_wait = closings.sent(elsewhere, "w2", wait=True)
    closings.sent(given_up, "w2", wait=False)
    closings.forget(given_up)
    closings.worker_gone("w1")
    assert dead_wait is not None and dead_wait.done()
    assert other_wait is not None and not other_wait.done()
    closings.confirmed(given_up)  # a late answer to a close that stopped waiting
    closings.confirmed(on_dead)  # and one from a worker already counted dead
    assert not other_wait.done()
