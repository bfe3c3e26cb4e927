"""The debug client's auto-approval rule (OpenClaw's): which permission requests it
answers by itself.

Only zeroclaw's own read-only tools, named in ``toolCall._meta.zeroclaw.tool``
(:data:`READ_ONLY_TOOLS`), reading inside the client's ``--cwd``: every path in
``rawInput`` and in ``locations`` resolved (symlinks followed) must lie inside it.
``toolCall.kind`` is what the server says the call is, a display hint: it never
approves anything. Everything else is asked. Pure functions: the client's loop
thread calls them.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["READ_ONLY_TOOLS", "Verdict", "allow_option", "auto_approval", "option_of_kind",
           "tool_name"]

#: zeroclaw's tools that only read, and the path each reads when ``path`` is absent
#: (None: the call has no default, so it is asked).
READ_ONLY_TOOLS: Mapping[str, str | None] = {"file_read": None, "file_list": ".", "search": "."}
#: ``rawInput`` fields that name a path (zeroclaw's tools use ``path``; the others are
#: checked too, so a field the rule does not know cannot carry a path out of cwd).
_PATH_FIELDS = ("path", "paths", "file", "file_path", "filePath", "dir", "directory", "root",
                "cwd", "glob")


@dataclass(frozen=True, slots=True)
class Verdict:
    """``option_id``: the option to answer with (None: ask the user); ``reason``: why."""

    option_id: str | None
    reason: str


def tool_name(tool_call: Mapping[str, Any]) -> str | None:
    """The zeroclaw tool a tool call runs (``_meta.zeroclaw.tool``), None when unnamed."""
    meta = tool_call.get("_meta")
    ours = meta.get("zeroclaw") if isinstance(meta, Mapping) else None
    name = ours.get("tool") if isinstance(ours, Mapping) else None
    return name if isinstance(name, str) else None


def option_of_kind(params: Mapping[str, Any], *kinds: str) -> str | None:
    """The ``optionId`` of the first offered option whose kind is the first of ``kinds``
    offered, then the next kind..."""
    options = params.get("options")
    offered = [o for o in options if isinstance(o, Mapping)] if isinstance(options, list) else []
    for kind in kinds:
        for option in offered:
            if option.get("kind") == kind and isinstance(option.get("optionId"), str):
                return str(option["optionId"])
    return None


def allow_option(params: Mapping[str, Any]) -> str | None:
    """The option that allows this call once (``allow_once``), None when not offered."""
    return option_of_kind(params, "allow_once")


def auto_approval(params: Mapping[str, Any], cwd: Path) -> Verdict:
    """Whether ``session/request_permission`` ``params`` is answered without asking."""
    tool_call = params.get("toolCall")
    if not isinstance(tool_call, Mapping):
        return Verdict(None, "no toolCall")
    name = tool_name(tool_call)
    if name is None or name not in READ_ONLY_TOOLS:
        return Verdict(None, f"{name or 'an unnamed tool'} is not a read-only tool")
    paths = _paths(name, tool_call)
    if paths is None:
        return Verdict(None, f"{name}: a path that cannot be checked")
    root = cwd.resolve()
    outside = [p for p in paths if not _inside(p, root)]
    if outside:
        return Verdict(None, f"{name}: {outside[0]} is outside {root}")
    option = allow_option(params)
    if option is None:
        return Verdict(None, "no allow_once option offered")
    shown = ", ".join(dict.fromkeys(paths))
    return Verdict(option, f"{name} {shown} (read-only, inside {root})")


def _paths(name: str, tool_call: Mapping[str, Any]) -> list[str] | None:
    """Every path the call names, None when one is not a string or none is named."""
    raw = tool_call.get("rawInput")
    if not isinstance(raw, Mapping):
        return None
    found: list[str] = []
    for value in _path_values(raw):
        if not isinstance(value, str):
            return None
        found.append(value)
    if "path" not in raw:
        default = READ_ONLY_TOOLS[name]
        if default is None:
            return None
        found.append(default)
    locations = tool_call.get("locations")
    for location in locations if isinstance(locations, list) else ():
        path = location.get("path") if isinstance(location, Mapping) else None
        if not isinstance(path, str):
            return None
        found.append(path)
    return found


def _path_values(raw: Mapping[str, Any]) -> Iterator[Any]:
    for field in _PATH_FIELDS:
        if field not in raw:
            continue
        value = raw[field]
        if isinstance(value, list):
            yield from value
        else:
            yield value


def _inside(path: str, root: Path) -> bool:
    """True when ``path`` (relative to ``root``; ``~`` expanded) resolves inside ``root``,
    symlinks followed (a missing file: its existing parents are resolved)."""
    if not path or "\0" in path:
        return False
    resolved = (root / os.path.expanduser(path)).resolve()
    return resolved == root or root in resolved.parents
