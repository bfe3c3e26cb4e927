"""A local Anthropic Messages API for Claude Code: a real HTTP server
(:class:`~tests.e2e.model_server.ModelServer`) answering each request from what it asks.

The conversation is a scripted coding task (:class:`CodingTask`) played with Claude Code's
own tool names: read ``calc.py`` (``Read``), fix its bug (``Edit``), run it (``Bash``),
answer. Each step is a streamed Messages reply exactly as the API documents it
(``message_start``, ``ping``, ``content_block_start``/``delta``/``stop`` for thinking,
text and ``tool_use`` with ``input_json_delta``, ``message_delta`` with ``stop_reason``
and ``usage``, ``message_stop``); the step is chosen by how many ``tool_result`` blocks
the request carries, so retries and a second process replay the same answers. Claude
Code's side requests are answered too: the session title (a JSON-schema output),
``count_tokens``, and any other request (a short text; a GET gets a 404 error body).
Everything is recorded by the server.

The responder runs on the server's request threads; the test's thread reads
:attr:`CodingTask.server`'s records.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from tests.e2e.model_server import Recorded, Reply
from tests.e2e.model_streams import (
    anthropic_reply,
    anthropic_text,
    anthropic_thinking,
    anthropic_tool_use,
)

from .bench import ANSWER, CalcTask

__all__ = ["CodingTask", "Kind", "kind_of", "tool_results"]

TITLE = "Fix calc.py sum"

Kind = str  # "turn" | "title" | "count_tokens" | "other"


def kind_of(recorded: Recorded) -> Kind:
    """What Claude Code asked for in ``recorded``."""
    body = recorded.body
    if recorded.method != "POST" or not recorded.path.startswith("/v1/messages"):
        return "other"
    if "count_tokens" in recorded.path:
        return "count_tokens"
    schema = ((body.get("output_config") or {}).get("format") or {}).get("schema") or {}
    if "title" in (schema.get("properties") or {}):
        return "title"
    if body.get("tools") and body.get("messages"):
        return "turn"
    return "other"


def tool_results(body: dict[str, Any]) -> list[dict[str, Any]]:
    """Every ``tool_result`` block of a Messages request, in order."""
    return [block for message in body.get("messages") or []
            if isinstance(message.get("content"), list)
            for block in message["content"] if block.get("type") == "tool_result"]


def _json_parts(value: dict[str, Any]) -> list[str]:
    """``value`` as JSON cut in three ``partial_json`` pieces, as the API streams it."""
    text = json.dumps(value)
    third = max(len(text) // 3, 1)
    return [text[:third], text[third:2 * third], text[2 * third:]]


@dataclass(frozen=True)
class CodingTask(CalcTask):
    """The coding task on ``cwd/calc.py``; :meth:`responder` answers the server."""

    def responder(self, recorded: Recorded) -> Reply:
        """Runs on a server thread: the reply to one request."""
        kind = kind_of(recorded)
        if kind == "count_tokens":
            return Reply(body=b'{"input_tokens": 2048}')
        if kind == "title":
            return anthropic_reply(anthropic_text(0, json.dumps({"title": TITLE})),
                                   message_id="msg_01TitLeGenErAtIon000001", usage=(120, 9))
        if kind == "turn":
            return self.step(len(tool_results(recorded.body)))
        if recorded.method != "POST":
            return Reply(status=404, body=json.dumps({"type": "error", "error": {
                "type": "not_found_error", "message": f"no {recorded.path} here"}}).encode())
        return anthropic_reply(anthropic_text(0, "OK"), message_id="msg_01OtHeRrEqUeSt0000001")

    def step(self, done: int) -> Reply:
        """The model's reply after ``done`` tool results."""
        path = str(self.calc)
        if done == 0:
            blocks = [*anthropic_thinking(0, "The user says the sum is wrong. ",
                                          "I should read calc.py first."),
                      *anthropic_text(1, "Let me read ", "calc.py."),
                      *anthropic_tool_use(2, "toolu_01ReadCalc00000000001", "Read",
                                          *_json_parts({"file_path": path}))]
            return anthropic_reply(blocks, "tool_use", (1800, 60), "msg_01StepReadCalc0000001")
        if done == 1:
            edit = {"file_path": path, "old_string": "    return a - b",
                    "new_string": "    return a + b", "replace_all": False}
            blocks = [*anthropic_text(0, "`add` subtracts. ", "Fixing it."),
                      *anthropic_tool_use(1, "toolu_01EditCalc00000000002", "Edit",
                                          *_json_parts(edit))]
            return anthropic_reply(blocks, "tool_use", (1900, 80), "msg_01StepEditCalc0000002")
        if done == 2:
            run = {"command": "python3 calc.py", "description": "Run calc.py"}
            blocks = [*anthropic_text(0, "Now running it."),
                      *anthropic_tool_use(1, "toolu_01BashCalc00000000003", "Bash",
                                          *_json_parts(run))]
            return anthropic_reply(blocks, "tool_use", (2000, 40), "msg_01StepBashCalc0000003")
        return anthropic_reply(anthropic_text(0, *ANSWER.partition(" now ")), "end_turn",
                               (2100, 30), "msg_01StepAnswer000000004")
