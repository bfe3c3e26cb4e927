"""The ``echo`` agent: offline and deterministic, for demos and tests (SPEC §7).

The prompt is read line by line. Ordinary lines are streamed back word by word
(``"hello "``, ``"world"``, with ``"\\n"`` between lines); these directive lines
exercise the rest of the agent loop:

``!sleep SECS``     wait (cancellable)
``!think TEXT``     a thought chunk
``!plan A; B; C``   a plan (the first entry in progress)
``!tool NAME JSON`` a tool call through the session's approval and path rules
``!fail TEXT``      fail the turn with TEXT
``!ask QUESTION``   ask the user (``ask_user``) and echo the answer

Runs on the session actor's thread.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any, ClassVar

import orjson

from actors.worker.agents.base import Agent, AgentFailure, TurnContext, estimate_tokens
from ipc.events import MessageChunk, PlanEntry, PlanUpdate, ThoughtChunk, UsageUpdate

__all__ = ["ASK_SCHEMA", "CONTEXT_WINDOW", "EchoAgent"]

CONTEXT_WINDOW = 128_000
#: The form ``!ask`` sends: one free-text answer.
ASK_SCHEMA = {
    "type": "object",
    "properties": {"answer": {"type": "string", "title": "Answer"}},
    "required": ["answer"],
}
_WORD = re.compile(r"\s*\S+\s*|\s+")


class EchoAgent(Agent):
    """Echo the prompt back; see the module docstring for the directives."""

    provider: ClassVar[str] = "echo"

    def run_turn(self, prompt: str, ctx: TurnContext) -> None:
        turn = _EchoTurn(ctx)
        for line in prompt.split("\n"):
            if ctx.cancelled.is_set():
                break
            turn.handle_line(line.removesuffix("\r"))
        used = ctx.history_tokens + estimate_tokens(prompt) + turn.tokens()
        ctx.emit(UsageUpdate(used=used, size=CONTEXT_WINDOW))


class _EchoTurn:
    """State of one echo turn: which streams have started, what was said."""

    def __init__(self, ctx: TurnContext) -> None:
        self.ctx = ctx
        self.said: list[str] = []
        self.thought: list[str] = []
        self.echoed_lines = 0
        self.thought_lines = 0
        self.directives: dict[str, Callable[[str], None]] = {
            "!sleep": self.sleep,
            "!think": self.think,
            "!plan": self.plan,
            "!tool": self.tool,
            "!fail": self.fail,
            "!ask": self.ask,
        }

    def tokens(self) -> int:
        return estimate_tokens("".join(self.said)) + estimate_tokens("".join(self.thought))

    def handle_line(self, line: str) -> None:
        word, _, rest = line.strip().partition(" ")
        directive = self.directives.get(word)
        if directive is None:
            self.echo(line)
        else:
            directive(rest.strip())

    def echo(self, line: str) -> None:
        if self.echoed_lines:
            self.say("\n")
        self.echoed_lines += 1
        for word in _WORD.finditer(line):  # lazily: a huge prompt is not copied word by word
            if self.ctx.cancelled.is_set():
                return
            self.say(word.group())

    def say(self, text: str) -> None:
        self.said.append(text)
        self.ctx.emit(MessageChunk(text))

    def sleep(self, arg: str) -> None:
        try:
            seconds = float(arg)
        except ValueError:
            raise AgentFailure(f"!sleep needs a number of seconds, got {arg!r}") from None
        if not math.isfinite(seconds) or seconds < 0:
            raise AgentFailure(f"!sleep needs a non-negative number of seconds, got {arg!r}")
        self.ctx.cancelled.wait(seconds)

    def think(self, text: str) -> None:
        chunk = ("\n" if self.thought_lines else "") + text
        self.thought_lines += 1
        self.thought.append(chunk)
        self.ctx.emit(ThoughtChunk(chunk))

    def plan(self, arg: str) -> None:
        steps = [step.strip() for step in arg.split(";") if step.strip()]
        entries = tuple(
            PlanEntry(content=step, status="in_progress" if i == 0 else "pending")
            for i, step in enumerate(steps)
        )
        self.ctx.emit(PlanUpdate(entries))

    def tool(self, arg: str) -> None:
        name, _, json_text = arg.partition(" ")
        if not name:
            raise AgentFailure("!tool needs a tool name")
        self.ctx.run_tool(name, _tool_arguments(name, json_text.strip()))

    def ask(self, question: str) -> None:
        """Ask the user and say what came back: the answer, or why there is none."""
        reply = self.ctx.ask_user(question or "?", ASK_SCHEMA)
        if reply is None:
            text = "(no answer)"
        elif reply.get("action") != "accept":
            text = f"({reply.get('action', 'no answer')})"
        else:
            content = reply.get("content")
            answer = content.get("answer") if isinstance(content, dict) else None
            text = str(answer) if answer is not None else "(empty answer)"
        if self.echoed_lines:
            self.say("\n")
        self.echoed_lines += 1
        self.say(text)

    def fail(self, text: str) -> None:
        raise AgentFailure(text or "echo agent failed as asked")


def _tool_arguments(name: str, json_text: str) -> dict[str, Any]:
    if not json_text:
        return {}
    try:
        value = orjson.loads(json_text)
    except orjson.JSONDecodeError:
        raise AgentFailure(f"!tool {name}: arguments are not valid JSON") from None
    if not isinstance(value, dict):
        raise AgentFailure(f"!tool {name}: arguments must be a JSON object")
    return value
