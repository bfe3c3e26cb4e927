"""Small helpers shared by the SDK-driven tests: prompt text, wire-order queries.

Pure functions over a :class:`~tests.e2e.sdkhost.SdkHost`'s frame log; run on the test's thread.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from .sdkhost import SdkHost, update_text

__all__ = [
    "ReplayedTurn",
    "host_status",
    "response_index",
    "split_turns",
    "tool",
    "tool_result_text",
    "update_indexes",
    "wire_index",
    "words",
]


def words(text: str) -> list[str]:
    return text.split()


def tool(name: str, args: dict[str, Any]) -> str:
    return f"!tool {name} {json.dumps(args)}"


def wire_index(host: SdkHost, predicate: Any) -> list[int]:
    return [i for i, (d, frame) in enumerate(host.wire) if predicate(d, frame)]


def response_index(host: SdkHost, method: str, session_id: str) -> int:
    """Position on the wire of the response to the latest ``method`` about ``session_id``."""
    request_ids = [
        frame["id"] for d, frame in host.wire
        if d == "outgoing" and frame.get("method") == method
        and (frame.get("params") or {}).get("sessionId") == session_id
    ]
    found = wire_index(host, lambda d, f: d == "incoming" and "method" not in f
                       and f.get("id") == request_ids[-1])
    assert found, f"no response to {method} on the wire"
    return found[0]


def update_indexes(host: SdkHost, session_id: str, kind: str) -> list[int]:
    return wire_index(host, lambda d, f: d == "incoming" and f.get("method") == "session/update"
                      and f["params"].get("sessionId") == session_id
                      and f["params"]["update"].get("sessionUpdate") == kind)


async def host_status(host: SdkHost) -> dict[str, Any]:
    """The host's ``status`` (SPEC §4), which answers on every transport after initialize."""
    result: dict[str, Any] = await host.raw("status", {})
    return result


@dataclass
class ReplayedTurn:
    user: str = ""
    agent: str = ""
    thought: str = ""
    tools: dict[str, list[Any]] = field(default_factory=dict)


def split_turns(updates: list[Any]) -> list[ReplayedTurn]:
    """Group replayed updates into turns; each turn starts with user_message_chunk(s)."""
    turns: list[ReplayedTurn] = []
    previous = ""
    for update in updates:
        kind = update.session_update
        if kind == "user_message_chunk":
            if previous != "user_message_chunk":
                turns.append(ReplayedTurn())
            turns[-1].user += update_text(update)
        elif turns and kind == "agent_message_chunk":
            turns[-1].agent += update_text(update)
        elif turns and kind == "agent_thought_chunk":
            turns[-1].thought += update_text(update)
        elif turns and kind in ("tool_call", "tool_call_update"):
            turns[-1].tools.setdefault(update.tool_call_id, []).append(update)
        previous = kind
    return turns


def tool_result_text(updates: list[Any]) -> str:
    """Everything a client could show as a tool call's result."""
    parts = []
    for u in updates:
        parts.append(json.dumps(u.raw_output))
        parts.extend(json.dumps(c.model_dump()) for c in (u.content or []))
    return " ".join(parts)
