"""A hosted ACP agent's ``session/update`` objects as the events that carry them on.

Every update goes on as the agent sent it, one event each, in order: a plain text
chunk (an ``agent_message_chunk`` or ``agent_thought_chunk`` whose only fields are
``sessionUpdate`` and a ``{type: "text", text}`` content) as a
:class:`ipc.events.MessageChunk` / :class:`ipc.events.ThoughtChunk`, which the host
renders back to the same update on the way every streamed chunk takes; any other
update as an :class:`ipc.events.AgentUpdate` holding it untouched (``_meta``, fields
zeroclaw does not know, everything). Only what is not an ACP update at all (not an
object, no ``sessionUpdate`` string) is left out.

Pure functions; run on the agent process's loop thread or the session's actor thread.
"""

from __future__ import annotations

import logging
from typing import Any

from ipc.events import AgentUpdate, Event, MessageChunk, ThoughtChunk

__all__ = ["relayed_events"]

log = logging.getLogger("zeroclaw.agent")

_CHUNKS: dict[str, type[MessageChunk] | type[ThoughtChunk]] = {
    "agent_message_chunk": MessageChunk,
    "agent_thought_chunk": ThoughtChunk,
}


def relayed_events(updates: list[Any]) -> list[Event]:
    """One event for each of the agent's ``updates``, in order."""
    events: list[Event] = []
    for update in updates:
        if type(update) is not dict or type(update.get("sessionUpdate")) is not str:
            log.debug("dropped a session/update that is not an ACP update: %.80r", update)
            continue
        chunk = _plain_chunk(update)
        events.append(chunk if chunk is not None else AgentUpdate(update))
    return events


def _plain_chunk(update: dict[str, Any]) -> MessageChunk | ThoughtChunk | None:
    """The chunk event of a plain text chunk; None for any other update."""
    if len(update) != 2:
        return None
    chunk = _CHUNKS.get(update["sessionUpdate"])
    content = update.get("content")
    if chunk is None or type(content) is not dict or len(content) != 2:
        return None
    text = content.get("text")
    if content.get("type") != "text" or type(text) is not str:
        return None
    return chunk(text)
