"""Tools an agent can call, by name.

:func:`default_tools` builds a fresh set per session (tools may carry limits as
state); the session actor looks names up in it. Safe from any thread.
"""

from __future__ import annotations

from actors.worker.tools.ask import AskUserTool
from actors.worker.tools.base import Tool, ToolEnv, ToolError, ToolResult
from actors.worker.tools.deliver import DeliverFileTool
from actors.worker.tools.files import FileEditTool, FileReadTool, FileWriteTool
from actors.worker.tools.listing import FileListTool, SearchTool
from actors.worker.tools.paths import PathDenied, PathPolicy
from actors.worker.tools.shell import ShellTool

__all__ = [
    "AskUserTool",
    "DeliverFileTool",
    "FileEditTool",
    "FileListTool",
    "FileReadTool",
    "FileWriteTool",
    "PathDenied",
    "PathPolicy",
    "SearchTool",
    "ShellTool",
    "Tool",
    "ToolEnv",
    "ToolError",
    "ToolResult",
    "default_tools",
]


def default_tools() -> dict[str, Tool]:
    """The tools every session gets: ``shell``, the file tools (``file_read``,
    ``file_write``, ``file_edit``, ``file_list``, ``search``), ``ask_user`` and
    ``deliver_file``."""
    tools: list[Tool] = [ShellTool(), FileReadTool(), FileWriteTool(), FileEditTool(),
                         FileListTool(), SearchTool(), AskUserTool(), DeliverFileTool()]
    return {tool.name: tool for tool in tools}
