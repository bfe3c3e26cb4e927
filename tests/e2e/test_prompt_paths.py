"""The two ways of ``session/prompt`` give the same answers and updates.

A prompt on an open idle session, with no earlier request of its connection still
to start, starts at once and is answered by a plain call when its turn settles
(``Sessions.start_now``); one behind a request whose handler has not started yet
takes the general way (``Sessions.prompt``, a task), so that requests keep their
arrival order.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .rawclient import RawHost
from .test_races import frames, prompt, request, responses

TEXT = "hello  world\nsecond line"


def _updates(host: RawHost, sid: str) -> list[dict[str, Any]]:
    return [n["params"]["update"] for n in host.notifications
            if n["method"] == "session/update" and n["params"]["sessionId"] == sid
            and n["params"]["update"]["sessionUpdate"] != "session_info_update"]


def _answer(frame: dict[str, Any], sid: str) -> dict[str, Any]:
    assert frame["result"]["sessionId"] == sid
    return {key: value for key, value in frame["result"].items() if key != "sessionId"}


def test_a_prompt_started_at_once_answers_as_one_taking_the_general_way(
    raw_host: RawHost, workspace: Path
) -> None:
    raw_host.initialize()
    at_once, general = raw_host.new_session(workspace), raw_host.new_session(workspace)
    raw_host.send_bytes(frames(prompt(100, at_once, TEXT)))
    first = responses(raw_host, 1)[100]
    # behind a cancel whose handler task has not run yet: the general way
    raw_host.send_bytes(frames(request(200, "session/cancel", at_once), prompt(201, general, TEXT)))
    got = responses(raw_host, 2)
    assert got[200]["result"] == {}
    assert _answer(first, at_once) == _answer(got[201], general)
    assert _answer(first, at_once) == {"stopReason": "end_turn", "content": TEXT}
    assert _updates(raw_host, at_once) == _updates(raw_host, general) != []
    titles = [n["params"]["sessionId"] for n in raw_host.notifications
              if n["method"] == "session/update"
              and n["params"]["update"]["sessionUpdate"] == "session_info_update"]
    assert sorted(titles) == sorted([at_once, general])  # each first turn names its session
    # and a second turn of each, both at once now
    raw_host.send_bytes(frames(prompt(300, at_once, TEXT), prompt(301, general, TEXT)))
    again = responses(raw_host, 2)
    assert _answer(again[300], at_once) == _answer(again[301], general) == _answer(first, at_once)


def test_a_busy_session_answers_busy_either_way(raw_host: RawHost, workspace: Path) -> None:
    raw_host.initialize()
    sid = raw_host.new_session(workspace)
    raw_host.send_bytes(frames(prompt(100, sid, TEXT), prompt(101, sid, TEXT)))  # one read
    got = responses(raw_host, 2)
    assert got[101]["error"]["code"] == -32002
    assert got[100]["result"]["stopReason"] == "end_turn"
