"""The host's slash commands: ``/help``, ``/status``, ``/mode NAME``, ``/clear``.

A prompt whose text starts with one of these words is answered by the host
without calling the agent: the answer streams as one ``agent_message_chunk``
and the prompt ends with ``end_turn``. Any other ``/word`` is ordinary text for
the agent. ACP clients learn the list from the ``available_commands_update`` the
host sends after ``session/new``, ``session/load`` and ``session/resume``.

The host's answers are stored as ordinary turns (the command as the user text,
the answer as the assistant text, no tokens), so ``session/load`` replays the
conversation exactly as the user saw it. The agent never sees them: a restored
session's history (:func:`agent_history`) leaves them out, as the live agent
never had them. ``/clear`` starts a fresh context: the agent forgets the
session's history, and the store keeps it (``session/load`` still replays it). Its
stored turn is the marker: a restored agent gets only what came after the last
``/clear``, and the live session is dropped from its worker right after the
clear turn is committed, so its next prompt restores it through that same rule.

Runs on the asyncio loop thread.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from ipc.errors import InternalError, RpcError
from ipc.events import AvailableCommands, CommandInfo, MessageChunk, TextItem, TurnItem, TurnRecord
from supervisor.config.config import AUTONOMY_LEVELS

if TYPE_CHECKING:
    from supervisor.config.config import Settings
    from supervisor.core.peer import Peer
    from supervisor.core.routes import Route, RunningTurn
    from supervisor.host.host import Host

__all__ = ["COMMANDS", "CommandSessions", "HostCommand", "agent_history",
           "available_commands", "parse", "run_host_command"]

COMMANDS: tuple[CommandInfo, ...] = (
    CommandInfo("help", "List the commands the host answers itself"),
    CommandInfo("status", "This session's agent, mode, turns and token usage"),
    CommandInfo("mode", "Switch the autonomy mode: " + ", ".join(AUTONOMY_LEVELS),
                hint=" | ".join(AUTONOMY_LEVELS)),
    CommandInfo("clear", "Start a fresh context: the agent forgets this session's history "
                "(the store keeps it)"),
)
_NAMES = frozenset(c.name for c in COMMANDS)
CLEARED = ("Context cleared: the agent starts afresh with the next prompt. "
           "The conversation stays stored (session/load still shows it).")


@dataclass(frozen=True, slots=True)
class HostCommand:
    """A slash command found at the start of a prompt, and the text after its name."""

    name: str
    argument: str


class CommandSessions(Protocol):
    """What a command needs of the session operations that run it
    (:class:`supervisor.host.sessions.Sessions`, which imports this module)."""

    @property
    def host(self) -> Host: ...

    @property
    def settings(self) -> Settings: ...

    async def set_mode(self, peer: Peer, sid: str, mode: str) -> None: ...


def available_commands() -> AvailableCommands:
    return AvailableCommands(COMMANDS)


def parse(text: str) -> HostCommand | None:
    """The host command ``text`` starts with (its first word is ``/help``, ``/status``,
    ``/mode`` or ``/clear``), else None: the text goes to the agent."""
    words = text.strip().split(maxsplit=1)
    if not words or not words[0].startswith("/") or words[0][1:] not in _NAMES:
        return None
    return HostCommand(words[0][1:], words[1].strip() if len(words) > 1 else "")


def agent_history(items: Sequence[TurnItem]) -> list[TurnItem]:
    """What the agent remembers of a session's stored items: the turns after the last
    ``/clear``, without the host's own command turns (each turn starts with its
    user text)."""
    kept: list[TurnItem] = []
    host_turn = False
    for item in items:
        if isinstance(item, TextItem) and item.role == "user":
            command = parse(item.text)
            host_turn = command is not None
            if command is not None and command.name == "clear":
                kept.clear()
        if not host_turn:
            kept.append(item)
    return kept


async def run_host_command(sessions: CommandSessions, turn: RunningTurn, route: Route, text: str,
              command: HostCommand) -> None:
    """Answer ``command`` as the turn's reply, store it as a turn, and settle the prompt
    (this owns the turn's ending, as a worker's ``TurnEnded`` does for agent turns)."""
    host = sessions.host
    try:
        reply = await _ANSWERS[command.name](sessions, turn, route, command.argument)
    except Exception as exc:
        host.turns.settle(turn, error=exc if isinstance(exc, RpcError) else InternalError())
        return
    turn.peer.send_event(turn.sid, MessageChunk(reply))
    now = time.time()
    record = TurnRecord(session_id=turn.sid, items=(TextItem("user", text),
                        TextItem("assistant", reply)), stop_reason="end_turn",
                        content=reply, started_at=now, finished_at=now)
    await host.turns.complete(turn, record)
    if command.name == "clear":  # committed or not, the live agent must go: the next
        await host.evict(turn.sid)  # prompt restores it as the store says (after the marker)


async def _help(sessions: CommandSessions, turn: RunningTurn, route: Route, argument: str) -> str:
    lines = ["Commands answered by zeroclaw itself (other text goes to the agent):"]
    for command in COMMANDS:
        usage = f"/{command.name}" + (" NAME" if command.hint else "")
        lines.append(f"  {usage:<12} {command.description}")
    return "\n".join(lines)


async def _status(sessions: CommandSessions, turn: RunningTurn, route: Route, argument: str) -> str:
    agent = sessions.settings.agents.get(route.agent_alias)
    provider = f" ({agent.provider})" if agent is not None else ""
    return "\n".join([
        f"session: {route.sid}",
        f"agent: {route.agent_alias}{provider}",
        f"mode: {route.mode}",
        f"cwd: {route.cwd}",
        f"turns: {route.status['turns']}",
        f"usage: {route.status['usage']['totalTokens']} tokens (estimated)",
    ])


async def _mode(sessions: CommandSessions, turn: RunningTurn, route: Route, argument: str) -> str:
    """As ``session/set_mode``: persisted, and a ``current_mode_update`` goes to the client."""
    choices = ", ".join(AUTONOMY_LEVELS)
    mode = argument.split()[0] if argument else ""
    if not mode:
        return f"Mode: {route.mode}. Switch with /mode NAME (one of {choices})."
    if mode not in AUTONOMY_LEVELS:
        return f"Unknown mode {mode[:40]!r}: use one of {choices}."
    await sessions.set_mode(turn.peer, turn.sid, mode)
    return f"Mode set to {mode}."


async def _clear(sessions: CommandSessions, turn: RunningTurn, route: Route, argument: str) -> str:
    return CLEARED


_ANSWERS: dict[str, Callable[[CommandSessions, RunningTurn, Route, str], Awaitable[str]]] = {
    "help": _help,
    "status": _status,
    "mode": _mode,
    "clear": _clear,
}
