"""What zeroclaw serves to a hosted ACP agent as its client: the agent's requests
and notifications, by method.

Runs on the agent process's loop thread (:mod:`actors.agents.acp_process`).
``session/update`` and ``session/request_permission`` are handed to the
session's turn (its :class:`SessionLink` inbox, read on the session's actor
thread); ``fs/read_text_file`` and ``fs/write_text_file`` run zeroclaw's file
tools under the session's path policy on a worker thread. Anything else gets
-32601 from the endpoint.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any

from actors.agents.acp_process import AgentProcess, SessionLink
from actors.tools import FileReadTool, FileWriteTool, ToolEnv, ToolError
from ipc.errors import InvalidParams

__all__ = ["CANCELLED_OUTCOME", "HANDLERS"]

log = logging.getLogger("zeroclaw.agent")

#: The answer to a permission request nobody can decide (no turn, cancelled, no option).
CANCELLED_OUTCOME: dict[str, Any] = {"outcome": {"outcome": "cancelled"}}

def _link(process: AgentProcess, params: Any) -> SessionLink | None:
    sid = params.get("sessionId") if isinstance(params, Mapping) else None
    return process.links.get(sid) if isinstance(sid, str) else None


def _on_update(process: AgentProcess, params: Any) -> None:
    link = _link(process, params)
    if link is None or not link.turn_open.is_set():
        log.debug("agent %s: session/update outside a turn dropped", process.alias)
        return
    link.inbox.put(("update", params.get("update")))


def _on_permission(process: AgentProcess, params: Any) -> Any:
    link = _link(process, params)
    if link is None or not link.turn_open.is_set():
        return CANCELLED_OUTCOME
    loop = asyncio.get_running_loop()
    answer: asyncio.Future[Any] = loop.create_future()

    def reply(outcome: dict[str, Any]) -> None:  # any thread
        loop.call_soon_threadsafe(_settle, answer, outcome)

    link.inbox.put(("permission", (params, reply)))
    return answer


def _settle(future: asyncio.Future[Any], value: Any) -> None:
    if not future.done():
        future.set_result(value)


def _on_read(process: AgentProcess, params: Any) -> Any:
    link = _required_link(process, params)
    args = {"path": params.get("path")}
    return asyncio.to_thread(_read_text, link, args, params.get("line"), params.get("limit"))


def _on_write(process: AgentProcess, params: Any) -> Any:
    link = _required_link(process, params)
    if link.mode() == "read_only":
        raise InvalidParams("fs/write_text_file refused: the session's autonomy is read_only")
    args = {"path": params.get("path"), "content": params.get("content")}
    return asyncio.to_thread(_write_text, link, args)


def _required_link(process: AgentProcess, params: Any) -> SessionLink:
    link = _link(process, params)
    if link is None:
        raise InvalidParams("sessionId: no such session of this client")
    return link


def _read_text(link: SessionLink, args: dict[str, Any], line: Any, limit: Any) -> dict[str, Any]:
    """``fs/read_text_file`` through the ``file_read`` tool (a worker thread)."""
    try:
        result = FileReadTool().run(args, ToolEnv(link.paths, threading.Event()))
    except ToolError as exc:
        raise InvalidParams(f"fs/read_text_file: {exc}") from None
    content = str(result.raw_output["content"])
    if _positive(line) or _positive(limit):
        lines = content.splitlines(keepends=True)
        start = line - 1 if _positive(line) else 0
        end = start + limit if _positive(limit) else len(lines)
        content = "".join(lines[start:end])
    return {"content": content}


def _write_text(link: SessionLink, args: dict[str, Any]) -> None:
    """``fs/write_text_file`` through the ``file_write`` tool (a worker thread)."""
    try:
        FileWriteTool().run(args, ToolEnv(link.paths, threading.Event()))
    except ToolError as exc:
        raise InvalidParams(f"fs/write_text_file: {exc}") from None


def _positive(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


HANDLERS: dict[str, Callable[[AgentProcess, Any], Any]] = {
    "session/update": _on_update,
    "session/request_permission": _on_permission,
    "fs/read_text_file": _on_read,
    "fs/write_text_file": _on_write,
}
