"""How the debug client shows what the server sends: ``session/update`` objects and
permission requests as styled lines, diffs as unified diffs.

A :data:`Line` is ``(style, text)``; :func:`paint` turns lines into terminal text
(ANSI colours only when asked). Streamed text is line-buffered per stream by
:class:`StreamBuffer` so chunks from different streams never share a line. Pure
code: the client's loop thread calls it.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

__all__ = ["Line", "StreamBuffer", "paint", "permission_lines", "update_lines"]

Line = tuple[str, str]
MAX_OUTPUT_LINES = 12  # of a tool's text result
MAX_INPUT_CHARS = 300  # of a tool call's rawInput
_ANSI = {"dim": "2", "thought": "2;3", "user": "1;36", "tool": "1;33", "add": "32",
         "del": "31", "hunk": "36", "error": "1;31", "ok": "32", "note": "35", "bold": "1"}
_STREAMS = {"agent_message_chunk": "", "agent_thought_chunk": "thought",
            "user_message_chunk": "user"}
_PLAN_MARKS = {"pending": "[ ]", "in_progress": "[~]", "completed": "[x]"}


def paint(lines: Sequence[Line], color: bool) -> str:
    """``lines`` as text, one per line (with a final newline unless empty)."""
    out = []
    for style, text in lines:
        code = _ANSI.get(style) if color else None
        out.append(f"\x1b[{code}m{text}\x1b[0m" if code else text)
    return "".join(line + "\n" for line in out)


class StreamBuffer:
    """Chunks of the agent's text, thoughts and (replayed) user text, to whole lines."""

    def __init__(self) -> None:
        self.kind = ""
        self.partial = ""

    def add(self, kind: str, text: str) -> list[Line]:
        """The lines that ``text`` completes (the other stream's rest first)."""
        lines = self.flush() if kind != self.kind else []
        self.kind = kind
        *whole, self.partial = (self.partial + text).split("\n")
        return lines + [self._line(part) for part in whole]

    def flush(self) -> list[Line]:
        """The unfinished line, if any (a new stream, a tool call, the turn's end)."""
        if not self.partial:
            return []
        line, self.partial = self._line(self.partial), ""
        return [line]

    def _line(self, text: str) -> Line:
        style = _STREAMS.get(self.kind, "")
        return style, (f"you> {text}" if style == "user" else text)


def update_lines(update: Mapping[str, Any], stream: StreamBuffer) -> list[Line]:
    """The lines one ``session/update`` adds to the screen."""
    kind = str(update.get("sessionUpdate", ""))
    if kind in _STREAMS:
        return stream.add(kind, _content_text(update.get("content")))
    lines = stream.flush()
    if kind == "tool_call":
        return lines + _tool_call_lines(update, "tool")
    if kind == "tool_call_update":
        return lines + _tool_call_lines(update, "update")
    if kind == "plan":
        return lines + _plan_lines(update.get("entries"))
    return lines + _other_lines(kind, update)


def _other_lines(kind: str, update: Mapping[str, Any]) -> list[Line]:
    if kind == "usage_update":
        cost = update.get("cost")
        amount = f", ${cost.get('amount')}" if isinstance(cost, Mapping) else ""
        return [("dim", f"usage: {update.get('used')}/{update.get('size')} tokens{amount}")]
    if kind == "current_mode_update":
        return [("note", f"mode: {update.get('currentModeId')}")]
    if kind == "session_info_update":
        return [("dim", f"session title: {update['title']}")] if "title" in update else []
    if kind == "available_commands_update":
        names = [str(c.get("name")) for c in update.get("availableCommands") or []
                 if isinstance(c, Mapping)]
        return [("dim", "agent commands: " + " ".join(f"/{n}" for n in names))]
    return [("dim", f"[{kind or 'update'}]")]


def _content_text(content: Any) -> str:
    """A content block's text; a placeholder for an image, audio or resource."""
    if not isinstance(content, Mapping):
        return ""
    if content.get("type") == "text":
        return str(content.get("text", ""))
    resource = content.get("resource")
    uri = resource.get("uri") if isinstance(resource, Mapping) else content.get("uri")
    return f"[{content.get('type')} {content.get('mimeType') or uri or ''}]".replace(" ]", "]")


def _tool_call_lines(call: Mapping[str, Any], what: str) -> list[Line]:
    """A tool call (``tool``) or its update: title, kind, status, locations, content."""
    ident = call.get("toolCallId", "?")
    title = call.get("title")
    status = call.get("status")
    if what == "tool":
        head = f"tool {title or '?'} ({call.get('kind') or 'other'}, {status or 'pending'})"
    else:
        head = f"  -> {ident} {status or ''}" + (f": {title}" if title else "")
    lines: list[Line] = [("tool", head)]
    if what == "tool":
        lines.append(("dim", f"  id {ident} input {_clip(call.get('rawInput'))}"))
    for location in call.get("locations") or []:
        if isinstance(location, Mapping):
            line = f":{location['line']}" if location.get("line") is not None else ""
            lines.append(("dim", f"  at {location.get('path')}{line}"))
    return lines + content_lines(call.get("content"))


def content_lines(content: Any) -> list[Line]:
    """A tool call's content: text (clipped), diffs, embedded things."""
    lines: list[Line] = []
    for item in content if isinstance(content, list) else []:
        if not isinstance(item, Mapping):
            continue
        if item.get("type") == "diff":
            lines += diff_lines(item)
        elif item.get("type") == "terminal":
            lines.append(("dim", f"  [terminal {item.get('terminalId')}]"))
        else:
            lines += _text_block(_content_text(item.get("content")))
    return lines


def _text_block(text: str) -> list[Line]:
    rows = text.splitlines()
    shown = [("", f"  | {row}") for row in rows[:MAX_OUTPUT_LINES]]
    if len(rows) > MAX_OUTPUT_LINES:
        shown.append(("dim", f"  | ... {len(rows) - MAX_OUTPUT_LINES} more lines"))
    return shown


def diff_lines(diff: Mapping[str, Any]) -> list[Line]:
    """A ``{type: diff, path, oldText, newText}`` as a unified diff (oldText null: a new
    file)."""
    path = str(diff.get("path", "?"))
    old = diff.get("oldText")
    new = str(diff.get("newText") or "")
    before = str(old).splitlines() if old is not None else []
    rows = difflib.unified_diff(before, new.splitlines(),
                                "/dev/null" if old is None else path, path, lineterm="")
    lines: list[Line] = [("bold", f"  diff {path}")]
    for row in rows:
        style = ("hunk" if row.startswith("@@") else "bold" if row[:3] in ("---", "+++")
                 else "add" if row.startswith("+") else "del" if row.startswith("-") else "")
        lines.append((style, f"  {row}"))
    return lines


def _plan_lines(entries: Any) -> list[Line]:
    lines: list[Line] = [("note", "plan:")]
    for entry in entries if isinstance(entries, list) else []:
        if isinstance(entry, Mapping):
            mark = _PLAN_MARKS.get(str(entry.get("status")), "[?]")
            priority = f" ({entry['priority']})" if entry.get("priority") else ""
            lines.append(("note", f"  {mark} {entry.get('content')}{priority}"))
    return lines


def permission_lines(params: Mapping[str, Any]) -> list[Line]:
    """A permission request: the tool call, then its options numbered from 1."""
    call = params.get("toolCall")
    lines: list[Line] = [("error", "permission requested:")]
    if isinstance(call, Mapping):
        lines += _tool_call_lines(call, "tool")
    for number, option in enumerate(offered_options(params), 1):
        lines.append(("bold", f"  {number}. {option.get('name')} ({option.get('kind')})"))
    lines.append(("dim", "  type a number to answer, /cancel to cancel the turn"))
    return lines


def offered_options(params: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The options a permission request offers, in order."""
    options = params.get("options")
    return [o for o in options if isinstance(o, Mapping)] if isinstance(options, list) else []


def _clip(value: Any) -> str:
    text = orjson.dumps(value).decode() if value is not None else "{}"
    return text if len(text) <= MAX_INPUT_CHARS else text[:MAX_INPUT_CHARS] + "..."
