"""SupervisorActor: typed messages, each answered with its own type; a message it
cannot handle answers the asker with the error and the actor lives on.

(The session-table decisions it used to make are in tests/test_live_table.py.)"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import pytest

from actors.bridge import Request, ask, tell
from supervisor.workers.supervisor import EndOrphans, StartWorker, SupervisorActor


@dataclass(frozen=True, slots=True)
class Unknown(Request[None]):
    pass


@pytest.fixture
def supervisor():
    ref = SupervisorActor.start()
    yield ref
    ref.stop()


async def test_end_orphans_answers_the_pids_it_ended(supervisor) -> None:
    assert await ask(supervisor, EndOrphans()) == ()  # this test process has none


async def test_an_unknown_message_fails_its_asker_not_the_actor(supervisor) -> None:
    with pytest.raises(TypeError, match="Unknown"):
        await ask(supervisor, Unknown())
    tell(supervisor, Unknown())  # logged by the actor
    assert await ask(supervisor, EndOrphans()) == ()


async def test_start_worker_answers_the_started_process(supervisor) -> None:
    proc = await ask(supervisor, StartWorker((sys.executable, "-c", "pass"), {}))
    assert proc.wait(timeout=10) == 0
    with pytest.raises(OSError):  # the pool's launch sees the same error as from Popen
        await ask(supervisor, StartWorker(("/nonexistent/zeroclaw-worker",), {}))
