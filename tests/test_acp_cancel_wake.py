"""A hosted agent's turn wakes on the turn's cancel itself, not on a poll of its flag."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from actors.worker.agents import acp_turn
from actors.worker.agents.acp_turn import AcpTurn
from actors.worker.agents.base import AgentFailure
from actors.worker.cancel import TurnCancel
from tests.test_acp_stream_units import _fixture_turn

WAIT = 10.0


class _Client:
    """A turn's context that takes every event; :attr:`spoke` once the agent said something."""

    def __init__(self, cancelled: threading.Event) -> None:
        self.cancelled = cancelled
        self.spoke = threading.Event()
        self.events: list[Any] = []

    def emit_all_nowait(self, events: Sequence[Any]) -> bool:
        for event in events:
            self.emit(event)
        return True

    def emit(self, event: Any) -> None:
        self.events.append(event)
        self.spoke.set()


def _cancelled_turn(tmp_path: Path, client: _Client, prompt: str,
                    grace: float) -> tuple[list[str | None], bool]:
    """Run ``prompt`` on the fixture agent, cancel it once the agent spoke; what the
    turn returned and whether it ignored the cancel (the grace ran out)."""
    process, _link, turn = _fixture_turn(tmp_path, "wake", client, "full")
    turn.cancel_grace = grace
    outcome: list[str | None] = []
    runner = threading.Thread(target=lambda: outcome.append(turn.run(prompt)), daemon=True)
    try:
        runner.start()
        assert client.spoke.wait(WAIT), "the agent never spoke"
        client.cancelled.set()  # the agent is silent from now on
        runner.join(WAIT)
        assert not runner.is_alive(), "the cancel did not end the turn's wait"
        return outcome, turn.ignored_cancel
    finally:
        client.cancelled.set()
        process.stop()
        runner.join(WAIT)


def test_a_cancel_reaches_a_silent_agent_at_once_and_its_answer_ends_the_turn(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The agent waits for ``session/cancel`` and answers ``cancelled``: the turn's
    wait is woken by the cancel (a poll would not see it in time)."""
    monkeypatch.setattr(acp_turn, "_POLL_SECS", 3600.0)
    outcome, ignored = _cancelled_turn(tmp_path, _Client(TurnCancel()), "wait", grace=WAIT * 2)
    assert outcome == ["cancelled"] and not ignored


def test_a_cancel_ignored_by_a_silent_agent_ends_the_turn_when_its_grace_runs_out(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The agent ignores ``session/cancel``: the grace is the wait's bound."""
    monkeypatch.setattr(acp_turn, "_POLL_SECS", 3600.0)
    outcome, ignored = _cancelled_turn(tmp_path, _Client(TurnCancel()), "stubborn", grace=0.5)
    assert outcome == [None] and ignored


def test_a_plain_event_as_the_cancel_flag_is_polled(tmp_path: Path) -> None:
    """A context whose cancel cannot wake the turn (a plain Event) still ends it."""
    outcome, ignored = _cancelled_turn(tmp_path, _Client(threading.Event()), "stubborn",
                                       grace=0.5)
    assert outcome == [None] and ignored


def _failing_turn(turn: AcpTurn, prompt: str) -> tuple[threading.Thread, list[AgentFailure]]:
    """A thread (not started) that runs ``turn`` on ``prompt``, and the list that gets
    the :class:`AgentFailure` it ends with."""
    failures: list[AgentFailure] = []

    def run() -> None:
        try:
            turn.run(prompt)
        except AgentFailure as exc:
            failures.append(exc)

    return threading.Thread(target=run, daemon=True), failures


def test_a_turn_hears_its_agent_stopped_from_another_thread(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The agent is stopped mid-turn (the session closed, the worker shuts down): its
    turn's wait ends on the exit told to its inbox, not on a poll of the process."""
    monkeypatch.setattr(acp_turn, "_POLL_SECS", 3600.0)
    client = _Client(TurnCancel())
    process, _link, turn = _fixture_turn(tmp_path, "stopped", client, "full")
    runner, failures = _failing_turn(turn, "stubborn")
    try:
        runner.start()
        assert client.spoke.wait(WAIT), "the agent never spoke"
        process.stop()
        runner.join(WAIT)
        assert not runner.is_alive(), "the turn did not hear its agent stop"
        assert len(failures) == 1
    finally:
        process.stop()
        runner.join(WAIT)


def test_a_turn_hears_its_agent_exit_while_a_child_holds_its_stdout_open(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The agent exits, its child keeps its stdout open: the turn still fails on the
    exit (the loop watches the process itself), not on a poll of it."""
    monkeypatch.setattr(acp_turn, "_POLL_SECS", 3600.0)
    client = _Client(TurnCancel())
    process, _link, turn = _fixture_turn(tmp_path, "orphaned", client, "full")
    runner, failures = _failing_turn(turn, "orphan")
    try:
        runner.start()
        runner.join(WAIT)
        assert not runner.is_alive(), "the turn did not hear its agent exit"
        assert len(failures) == 1 and "exited with status 0" in str(failures[0])
    finally:
        process.stop()
        runner.join(WAIT)
