"""A local Gemini API for Gemini CLI: a real HTTP server
(:class:`~tests.e2e.model_server.ModelServer`) answering each request from what it asks.

The conversation (:class:`GeminiTask`) is two prompts in one session, played with Gemini
CLI's own tool names: a greeting answered with text only, then the coding task of
:mod:`tests.vendors.anthropic_api`: read ``calc.py`` (``read_file``), fix its bug
(``replace``), run it (``run_shell_command``), answer. Each model turn is
``POST /v1beta/models/{model}:streamGenerateContent?alt=sse`` answered as the API
documents it: ``data: {GenerateContentResponse}`` lines whose ``candidates[0].content``
``parts`` carry thoughts (``thought: true``), text and ``functionCall`` (with an ``id``,
so that the CLI's tool call ids do not depend on the clock), the last one with
``finishReason`` and ``usageMetadata``. The step is chosen by how many
``functionResponse`` parts follow the prompt, so retries and a second process replay the
same answers. The CLI's side requests are answered too: ``:generateContent`` with a
``responseJsonSchema`` (its model router's complexity classifier, its next-speaker
check) gets a JSON object of that schema; ``:countTokens`` a ``totalTokens``; anything
else the API's 404 error body. Everything is recorded by the server, headers included
(the key comes as ``x-goog-api-key``).

The responder runs on the server's request threads; the test's thread reads
:attr:`GeminiTask.server`'s records.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from tests.e2e.model_server import Recorded, Reply

from .bench import ANSWER, PROMPT, CalcTask

__all__ = ["EDIT_ID", "GREETING", "HELLO", "READ_ID", "SHELL_ID", "GeminiTask", "Kind",
           "function_responses", "kind_of"]

GREETING = "Hi! In one sentence: what can you do here?"
HELLO = "I can read, edit and run the files of this workspace for you."
READ_ID, EDIT_ID, SHELL_ID = "call-read-calc-1", "call-edit-calc-2", "call-run-calc-3"
_SIGNATURE = "CiQB0e2Kb6tXf0Jt4dy3QHkzSd7FlnQ8o2VgQn9wXEkFj3m1FJcSVQHR7Ypv"
_MODEL_PATH = re.compile(r"^/v1beta/models/([^/:?]+):(\w+)")

Kind = str  # "turn" | "json" | "count_tokens" | "other"


def kind_of(recorded: Recorded) -> Kind:
    """What Gemini CLI asked for in ``recorded``."""
    found = _MODEL_PATH.match(recorded.path)
    if recorded.method != "POST" or found is None:
        return "other"
    method = found[2]
    if method == "streamGenerateContent" and "alt=sse" in recorded.path:
        return "turn"
    if method == "generateContent" and _json_schema(recorded.body):
        return "json"
    if method == "countTokens":
        return "count_tokens"
    return "other"


def _json_schema(body: dict[str, Any]) -> dict[str, Any]:
    config = body.get("generationConfig") or {}
    schema: dict[str, Any] = config.get("responseJsonSchema") or config.get(
        "responseSchema") or {}
    return schema


def _parts(body: dict[str, Any]) -> list[dict[str, Any]]:
    return [part for content in body.get("contents") or []
            for part in content.get("parts") or []]


def function_responses(body: dict[str, Any]) -> list[dict[str, Any]]:
    """Every ``functionResponse`` of a request, in order."""
    return [part["functionResponse"] for part in _parts(body) if "functionResponse" in part]


def _after_last_prompt(body: dict[str, Any]) -> tuple[str, list[dict[str, Any]]]:
    """Which of the task's prompts the request answers (the last one the user sent),
    and the parts that follow it."""
    parts = _parts(body)
    for index in range(len(parts) - 1, -1, -1):
        text = str(parts[index].get("text") or "")
        for prompt in (PROMPT, GREETING):
            if prompt in text:
                return prompt, parts[index + 1:]
    return "", parts


# --- the wire format -----------------------------------------------------------------


def _event(response: dict[str, Any]) -> bytes:
    """One SSE line of a streamed ``GenerateContentResponse``, as the API frames it."""
    return b"data: " + json.dumps(response).encode() + b"\r\n\r\n"


def _response(model: str, parts: list[dict[str, Any]], response_id: str,
              finish: str | None = None, usage: tuple[int, int] | None = None
              ) -> dict[str, Any]:
    candidate: dict[str, Any] = {"content": {"role": "model", "parts": parts}, "index": 0}
    if finish is not None:
        candidate["finishReason"] = finish
    response: dict[str, Any] = {"candidates": [candidate], "modelVersion": model,
                                "responseId": response_id}
    if usage is not None:
        response["usageMetadata"] = {"promptTokenCount": usage[0],
                                     "candidatesTokenCount": usage[1],
                                     "totalTokenCount": usage[0] + usage[1]}
    return response


def stream_reply(model: str, chunks: list[list[dict[str, Any]]], response_id: str,
                 usage: tuple[int, int]) -> Reply:
    """A streamed reply: each of ``chunks`` (its parts) one event, the last with
    ``finishReason: STOP`` and the usage."""
    events = [_event(_response(model, parts, response_id)) for parts in chunks[:-1]]
    events.append(_event(_response(model, chunks[-1], response_id, "STOP", usage)))
    return Reply(events=tuple(events))


def _thought(subject: str, text: str) -> dict[str, Any]:
    """A thought summary part, as the API words one: a bold subject, then the text."""
    return {"text": f"**{subject}**\n\n{text}", "thought": True}


def _call(call_id: str, name: str, args: dict[str, Any]) -> dict[str, Any]:
    return {"functionCall": {"id": call_id, "name": name, "args": args},
            "thoughtSignature": _SIGNATURE}


def _json_answer(schema: dict[str, Any]) -> dict[str, Any]:
    """An object of ``schema`` (the CLI's routing and next-speaker questions)."""
    answer: dict[str, Any] = {}
    for name, spec in (schema.get("properties") or {}).items():
        if name == "complexity_score":
            answer[name] = 20
        elif name == "next_speaker":
            answer[name] = "user"
        elif spec.get("enum"):
            answer[name] = spec["enum"][0]
        elif str(spec.get("type")).upper() in ("INTEGER", "NUMBER"):
            answer[name] = 1
        elif str(spec.get("type")).upper() == "BOOLEAN":
            answer[name] = False
        else:
            answer[name] = "A routine, single-file task."
    return answer


def _not_found(path: str) -> Reply:
    return Reply(status=404, body=json.dumps({"error": {
        "code": 404, "message": f"no {path} here", "status": "NOT_FOUND"}}).encode())


# --- the task --------------------------------------------------------------------------


@dataclass(frozen=True)
class GeminiTask(CalcTask):
    """The greeting and the coding task on ``cwd/calc.py``; :meth:`responder` answers
    the server."""

    def responder(self, recorded: Recorded) -> Reply:
        """Runs on a server thread: the reply to one request."""
        kind = kind_of(recorded)
        found = _MODEL_PATH.match(recorded.path)
        model = found[1] if found else "gemini"
        if kind == "turn":
            return self.turn(model, recorded.body)
        if kind == "json":
            text = json.dumps(_json_answer(_json_schema(recorded.body)))
            body = _response(model, [{"text": text}], "resp-json-0001", "STOP", (900, 20))
            return Reply(body=json.dumps(body).encode())
        if kind == "count_tokens":
            return Reply(body=b'{"totalTokens": 2048}')
        return _not_found(recorded.path)

    def turn(self, model: str, body: dict[str, Any]) -> Reply:
        """The model's streamed turn for the prompt ``body`` answers."""
        prompt, after = _after_last_prompt(body)
        if prompt == GREETING:
            thought = _thought("Answering a greeting", "Say what I can do.")
            return stream_reply(model, [[thought], [{"text": HELLO[:22]}],
                                        [{"text": HELLO[22:]}]], "resp-hello-0001", (1500, 15))
        if prompt == PROMPT:
            return self.step(model, sum("functionResponse" in part for part in after))
        return _not_found("prompt")

    def step(self, model: str, done: int) -> Reply:
        """The model's reply after ``done`` function responses."""
        path = str(self.calc)
        if done == 0:
            return stream_reply(model, [
                [_thought("Reading the code", "The sum is wrong: read calc.py first.")],
                [{"text": "Let me read calc.py."}],
                [_call(READ_ID, "read_file", {"file_path": path})],
            ], "resp-read-0001", (1800, 60))
        if done == 1:
            edit = {"file_path": path, "instruction": "Make add return the sum.",
                    "old_string": "    return a - b", "new_string": "    return a + b"}
            return stream_reply(model, [[{"text": "`add` subtracts. Fixing it."}],
                                        [_call(EDIT_ID, "replace", edit)]],
                                "resp-edit-0002", (1900, 80))
        if done == 2:
            run = {"command": "python3 calc.py", "description": "Run calc.py"}
            return stream_reply(model, [[{"text": "Now running it."}],
                                        [_call(SHELL_ID, "run_shell_command", run)]],
                                "resp-shell-0003", (2000, 40))
        first, sep, rest = ANSWER.partition(" now ")
        return stream_reply(model, [[{"text": first}], [{"text": sep + rest}]],
                            "resp-answer-0004", (2100, 30))
