"""zeroclaw's own agent loop on a model API; providers subclass :class:`ModelAgent`.

A turn: the system prompt, the session's history (oldest turns dropped to fit
``context_window``) and the prompt go to the model; its streamed reply reaches the
client as it arrives; the tool calls it asks for run through the session's rules
(:meth:`TurnContext.run_tool`) and their results go back to it, until it answers
without tools or ``max_tool_rounds`` is reached. A subclass says how its API is
spoken: the URL, headers, request body, and how a streamed payload reads.

Created on the worker's IO thread; turns run on the session actor's thread.
"""

from __future__ import annotations

import contextlib
import logging
import re
from abc import abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import orjson

from actors.worker.agents.base import (
    Agent,
    AgentFailure,
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
from actors.worker.agents.llm.http import ModelHttp, model_failure
from actors.worker.agents.llm.reply import ModelReply, ReplyBuilder
from actors.worker.agents.llm.tool_specs import ToolSpec, model_tools
from ipc.events import MessageChunk, ToolItem, UsageUpdate

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
        stop = self._converse(prompt, ctx)
        return None if stop is None else TurnResult(stop_reason=stop)

    def _converse(self, prompt: str, ctx: TurnContext) -> TurnStop | None:
        """Ask the model, run the tools it calls, feed them back, until it answers."""
        system = system_prompt(self.settings.alias, ctx.workspace, self.settings.workspace)
        history = history_turns(ctx.history)
        used_ids = {item.tool_call_id for item in ctx.history if isinstance(item, ToolItem)}
        turn: list[Message] = [UserMessage(prompt)]
        rounds = 0
        while True:
            messages = self._context(system, history, turn, log=rounds == 0)
            reply = self._ask(system, messages, ctx)
            if ctx.cancelled.is_set():
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
            calls, results = self._run_tools(reply.tool_calls, ctx, used_ids, rounds)
            turn.append(AssistantMessage(reply.text, calls))
            turn.extend(results)
            if ctx.cancelled.is_set():
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

    def _ask(self, system: str, messages: list[Message], ctx: TurnContext) -> ModelReply:
        """One streamed request; its text reaches the client as it comes: the deltas
        that arrived together (one network read) as one chunk."""
        reply = ReplyBuilder(ctx.emit)
        body = self.request_body(system, messages)
        stream = self.http.stream(self.endpoint(), self.request_headers(), body, ctx.cancelled)
        with contextlib.closing(stream):
            for payloads in stream:
                try:
                    for payload in payloads:
                        self.read_payload(payload, reply)
                finally:  # also when an error event fails the turn: what came before it
                    reply.flush()
                if ctx.cancelled.is_set():
                    break
        return reply.build()

    def _report_usage(self, ctx: TurnContext, reply: ModelReply, system: str,
                      messages: list[Message]) -> None:
        if reply.usage is not None:
            used = reply.usage.input_tokens + reply.usage.output_tokens
        else:
            used = estimate_tokens(system) + messages_tokens(messages)
            used += estimate_tokens(reply.text)
        ctx.emit(UsageUpdate(used=used, size=self.settings.context_window))

    def _run_tools(self, calls: Sequence[ToolCallRequest], ctx: TurnContext, used_ids: set[str],
                   step: int) -> tuple[tuple[ToolCallRequest, ...], list[ToolResultMessage]]:
        """Run the calls; each as the session stores it (its tool call id, its arguments
        as JSON text) and its result. The rest of the turn goes to the model in that
        form, the one later turns rebuild from the store (:func:`history_turns`), so
        every request of a session extends the one before it and a server's prompt
        cache keeps matching. A call keeps the model's id unless the session already
        has it (a server that numbers calls per reply) or it is not a plain token;
        ``step`` (this reply's number in the turn) keeps the replies apart in the store."""
        ran: list[ToolCallRequest] = []
        results = []
        for call in calls:
            if ctx.cancelled.is_set():
                break
            arguments = _arguments(call.arguments)
            own_id = call.call_id if (_PLAIN_ID.fullmatch(call.call_id)
                                      and call.call_id not in used_ids) else None
            outcome = ctx.run_tool(call.name, arguments, own_id, step)
            used_ids.add(outcome.tool_call_id)
            ran.append(ToolCallRequest(outcome.tool_call_id, call.name,
                                       arguments_text(arguments)))
            results.append(ToolResultMessage(outcome.tool_call_id, call.name, outcome.text,
                                             outcome.outcome != "completed"))
        return tuple(ran), results

    def failure(self, message: str) -> AgentFailure:
        """An AgentFailure naming the API and model, with the key redacted."""
        return model_failure(self.settings, message)


def _arguments(text: str) -> Any:
    """A tool call's arguments: a JSON object as a dict, else the text as it came
    (the tool call then fails, and the model is told why)."""
    if not text.strip():
        return {}
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return text
