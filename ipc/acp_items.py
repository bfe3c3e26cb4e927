"""What zeroclaw reads out of ACP ``session/update`` objects for its own index of a
turn: the text of a content block, the result text of a tool call.

The updates themselves are kept and relayed as they came; this only fills the
columns the store searches and lists by, and the history zeroclaw's own agents read.
Pure functions: safe from any thread.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

__all__ = ["content_text", "tool_result_text"]


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


def tool_result_text(update: Mapping[str, Any]) -> str:
    """A tool call's result as text: its ``content`` (text blocks; a diff by its path
    and new text; a terminal by its id), else its ``rawOutput``."""
    text = _tool_content_text(update.get("content"))
    return text or _raw_output_text(update.get("rawOutput"))


def _tool_content_text(content: Any) -> str:
    if not isinstance(content, list):
        return ""
    parts = []
    for item in content:
        if not isinstance(item, Mapping):
            continue
        if item.get("type") == "content":
            parts.append(content_text(item.get("content")))
        elif item.get("type") == "diff":
            parts.append(f"edited {_str(item.get('path'))}:\n{_str(item.get('newText'))}")
        elif item.get("type") == "terminal":
            parts.append(f"terminal {_str(item.get('terminalId'))}")
    return "\n".join(p for p in parts if p)


def _raw_output_text(raw_output: Any) -> str:
    """A string as it is, anything else as JSON (empty for none)."""
    if raw_output is None or isinstance(raw_output, str):
        return raw_output or ""
    try:
        return orjson.dumps(raw_output, option=orjson.OPT_SORT_KEYS).decode()
    except TypeError:
        return str(raw_output)


def _str(value: Any) -> str:
    return value if isinstance(value, str) else ""
