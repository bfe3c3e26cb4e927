"""A model stream's wait ends on the turn's cancel itself, not on a poll of its flag."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from actors.worker.agents.llm import http
from actors.worker.agents.llm.config import ModelSettings
from actors.worker.cancel import TurnCancel
from tests.e2e.model_server import ModelServer, Reply
from tests.e2e.model_streams import openai_reply

WAIT = 10.0


def test_a_cancel_wakes_a_wait_on_a_stalled_stream_and_closes_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(http, "POLL_SECS", 3600.0)  # a poll would not see the cancel in time
    server = ModelServer()
    server.script(Reply(events=openai_reply({"content": "thinking"}).events, hold_after=2))
    settings = ModelSettings(
        alias="main", base_url=server.url, model="m", api_key=None, headers={},
        temperature=None, max_tokens=None, context_window=10_000, request_timeout_secs=WAIT,
        max_retries=0, max_tool_rounds=1, workspace="")
    cancel, first = TurnCancel(), threading.Event()
    batches: list[list[dict[str, Any]]] = []

    def read() -> None:
        for batch in http.ModelHttp(settings).stream(
                f"{server.url}/v1/chat/completions", {}, {"stream": True}, cancel):
            batches.append(batch)
            first.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert first.wait(WAIT)  # the stream stalls after its first events
        cancel.set()
        reader.join(WAIT / 4)
        assert not reader.is_alive(), "the cancel did not end the wait"
        assert server.state.client_gone.wait(WAIT), "the HTTP stream was not closed"
    finally:
        cancel.set()
        server.close()
