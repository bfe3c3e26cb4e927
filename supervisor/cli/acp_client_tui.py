"""``zeroclaw acp client``: the interactive debug client for a person at a terminal.

prompt_toolkit reads the input line (``PromptSession.prompt_async``) while the
server's updates print above it (``patch_stdout``). A prompt runs as its own task,
so ``/cancel`` and permission answers can be typed while it streams. Permission
requests queue: while one waits, a number answers the oldest. Everything runs on
the asyncio loop of the main thread (prompt_toolkit's stdout proxy flushes from its
own thread).
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from prompt_toolkit import PromptSession
from prompt_toolkit.key_binding import KeyBindings, KeyPressEvent
from prompt_toolkit.patch_stdout import patch_stdout

from supervisor.cli.acp_client import (
    CANCELLED,
    ClientSession,
    ConnectionLost,
    Handlers,
    RemoteError,
    ServerConnection,
    ServerStartError,
    selected,
)
from supervisor.cli.acp_client_options import EXIT_SERVER, ClientOptions
from supervisor.cli.acp_client_policy import auto_approval
from supervisor.cli.acp_client_view import (
    Line,
    StreamBuffer,
    offered_options,
    paint,
    permission_lines,
    update_lines,
)

__all__ = ["run_interactive"]

INITIALIZE_TIMEOUT = 60.0
IDLE_FLUSH = 0.4  # seconds: an unfinished streamed line is shown after this pause
HELP = ("commands: /cancel (the running prompt), /mode [ID], /load ID, /list, /help, /quit; "
        "anything else is a prompt (Alt-Enter: a new line in it)")


def run_interactive(options: ClientOptions) -> int:
    """Until ``/quit`` or end of input: 0; 3 when the server could not start or died."""
    try:
        return asyncio.run(Client(options).run())
    except KeyboardInterrupt:
        return 130


def _newline_keys() -> KeyBindings:
    """Alt-Enter (Esc then Enter) puts a newline in the prompt; Enter sends it."""
    keys = KeyBindings()

    @keys.add("escape", "enter")
    def _newline(event: KeyPressEvent) -> None:
        event.current_buffer.insert_text("\n")

    return keys


@dataclass
class _Ask:
    """A permission request waiting for the user's number."""

    params: Mapping[str, Any]
    answer: asyncio.Future[dict[str, Any]]


class Client:
    """The interactive client's state: the connection, the session, the screen."""

    def __init__(self, options: ClientOptions) -> None:
        self.options = options
        self.color = sys.stdout.isatty()
        self.stream = StreamBuffer()
        self.asks: deque[_Ask] = deque()
        self.turn: asyncio.Task[None] | None = None
        self.flush_timer: asyncio.TimerHandle | None = None
        self.input: PromptSession[str] = PromptSession(message=self._message,
                                                       key_bindings=_newline_keys())
        handlers = Handlers(on_update=self._on_update, on_permission=self._on_permission,
                            on_stderr=lambda text: self.show([("dim", f"server: {text}")]))
        self.connection = ServerConnection(options.server, handlers)
        self.session = ClientSession(self.connection, options.cwd)

    def _message(self) -> str:
        """The input line's prompt: what typing a line now does."""
        if self.asks:
            return f"permission 1-{len(offered_options(self.asks[0].params))}> "
        mode = self.session.modes.get("currentModeId")
        head = f"[{mode}]" if mode else ""
        return f"{head} ...> " if self.turn is not None else f"{head}> "

    def show(self, lines: Sequence[Line]) -> None:
        """Print lines above the input line."""
        if lines:
            sys.stdout.write(paint(lines, self.color))
            sys.stdout.flush()

    def _redraw(self) -> None:
        with contextlib.suppress(Exception):  # no prompt running yet
            self.input.app.invalidate()

    # --- the server's messages ---------------------------------------------------

    def _on_update(self, params: Mapping[str, Any]) -> None:
        update = params.get("update")
        if not isinstance(update, Mapping):
            return
        self.show(update_lines(update, self.stream))
        if self.flush_timer is not None:
            self.flush_timer.cancel()
        if self.stream.partial:
            loop = asyncio.get_running_loop()
            self.flush_timer = loop.call_later(IDLE_FLUSH, self._flush_stream)
        if update.get("sessionUpdate") == "current_mode_update":
            self.session.modes = {**self.session.modes,
                                  "currentModeId": update.get("currentModeId")}
            self._redraw()

    def _flush_stream(self) -> None:
        self.flush_timer = None
        self.show(self.stream.flush())

    async def _on_permission(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """Auto-approve by the rule, else show the request and wait for a number."""
        self.show(self.stream.flush())
        if self.options.auto_approve:
            verdict = auto_approval(params, self.options.cwd)
            if verdict.option_id is not None:
                self.show([("ok", f"auto-approved: {verdict.reason}")])
                return selected(verdict.option_id)
        if not offered_options(params):
            self.show([("error", "permission request without options: cancelled")])
            return CANCELLED
        ask = _Ask(params, asyncio.get_running_loop().create_future())
        self.asks.append(ask)
        if len(self.asks) == 1:
            self.show(permission_lines(params))
        self._redraw()
        return await ask.answer

    # --- the user's lines ----------------------------------------------------------

    async def run(self) -> int:
        """Connect, then read lines until /quit, end of input or the server's end."""
        with patch_stdout(raw=True):
            if not await self._connect():
                return EXIT_SERVER
            reading = asyncio.create_task(self._read_lines())
            ended = asyncio.create_task(self.connection.ended.wait())
            await asyncio.wait({reading, ended}, return_when=asyncio.FIRST_COMPLETED)
            server_died = ended.done() and not reading.done()
            reading.cancel()
            ended.cancel()
            if server_died:
                self.show([("error", "the server exited")])
            await self.connection.stop()
        return EXIT_SERVER if server_died else 0

    async def _connect(self) -> bool:
        try:
            await self.connection.start()
            agent = await self.session.initialize(INITIALIZE_TIMEOUT)
            sid = await self.session.new()
        except (ServerStartError, RemoteError, ConnectionLost, TimeoutError, KeyError,
                TypeError) as exc:
            self.show([("error", f"the server could not open a session: {exc}")])
            await self.connection.stop()
            return False
        info = agent.get("agentInfo") or {}
        self.show([("bold", f"connected to {info.get('name', '?')} {info.get('version', '')}"),
                   ("dim", f"session {sid} in {self.options.cwd}"), ("dim", HELP)])
        return True

    async def _read_lines(self) -> None:
        while True:
            try:
                line = await self.input.prompt_async()
            except EOFError:
                return
            except KeyboardInterrupt:
                if self.turn is not None:
                    self._cancel()
                continue
            if await self._handle(line.strip()):
                return

    async def _handle(self, line: str) -> bool:
        """Act on one typed line; True to quit."""
        if not line:
            return False
        if self.asks and not line.startswith("/"):
            self._answer(line)
            return False
        if line.startswith("/"):
            return await self._command(line)
        if self.turn is not None:
            self.show([("error", "a prompt is running: wait for it, or /cancel")])
            return False
        self.turn = asyncio.create_task(self._prompt(line))
        return False

    async def _prompt(self, text: str) -> None:
        """The prompt task: one ``session/prompt`` until its stop reason."""
        try:
            stop = await self.session.prompt(text)
            self.show([*self.stream.flush(), ("dim", f"(turn ended: {stop})")])
        except RemoteError as exc:
            self.show([*self.stream.flush(), ("error", f"prompt failed: {exc}")])
        except ConnectionLost:
            self.show(self.stream.flush())
        finally:
            self.turn = None
            self._redraw()

    def _answer(self, text: str) -> None:
        """A number typed for the oldest permission request."""
        ask = self.asks[0]
        options = offered_options(ask.params)
        if not text.isdigit() or not 1 <= int(text) <= len(options):
            self.show([("error", f"answer with a number from 1 to {len(options)}")])
            return
        option = options[int(text) - 1]
        self.asks.popleft()
        if not ask.answer.done():
            ask.answer.set_result(selected(str(option.get("optionId"))))
        self.show([("dim", f"answered: {option.get('name')}")])
        if self.asks:
            self.show(permission_lines(self.asks[0].params))
        self._redraw()

    def _cancel(self) -> None:
        """``session/cancel``; waiting permission requests are answered cancelled."""
        if self.turn is None:
            self.show([("error", "no prompt is running")])
            return
        self.session.cancel()
        while self.asks:
            ask = self.asks.popleft()
            if not ask.answer.done():
                ask.answer.set_result(CANCELLED)
        self.show([("note", "cancel sent")])
        self._redraw()

    async def _command(self, line: str) -> bool:
        """A ``/command``; True for ``/quit``."""
        name, _, arg = line.partition(" ")
        arg = arg.strip()
        if name in ("/quit", "/exit"):
            return True
        if name == "/cancel":
            self._cancel()
        elif name == "/help":
            self.show([("dim", HELP)])
        elif self.turn is not None and name in ("/mode", "/load", "/list"):
            self.show([("error", f"{name}: a prompt is running (/cancel first)")])
        elif name in ("/mode", "/load", "/list"):
            await self._session_command(name, arg)
        else:
            self.show([("error", f"unknown command {name} (/help)")])
        return False

    async def _session_command(self, name: str, arg: str) -> None:
        try:
            if name == "/mode":
                await self._mode(arg)
            elif name == "/load":
                await self._load(arg)
            else:
                await self._list()
        except RemoteError as exc:
            self.show([*self.stream.flush(), ("error", f"{name} failed: {exc}")])
        except ConnectionLost:
            self.show([("error", f"{name}: the server is gone")])

    async def _mode(self, mode_id: str) -> None:
        if not mode_id:
            modes = self.session.modes.get("availableModes") or []
            ids = " ".join(str(m.get("id")) for m in modes if isinstance(m, Mapping))
            current = self.session.modes.get("currentModeId")
            self.show([("note", f"mode {current}; available: {ids or '(none offered)'}")])
            return
        await self.session.set_mode(mode_id)
        self.show([("note", f"mode set: {mode_id}")])
        self._redraw()

    async def _load(self, session_id: str) -> None:
        if not session_id:
            self.show([("error", "/load needs a session id (/list shows them)")])
            return
        self.show([("note", f"loading {session_id}; its history:")])
        await self.session.load(session_id)
        self.show([*self.stream.flush(), ("note", f"loaded {session_id}")])
        self._redraw()

    async def _list(self) -> None:
        sessions = await self.session.list()
        lines: list[Line] = [("note", f"{len(sessions)} session(s):")]
        for entry in sessions:
            mark = "*" if entry.get("sessionId") == self.session.session_id else " "
            lines.append(("", f" {mark} {entry.get('sessionId')}  {entry.get('updatedAt', '')}"
                              f"  {entry.get('title') or ''}"))
        self.show(lines)
