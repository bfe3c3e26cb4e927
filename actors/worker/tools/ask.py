"""The ``ask_user`` tool: ask the user a question, optionally with choices.

Runs on the session actor's thread, and waits there for the answer (bounded by
the session timeout; a cancelled turn withdraws the question). The question goes
through :meth:`TurnContext.ask_user`: an ACP client sees the choices as the
options of a ``session/request_permission`` request; a ``daemon.sock`` client
that advertised elicitation gets ``elicitation/create`` with the choices as an
``enum``. ACP has no free-text question yet, so a question without choices to
an ACP client fails at once, and says so.
"""

from __future__ import annotations

from typing import Any, ClassVar

from actors.worker.tools.base import Tool, ToolEnv, ToolError, ToolResult, require_str

__all__ = ["MAX_CHOICES", "AskUserTool", "question_schema"]

MAX_CHOICES = 20


def question_schema(choices: list[str] | None) -> dict[str, Any]:
    """The form asked: one string ``answer``, limited to ``choices`` when given."""
    answer: dict[str, Any] = {"type": "string", "title": "Answer"}
    if choices:
        answer["enum"] = list(choices)
    return {"type": "object", "properties": {"answer": answer}, "required": ["answer"]}


def _choices(args: dict[str, Any]) -> list[str] | None:
    value = args.get("choices")
    if value is None:
        return None
    if (not isinstance(value, list) or not 1 <= len(value) <= MAX_CHOICES
            or not all(isinstance(c, str) and c.strip() for c in value)):
        raise ToolError(f"argument 'choices' must be a list of 1 to {MAX_CHOICES} "
                        "non-empty strings")
    if len(set(value)) != len(value):
        raise ToolError("argument 'choices' has the same choice twice")
    return value


class AskUserTool(Tool):
    """Ask the user; arguments ``question`` and optional ``choices`` (a list of strings)."""

    name: ClassVar[str] = "ask_user"
    kind: ClassVar[str] = "other"
    mutating: ClassVar[bool] = False

    def title(self, args: dict[str, Any]) -> str:
        question = args.get("question")
        return f"Ask: {question}" if isinstance(question, str) else "Ask the user"

    def run(self, args: dict[str, Any], env: ToolEnv) -> ToolResult:
        question = require_str(args, "question")
        choices = _choices(args)
        reply = env.ask_user(question, question_schema(choices))
        if reply is None:
            hint = "" if choices else " (this client can only answer questions with choices)"
            raise ToolError(f"the user could not be asked or did not answer{hint}")
        action = reply.get("action")
        if action != "accept":
            return ToolResult(text=f"the user did not answer ({action})",
                              raw_output={"action": action}, ok=False)
        content = reply.get("content")
        answer = content.get("answer") if isinstance(content, dict) else None
        if not isinstance(answer, str) or (choices and answer not in choices):
            raise ToolError("the client's answer is not one of the choices")
        return ToolResult(text=answer, raw_output={"action": "accept", "answer": answer})
