"""A local OpenAI Responses API for Codex: a real HTTP server
(:class:`~tests.e2e.model_server.ModelServer`, threaded, on 127.0.0.1:0) answering each
``POST /v1/responses`` (``stream: true``) from what it asks.

Each reply is a Responses stream as OpenAI documents it: ``response.created``,
``response.in_progress``, then per output item ``response.output_item.added``, its deltas
(``response.reasoning_summary_text.delta``, ``response.output_text.delta``,
``response.function_call_arguments.delta``/``done``,
``response.custom_tool_call_input.delta``/``done``), ``response.output_item.done``, and
``response.completed`` with ``usage``.

The script (:class:`CodexTask`): a question answered with text (:data:`HELLO_PROMPT`),
then a coding task played with Codex's own tools: read ``calc.py`` (``shell_command``
``cat``), fix its bug (``apply_patch``), run it (``shell_command``), answer. The step is
chosen by the last user message and the number of tool outputs the request carries, so
retries and a second process get the same answers. Anything else (a GET, another path)
gets a 404 error body. Everything is recorded by the server.

The responder runs on the server's request threads; the test's thread reads the
server's records.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from typing import Any

from tests.e2e.model_server import Recorded, Reply
from tests.e2e.model_streams import sse

from .bench import ANSWER, CalcTask

__all__ = ["HELLO", "HELLO_PROMPT", "MODEL", "CodexTask", "is_turn", "last_user_text",
           "tool_outputs"]

MODEL = "gpt-5.3-codex"
HELLO_PROMPT = "Say hello in five words."
HELLO = "Hello from the fake Codex."
READ_ID, PATCH_ID, RUN_ID = "call_ReadCalc0001", "call_PatchCalc002", "call_RunCalc00003"
TOOL_OUTPUTS = ("function_call_output", "custom_tool_call_output")


def is_turn(recorded: Recorded) -> bool:
    return recorded.method == "POST" and recorded.path.endswith("/responses")


def tool_outputs(body: dict[str, Any]) -> list[dict[str, Any]]:
    """Every tool output item of a Responses request, in order."""
    return [item for item in body.get("input") or [] if item.get("type") in TOOL_OUTPUTS]


def last_user_text(body: dict[str, Any]) -> str:
    """The text of the request's last user message."""
    users = [item for item in body.get("input") or []
             if item.get("type") == "message" and item.get("role") == "user"]
    if not users:
        return ""
    return "".join(part.get("text", "") for part in users[-1].get("content") or [])


# --- the wire format ---------------------------------------------------------------------


class _Stream:
    """One Responses stream being built: numbered events, the finished output items."""

    def __init__(self, response_id: str) -> None:
        self.response_id = response_id
        self.events: list[bytes] = []
        self.output: list[dict[str, Any]] = []
        self._sequence = itertools.count()

    def emit(self, kind: str, **fields: Any) -> None:
        self.events.append(sse({"type": kind, "sequence_number": next(self._sequence),
                                **fields}, kind))

    def response(self, status: str, usage: dict[str, Any] | None = None) -> dict[str, Any]:
        return {"id": self.response_id, "object": "response", "created_at": 1765000000,
                "status": status, "model": MODEL, "output": list(self.output),
                "parallel_tool_calls": False, "tool_choice": "auto", "tools": [],
                "usage": usage}

    def item(self, item: dict[str, Any], deltas: list[tuple[str, dict[str, Any]]],
             done: dict[str, Any]) -> None:
        index = len(self.output)
        self.emit("response.output_item.added", output_index=index,
                  item={**item, **_empty(item["type"]), "status": "in_progress"})
        for kind, fields in deltas:
            self.emit(kind, item_id=item["id"], output_index=index, **fields)
        self.output.append({**item, **done, "status": "completed"})
        self.emit("response.output_item.done", output_index=index, item=self.output[-1])


def _empty(kind: str) -> dict[str, Any]:
    """An output item of ``kind`` as it is added, before its deltas (made anew)."""
    empty: dict[str, dict[str, Any]] = {
        "message": {"content": []}, "reasoning": {"summary": []},
        "function_call": {"arguments": ""}, "custom_tool_call": {"input": ""}}
    return empty[kind]


def reasoning(stream: _Stream, item_id: str, *parts: str) -> None:
    text = "".join(parts)
    part = {"type": "summary_text", "text": ""}
    deltas = [("response.reasoning_summary_part.added", {"summary_index": 0, "part": part})]
    deltas += [("response.reasoning_summary_text.delta", {"summary_index": 0, "delta": p})
               for p in parts]
    deltas += [("response.reasoning_summary_text.done", {"summary_index": 0, "text": text}),
               ("response.reasoning_summary_part.done",
                {"summary_index": 0, "part": {**part, "text": text}})]
    stream.item({"id": item_id, "type": "reasoning"}, deltas,
                {"summary": [{**part, "text": text}]})


def message(stream: _Stream, item_id: str, *parts: str) -> None:
    text = "".join(parts)
    part = {"type": "output_text", "annotations": [], "logprobs": [], "text": ""}
    where = {"content_index": 0}
    deltas = [("response.content_part.added", {**where, "part": part})]
    deltas += [("response.output_text.delta", {**where, "delta": p, "logprobs": []})
               for p in parts]
    deltas += [("response.output_text.done", {**where, "text": text, "logprobs": []}),
               ("response.content_part.done", {**where, "part": {**part, "text": text}})]
    stream.item({"id": item_id, "type": "message", "role": "assistant"}, deltas,
                {"content": [{**part, "text": text}]})


def function_call(stream: _Stream, item_id: str, call_id: str, name: str,
                  arguments: dict[str, Any]) -> None:
    text = json.dumps(arguments)
    third = max(len(text) // 3, 1)
    deltas = [("response.function_call_arguments.delta", {"delta": piece})
              for piece in (text[:third], text[third:2 * third], text[2 * third:])]
    deltas.append(("response.function_call_arguments.done", {"name": name, "arguments": text}))
    stream.item({"id": item_id, "type": "function_call", "call_id": call_id, "name": name},
                deltas, {"arguments": text})


def custom_tool_call(stream: _Stream, item_id: str, call_id: str, name: str,
                     text: str) -> None:
    half = max(len(text) // 2, 1)
    deltas = [("response.custom_tool_call_input.delta", {"delta": piece})
              for piece in (text[:half], text[half:])]
    deltas.append(("response.custom_tool_call_input.done", {"input": text}))
    stream.item({"id": item_id, "type": "custom_tool_call", "call_id": call_id,
                 "name": name}, deltas, {"input": text})


def finished(stream: _Stream, usage: tuple[int, int]) -> Reply:
    """``stream`` with its ``response.created``/``in_progress`` before and its
    ``response.completed`` (with ``usage``) after."""
    body = stream.events
    stream.events = []
    stream.emit("response.created", response=stream.response("in_progress"))
    stream.emit("response.in_progress", response=stream.response("in_progress"))
    head, stream.events = stream.events, []
    tokens_in, tokens_out = usage
    stream.emit("response.completed", response=stream.response("completed", {
        "input_tokens": tokens_in, "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": tokens_out, "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": tokens_in + tokens_out}))
    return Reply(events=(*head, *body, *stream.events))


# --- the script ------------------------------------------------------------------------


PATCH = ("*** Begin Patch\n*** Update File: calc.py\n@@\n def add(a, b):\n"
         "-    return a - b\n+    return a + b\n*** End Patch\n")


@dataclass(frozen=True)
class CodexTask(CalcTask):
    """The script on ``cwd/calc.py``; :meth:`responder` answers the server."""

    def responder(self, recorded: Recorded) -> Reply:
        """Runs on a server thread: the reply to one request."""
        if not is_turn(recorded):
            return Reply(status=404, body=json.dumps({"error": {
                "message": f"no {recorded.method} {recorded.path} here",
                "type": "invalid_request_error", "code": None}}).encode())
        if last_user_text(recorded.body) == HELLO_PROMPT:
            stream = _Stream("resp_hello0000000000000001")
            message(stream, "msg_hello000000000000001", *HELLO.partition(" the "))
            return finished(stream, (900, 12))
        return self.step(len(tool_outputs(recorded.body)))

    def step(self, done: int) -> Reply:
        """The model's reply after ``done`` tool outputs of the coding task."""
        stream = _Stream(f"resp_calc{done:016d}")
        if done == 0:
            reasoning(stream, "rs_calc0000000000000001", "The sum is wrong. ",
                      "Read calc.py first.")
            message(stream, "msg_calc000000000000001", "Let me read ", "calc.py.")
            function_call(stream, "fc_calc0000000000000001", READ_ID, "exec_command",
                          {"cmd": "cat calc.py", "workdir": str(self.cwd)})
            return finished(stream, (1800, 60))
        if done == 1:
            message(stream, "msg_calc000000000000002", "`add` subtracts. ", "Fixing it.")
            custom_tool_call(stream, "ctc_calc000000000000002", PATCH_ID, "apply_patch", PATCH)
            return finished(stream, (1900, 80))
        if done == 2:
            message(stream, "msg_calc000000000000003", "Now running it.")
            function_call(stream, "fc_calc0000000000000003", RUN_ID, "exec_command",
                          {"cmd": "python3 calc.py", "workdir": str(self.cwd)})
            return finished(stream, (2000, 40))
        message(stream, "msg_calc000000000000004", *ANSWER.partition(" now "))
        return finished(stream, (2100, 30))
