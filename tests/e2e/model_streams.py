"""Streamed replies shaped like real servers' (recorded style), for :mod:`model_server`.

OpenAI Chat Completions: ``data: {chat.completion.chunk}`` frames, a usage-only last
chunk when asked for, then ``data: [DONE]``. Anthropic Messages: ``event:`` +
``data:`` frames from ``message_start`` to ``message_stop``. Pure functions.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from .model_server import Reply

__all__ = [
    "ToolCallPart",
    "anthropic_reply",
    "anthropic_text",
    "anthropic_thinking",
    "anthropic_tool_use",
    "openai_chunk",
    "openai_reply",
    "sse",
]

ToolCallPart = dict[str, Any]


def sse(payload: dict[str, Any] | str, event: str | None = None) -> bytes:
    data = payload if isinstance(payload, str) else json.dumps(payload)
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {data}\n\n".encode()


def openai_chunk(delta: dict[str, Any] | None = None, finish: str | None = None,
                 usage: tuple[int, int] | None = None, choices: bool = True) -> bytes:
    chunk: dict[str, Any] = {
        "id": "chatcmpl-B9MHDbslfkBeAs8l4bebGdFOJ6PeG", "object": "chat.completion.chunk",
        "created": 1741570283, "model": "gpt-test-2025-01-01",
        "system_fingerprint": "fp_06737a9306", "service_tier": "default",
        "choices": [{"index": 0, "delta": delta or {}, "logprobs": None,
                     "finish_reason": finish}] if choices else [],
        "usage": None,
    }
    if usage is not None:
        prompt, completion = usage
        chunk["usage"] = {"prompt_tokens": prompt, "completion_tokens": completion,
                          "total_tokens": prompt + completion,
                          "prompt_tokens_details": {"cached_tokens": 0}}
    return sse(chunk)


def openai_reply(*deltas: dict[str, Any], finish: str = "stop",
                 usage: tuple[int, int] | None = (12, 5), **reply: Any) -> Reply:
    """A whole streamed reply: role chunk, the deltas, the finish chunk, usage, [DONE]."""
    events = [openai_chunk({"role": "assistant", "content": "", "refusal": None})]
    events += [openai_chunk(delta) for delta in deltas]
    events.append(openai_chunk({}, finish=finish))
    if usage is not None:
        events.append(openai_chunk(usage=usage, choices=False))
    events.append(sse("[DONE]"))
    return Reply(events=tuple(events), **reply)


def anthropic_text(index: int, *parts: str) -> list[bytes]:
    events = [sse({"type": "content_block_start", "index": index,
                   "content_block": {"type": "text", "text": ""}}, "content_block_start")]
    events += [sse({"type": "content_block_delta", "index": index,
                    "delta": {"type": "text_delta", "text": part}}, "content_block_delta")
               for part in parts]
    events.append(sse({"type": "content_block_stop", "index": index}, "content_block_stop"))
    return events


def anthropic_thinking(index: int, *parts: str, signature: str = "EqQBCgIYAhIM1gbcDa9GJwZA2b3h"
                       ) -> list[bytes]:
    """A thinking block as Anthropic streams it: ``thinking_delta``s, then its
    ``signature_delta``."""
    events = [sse({"type": "content_block_start", "index": index,
                   "content_block": {"type": "thinking", "thinking": "", "signature": ""}},
                  "content_block_start")]
    events += [sse({"type": "content_block_delta", "index": index,
                    "delta": {"type": "thinking_delta", "thinking": part}}, "content_block_delta")
               for part in parts]
    events.append(sse({"type": "content_block_delta", "index": index,
                       "delta": {"type": "signature_delta", "signature": signature}},
                      "content_block_delta"))
    events.append(sse({"type": "content_block_stop", "index": index}, "content_block_stop"))
    return events


def anthropic_tool_use(index: int, call_id: str, name: str, *json_parts: str) -> list[bytes]:
    events = [sse({"type": "content_block_start", "index": index,
                   "content_block": {"type": "tool_use", "id": call_id, "name": name,
                                     "input": {}}}, "content_block_start")]
    events += [sse({"type": "content_block_delta", "index": index,
                    "delta": {"type": "input_json_delta", "partial_json": part}},
                   "content_block_delta") for part in json_parts]
    events.append(sse({"type": "content_block_stop", "index": index}, "content_block_stop"))
    return events


def anthropic_reply(blocks: Iterable[bytes], stop_reason: str = "end_turn",
                    usage: tuple[int, int] = (25, 7),
                    message_id: str = "msg_01XFDUDYJgAACzvnptvVoYEL",
                    model: str = "claude-test") -> Reply:
    start = {"type": "message_start", "message": {
        "id": message_id, "type": "message", "role": "assistant",
        "content": [], "model": model, "stop_reason": None, "stop_sequence": None,
        "usage": {"input_tokens": usage[0], "output_tokens": 1}}}
    events = [sse(start, "message_start"), sse({"type": "ping"}, "ping"), *blocks,
              sse({"type": "message_delta", "delta": {"stop_reason": stop_reason,
                                                      "stop_sequence": None},
                   "usage": {"output_tokens": usage[1]}}, "message_delta"),
              sse({"type": "message_stop"}, "message_stop")]
    return Reply(events=tuple(events))
