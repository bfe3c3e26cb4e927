"""An MCP server's tool as one of the session's tools (:class:`actors.worker.tools.Tool`).

Its kind and whether it mutates are zeroclaw's, never the server's: a tool is
``other`` and mutating (supervised asks, read_only refuses) unless the agent's
``mcp_read_only_tools`` lists its (prefixed) name; then it is ``read`` and runs
without asking. A server's ``readOnlyHint`` is only mentioned to the model.
Runs on the session actor's thread, like every tool.
"""

from __future__ import annotations

from typing import Any, ClassVar

from actors.worker.mcp.connection import ListedTool, McpCallFailed, McpConnection
from actors.worker.tools.base import Tool, ToolEnv, ToolError, ToolResult

__all__ = ["McpTool", "mcp_tool", "result_text"]

MAX_RESULT_CHARS = 256 * 1024


class McpTool(Tool):
    """One listed tool of one server; :func:`mcp_tool` makes the class per tool (name,
    kind and mutating are class attributes of every tool)."""

    name: ClassVar[str] = "mcp"
    kind: ClassVar[str] = "other"
    mutating: ClassVar[bool] = True
    connection: ClassVar[McpConnection]
    listed: ClassVar[ListedTool]

    def title(self, args: dict[str, Any]) -> str:
        return f"{self.connection.spec.name}: {self.listed.name}"

    def unavailable(self) -> str | None:
        connection = self.connection
        if connection.state != "running":
            return connection.problem or f"{connection.label} is {connection.state}"
        return None

    def run(self, args: dict[str, Any], env: ToolEnv) -> ToolResult:
        try:
            result = self.connection.call(self.listed.name, args, env.cancelled)
        except McpCallFailed as exc:
            raise ToolError(str(exc)) from None
        text = result_text(result)
        raw: dict[str, Any] = {"content": [_dump(block) for block in result.content]}
        structured = getattr(result, "structured_content", None)
        if structured is not None:
            raw["structuredContent"] = structured
        error = bool(getattr(result, "is_error", False))
        if error:
            raw["isError"] = True
        return ToolResult(text=text, raw_output=raw, ok=not error)


def mcp_tool(prefixed: str, listed: ListedTool, connection: McpConnection,
             read_only: bool) -> McpTool:
    """The session tool named ``prefixed`` for ``listed``; ``read_only`` from zeroclaw's
    own allowlist."""
    cls = type(f"McpTool_{prefixed}", (McpTool,), {
        "name": prefixed, "kind": "read" if read_only else "other",
        "mutating": not read_only, "connection": connection, "listed": listed})
    return cls()


def _dump(block: Any) -> Any:
    dump = getattr(block, "model_dump", None)
    return dump(mode="json", by_alias=True, exclude_none=True) if dump else str(block)


def result_text(result: Any) -> str:
    """The text a model gets: text blocks as they are, other blocks named."""
    parts: list[str] = []
    for block in getattr(result, "content", ()) or ():
        kind = getattr(block, "type", "")
        if kind == "text":
            parts.append(str(getattr(block, "text", "")))
        elif kind == "resource":
            resource = getattr(block, "resource", None)
            parts.append(str(getattr(resource, "text", "") or
                             f"[resource {getattr(resource, 'uri', '')}]"))
        else:
            parts.append(f"[{kind or 'content'} block]")
    text = "\n".join(parts)
    if not text and getattr(result, "structured_content", None) is not None:
        import orjson

        text = orjson.dumps(result.structured_content).decode()
    if len(text) > MAX_RESULT_CHARS:
        text = text[:MAX_RESULT_CHARS] + f"\n[truncated: {len(text)} characters]"
    return text
