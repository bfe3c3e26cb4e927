"""The interface between a session actor and the agent that produces a turn.

An :class:`Agent` is created once per session (on the worker's IO thread, when
the session opens) and then only used on that session's actor thread, one
turn at a time. During a turn it talks to the world through a
:class:`TurnContext`: it emits events, runs tools (approval and path rules are
applied for it) and watches the cancel flag.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal, Protocol, TypeAlias

from actors.worker.tools.base import Tool
from actors.worker.tools.paths import PathPolicy
from ipc.events import Event, TextItem, ToolItem, TurnItem

__all__ = [
    "Agent",
    "AgentFailure",
    "AgentRefused",
    "ClientChannel",
    "SessionSetup",
    "ToolCallOutcome",
    "TurnContext",
    "TurnResult",
    "TurnStop",
    "estimate_tokens",
    "history_tokens",
]


#: How an agent may end a turn other than normally (ACP stop reasons): the model hit its
#: output limit, or refused. ``None`` from :meth:`Agent.run_turn` means ``end_turn``.
TurnStop: TypeAlias = Literal["max_tokens", "refusal"]


class AgentFailure(Exception):
    """The turn cannot go on; the message is shown to the client. The session stays usable."""


class AgentRefused(AgentFailure):
    """The agent answered the turn's request with a JSON-RPC error: the client gets that
    error as the agent sent it (``error``: ``{code, message, data?}``, data bounded);
    the message (naming the agent) is for the log and the stored turn."""

    def __init__(self, text: str, error: dict[str, Any]) -> None:
        super().__init__(text)
        self.error = error


@dataclass(frozen=True, slots=True)
class ToolCallOutcome:
    """How a tool call ended: ``outcome`` is ``completed``, ``failed`` or ``denied``."""

    tool_call_id: str
    outcome: str
    text: str
    raw_output: Any = None


@dataclass(frozen=True, slots=True)
class ClientChannel:
    """Requests to the client that holds the session, through the host (a hosted ACP
    agent's ``fs/*`` and ``terminal/*``). ``call(method, params)`` may run on any
    thread; its future holds the host's :class:`ipc.worker_wire.ClientReply`, or None
    when the wait was withdrawn (the turn was cancelled or ended). The host gives the
    client ``timeout`` seconds; a caller waits a little longer, never forever."""

    call: Callable[[str, dict[str, Any]], Future[Any]]
    timeout: float
    #: ``notify(method, params)``: a notification for that client (an extension
    #: ``_name``), nothing answers it; any thread; raises EncodeError.
    notify: Callable[[str, dict[str, Any]], None]


@dataclass(frozen=True, slots=True)
class SessionSetup:
    """What an agent may know about its session when it opens (see :meth:`Agent.open`).

    ``mode`` reads the session's current autonomy level (thread-safe);
    ``mcp_servers`` is the client's list from ``session/new``, as sent; ``meta`` the
    stored session's meta (what earlier turns' :attr:`TurnResult.session_meta` kept);
    ``client`` reaches the session's client (None: no host to ask, as in unit tests);
    ``modes_changed`` tells the host that :meth:`Agent.own_modes` changed (any thread);
    ``tools`` is the session's tool registry, where an agent may add tools of its own
    (its MCP servers'; the actor thread only) so that :meth:`TurnContext.run_tool`
    runs them under the session's rules like any other; ``report_mcp`` tells the
    host the state of the session's MCP servers for ``status`` (any thread).
    """

    sid: str
    paths: PathPolicy
    mode: Callable[[], str]
    mcp_servers: tuple[Any, ...] = ()
    has_history: bool = False
    meta: Mapping[str, Any] = field(default_factory=dict)
    client: ClientChannel | None = None
    modes_changed: Callable[[], None] | None = None
    tools: MutableMapping[str, Tool] | None = None
    report_mcp: Callable[[list[dict[str, Any]]], None] | None = None


@dataclass(frozen=True, slots=True)
class TurnResult:
    """What :meth:`Agent.run_turn` may return: the ACP stop reason (None: the default,
    ``end_turn``, or ``cancelled`` when the turn was cancelled), fields for the
    prompt result's ``_meta.zeroclaw`` (``meta``), and fields merged into the
    stored session's ``meta`` once the turn is stored (``session_meta``)."""

    stop_reason: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    session_meta: dict[str, Any] = field(default_factory=dict)


class TurnContext(Protocol):
    """What an agent may use during one turn (implemented by the session actor)."""

    @property
    def cancelled(self) -> threading.Event:
        """Set when the client cancels the turn; check it often and return soon after."""
        ...

    @property
    def workspace(self) -> Path:
        """The session's effective workspace (its cwd, else the agent's workspace):
        where relative tool paths and the shell start."""
        ...

    @property
    def history(self) -> Sequence[TurnItem]:
        """The session's earlier turns, oldest first (not the current one)."""
        ...

    @property
    def history_tokens(self) -> int:
        """:func:`history_tokens` of :attr:`history`, kept up to date (no rescan per turn)."""
        ...

    def emit(self, event: Event) -> None:
        """Stream one event to the client (and into the turn's record)."""
        ...

    def emit_all_nowait(self, events: Sequence[Event]) -> bool:
        """:meth:`emit` of each of ``events`` without waiting while the client lags:
        whether it may go on so (False: the stream window is used up, the next events
        go through :meth:`emit`). Any thread, never while another emits for the turn."""
        ...

    def ask_permission(
        self, tool_call_id: str, tool_name: str, title: str, kind: str, raw_input: Any,
        *, request: Mapping[str, Any] | None = None,
    ) -> str | None:
        """Ask the client; the chosen option id, or None if cancelled, timed out or gone.
        ``request``: a hosted agent's own ``session/request_permission`` params (no
        ``sessionId``), which the client then gets as they are, instead of zeroclaw's."""
        ...

    def ask_user(self, message: str, schema: dict[str, Any]) -> dict[str, Any] | None:
        """Ask the user (``elicitation/create`` where the client supports it).

        The answer is ``{action: accept|decline|cancel, content}``; None when the
        client cannot be asked, does not answer in time, or the turn is cancelled.
        """
        ...

    def run_tool(self, name: str, raw_input: Any, call_id: str | None = None,
                 step: int = 0) -> ToolCallOutcome:
        """Announce, authorise (session mode), run and report one tool call.

        ``call_id`` is its id for the client and the store; the caller makes sure no
        other call of the session has it. None: a new one. ``step``: which model reply
        of the turn asked for it (stored, see :class:`ipc.events.ToolItem`)."""
        ...


class Agent(ABC):
    """A conversational agent. ``config`` is the agent's config section plus ``alias``."""

    provider: ClassVar[str]
    #: The host waits at ``session/new`` for this agent's session to open (it may have
    #: modes of its own: :meth:`own_modes`).
    reports_open: ClassVar[bool] = False

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config

    @classmethod
    def config_problem(cls, config: Mapping[str, Any], env: Mapping[str, str]) -> str | None:
        """Why ``config`` cannot work in ``env`` (a missing key, a bad value), else None.

        Pure; the host calls it at ``session/new`` (loop thread), the worker when it
        creates the agent.
        """
        return None

    def open(self, setup: SessionSetup) -> None:
        """The session's actor started (its thread); the default does nothing."""
        return None

    def close(self) -> None:
        """The session's actor stops (its thread); the default does nothing."""
        return None

    def forward(self, method: str, params: dict[str, Any]) -> Future[Any] | None:
        """A client's request for the agent itself (an extension method ``_name``, the
        agent's own ``session/set_mode``), for an agent that takes them: the future of
        its result (RpcError or AgentFailure for an error), or None (the default: this
        agent takes none, -32601). The worker's IO thread calls it: it must not block."""
        return None

    def notify(self, method: str, params: dict[str, Any]) -> None:
        """A client's notification for the agent itself (an extension method
        ``_name``): dropped by default. The worker's IO thread calls it: it must not
        block."""
        return None

    def own_modes(self) -> dict[str, Any] | None:
        """The agent's own session modes (``{currentModeId, availableModes}``) once
        :meth:`open` returned, for an agent that has them; None (the default) else."""
        return None

    @abstractmethod
    def run_turn(self, prompt: str, ctx: TurnContext) -> TurnResult | None:
        """Produce one turn for ``prompt``; return early when ``ctx.cancelled`` is set.

        Return None for a normal end (``end_turn``), or a :class:`TurnResult` with
        another stop reason (a model's :data:`TurnStop`) or fields for the result.
        Raise :class:`AgentFailure` for a failure the client should see.
        """


def estimate_tokens(text: str) -> int:
    """A rough token count (about four characters per token)."""
    return (len(text) + 3) // 4


def history_tokens(items: Sequence[TurnItem]) -> int:
    """:func:`estimate_tokens` over the text of ``items``."""
    total = 0
    for item in items:
        if isinstance(item, TextItem):
            total += estimate_tokens(item.text)
        elif isinstance(item, ToolItem):
            total += estimate_tokens(item.result)
    return total
