"""The tools a model may call, as JSON-schema definitions (one place for every provider).

The names come from the tool registry (:func:`actors.tools.default_tools`); each
has a description and a parameters schema here. A registered tool without an
entry is not offered to models (a test keeps the two in step). Pure data: safe
from any thread.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from actors.tools import default_tools

__all__ = ["TOOL_SCHEMAS", "ToolSpec", "model_tools"]


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """One tool as a model sees it: name, description, JSON schema of its arguments."""

    name: str
    description: str
    parameters: dict[str, Any]


def _object(properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": required,
            "additionalProperties": False}


#: Description and argument schema per registered tool name.
TOOL_SCHEMAS: dict[str, tuple[str, dict[str, Any]]] = {
    "shell": (
        "Run a shell command (/bin/sh -c) in the working directory; returns its combined "
        "stdout and stderr and the exit code.",
        _object({
            "command": {"type": "string", "description": "The command line to run."},
            "timeout": {"type": "number", "description": "Seconds before it is killed "
                        "(default 60)."},
        }, ["command"]),
    ),
    "file_read": (
        "Read a text file. Relative paths start at the working directory.",
        _object({"path": {"type": "string", "description": "The file to read."}}, ["path"]),
    ),
    "file_write": (
        "Create or replace a text file with the given content (parent directories are "
        "created). Relative paths start at the working directory.",
        _object({
            "path": {"type": "string", "description": "The file to write."},
            "content": {"type": "string", "description": "The whole new content."},
        }, ["path", "content"]),
    ),
}


def model_tools() -> tuple[ToolSpec, ...]:
    """The registered tools that have a schema, in registry order."""
    specs = []
    for name, tool in default_tools().items():
        entry = TOOL_SCHEMAS.get(name)
        if entry is None:
            continue
        description, parameters = entry
        if tool.mutating:
            description += " Needs the user's approval in supervised mode."
        specs.append(ToolSpec(name, description, parameters))
    return tuple(specs)
