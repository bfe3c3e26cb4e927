"""The ``anthropic`` agent: the Messages API with streaming and tool use.

``POST {base_url}/v1/messages`` with ``x-api-key`` and ``anthropic-version``. The
stream is typed events: ``message_start`` (input usage), ``content_block_start``
(text, ``tool_use`` with its id and name, ``thinking``), ``content_block_delta``
(``text_delta``, ``input_json_delta``, ``thinking_delta``), ``message_delta``
(``stop_reason``, output usage), ``message_stop``, ``ping`` and ``error``.
``stop_reason`` ``max_tokens`` ends the turn ``max_tokens``; ``refusal`` ends it
``refusal``.

Runs on the session actor's thread (created on the worker's IO thread).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import orjson

from actors.worker.agents.llm.conversation import (
    Message,
    ToolResultMessage,
    UserMessage,
    arguments_text,
)
from actors.worker.agents.llm.loop import ModelAgent
from actors.worker.agents.llm.reply import Finish, ReplyBuilder

__all__ = ["AnthropicAgent"]

API_VERSION = "2023-06-01"
DEFAULT_MAX_TOKENS = 8192

_FINISH: dict[str, Finish] = {
    "end_turn": "end",
    "stop_sequence": "end",
    "tool_use": "tool_calls",
    "max_tokens": "max_tokens",
    "refusal": "refusal",
}


def _input(arguments: str) -> dict[str, Any]:
    """Tool input as the API wants it (an object), from stored JSON text."""
    try:
        value = orjson.loads(arguments) if arguments.strip() else {}
    except orjson.JSONDecodeError:
        return {"unparsed_arguments": arguments}
    return value if isinstance(value, dict) else {"arguments": value}


def _blocks(message: Message) -> tuple[str, list[dict[str, Any]]]:
    if isinstance(message, UserMessage):
        return "user", [{"type": "text", "text": message.text}] if message.text else []
    if isinstance(message, ToolResultMessage):
        block = {"type": "tool_result", "tool_use_id": message.call_id,
                 "content": message.text or "(no output)", "is_error": message.is_error}
        return "user", [block]
    blocks: list[dict[str, Any]] = [{"type": "text", "text": message.text}] if message.text else []
    blocks.extend({"type": "tool_use", "id": call.call_id, "name": call.name,
                   "input": _input(call.arguments)} for call in message.tool_calls)
    return "assistant", blocks


def _messages(messages: Sequence[Message]) -> list[dict[str, Any]]:
    """Alternating user/assistant messages (consecutive ones of a role merged)."""
    wire: list[dict[str, Any]] = []
    for message in messages:
        role, blocks = _blocks(message)
        if not blocks:
            continue
        if wire and wire[-1]["role"] == role:
            wire[-1]["content"].extend(blocks)
        else:
            wire.append({"role": role, "content": blocks})
    return wire


class AnthropicAgent(ModelAgent):
    """The Messages API (``stream: true``)."""

    provider: ClassVar[str] = "anthropic"
    needs_api_key: ClassVar[bool] = True
    default_max_tokens: ClassVar[int | None] = DEFAULT_MAX_TOKENS

    def endpoint(self) -> str:
        return f"{self.settings.base_url}/v1/messages"

    def request_headers(self) -> dict[str, str]:
        headers = {"content-type": "application/json", "accept": "text/event-stream",
                   "anthropic-version": API_VERSION}
        if self.settings.api_key:
            headers["x-api-key"] = self.settings.api_key
        headers.update(self.settings.headers)
        return headers

    def request_body(self, system: str, messages: Sequence[Message]) -> dict[str, Any]:
        settings = self.settings
        body: dict[str, Any] = {
            "model": settings.model,
            "system": system,
            "messages": _messages(messages),
            "max_tokens": settings.max_tokens or DEFAULT_MAX_TOKENS,
            "stream": True,
        }
        if self.tools:
            body["tools"] = [{"name": t.name, "description": t.description,
                              "input_schema": t.parameters} for t in self.tools]
        if settings.temperature is not None:
            body["temperature"] = settings.temperature
        return body

    def read_payload(self, payload: dict[str, Any], reply: ReplyBuilder) -> None:
        kind = payload.get("type")
        if kind == "error":
            error = payload.get("error")
            message = error.get("message") if isinstance(error, dict) else error
            raise self.failure(f"error in the stream: {str(message)[:300]}")
        if kind == "message_start":
            message = payload.get("message")
            usage = message.get("usage") if isinstance(message, dict) else None
            if isinstance(usage, dict):
                reply.usage(_count(usage, "input_tokens"), _count(usage, "output_tokens"))
        elif kind == "content_block_start":
            _block_start(payload, reply)
        elif kind == "content_block_delta":
            _block_delta(payload, reply)
        elif kind == "message_delta":
            _message_delta(payload, reply)


def _message_delta(payload: dict[str, Any], reply: ReplyBuilder) -> None:
    delta = payload.get("delta")
    reason = delta.get("stop_reason") if isinstance(delta, dict) else None
    if isinstance(reason, str):
        reply.finish(_FINISH.get(reason, "end"))
    usage = payload.get("usage")
    if isinstance(usage, dict):
        reply.usage(_count(usage, "input_tokens") or None, _count(usage, "output_tokens"))


def _block_start(payload: dict[str, Any], reply: ReplyBuilder) -> None:
    block = payload.get("content_block")
    index = payload.get("index")
    if not isinstance(block, dict) or not isinstance(index, int):
        return
    if block.get("type") == "tool_use":
        given = block.get("input")
        reply.tool_delta(index, str(block.get("id") or "") or None, str(block.get("name") or ""),
                         arguments_text(given) if given else "")
    elif block.get("type") == "text" and block.get("text"):
        reply.text(str(block["text"]))
    elif block.get("type") == "thinking" and block.get("thinking"):
        reply.thought(str(block["thinking"]))


def _block_delta(payload: dict[str, Any], reply: ReplyBuilder) -> None:
    delta = payload.get("delta")
    index = payload.get("index")
    if not isinstance(delta, dict):
        return
    kind = delta.get("type")
    if kind == "text_delta" and isinstance(delta.get("text"), str):
        reply.text(delta["text"])
    elif kind == "thinking_delta" and isinstance(delta.get("thinking"), str):
        reply.thought(delta["thinking"])
    elif kind == "input_json_delta" and isinstance(index, int):
        reply.tool_delta(index, None, None, str(delta.get("partial_json") or ""))


def _count(usage: Any, key: str) -> int:
    value = usage.get(key) if isinstance(usage, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else 0
