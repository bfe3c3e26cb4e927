"""Stand-ins for a hosted agent's turn context in unit tests (any thread)."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["RecordingStream"]


class RecordingStream:
    """A turn's context that keeps what is emitted; its window is used up after ``room``
    events."""

    def __init__(self, room: int) -> None:
        self.events: list[object] = []
        self.room = room

    def emit_all_nowait(self, events: Sequence[object]) -> bool:
        self.events += events
        return len(self.events) < self.room
