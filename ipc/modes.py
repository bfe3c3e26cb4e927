"""The session modes, which are the autonomy levels (SPEC §3 ``session/set_mode``).

One list for the config (``autonomy.level``), the ACP dialect (``modes``) and the
worker's permission checks. Pure data: any thread, any process.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["MODES", "MODE_IDS", "Mode"]


@dataclass(frozen=True, slots=True)
class Mode:
    """A session mode as ACP clients show it."""

    id: str
    name: str
    description: str


MODES: tuple[Mode, ...] = (
    Mode("read_only", "Read only", "The agent reads and answers; it runs no mutating tool."),
    Mode("supervised", "Supervised", "The agent asks before running or changing anything."),
    Mode("full", "Full", "The agent runs tools without asking; forbidden paths still apply."),
)

#: The mode ids, least permissive first.
MODE_IDS: tuple[str, ...] = tuple(mode.id for mode in MODES)
