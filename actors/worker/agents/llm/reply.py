"""One streamed model reply, assembled from provider-neutral deltas as they arrive.

A provider's stream parser calls :class:`ReplyBuilder` (``text``, ``thought``,
``tool_delta``, ``finish``, ``usage``); the builder streams the text and thoughts
to the client at each :meth:`~ReplyBuilder.flush` (the agent loop flushes after the
deltas that arrived together, so a burst of small deltas is one chunk, not one
update each; ``<think>…</think>`` in the text becomes thoughts) and
keeps what the agent loop needs afterwards: the answer text, the tool calls
(assembled from fragments keyed by index or id), how the reply ended, and the
token counts the provider reported.

Runs on the session actor's thread, or on the model I/O loop thread while the
actor's thread waits for the stream's end (:meth:`ModelHttp.stream`'s ``take``): one
thread at a time, handed over under the stream's lock.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, TypeAlias

from actors.worker.agents.llm.conversation import ToolCallRequest
from ipc.events import Event, MessageChunk, ThoughtChunk

__all__ = ["Finish", "ModelReply", "ReplyBuilder", "ThinkSplitter", "Usage"]

#: How a reply ended, in the agent loop's terms.
Finish: TypeAlias = Literal["end", "tool_calls", "max_tokens", "refusal"]

_OPEN, _CLOSE = "<think>", "</think>"


@dataclass(frozen=True, slots=True)
class Usage:
    input_tokens: int
    output_tokens: int


@dataclass(frozen=True, slots=True)
class ModelReply:
    text: str
    tool_calls: tuple[ToolCallRequest, ...]
    finish: Finish
    usage: Usage | None


class ThinkSplitter:
    """Splits streamed text at ``<think>`` / ``</think>``, even when a tag is cut
    across chunks; yields ``(is_thought, text)`` pieces."""

    def __init__(self) -> None:
        self.inside = False
        self._pending = ""

    def feed(self, text: str) -> list[tuple[bool, str]]:
        buffer = self._pending + text
        if "<" not in buffer:  # no tag, nor the start of one: the common case, cheaply
            self._pending = ""
            return [(self.inside, buffer)] if buffer else []
        pieces: list[tuple[bool, str]] = []
        while buffer:
            tag = _CLOSE if self.inside else _OPEN
            at = buffer.find(tag)
            if at >= 0:
                pieces.append((self.inside, buffer[:at]))
                buffer = buffer[at + len(tag):]
                self.inside = not self.inside
                continue
            keep = next((k for k in range(len(tag) - 1, 0, -1) if buffer.endswith(tag[:k])), 0)
            pieces.append((self.inside, buffer[: len(buffer) - keep]))
            self._pending = buffer[len(buffer) - keep:]
            break
        else:
            self._pending = ""
        return [(thought, piece) for thought, piece in pieces if piece]

    def flush(self) -> list[tuple[bool, str]]:
        pending, self._pending = self._pending, ""
        return [(self.inside, pending)] if pending else []


@dataclass(slots=True)
class _PartialCall:
    call_id: str
    name: str
    arguments: list[str]
    given_id: bool  # the provider named the call (else the id is ours)


class ReplyBuilder:
    """Collects one reply; ``emit`` streams events to the client (the turn context's)
    at each :meth:`flush`, consecutive pieces of one kind merged."""

    def __init__(self, emit: Callable[[Event], None]) -> None:
        self._emit = emit
        self._splitter = ThinkSplitter()
        self._text: list[str] = []
        self._unsent: list[tuple[bool, list[str]]] = []  # (is_thought, parts) since a flush
        self._calls: list[_PartialCall] = []
        self._by_index: dict[int, _PartialCall] = {}
        self._finish: Finish | None = None
        self._usage: Usage | None = None
        self._refused = False

    def text(self, text: str) -> None:
        for is_thought, piece in self._splitter.feed(text):
            self._say(is_thought, piece)

    def refusal(self, text: str) -> None:
        """The model refuses (the text is shown as its answer); the turn ends ``refusal``."""
        self._refused = True
        if text:
            self._say(False, text)

    def thought(self, text: str) -> None:
        if text:
            self._say(True, text)

    def _say(self, is_thought: bool, text: str) -> None:
        if not is_thought:
            self._text.append(text)
        unsent = self._unsent
        if unsent and unsent[-1][0] == is_thought:
            unsent[-1][1].append(text)
        else:
            unsent.append((is_thought, [text]))

    def flush(self) -> None:
        """Stream what came since the last flush: one chunk per run of one kind."""
        for event in self.take_unsent():
            self._emit(event)

    def take_unsent(self) -> list[Event]:
        """What came since the last flush, as :meth:`flush` would stream it; the caller
        streams it (the model I/O loop thread's way, without waiting for credit)."""
        unsent, self._unsent = self._unsent, []
        return [ThoughtChunk("".join(parts)) if is_thought else MessageChunk("".join(parts))
                for is_thought, parts in unsent]

    def tool_delta(self, key: int | None, call_id: str | None, name: str | None,
                   arguments: str) -> None:
        """A fragment of a tool call: ``key`` is the provider's index (None if absent).

        Fragments without an index go to the call with their id, else to the last
        call; a different id under an index already used starts another call.
        """
        call = self._find_call(key, call_id)
        if call is None:
            call = _PartialCall(call_id or f"call_{uuid.uuid4().hex[:16]}", name or "", [],
                                bool(call_id))
            self._calls.append(call)
        elif call_id and not call.given_id:
            call.call_id, call.given_id = call_id, True
        if key is not None:
            self._by_index[key] = call
        if name and not call.name:
            call.name = name
        call.arguments.append(arguments)

    def _find_call(self, key: int | None, call_id: str | None) -> _PartialCall | None:
        if key is not None:
            call = self._by_index.get(key)
            if call is not None and call_id and call.given_id and call.call_id != call_id:
                return None
            return call
        if call_id:
            return next((c for c in self._calls if c.given_id and c.call_id == call_id), None)
        return self._calls[-1] if self._calls else None

    def finish(self, finish: Finish) -> None:
        self._finish = finish

    @property
    def finished(self) -> bool:
        """Whether the provider said how the reply ended (a finish or stop reason)."""
        return self._finish is not None

    def usage(self, input_tokens: int | None, output_tokens: int | None) -> None:
        """Token counts the provider reported; a None keeps what an earlier event said."""
        old = self._usage or Usage(0, 0)
        self._usage = Usage(old.input_tokens if input_tokens is None else input_tokens,
                            old.output_tokens if output_tokens is None else output_tokens)

    def build(self) -> ModelReply:
        for is_thought, piece in self._splitter.flush():
            self._say(is_thought, piece)
        self.flush()
        calls = tuple(ToolCallRequest(c.call_id, c.name, "".join(c.arguments))
                      for c in self._calls)
        finish = self._finish or "end"
        if self._refused:
            finish = "refusal"
        elif finish == "end" and calls:
            finish = "tool_calls"
        return ModelReply("".join(self._text), calls, finish, self._usage)
