"""Tools an agent can call, by name.

:func:`default_tools` builds a fresh set per session (tools may carry limits as
state); the session actor looks names up in it. Safe from any thread.
"""

from __future__ import annotations

from actors.tools.base import Tool, ToolEnv, ToolError, ToolResult
from actors.tools.files import FileReadTool, FileWriteTool
from actors.tools.paths import PathDenied, PathPolicy
from actors.tools.shell import ShellTool

__all__ = [
    "FileReadTool",
    "FileWriteTool",
    "PathDenied",
    "PathPolicy",
    "ShellTool",
    "Tool",
    "ToolEnv",
    "ToolError",
    "ToolResult",
    "default_tools",
]


def default_tools() -> dict[str, Tool]:
    """The tools every session gets: ``shell``, ``file_read``, ``file_write``."""
    tools: list[Tool] = [ShellTool(), FileReadTool(), FileWriteTool()]
    return {tool.name: tool for tool in tools}
