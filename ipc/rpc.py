"""The daemon RPC dialect (SPEC §4, ``daemon.sock``): decode params, encode results and events.

Flat ``session/update`` notifications ``{sessionId, type, ...}`` instead of ACP's
nested ``update`` objects, an ``initialize`` that negotiates a protocol version,
and approvals answered by ``session/approve`` instead of a host-initiated request.

Nothing here knows about actors, workers or sockets. Pure functions: safe from
any thread (the daemon calls them on the asyncio loop thread).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from ipc.acp import NewSessionRequest, optional_str, session_entry
from ipc.acp_items import content_text
from ipc.errors import InvalidParams, ProtocolVersionMismatch
from ipc.events import (
    AgentUpdate,
    Event,
    MessageChunk,
    PlanUpdate,
    ThoughtChunk,
    ToolCallFinished,
    ToolCallStarted,
    UserChunk,
)

__all__ = [
    "DECISIONS",
    "ELICITATION_ACTIONS",
    "PROTOCOL_VERSION",
    "Approval",
    "RpcNewSession",
    "approval_request",
    "approve_request",
    "chosen_session_id",
    "elicitation_reply",
    "elicitation_request",
    "encode_event",
    "initialize_result",
    "list_params",
    "listed_session",
    "new_session_request",
    "protocol_version",
    "turn_complete",
    "turn_outcome",
]

PROTOCOL_VERSION: Final = 1
DECISIONS: Final = ("allow_once", "allow_always", "reject_once", "reject_always")
ELICITATION_ACTIONS: Final = ("accept", "decline", "cancel")
_DECISION_ALIASES: Final = {d.replace("_", "-"): d for d in DECISIONS} | {d: d for d in DECISIONS}


def _params(params: Any) -> Mapping[str, Any]:
    if not isinstance(params, Mapping):
        raise InvalidParams("params must be an object")
    return params


# --- initialize ---------------------------------------------------------------


def protocol_version(params: Any) -> int:
    """The client's ``protocolVersion`` (alias ``protocol_version``); -32011 unless it is 1."""
    p = _params(params)
    version = p.get("protocolVersion", p.get("protocol_version"))
    if version is None:
        raise InvalidParams("missing protocolVersion")
    if isinstance(version, bool) or not isinstance(version, int):
        raise InvalidParams("protocolVersion must be an integer")
    if version != PROTOCOL_VERSION:
        shown = str(version)[:40]
        raise ProtocolVersionMismatch(
            f"Protocol version mismatch: server={PROTOCOL_VERSION}, client={shown}"
        )
    return version


def initialize_result(server_version: str, pid: int) -> dict[str, Any]:
    return {"protocolVersion": PROTOCOL_VERSION, "serverVersion": server_version,
            "serverPid": pid}


# --- session/new ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RpcNewSession:
    """``session/new`` of the daemon dialect: the ACP request plus ``keep_siblings``."""

    request: NewSessionRequest
    keep_siblings: bool


def new_session_request(params: Any) -> RpcNewSession:
    p = _params(params)
    keep = p.get("keep_siblings", p.get("keepSiblings", False))
    if not isinstance(keep, bool):
        raise InvalidParams("keep_siblings must be a boolean")
    request = NewSessionRequest(
        cwd=optional_str(p, "cwd", "workspaceDir", "workspace_dir"),
        agent_alias=optional_str(p, "agentAlias", "agent_alias", "agent"),
        mcp_servers=[],
        session_id=chosen_session_id(p.get("sessionId", p.get("session_id"))),
    )
    return RpcNewSession(request, keep)


def chosen_session_id(value: Any) -> str | None:
    """A client-chosen ``sessionId``: None when absent, else a UUID in its canonical
    8-4-4-4-12 text form (any case), returned lower-case; anything else → -32602."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidParams("sessionId must be a string (a UUID)")
    try:
        parsed = uuid.UUID(value)
    except ValueError:
        parsed = None
    if parsed is None or str(parsed) != value.lower():
        raise InvalidParams(f"sessionId must be a UUID like {uuid.UUID(int=0)}: {value[:80]!r}")
    return str(parsed)


# --- session/list ---------------------------------------------------------------


def list_params(params: Any) -> tuple[str | None, str | None]:
    """``session/list {cwd?, cursor?}``: the filter and the cursor."""
    p = _params(params)
    return optional_str(p, "cwd"), optional_str(p, "cursor")


def listed_session(row: Any) -> dict[str, Any]:
    """A daemon ``session/list`` entry: ACP's ``{sessionId, cwd, title?, updatedAt}``
    plus what ops tools want: ``agentAlias``, ``turns``, ``usage: {totalTokens}`` and
    ``closed`` (closed by its client; still loadable)."""
    entry = session_entry(row)
    entry.update(agentAlias=row.agent_alias, turns=row.turn_count,
                 usage={"totalTokens": row.token_count}, closed=row.closed_at is not None)
    return entry


# --- approvals ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Approval:
    session_id: str
    request_id: str
    decision: str


def approve_request(params: Any) -> Approval:
    """``session/approve {sessionId, requestId, decision}``."""
    p = _params(params)
    sid = optional_str(p, "sessionId", "session_id")
    if not sid:
        raise InvalidParams("missing sessionId")
    request_id = optional_str(p, "requestId", "request_id")
    if not request_id:
        raise InvalidParams("missing requestId")
    raw = optional_str(p, "decision")
    decision = _DECISION_ALIASES.get(raw) if raw is not None else None
    if decision is None:
        raise InvalidParams(f"decision must be one of {', '.join(DECISIONS)}")
    return Approval(sid, request_id, decision)


def approval_request(
    sid: str, request_id: str, tool_name: str, summary: str, timeout_secs: float
) -> dict[str, Any]:
    """``session/update`` params announcing that a tool call waits for ``session/approve``."""
    return {"sessionId": sid, "type": "approval_request", "requestId": request_id,
            "toolName": tool_name, "summary": summary, "timeoutSecs": timeout_secs}


# --- elicitation ----------------------------------------------------------------


def elicitation_request(sid: str, message: str, schema: Mapping[str, Any]) -> dict[str, Any]:
    """``elicitation/create`` params: a form question for the user."""
    return {"sessionId": sid, "mode": "form", "message": message,
            "requestedSchema": dict(schema)}


def elicitation_reply(result: Any) -> dict[str, Any] | None:
    """``{action, content}`` of a client's answer; None when it is not a valid answer
    (``action`` outside accept/decline/cancel, or ``content`` not an object)."""
    if not isinstance(result, Mapping) or result.get("action") not in ELICITATION_ACTIONS:
        return None
    content = result.get("content")
    if content is not None and not isinstance(content, Mapping):
        return None
    return {"action": result["action"], "content": dict(content) if content else {}}


# --- events -------------------------------------------------------------------


_FLAT_CHUNKS: dict[str, type[MessageChunk | ThoughtChunk | UserChunk]] = {
    "agent_message_chunk": MessageChunk,
    "agent_thought_chunk": ThoughtChunk,
    "user_message_chunk": UserChunk,
}


def _flat_agent_update(sid: str, update: Mapping[str, Any]) -> dict[str, Any] | None:
    """An ACP update (a hosted agent's, or replayed) in this dialect's flat form: text
    chunks, tool calls, results and plans; None for the kinds it lacks."""
    kind = update.get("sessionUpdate")
    chunk = _FLAT_CHUNKS.get(kind) if isinstance(kind, str) else None
    if chunk is not None:
        text = content_text(update.get("content"))
        return encode_event(sid, chunk(text)) if text else None
    title = update.get("title")
    name = title if isinstance(title, str) else ""
    call_id = update.get("toolCallId")
    if kind == "tool_call" and isinstance(call_id, str):
        return {"sessionId": sid, "type": "tool_call", "toolCallId": call_id, "name": name,
                "rawInput": update.get("rawInput")}
    if (kind == "tool_call_update" and isinstance(call_id, str)
            and update.get("status") in ("completed", "failed")):
        return {"sessionId": sid, "type": "tool_result", "toolCallId": call_id, "name": name,
                "rawOutput": update.get("rawOutput"), "status": update["status"]}
    if kind == "plan" and isinstance(update.get("entries"), list):
        return {"sessionId": sid, "type": "plan", "entries": update["entries"]}
    return None


def encode_event(sid: str, event: Event) -> dict[str, Any] | None:
    """Flat ``session/update`` params for ``event``; None for kinds this dialect lacks."""
    match event:
        case AgentUpdate(update=update):
            return _flat_agent_update(sid, update)
        case MessageChunk(text=text):
            return {"sessionId": sid, "type": "agent_message_chunk", "text": text}
        case ThoughtChunk(text=text):
            return {"sessionId": sid, "type": "agent_thought_chunk", "text": text}
        case UserChunk(text=text):
            return {"sessionId": sid, "type": "user_message_chunk", "text": text}
        case ToolCallStarted():
            return {"sessionId": sid, "type": "tool_call", "toolCallId": event.tool_call_id,
                    "name": event.name, "rawInput": event.raw_input}
        case ToolCallFinished(status="in_progress"):
            return None  # the flat dialect reports a tool call's result only
        case ToolCallFinished():
            return {"sessionId": sid, "type": "tool_result", "toolCallId": event.tool_call_id,
                    "name": event.name, "rawOutput": event.raw_output, "status": event.status}
        case PlanUpdate(entries=entries):
            plan = [{"content": e.content, "priority": e.priority, "status": e.status}
                    for e in entries]
            return {"sessionId": sid, "type": "plan", "entries": plan}
    return None  # mode, session info, usage and command updates are ACP-only for now


def turn_outcome(stop_reason: str | None) -> str:
    """``turn_complete.outcome``: ``cancelled``, ``failed`` (None: the turn errored) or
    ``completed``."""
    if stop_reason is None:
        return "failed"
    return "cancelled" if stop_reason == "cancelled" else "completed"


def turn_complete(sid: str, stop_reason: str | None, content: str) -> dict[str, Any]:
    return {"sessionId": sid, "type": "turn_complete", "outcome": turn_outcome(stop_reason),
            "content": content}
