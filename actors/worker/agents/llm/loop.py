"""zeroclaw's own agent loop on a model API; providers subclass :class:`ModelAgent`.

A turn: the system prompt, the session's history (oldest turns dropped to fit
``context_window``) and the prompt go to the model; its streamed reply reaches the
client as it arrives; the tool calls it asks for run through the session's rules
(:meth:`TurnContext.run_tool`) and their results go back to it, until it answers
without tools or ``max_tool_rounds`` is reached. Of one reply's tool calls the first
``max_tool_calls_per_reply`` run; the others are refused: the model gets a result
saying so, the client sees each as a failed tool call (ACP clients show those as
such, and the store keeps them, so the next request still answers every call the
model made and a session's requests keep extending each other). A turn that runs
past ``max_turn_secs`` (a server that keeps its stream open with comments, a model
that keeps calling tools) ends ``cancelled`` with what it streamed, and a line saying
why. A subclass says how its API is spoken: the URL, headers, request body, and
how a streamed payload reads.

Created on the worker's IO thread; turns run on the session actor's thread.
"""

from __future__ import annotations

import contextlib
import logging
import re
import threading
import uuid
from abc import abstractmethod
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

import orjson

from actors.worker.agents.base import (
    Agent,
    AgentFailure,
    SessionSetup,
    ToolCallOutcome,
    TurnContext,
    TurnResult,
    TurnStop,
    estimate_tokens,
)
from actors.worker.agents.llm.config import load_settings, settings_problem
from actors.worker.agents.llm.conversation import (
    AssistantMessage,
    Message,
    ToolCallRequest,
    ToolResultMessage,
    UserMessage,
    arguments_text,
    fit_history,
    history_turns,
    messages_tokens,
    system_prompt,
)
from actors.worker.agents.llm.http import ModelHttp, StreamEnd, model_failure
from actors.worker.agents.llm.mcp_bridge import McpBridge
from actors.worker.agents.llm.model_io import model_io
from actors.worker.agents.llm.reply import ModelReply, ReplyBuilder
from actors.worker.agents.llm.tool_specs import ToolSpec, model_tools
from actors.worker.cancel import TurnCancel, call_on_cancel
from ipc.events import MessageChunk, ToolCallFinished, ToolCallStarted, ToolItem, UsageUpdate

__all__ = ["ModelAgent"]

logger = logging.getLogger("zeroclaw.model")

#: A model's tool call id that the session may use as its own.
_PLAIN_ID = re.compile(r"[A-Za-z0-9_.:-]{1,128}")
#: Tokens kept free for the reply when ``max_tokens`` is not set.
DEFAULT_REPLY_RESERVE = 4096


class ModelAgent(Agent):
    """The provider-neutral loop; subclasses implement the four wire methods."""

    needs_api_key: ClassVar[bool] = False
    default_max_tokens: ClassVar[int | None] = None

    @classmethod
    def config_problem(cls, config: Mapping[str, Any], env: Mapping[str, str]) -> str | None:
        return settings_problem(config, env, needs_key=cls.needs_api_key)

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__(config)
        self.settings = load_settings(config, default_max_tokens=self.default_max_tokens)
        self.http = ModelHttp(self.settings)
        self.tools: tuple[ToolSpec, ...] = model_tools()
        self.mcp: McpBridge | None = None
        self._mcp_pending = False

    def open(self, setup: SessionSetup) -> None:
        """Start the session's MCP servers (their tools join at the first turn)."""
        self.mcp = McpBridge.open(self.config, setup)
        self._mcp_pending = self.mcp is not None

    def close(self) -> None:
        """Stop the session's MCP servers."""
        if self.mcp is not None:
            self.mcp.close()

    def _join_mcp(self, ctx: TurnContext) -> None:
        """At the first turn: wait for the MCP servers, offer their tools; at later
        ones: start again those that died. Say in the turn which cannot be used."""
        if self.mcp is None:
            return
        if self._mcp_pending:
            self._mcp_pending = False
            found, notices = self.mcp.ready()
            specs: list[ToolSpec] | None = found
        else:
            specs, notices = self.mcp.revive(ctx.cancelled)
        if specs is not None:
            self.tools = (*model_tools(), *specs)
        for notice in notices:
            ctx.emit(MessageChunk(f"[{notice}]\n"))

    # --- the wire, per provider ------------------------------------------------------

    @abstractmethod
    def endpoint(self) -> str:
        """The URL to POST to."""

    @abstractmethod
    def request_headers(self) -> dict[str, str]:
        """Headers, with the API key when there is one."""

    @abstractmethod
    def request_body(self, system: str, messages: Sequence[Message]) -> dict[str, Any]:
        """The JSON body asking for a streamed reply to ``messages``."""

    @abstractmethod
    def read_payload(self, payload: dict[str, Any], reply: ReplyBuilder) -> None:
        """Feed one streamed payload into ``reply``; raise AgentFailure for an error event."""

    # --- the loop -------------------------------------------------------------------------

    def run_turn(self, prompt: str, ctx: TurnContext) -> TurnResult | None:
        self._join_mcp(ctx)
        stopped = TurnCancel()  # the client's cancel, or the turn's deadline
        unhook = call_on_cancel(ctx.cancelled, stopped.set)
        if unhook is None:  # a plain Event (tests): no deadline, the cancel is polled
            stopped, unhook = ctx.cancelled, _no_unhook  # type: ignore[assignment]
            call_off = _no_unhook
        else:
            call_off = model_io().call_later(self.settings.max_turn_secs, stopped.set)
        try:
            stop = self._converse(prompt, ctx, stopped)
        finally:
            call_off()
            unhook()
            if self.mcp is not None:
                self.mcp.report()
        if stopped.is_set() and not ctx.cancelled.is_set():
            ctx.emit(MessageChunk(f"\n[turn stopped: it ran past max_turn_secs "
                                  f"({self.settings.max_turn_secs:g} s)]"))
            return TurnResult(stop_reason="cancelled")
        return None if stop is None else TurnResult(stop_reason=stop)

    def _converse(self, prompt: str, ctx: TurnContext,
                  stopped: threading.Event) -> TurnStop | None:
        """Ask the model, run the tools it calls, feed them back, until it answers
        or ``stopped`` (a cancel, the deadline) is set."""
        system = system_prompt(self.settings.alias, ctx.workspace, self.settings.workspace)
        history = history_turns(ctx.history)
        used_ids = {item.tool_call_id for item in ctx.history if isinstance(item, ToolItem)}
        turn: list[Message] = [UserMessage(prompt)]
        rounds = 0
        while True:
            messages = self._context(system, history, turn, log=rounds == 0)
            reply = self._ask(system, messages, ctx, stopped)
            if stopped.is_set():
                return None
            self._report_usage(ctx, reply, system, messages)
            if reply.finish in ("max_tokens", "refusal"):
                return "max_tokens" if reply.finish == "max_tokens" else "refusal"
            if not reply.tool_calls:
                return None
            if rounds >= self.settings.max_tool_rounds:
                ctx.emit(MessageChunk(f"\n[stopped: the model asked for more than "
                                      f"{rounds} rounds of tool calls (max_tool_rounds)]"))
                return None
            rounds += 1
            calls, results = self._run_tools(reply.tool_calls, ctx, used_ids, rounds, stopped)
            turn.append(AssistantMessage(reply.text, calls))
            turn.extend(results)
            if stopped.is_set():
                return None

    def _context(self, system: str, history: list[tuple[Message, ...]], turn: list[Message],
                 *, log: bool) -> list[Message]:
        """The history that fits beside the system prompt, tools, this turn and the reply."""
        settings = self.settings
        reserve = settings.max_tokens or min(DEFAULT_REPLY_RESERVE, settings.context_window // 4)
        tools = sum(estimate_tokens(t.description + str(t.parameters)) for t in self.tools)
        fixed = estimate_tokens(system) + tools + messages_tokens(turn) + reserve
        kept, dropped = fit_history(history, max(0, settings.context_window - fixed))
        if dropped and log:
            logger.info("agent %s: %d oldest turn(s) left out to fit context_window %d",
                        settings.alias, dropped, settings.context_window)
        return [*kept, *turn]

    def _ask(self, system: str, messages: list[Message], ctx: TurnContext,
             stopped: threading.Event) -> ModelReply:
        """One streamed request; its text reaches the client as it comes: the deltas
        that arrived together (one network read) as one chunk."""
        reply = ReplyBuilder(ctx.emit)
        body = self.request_body(system, messages)
        end = StreamEnd()
        stream = self.http.stream(self.endpoint(), self.request_headers(), body, stopped, end,
                                  self._direct_take(reply, ctx))
        with contextlib.closing(stream):
            for payloads in stream:
                try:
                    for payload in payloads:
                        self.read_payload(payload, reply)
                finally:  # also when an error event fails the turn: what came before it
                    reply.flush()
                if stopped.is_set():
                    break
        built = reply.build()
        if not (reply.finished or end.done or stopped.is_set()):
            raise self.failure("the stream ended before the reply did "
                               "(no finish reason, no [DONE])")
        return built

    def _direct_take(self, reply: ReplyBuilder, ctx: TurnContext
                     ) -> Callable[[list[dict[str, Any]]], bool] | None:
        """What the model I/O loop thread does with each read's payloads once the
        stream flows (see :meth:`ModelHttp.stream`): read them into ``reply`` and stream
        its text without waiting for credit; whether the stream window has room left.
        A paced model then costs no wake-up of the actor's thread per delta."""
        emit_all_nowait = getattr(ctx, "emit_all_nowait", None)
        if emit_all_nowait is None:
            return None

        def take(payloads: list[dict[str, Any]]) -> bool:
            try:
                for payload in payloads:
                    self.read_payload(payload, reply)
            finally:  # also when an error event fails the turn: what came before it
                events = reply.take_unsent()
                room = bool(emit_all_nowait(events)) if events else True
            return room

        return take

    def _report_usage(self, ctx: TurnContext, reply: ModelReply, system: str,
                      messages: list[Message]) -> None:
        if reply.usage is not None:
            used = reply.usage.input_tokens + reply.usage.output_tokens
        else:
            used = estimate_tokens(system) + messages_tokens(messages)
            used += estimate_tokens(reply.text)
        ctx.emit(UsageUpdate(used=used, size=self.settings.context_window))

    def _run_tools(self, calls: Sequence[ToolCallRequest], ctx: TurnContext, used_ids: set[str],
                   step: int, stopped: threading.Event,
                   ) -> tuple[tuple[ToolCallRequest, ...], list[ToolResultMessage]]:
        """Run the calls; each as the session stores it (its tool call id, its arguments
        as JSON text) and its result. The rest of the turn goes to the model in that
        form, the one later turns rebuild from the store (:func:`history_turns`), so
        every request of a session extends the one before it and a server's prompt
        cache keeps matching. A call keeps the model's id unless the session already
        has it (a server that numbers calls per reply) or it is not a plain token;
        ``step`` (this reply's number in the turn) keeps the replies apart in the store.
        Calls past ``max_tool_calls_per_reply`` are refused (:func:`_refuse`)."""
        ran: list[ToolCallRequest] = []
        results = []
        most = self.settings.max_tool_calls_per_reply
        for index, call in enumerate(calls):
            if stopped.is_set():
                break
            arguments = _arguments(call.arguments)
            own_id = call.call_id if (_PLAIN_ID.fullmatch(call.call_id)
                                      and call.call_id not in used_ids) else None
            if index < most:
                outcome = ctx.run_tool(call.name, arguments, own_id, step)
            else:
                outcome = _refuse(ctx, call.name, arguments, own_id, step,
                                  f"refused: the reply asked for {len(calls)} tool calls; "
                                  f"only the first {most} run (max_tool_calls_per_reply)")
            used_ids.add(outcome.tool_call_id)
            ran.append(ToolCallRequest(outcome.tool_call_id, call.name,
                                       arguments_text(arguments)))
            results.append(ToolResultMessage(outcome.tool_call_id, call.name, outcome.text,
                                             outcome.outcome != "completed"))
        return tuple(ran), results

    def failure(self, message: str) -> AgentFailure:
        """An AgentFailure naming the API and model, with the key redacted."""
        return model_failure(self.settings, message)


def _no_unhook() -> None:
    """Nothing to unregister or call off."""


def _refuse(ctx: TurnContext, name: str, arguments: Any, call_id: str | None, step: int,
            reason: str) -> ToolCallOutcome:
    """A tool call that is not run: the client sees it fail with ``reason``."""
    call_id = call_id or f"call_{uuid.uuid4().hex[:16]}"
    ctx.emit(ToolCallStarted(call_id, name, name, "other", arguments, (), step))
    ctx.emit(ToolCallFinished(call_id, name, "failed", {"error": reason}, reason))
    return ToolCallOutcome(call_id, "failed", reason, {"error": reason})


def _arguments(text: str) -> Any:
    """A tool call's arguments: a JSON object as a dict, else the text as it came
    (the tool call then fails, and the model is told why)."""
    if not text.strip():
        return {}
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return text
