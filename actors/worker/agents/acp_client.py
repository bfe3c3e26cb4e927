"""What zeroclaw serves to a hosted ACP agent as its client: the agent's requests
and notifications, by method.

Runs on the agent process's loop thread (:mod:`actors.worker.agents.acp_process`).
``session/update`` and ``session/request_permission`` are handed to the
session's turn (its :class:`SessionLink` inbox, read on the session's actor
thread); ``fs/read_text_file``, ``fs/write_text_file`` and ``terminal/*`` go to the
client that holds the session when it offers them (:mod:`actors.worker.agents.acp_relay`),
else zeroclaw serves them: its file tools under the session's path policy on a
worker thread, its own sandboxed terminals (:mod:`actors.worker.agents.acp_terminals`).
An extension request (``_name``) goes to the client holding the session (-32601
when none takes it), an extension notification goes there as a notification.
Anything else gets -32601 from the endpoint.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any

from actors.worker.agents.acp_process import AgentProcess, SessionLink
from actors.worker.agents.acp_relay import relay_or_serve
from actors.worker.tools import FileReadTool, FileWriteTool, ToolEnv, ToolError
from ipc.errors import InvalidParams, MethodNotFound
from ipc.extensions import ExtensionMethods
from ipc.worker_wire import EncodeError

__all__ = ["CANCELLED_OUTCOME", "HANDLERS", "NOTIFICATIONS", "TERMINAL_METHODS",
           "between_turns", "on_updates"]

log = logging.getLogger("zeroclaw.agent")

TERMINAL_METHODS = ("terminal/create", "terminal/output", "terminal/wait_for_exit",
                    "terminal/kill", "terminal/release")
#: The answer to a permission request nobody can decide (no turn, cancelled, no option).
CANCELLED_OUTCOME: dict[str, Any] = {"outcome": {"outcome": "cancelled"}}

def _link(process: AgentProcess, params: Any) -> SessionLink | None:
    sid = params.get("sessionId") if isinstance(params, Mapping) else None
    return process.links.get(sid) if isinstance(sid, str) else None


def _on_update(process: AgentProcess, params: Any) -> None:
    sid = params.get("sessionId") if isinstance(params, Mapping) else None
    update = params.get("update") if isinstance(params, Mapping) else None
    link = process.link_or_keep(sid, [update]) if isinstance(sid, str) else None
    if link is None:
        return
    mode_id = _switched_mode(update)
    if mode_id is not None and link.mode_switched is not None:
        link.mode_switched(mode_id)  # the host's view of the agent's mode, in a turn or not
    turn = link.turn
    if turn is None:
        between_turns(process, link, [update])
        return
    turn.update(update)


def on_updates(process: AgentProcess, run: list[dict[str, Any]]) -> bool:
    """The params of ``session/update`` notifications the agent wrote one after another,
    in order: each session's consecutive updates go to its open turn together (as
    :func:`_on_update` does one by one). Whether one of those turns streams on."""
    link: SessionLink | None = None
    updates: list[Any] = []
    streaming = False
    for params in run:
        sid = params.get("sessionId")
        if link is None or sid != link.agent_session_id:
            streaming = _to_turn(process, link, updates) or streaming
            updates = []
            link = process.link_or_keep(sid, [params.get("update")]) if isinstance(
                sid, str) else None
            if link is None:
                continue
        update = params.get("update")
        if type(update) is not dict or update.get("sessionUpdate") != "agent_message_chunk":
            mode_id = _switched_mode(update)
            if mode_id is not None and link.mode_switched is not None:
                link.mode_switched(mode_id)
        updates.append(update)
    return _to_turn(process, link, updates) or streaming


def _to_turn(process: AgentProcess, link: SessionLink | None, updates: list[Any]) -> bool:
    if link is None or not updates:
        return False
    turn = link.turn
    if turn is None:
        between_turns(process, link, updates)
        return False
    return turn.updates(updates)


#: What an agent's ``session/load`` replays of a session's history.
HISTORY_UPDATES = frozenset({"user_message_chunk", "agent_message_chunk",
                             "agent_thought_chunk", "tool_call", "tool_call_update", "plan"})


def between_turns(process: AgentProcess, link: SessionLink, updates: list[Any]) -> None:
    """Updates the agent sent between turns (its commands after ``session/new``, a
    title, a mode it switched to) go to the client that holds the session as they
    came, under zeroclaw's session id; they belong to no turn, so no turn keeps them."""
    if link.client is None or not link.sid:
        log.debug("agent %s: session/update outside a turn dropped (no client)",
                  process.alias)
        return
    for update in updates:
        if link.replayed and isinstance(update, dict) and (
                update.get("sessionUpdate") in HISTORY_UPDATES):
            continue  # the agent's own replay of a reopened session: the store has it
        try:
            link.client.notify("session/update", {"sessionId": link.sid, "update": update})
        except EncodeError as exc:
            log.info("agent %s: an update between turns cannot be passed on: %s",
                     process.alias, exc)


def _switched_mode(update: Any) -> str | None:
    """The new mode of a ``current_mode_update``; None for any other update."""
    if not isinstance(update, Mapping) or update.get("sessionUpdate") != "current_mode_update":
        return None
    mode_id = update.get("currentModeId")
    return mode_id if isinstance(mode_id, str) and mode_id else None


def _on_permission(process: AgentProcess, params: Any) -> Any:
    link = _link(process, params)
    turn = link.turn if link is not None else None
    if turn is None:
        return CANCELLED_OUTCOME
    loop = asyncio.get_running_loop()
    answer: asyncio.Future[Any] = loop.create_future()

    def reply(outcome: dict[str, Any]) -> None:  # any thread
        loop.call_soon_threadsafe(_settle, answer, outcome)

    turn.put(("permission", (params, reply)))
    return answer


def _settle(future: asyncio.Future[Any], value: Any) -> None:
    if not future.done():
        future.set_result(value)


def _on_read(process: AgentProcess, params: Any) -> Any:
    link = _required_link(process, params)

    def local() -> Any:
        args = {"path": params.get("path")}
        return asyncio.to_thread(_read_text, link, args, params.get("line"), params.get("limit"))

    return relay_or_serve(link, "fs/read_text_file", params, local)


def _on_write(process: AgentProcess, params: Any) -> Any:
    link = _required_link(process, params)
    if link.mode() == "read_only":
        raise InvalidParams("fs/write_text_file refused: the session's autonomy is read_only")

    def local() -> Any:
        args = {"path": params.get("path"), "content": params.get("content")}
        return asyncio.to_thread(_write_text, link, args)

    return relay_or_serve(link, "fs/write_text_file", params, local)


def _terminal_handler(method: str) -> Callable[[AgentProcess, Any], Any]:
    """``terminal/*``: a terminal zeroclaw runs is served here; anything else goes
    to the session's client when it offers terminals, else to zeroclaw's own."""

    def handle(process: AgentProcess, params: Any) -> Any:
        link = _required_link(process, params)
        terminals = link.terminals
        if method == "terminal/create":
            if link.mode() == "read_only":
                raise InvalidParams("terminal/create refused: the session's autonomy is "
                                    "read_only")
            return relay_or_serve(link, method, params, lambda: terminals.create(params))
        if terminals.has(params.get("terminalId")):
            return terminals.serve(method, params)
        return relay_or_serve(link, method, params, lambda: terminals.serve(method, params))

    return handle


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


def _on_extension(method: str, process: AgentProcess, params: Any) -> Any:
    """An extension request (``_name``) about one of its sessions goes to the client
    holding it; nothing here serves one (-32601)."""
    link = _required_link(process, params)

    async def missing() -> Any:
        raise MethodNotFound(f"Method not found: {method}")

    return relay_or_serve(link, method, params, missing)


def _on_extension_notice(method: str, process: AgentProcess, params: Any) -> None:
    """An extension notification (``_name``) about one of its sessions goes on to the
    client holding it as a notification; dropped when there is none to take it."""
    link = _link(process, params)
    if link is None or link.client is None or not link.sid:
        log.debug("agent %s: notification %s for no reachable client dropped",
                  process.alias, method)
        return
    try:
        link.client.notify(method, {**params, "sessionId": link.sid})
    except EncodeError as exc:
        log.info("agent %s: notification %s cannot be passed on: %s", process.alias, method,
                 exc)


HANDLERS: dict[str, Callable[..., Any]] = ExtensionMethods({
    "session/update": _on_update,
    "session/request_permission": _on_permission,
    "fs/read_text_file": _on_read,
    "fs/write_text_file": _on_write,
    **{method: _terminal_handler(method) for method in TERMINAL_METHODS},
}, _on_extension)
#: The agent's notifications handled otherwise than its requests: extensions go on as
#: notifications.
NOTIFICATIONS: dict[str, Callable[..., Any]] = ExtensionMethods({}, _on_extension_notice)
