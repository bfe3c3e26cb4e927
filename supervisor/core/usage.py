"""The host's usage totals: tokens and turns over every session in its store.

Runs on the asyncio loop thread. Read from the store once at start
(:meth:`storage.store.StoreReader.usage_totals`), then kept current as this host
commits turns and deletes sessions, so ``status`` reads two integers and never
queries the store. Turns that another process writes to the same store (a second
``zeroclaw acp`` on the same config dir) are counted from the next start.

Tokens are the store's per-session ``token_count``: for each kept turn, an estimate
(about four characters a token) of its user, assistant, thought and tool-result
text; turns the host answers itself (slash commands) count none.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["UsageTotals"]


@dataclass(slots=True)
class UsageTotals:
    total_tokens: int = 0
    turns: int = 0

    def seed(self, totals: tuple[int, int]) -> None:
        """Start from the store's ``(tokens, turns)``, read when the host starts."""
        self.total_tokens, self.turns = totals

    def add_turn(self, tokens: int) -> None:
        """A turn was committed."""
        self.total_tokens += tokens
        self.turns += 1

    def forget_session(self, tokens: int, turns: int) -> None:
        """A stored session with these counts was deleted."""
        self.total_tokens = max(0, self.total_tokens - tokens)
        self.turns = max(0, self.turns - turns)

    def to_wire(self) -> dict[str, Any]:
        return {"totalTokens": self.total_tokens, "turns": self.turns}
