"""An external ACP agent's ``session/update`` notifications as zeroclaw events.

Pure functions plus one small per-turn state (:class:`ToolNames`); run on the
session actor's thread. A ``current_mode_update`` (the agent switched its own mode,
e.g. it left plan mode mid-turn) is a :class:`ipc.events.CurrentMode`. Kinds
without a zeroclaw event (the agent's own commands, config options, session info,
replayed user chunks) give no event: zeroclaw keeps its own commands and titles.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import Any, cast

import orjson

from ipc.events import (
    CurrentMode,
    Event,
    MessageChunk,
    PlanEntry,
    PlanUpdate,
    ThoughtChunk,
    ToolCallFinished,
    ToolCallStarted,
    UsageUpdate,
)

__all__ = ["ToolNames", "content_text", "events_from_update", "events_from_updates",
           "merged_chunks", "merged_events"]

_FINAL = ("completed", "failed")


class ToolNames:
    """The tool calls of one turn: name by id, and which have finished."""

    def __init__(self) -> None:
        self.names: dict[str, str] = {}
        self.finished: set[str] = set()


def content_text(block: Any) -> str:
    """The text of one ACP content block (a resource by its text or uri; else empty)."""
    if not isinstance(block, Mapping):
        return ""
    kind = block.get("type")
    if kind == "text":
        return _str(block.get("text"))
    if kind == "resource_link":
        return _str(block.get("uri"))
    if kind == "resource":
        resource = block.get("resource")
        if isinstance(resource, Mapping):
            return _str(resource.get("text")) or _str(resource.get("uri"))
    return ""


def _tool_content_text(content: Any) -> str:
    """A tool call's ``content`` list as text: content blocks, diffs by path, terminals."""
    if not isinstance(content, list):
        return ""
    parts = []
    for item in content:
        if not isinstance(item, Mapping):
            continue
        if item.get("type") == "content":
            parts.append(content_text(item.get("content")))
        elif item.get("type") == "diff":
            parts.append(f"diff of {_str(item.get('path'))}")
        elif item.get("type") == "terminal":
            parts.append(f"terminal {_str(item.get('terminalId'))}")
    return "\n".join(p for p in parts if p)


def events_from_update(update: Any, tools: ToolNames) -> list[Event]:
    """The zeroclaw events for one ``update`` object (empty for kinds zeroclaw leaves out)."""
    if not isinstance(update, Mapping):
        return []
    kind = update.get("sessionUpdate")
    if kind == "agent_message_chunk":
        text = content_text(update.get("content"))
        return [MessageChunk(text)] if text else []
    if kind == "agent_thought_chunk":
        text = content_text(update.get("content"))
        return [ThoughtChunk(text)] if text else []
    if kind == "tool_call":
        return _tool_call(update, tools)
    if kind == "tool_call_update":
        return _tool_call_update(update, tools)
    if kind == "plan":
        return _plan(update)
    if kind == "usage_update":
        return _usage(update)
    if kind == "current_mode_update":
        mode_id = _str(update.get("currentModeId"))
        return [CurrentMode(mode_id)] if mode_id else []
    return []


def events_from_updates(updates: list[Any], tools: ToolNames) -> list[Event]:
    """The zeroclaw events of several ``update`` objects, in order."""
    events: list[Event] = []
    for update in updates:
        events.extend(events_from_update(update, tools))
    return events


def merged_chunks(events: list[Event]) -> list[Event]:
    """``events`` with each run of consecutive message (or thought) chunks as one chunk
    of their joined text: what arrived together goes out as one update."""
    merged: list[Event] = []
    for kind, run in itertools.groupby(events, key=type):
        if kind is MessageChunk:
            merged.append(MessageChunk("".join(cast(MessageChunk, e).text for e in run)))
        elif kind is ThoughtChunk:
            merged.append(ThoughtChunk("".join(cast(ThoughtChunk, e).text for e in run)))
        else:
            merged.extend(run)
    return merged


def merged_events(updates: list[Any], tools: ToolNames) -> list[Event]:
    """``merged_chunks(events_from_updates(updates, tools))`` in one pass: a streaming
    agent's text chunks are joined as they come, with no event made for each."""
    merged: list[Event] = []
    texts: list[str] = []  # the run of message chunks being joined
    for update in updates:
        text = _message_text(update)
        if text is not None:
            texts.append(text)
            continue
        events = events_from_update(update, tools)
        if events and texts:
            merged.append(MessageChunk("".join(texts)))
            texts = []
        merged.extend(events)
    if texts:
        merged.append(MessageChunk("".join(texts)))
    merged = [e for e in merged if type(e) is not MessageChunk or e.text]  # "" is no chunk
    return merged_chunks(merged) if len(merged) > 1 else merged


def _message_text(update: Any) -> str | None:
    """The text of an ``agent_message_chunk`` holding a text block; else None."""
    if type(update) is not dict or update.get("sessionUpdate") != "agent_message_chunk":
        return None
    content = update.get("content")
    if type(content) is not dict or content.get("type") != "text":
        return None
    text = content.get("text")
    return text if type(text) is str else None


def _tool_call(update: Mapping[str, Any], tools: ToolNames) -> list[Event]:
    call_id = _str(update.get("toolCallId"))
    if not call_id:
        return []
    title = _str(update.get("title")) or "tool call"
    kind = _str(update.get("kind")) or "other"
    tools.names[call_id] = title
    events: list[Event] = [
        ToolCallStarted(call_id, title, title, kind, update.get("rawInput"))
    ]
    status = update.get("status")
    if status in ("in_progress", *_FINAL) or update.get("content"):
        events.extend(_tool_call_update(update, tools))
    return events


def _tool_call_update(update: Mapping[str, Any], tools: ToolNames) -> list[Event]:
    call_id = _str(update.get("toolCallId"))
    if not call_id or call_id in tools.finished:
        return []
    status = update.get("status")
    if status not in ("in_progress", *_FINAL):
        status = "in_progress"
    if status in _FINAL:
        tools.finished.add(call_id)
    name = _str(update.get("title")) or tools.names.get(call_id, "tool call")
    raw_output = update.get("rawOutput")
    text = _tool_content_text(update.get("content")) or _raw_output_text(raw_output)
    return [ToolCallFinished(call_id, name, str(status), raw_output, text)]


def _raw_output_text(raw_output: Any) -> str:
    """A result given only as ``rawOutput``, as text (what the turn record keeps and a
    replay shows): a string as it is, anything else as JSON."""
    if raw_output is None or isinstance(raw_output, str):
        return raw_output or ""
    return orjson.dumps(raw_output, option=orjson.OPT_SORT_KEYS).decode()


def _plan(update: Mapping[str, Any]) -> list[Event]:
    entries = update.get("entries")
    if not isinstance(entries, list):
        return []
    plan = tuple(
        PlanEntry(content=_str(e.get("content")), priority=_str(e.get("priority")) or "medium",
                  status=_str(e.get("status")) or "pending")
        for e in entries if isinstance(e, Mapping)
    )
    return [PlanUpdate(plan)]


def _usage(update: Mapping[str, Any]) -> list[Event]:
    used, size = update.get("used"), update.get("size")
    if not (isinstance(used, int) and isinstance(size, int) and _count(used) and _count(size)):
        return []
    cost = update.get("cost")
    amount = cost.get("amount") if isinstance(cost, Mapping) else None
    if isinstance(amount, bool) or not isinstance(amount, int | float):
        amount = None
    return [UsageUpdate(used=int(used), size=int(size),
                        cost=float(amount) if amount is not None else None)]


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _str(value: Any) -> str:
    return value if isinstance(value, str) else ""
