"""ACP v1 dialect: decode request params, encode results and events (SPEC §3).

Nothing here knows about actors, workers or SQL: the host's handlers call these
functions to turn wire params into typed requests and internal events into
``session/update`` params. Pure functions: safe from any thread (the host calls
them on the asyncio loop thread).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import mimetypes
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any
from urllib.parse import unquote, urlparse

import orjson

from ipc.errors import InvalidParams
from ipc.events import (
    AgentUpdate,
    AvailableCommands,
    CommandInfo,
    CurrentMode,
    DiffContent,
    Event,
    MessageChunk,
    PlanUpdate,
    SessionInfo,
    StoredTurn,
    TextItem,
    ThoughtChunk,
    ToolCallFinished,
    ToolCallStarted,
    ToolContent,
    ToolItem,
    ToolLocation,
    TurnItem,
    UsageUpdate,
    UserChunk,
    iso_utc,
    stored_updates,
)

__all__ = [
    "MAX_BLOB_BYTES",
    "Blob",
    "NewSessionRequest",
    "PromptRequest",
    "agent_option_chosen",
    "agent_permission_params",
    "chunk_update_frame",
    "encode_event",
    "new_session_request",
    "optional_str",
    "permission_params",
    "prompt_request",
    "replay_updates",
    "selected_option",
    "session_entry",
    "session_id",
    "tool_meta",
    "update_of",
]

MAX_BLOB_BYTES = 10 * 1024 * 1024
PERMISSION_OPTIONS = (
    {"optionId": "allow-once", "name": "Allow once", "kind": "allow_once"},
    {"optionId": "allow-always", "name": "Always allow", "kind": "allow_always"},
    {"optionId": "reject-once", "name": "Reject", "kind": "reject_once"},
    {"optionId": "reject-always", "name": "Always reject", "kind": "reject_always"},
)


# --- params -------------------------------------------------------------------


def _params(params: Any) -> Mapping[str, Any]:
    if not isinstance(params, Mapping):
        raise InvalidParams("params must be an object")
    return params


def optional_str(params: Mapping[str, Any], *names: str) -> str | None:
    """The first of ``names`` present; it must be a string (``None`` when absent)."""
    for name in names:
        if name in params and params[name] is not None:
            value = params[name]
            if not isinstance(value, str):
                raise InvalidParams(f"{name} must be a string")
            return value
    return None


def session_id(params: Any) -> str:
    """``sessionId`` (alias ``session_id``), required."""
    value = optional_str(_params(params), "sessionId", "session_id")
    if not value:
        raise InvalidParams("missing sessionId")
    return value


@dataclass(frozen=True, slots=True)
class NewSessionRequest:
    cwd: str | None
    agent_alias: str | None
    mcp_servers: list[Any]
    session_id: str | None = None


def new_session_request(params: Any) -> NewSessionRequest:
    p = _params(params)
    mcp = p.get("mcpServers", p.get("mcp_servers")) or []
    if not isinstance(mcp, list):
        raise InvalidParams("mcpServers must be an array")
    alias = optional_str(p, "agentAlias", "agent_alias", "agent")
    return NewSessionRequest(
        cwd=optional_str(p, "cwd", "workspaceDir", "workspace_dir"),
        agent_alias=alias if alias is not None else meta_agent(p),
        mcp_servers=mcp,  # no session_id: on ACP the host always picks the id
    )


def meta_agent(params: Mapping[str, Any]) -> str | None:
    """``_meta.zeroclaw.agent``: the agent an editor that cannot send ``agentAlias`` (an
    ACP client sends only schema fields) names through the schema's extension point."""
    meta = params.get("_meta")
    ours = meta.get("zeroclaw") if isinstance(meta, Mapping) else None
    if not isinstance(ours, Mapping):
        return None
    alias = ours.get("agent")
    if alias is not None and not isinstance(alias, str):
        raise InvalidParams("_meta.zeroclaw.agent must be a string")
    return alias or None


@dataclass(frozen=True, slots=True)
class Blob:
    """A decoded blob resource: ``marker`` is filled in once it is written."""

    index: int
    uri: str
    mime_type: str
    data: bytes

    @property
    def file_name(self) -> str:
        ext = _extension(self.mime_type, self.uri)
        return f"{hashlib.sha256(self.data).hexdigest()}{ext}"

    @property
    def display_name(self) -> str:
        path = unquote(urlparse(self.uri).path) if self.uri else ""
        return path.rsplit("/", 1)[-1] or self.file_name


@dataclass(frozen=True, slots=True)
class PromptRequest:
    """Prompt parts in order; blobs leave ``None`` placeholders in ``texts``."""

    session_id: str
    texts: tuple[str | None, ...]
    blobs: tuple[Blob, ...]

    def assemble(self, blob_markers: Mapping[int, str]) -> str:
        parts = [t if t is not None else blob_markers[i] for i, t in enumerate(self.texts)]
        return "\n\n".join(parts)


def _extension(mime_type: str, uri: str) -> str:
    path = unquote(urlparse(uri).path) if uri else ""
    name = path.rsplit("/", 1)[-1]
    if "." in name:
        ext = "." + name.rsplit(".", 1)[-1].lower()
        if ext[1:].isalnum() and len(ext) <= 10:
            return ext
    return mimetypes.guess_extension(mime_type or "") or ".bin"


def _b64decode(text: str) -> bytes:
    """Strict base64, also accepting MIME-style line breaks."""
    try:
        return base64.b64decode(text, validate=True)
    except binascii.Error:
        if not any(c in text for c in " \t\r\n"):
            raise
        return base64.b64decode("".join(text.split()), validate=True)


def _decode_blob(index: int, resource: Mapping[str, Any]) -> Blob:
    blob = resource.get("blob")
    if not isinstance(blob, str):
        raise InvalidParams(f"prompt[{index}].resource.blob must be a base64 string")
    if len(blob) > (MAX_BLOB_BYTES * 4) // 3 + 8:
        raise InvalidParams(f"prompt[{index}]: blob larger than 10 MiB")
    try:
        data = _b64decode(blob)
    except (binascii.Error, ValueError):
        raise InvalidParams(f"prompt[{index}].resource.blob is not valid base64") from None
    if len(data) > MAX_BLOB_BYTES:
        raise InvalidParams(f"prompt[{index}]: blob larger than 10 MiB")
    uri = resource.get("uri")
    mime = resource.get("mimeType")
    return Blob(
        index=index,
        uri=uri if isinstance(uri, str) else "",
        mime_type=mime if isinstance(mime, str) else "application/octet-stream",
        data=data,
    )


def _part(index: int, part: Any) -> str | Blob:
    if isinstance(part, str):
        return part
    if not isinstance(part, Mapping):
        raise InvalidParams(f"prompt[{index}] must be an object")
    kind = part.get("type", "text")
    if kind == "text":
        text = part.get("text")
        if not isinstance(text, str):
            raise InvalidParams(f"prompt[{index}].text must be a string")
        return text
    if kind == "resource":
        resource = part.get("resource")
        if not isinstance(resource, Mapping):
            raise InvalidParams(f"prompt[{index}].resource must be an object")
        if "blob" in resource:
            return _decode_blob(index, resource)
        text = resource.get("text")
        if not isinstance(text, str):
            raise InvalidParams(f"prompt[{index}].resource needs text or blob")
        uri = resource.get("uri")
        return f"{text}" if not isinstance(uri, str) else f"[Resource: {uri}]\n{text}"
    if kind == "resource_link":
        uri = part.get("uri")
        if not isinstance(uri, str):
            raise InvalidParams(f"prompt[{index}].uri must be a string")
        return f"[Resource: {uri}]"
    raise InvalidParams(f"prompt[{index}]: unsupported content type {str(kind)[:40]!r}")


def prompt_request(params: Any) -> PromptRequest:
    """Decode ``session/prompt``; every blob is decoded (and checked) before anything is written."""
    p = _params(params)
    sid = session_id(p)
    raw = p.get("prompt")
    if isinstance(raw, str):
        return PromptRequest(sid, (raw,), ())
    if not isinstance(raw, list) or not raw:
        raise InvalidParams("prompt must be a string or a non-empty array of content parts")
    texts: list[str | None] = []
    blobs: list[Blob] = []
    for index, part in enumerate(raw):
        decoded = _part(index, part)
        if isinstance(decoded, Blob):
            blobs.append(Blob(len(texts), decoded.uri, decoded.mime_type, decoded.data))
            texts.append(None)
        else:
            texts.append(decoded)
    return PromptRequest(sid, tuple(texts), tuple(blobs))


def blob_marker(blob: Blob, path: str) -> str:
    if blob.mime_type.startswith("image/"):
        return f"[IMAGE:{path}]"
    return f"[Document: {blob.display_name}] {path}"


# --- permissions --------------------------------------------------------------


def tool_meta(tool_name: str) -> dict[str, Any]:
    """``_meta`` of zeroclaw's own tool calls: the tool's name (``file_read``, ``shell``),
    so a client can apply an allowlist by name (``kind`` is only a display hint)."""
    return {"zeroclaw": {"tool": tool_name}}


def permission_params(
    sid: str, tool_call_id: str, title: str, kind: str, raw_input: Any,
    preview: tuple[ToolContent, ...] = (), tool_name: str | None = None,
) -> dict[str, Any]:
    """``session/request_permission`` params. ``toolCall.content`` carries the summary a
    client shows above the options: the tool call's title (e.g. ``shell: git status``,
    ``Write /path``), the same text the daemon dialect's ``approval_request`` calls
    ``summary``, then ``preview`` (a file tool's diff, so the change is seen before
    it is allowed). ``tool_name`` goes in ``toolCall._meta`` (:func:`tool_meta`)."""
    tool_call: dict[str, Any] = {
        "toolCallId": tool_call_id,
        "title": title,
        "kind": kind,
        "status": "pending",
        "rawInput": raw_input,
        "content": [{"type": "content", "content": {"type": "text", "text": title}},
                    *(_tool_content(item) for item in preview)],
    }
    if tool_name is not None:
        tool_call["_meta"] = tool_meta(tool_name)
    return {
        "sessionId": sid,
        "toolCall": tool_call,
        "options": list(PERMISSION_OPTIONS),
    }


def agent_permission_params(sid: str, request: Mapping[str, Any]) -> dict[str, Any]:
    """A hosted agent's own ``session/request_permission`` params as it sent them (its
    tool call with diff and locations, its options, its ``_meta``), under ``sid``."""
    return {"sessionId": sid, **{k: v for k, v in request.items() if k != "sessionId"}}


def agent_option_chosen(request: Mapping[str, Any], result: Any) -> str | None:
    """The ``optionId`` a client selected among the agent's own options; None when it
    cancelled or answered something that is not one of them."""
    outcome = result.get("outcome") if isinstance(result, Mapping) else None
    if not isinstance(outcome, Mapping) or outcome.get("outcome") != "selected":
        return None
    option = outcome.get("optionId")
    options = request.get("options")
    offered = options if isinstance(options, list) else []
    if any(isinstance(o, Mapping) and o.get("optionId") == option for o in offered):
        return option if isinstance(option, str) else None
    return None


_OPTION_IDS = {
    "allow-once": "allow_once",
    "allow_once": "allow_once",
    "allow-always": "allow_always",
    "allow_always": "allow_always",
    "reject-once": "reject_once",
    "reject_once": "reject_once",
    "reject-always": "reject_always",
    "reject_always": "reject_always",
}


def selected_option(result: Any) -> str | None:
    """The chosen option as ``allow_once``/``allow_always``/``reject_once``/``reject_always``;
    None = cancelled."""
    if not isinstance(result, Mapping):
        return None
    outcome = result.get("outcome")
    if not isinstance(outcome, Mapping) or outcome.get("outcome") != "selected":
        return None
    option = outcome.get("optionId")
    return _OPTION_IDS.get(option) if isinstance(option, str) else None


# --- questions (ask_user) -----------------------------------------------------


def question_choices(schema: Mapping[str, Any]) -> tuple[str, list[str]] | None:
    """The field name and choices of a one-field question form (its ``enum`` of
    strings), else None: ACP v1 can only ask a question as a choice between
    permission options."""
    properties = schema.get("properties")
    if not isinstance(properties, Mapping) or len(properties) != 1:
        return None
    name, field = next(iter(properties.items()))
    choices = field.get("enum") if isinstance(field, Mapping) else None
    if not isinstance(choices, list) or not choices:
        return None
    return (name, choices) if all(isinstance(c, str) for c in choices) else None


def question_params(sid: str, request_id: str, message: str,
                    choices: list[str]) -> dict[str, Any]:
    """``session/request_permission`` params asking ``message``; option ``choice-N`` is
    the N-th choice (kind ``allow_once``: ACP has no neutral kind)."""
    options = [{"optionId": f"choice-{i}", "name": choice, "kind": "allow_once"}
               for i, choice in enumerate(choices)]
    return {
        "sessionId": sid,
        "toolCall": {
            "toolCallId": request_id,
            "title": message,
            "kind": "other",
            "status": "pending",
            "content": [{"type": "content", "content": {"type": "text", "text": message}}],
        },
        "options": options,
    }


def question_answer(result: Any, field: str, choices: list[str]) -> dict[str, Any]:
    """The ``{action, content}`` answer for a reply to :func:`question_params`."""
    outcome = result.get("outcome") if isinstance(result, Mapping) else None
    option = outcome.get("optionId") if isinstance(outcome, Mapping) else None
    if (isinstance(outcome, Mapping) and outcome.get("outcome") == "selected"
            and isinstance(option, str) and option.startswith("choice-")):
        index = option.removeprefix("choice-")
        if index.isdigit() and int(index) < len(choices):
            return {"action": "accept", "content": {field: choices[int(index)]}}
    return {"action": "cancel", "content": {}}


# --- events -------------------------------------------------------------------


def _text(kind: str, text: str) -> dict[str, Any]:
    return {"sessionUpdate": kind, "content": {"type": "text", "text": text}}


def update_of(event: Event) -> dict[str, Any]:
    """The ACP ``session/update`` object of ``event`` (an agent's own as it came)."""
    match event:
        case AgentUpdate(update=update):
            return update
        case MessageChunk(text=text):
            return _text("agent_message_chunk", text)
        case ThoughtChunk(text=text):
            return _text("agent_thought_chunk", text)
        case UserChunk(text=text):
            return _text("user_message_chunk", text)
        case ToolCallStarted():
            started: dict[str, Any] = {
                "sessionUpdate": "tool_call",
                "toolCallId": event.tool_call_id,
                "title": event.title,
                "kind": event.kind,
                "status": "pending",
                "rawInput": event.raw_input,
                "_meta": tool_meta(event.name),
            }
            if event.locations:
                started["locations"] = [_location(loc) for loc in event.locations]
            return started
        case ToolCallFinished():
            return _tool_call_update(event)
        case PlanUpdate(entries=entries):
            plan = [{"content": e.content, "priority": e.priority, "status": e.status}
                    for e in entries]
            return {"sessionUpdate": "plan", "entries": plan}
        case CurrentMode(mode_id=mode_id):
            return {"sessionUpdate": "current_mode_update", "currentModeId": mode_id}
        case SessionInfo():
            info: dict[str, Any] = {"sessionUpdate": "session_info_update"}
            if event.title is not None:
                info["title"] = event.title
            if event.updated_at is not None:
                info["updatedAt"] = event.updated_at
            if event.meta:
                info["_meta"] = event.meta
            return info
        case UsageUpdate():
            usage: dict[str, Any] = {"sessionUpdate": "usage_update", "used": event.used,
                                     "size": event.size}
            if event.cost is not None:
                usage["cost"] = {"amount": event.cost, "currency": "USD"}
            return usage
        case AvailableCommands(commands=commands):
            return {"sessionUpdate": "available_commands_update",
                    "availableCommands": [_command(c) for c in commands]}
    raise TypeError(f"not an event: {event!r}")


def _tool_call_update(event: ToolCallFinished) -> dict[str, Any]:
    """``tool_call_update``: the text result first, then any diff or embedded file."""
    update: dict[str, Any] = {
        "sessionUpdate": "tool_call_update",
        "toolCallId": event.tool_call_id,
        "status": event.status,
    }
    if event.title is not None:
        update["title"] = event.title
    if event.locations:
        update["locations"] = [_location(loc) for loc in event.locations]
    if event.status != "in_progress":
        update["rawOutput"] = event.raw_output
        update["content"] = [
            {"type": "content", "content": {"type": "text", "text": event.text}},
            *(_tool_content(item) for item in event.content),
        ]
    return update


def _location(location: ToolLocation) -> dict[str, Any]:
    entry: dict[str, Any] = {"path": location.path}
    if location.line is not None:
        entry["line"] = location.line
    return entry


def _tool_content(item: ToolContent) -> dict[str, Any]:
    if isinstance(item, DiffContent):
        return {"type": "diff", "path": item.path, "oldText": item.old_text,
                "newText": item.new_text}
    resource = {"uri": item.uri, "mimeType": item.mime_type, "blob": item.blob}
    return {"type": "content", "content": {"type": "resource", "resource": resource}}


def _command(command: CommandInfo) -> dict[str, Any]:
    entry: dict[str, Any] = {"name": command.name, "description": command.description}
    if command.hint is not None:
        entry["input"] = {"hint": command.hint}
    return entry


def encode_event(sid: str, event: Event) -> dict[str, Any]:
    """``session/update`` notification params for ``event``."""
    return {"sessionId": sid, "update": update_of(event)}


_CHUNK_UPDATES: dict[type[Any], str] = {
    MessageChunk: "agent_message_chunk",
    ThoughtChunk: "agent_thought_chunk",
}
_CHUNK_UPDATE_END = b"}}}}\n"


def chunk_update_frame(sid: str, event: Event) -> bytes | None:
    """The whole ``session/update`` notification line (JSON-RPC, newline included)
    for ``event`` when it is a message or thought chunk, else None: the same bytes
    as the notification of :func:`encode_event`, made without its dicts (the way
    of every streamed chunk). Raises ``TypeError`` when the text cannot be encoded."""
    kind = _CHUNK_UPDATES.get(type(event))
    if kind is None:
        return None
    text: str = event.text  # type: ignore[union-attr]
    return _chunk_update_prefix(sid, kind) + orjson.dumps(text) + _CHUNK_UPDATE_END


@lru_cache(maxsize=1024)
def _chunk_update_prefix(sid: str, kind: str) -> bytes:
    """The notification of a ``kind`` chunk of ``sid`` up to its text."""
    params = {"sessionId": sid, "update": _text(kind, "")}
    whole = orjson.dumps({"jsonrpc": "2.0", "method": "session/update", "params": params})
    return whole[: -len(b'""}}}}')]


_REPLAY_CHUNKS: dict[str, type[UserChunk | MessageChunk | ThoughtChunk]] = {
    "user": UserChunk,
    "assistant": MessageChunk,
    "thought": ThoughtChunk,
}


def replay_updates(turns: list[StoredTurn]) -> Iterator[dict[str, Any]]:
    """The ``session/update`` objects ``session/load`` replays for stored ``turns``: each
    turn's prompt as user chunks, then the updates its client got live, as they were
    sent; a turn stored without them as its items (:func:`replay_events`)."""
    for turn in turns:
        if not turn.updates:
            yield from (update_of(event) for event in replay_events(turn.items))
            continue
        for item in turn.items:
            if isinstance(item, TextItem) and item.role == "user":
                yield _text("user_message_chunk", item.text)
        for stored in turn.updates:
            yield from stored_updates(stored)


def replay_events(items: Sequence[TurnItem]) -> list[Event]:
    """Stored items as the events ``session/load`` replays (tool calls as completed)."""
    events: list[Event] = []
    for item in items:
        if isinstance(item, TextItem):
            chunk: type[UserChunk | MessageChunk | ThoughtChunk] = _REPLAY_CHUNKS[item.role]
            events.append(chunk(item.text))
        elif isinstance(item, ToolItem):
            events.append(
                ToolCallStarted(item.tool_call_id, item.name, item.title or item.name,
                                item.kind, item.arguments)
            )
            status = "completed" if item.outcome == "completed" else "failed"
            events.append(
                ToolCallFinished(item.tool_call_id, item.name, status, item.result, item.result)
            )
    return events


def session_entry(row: Any) -> dict[str, Any]:
    """A ``session/list`` entry for a stored session (:class:`storage.models.StoredSession`)."""
    entry: dict[str, Any] = {
        "sessionId": row.id,
        "cwd": row.cwd,
        "updatedAt": iso_utc(row.last_activity),
    }
    if row.title:
        entry["title"] = row.title
    return entry
