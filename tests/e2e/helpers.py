"""Small helpers shared by the end-to-end tests: prompt text, wire-order queries, replays
and what the store holds.

Pure functions over a :class:`~tests.e2e.sdkhost.SdkHost`'s frame log, raw frames or a
store file; run on the test's thread.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from acp.schema import SessionNotification

from ipc.events import TextItem, ToolItem, TurnItem
from storage.models import StoredSession
from storage.store import StoreReader

from .sdkhost import SdkHost, update_text

__all__ = [
    "CANCEL_MARKER",
    "ReplayedTurn",
    "assert_denied_and_cancelled",
    "host_status",
    "response_index",
    "sdk_updates",
    "split_turns",
    "stored_session",
    "tool",
    "tool_result_text",
    "update_indexes",
    "wire_index",
    "words",
]

#: How a cancelled turn's text ends (SPEC §3, ``session/cancel``).
CANCEL_MARKER = "[turn cancelled via client]"


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


def sdk_updates(params: Iterable[dict[str, Any]]) -> list[Any]:
    """Raw ACP ``session/update`` params (``{sessionId, update}``) as the SDK's typed
    updates, ready for :func:`split_turns`."""
    return [SessionNotification.model_validate(p).update for p in params]


def stored_session(config_dir: Path, sid: str) -> tuple[StoredSession | None, list[TurnItem]]:
    """The row and the items the store under ``config_dir`` holds for ``sid``."""
    reader = StoreReader(config_dir / "data" / "sessions" / "acp-sessions.db")
    try:
        return reader.get_session(sid), reader.load_items(sid)
    finally:
        reader.close()


def assert_denied_and_cancelled(config_dir: Path, sid: str, turns: int) -> None:
    """On disk: ``sid`` has ``turns`` turns, the last one cancelled with its one tool
    call ``denied``, and the session is not closed (it can go on)."""
    session, items = stored_session(config_dir, sid)
    assert session is not None and session.closed_at is None, session
    assert session.turn_count == turns, session
    [call] = [i for i in items if isinstance(i, ToolItem)]
    assert call.outcome == "denied", call
    last = items[-1]
    assert isinstance(last, TextItem) and last.text.endswith(CANCEL_MARKER), last
