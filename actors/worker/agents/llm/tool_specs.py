"""The tools a model may call, as JSON-schema definitions (one place for every provider).

The names come from the tool registry (:func:`actors.worker.tools.default_tools`); each
has a description and a parameters schema here. A registered tool without an
entry is not offered to models (a test keeps the two in step). Pure data: safe
from any thread.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from actors.worker.tools import default_tools

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
        "Read a text file. Relative paths start at the working directory. Give offset "
        "and limit to read only some lines of a long file.",
        _object({
            "path": {"type": "string", "description": "The file to read."},
            "offset": {"type": "integer", "minimum": 1,
                       "description": "The first line to read, counted from 1."},
            "limit": {"type": "integer", "minimum": 1,
                      "description": "How many lines to read from offset."},
        }, ["path"]),
    ),
    "file_write": (
        "Create or replace a text file with the given content (parent directories are "
        "created). Relative paths start at the working directory.",
        _object({
            "path": {"type": "string", "description": "The file to write."},
            "content": {"type": "string", "description": "The whole new content."},
        }, ["path", "content"]),
    ),
    "file_edit": (
        "Edit a text file by replacing an exact string. old_string must match the file "
        "exactly (whitespace included) and occur once, unless replace_all is true; include "
        "enough surrounding lines to make it unique. Read the file first.",
        _object({
            "path": {"type": "string", "description": "The file to edit."},
            "old_string": {"type": "string", "description": "The exact text to replace."},
            "new_string": {"type": "string", "description": "The text to put instead."},
            "replace_all": {"type": "boolean",
                            "description": "Replace every occurrence (default false)."},
        }, ["path", "old_string", "new_string"]),
    ),
    "file_list": (
        "List files and directories (directories end with /) whose path matches a glob "
        "such as src/**/*.py, under a directory. Files ignored by .gitignore are left out.",
        _object({
            "pattern": {"type": "string", "description": "The glob, relative to path "
                        "(default **/*: everything). * stays within a directory; ** "
                        "spans directories."},
            "path": {"type": "string", "description": "Where to start (default: the "
                     "working directory)."},
            "limit": {"type": "integer", "minimum": 1,
                      "description": "At most this many entries (default 500)."},
        }, []),
    ),
    "search": (
        "Search file contents for a regular expression (Python syntax, matched line by "
        "line); returns path:line: text for each matching line. Binary files and files "
        "ignored by .gitignore are skipped.",
        _object({
            "pattern": {"type": "string", "description": "The regular expression."},
            "path": {"type": "string", "description": "The directory to search (default: "
                     "the working directory)."},
            "glob": {"type": "string", "description": "Only files matching this glob, "
                     "e.g. *.py (matched against the file name) or src/**/*.ts."},
            "ignore_case": {"type": "boolean", "description": "Match case-insensitively."},
            "limit": {"type": "integer", "minimum": 1,
                      "description": "At most this many matching lines (default 100)."},
        }, ["pattern"]),
    ),
    "ask_user": (
        "Ask the user a question and wait for the answer. Give choices whenever you can: "
        "some editors can only offer a question as a choice between options.",
        _object({
            "question": {"type": "string", "description": "The question."},
            "choices": {"type": "array", "items": {"type": "string"}, "minItems": 1,
                        "maxItems": 20, "description": "The answers to choose from."},
        }, ["question"]),
    ),
    "deliver_file": (
        "Hand a file from the workspace to the user (a download or preview in their "
        "editor), up to 10 MiB. Returns its attachment:// uri; cite that uri as it is.",
        _object({
            "path": {"type": "string", "description": "The file to deliver."},
            "mimeType": {"type": "string", "description": "Its media type (default: "
                         "guessed from the name)."},
            "title": {"type": "string", "description": "The label the user sees (default: "
                      "the file name)."},
        }, ["path"]),
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
