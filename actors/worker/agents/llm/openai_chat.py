"""The ``openai`` agent: the Chat Completions API with streaming and tool calls.

Spoken by OpenAI, OpenRouter, Ollama (``/v1``), vLLM, llama.cpp's server and LM
Studio. What real servers differ in, and how it is read here:

- usage comes in a last chunk with no choices (``stream_options.include_usage``),
  or not at all (then the loop estimates);
- tool-call fragments are keyed by ``index``, with the ``id`` on the first
  fragment, on every one, or missing;
- reasoning arrives as ``reasoning_content`` or ``reasoning`` deltas, or as
  ``<think>…</think>`` inside the content: all become thoughts;
- ``finish_reason`` ``length`` ends the turn ``max_tokens``; ``content_filter`` or
  a ``refusal`` delta ends it ``refusal``; an ``error`` payload fails it.

Runs on the session actor's thread (created on the worker's IO thread).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from actors.worker.agents.llm.conversation import (
    Message,
    ToolResultMessage,
    UserMessage,
    arguments_text,
)
from actors.worker.agents.llm.loop import ModelAgent
from actors.worker.agents.llm.reply import Finish, ReplyBuilder

__all__ = ["OpenAIAgent"]

_FINISH: dict[str, Finish] = {
    "stop": "end",
    "length": "max_tokens",
    "content_filter": "refusal",
    "tool_calls": "tool_calls",
    "function_call": "tool_calls",
}


def _message(message: Message) -> dict[str, Any]:
    if isinstance(message, UserMessage):
        return {"role": "user", "content": message.text}
    if isinstance(message, ToolResultMessage):
        return {"role": "tool", "tool_call_id": message.call_id, "content": message.text}
    wire: dict[str, Any] = {"role": "assistant", "content": message.text}
    if message.tool_calls:
        wire["tool_calls"] = [
            {"id": call.call_id, "type": "function",
             "function": {"name": call.name, "arguments": call.arguments}}
            for call in message.tool_calls
        ]
    return wire


class OpenAIAgent(ModelAgent):
    """Chat Completions (``POST {base_url}/chat/completions``, ``stream: true``)."""

    provider: ClassVar[str] = "openai"
    needs_api_key: ClassVar[bool] = False  # local servers need none

    def endpoint(self) -> str:
        return f"{self.settings.base_url}/chat/completions"

    def request_headers(self) -> dict[str, str]:
        headers = {"content-type": "application/json", "accept": "text/event-stream"}
        if self.settings.api_key:
            headers["authorization"] = f"Bearer {self.settings.api_key}"
        headers.update(self.settings.headers)
        return headers

    def request_body(self, system: str, messages: Sequence[Message]) -> dict[str, Any]:
        settings = self.settings
        body: dict[str, Any] = {
            "model": settings.model,
            "messages": [{"role": "system", "content": system}, *map(_message, messages)],
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if self.tools:
            body["tools"] = [
                {"type": "function", "function": {"name": t.name, "description": t.description,
                                                  "parameters": t.parameters}}
                for t in self.tools
            ]
        if settings.temperature is not None:
            body["temperature"] = settings.temperature
        if settings.max_tokens is not None:
            body["max_tokens"] = settings.max_tokens
        return body

    def read_payload(self, payload: dict[str, Any], reply: ReplyBuilder) -> None:
        error = payload.get("error")
        if error is not None:
            message = error.get("message") if isinstance(error, dict) else error
            raise self.failure(f"error in the stream: {str(message)[:300]}")
        usage = payload.get("usage")
        if isinstance(usage, dict):
            reply.usage(_count(usage, "prompt_tokens"), _count(usage, "completion_tokens"))
        for choice in payload.get("choices") or ():
            if isinstance(choice, dict) and choice.get("index", 0) == 0:
                _read_choice(choice, reply)


def _read_choice(choice: dict[str, Any], reply: ReplyBuilder) -> None:
    delta = choice.get("delta")
    if isinstance(delta, dict):
        _read_delta(delta, reply)
    reason = choice.get("finish_reason")
    if isinstance(reason, str) and reason:
        reply.finish(_FINISH.get(reason, "end"))


def _read_delta(delta: dict[str, Any], reply: ReplyBuilder) -> None:
    for key in ("reasoning_content", "reasoning"):
        if isinstance(delta.get(key), str):
            reply.thought(delta[key])
            break
    if isinstance(delta.get("content"), str):
        reply.text(delta["content"])
    if isinstance(delta.get("refusal"), str):
        reply.refusal(delta["refusal"])
    for call in delta.get("tool_calls") or ():
        if not isinstance(call, dict):
            continue
        function = call.get("function")
        if not isinstance(function, dict):
            function = {}
        index = call.get("index")
        call_id = call.get("id")
        name = function.get("name")
        arguments = function.get("arguments")
        reply.tool_delta(
            index if isinstance(index, int) and not isinstance(index, bool) else None,
            call_id if isinstance(call_id, str) and call_id else None,
            name if isinstance(name, str) and name else None,
            arguments_text(arguments) if arguments is not None else "",
        )


def _count(usage: dict[str, Any], key: str) -> int:
    value = usage.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else 0
