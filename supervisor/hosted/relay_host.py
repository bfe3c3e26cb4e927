"""What the relays of this package need of their host (:class:`supervisor.host.host.Host`).

The host makes the relays and hands them itself; they reach its worker pool, its
live table, its running turns and its settings through this, and import none of
the host package (the data goes host → relay → client, and back to the worker).
Used on the asyncio loop thread.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, Protocol

from supervisor.config.config import Settings
from supervisor.core.live import LiveTable
from supervisor.core.turns import TurnBook, WorkerSender

__all__ = ["RelayHost"]


class RelayHost(Protocol):
    """The host's parts a relay uses."""

    @property
    def settings(self) -> Settings: ...

    @property
    def pool(self) -> WorkerSender: ...

    @property
    def live(self) -> LiveTable: ...

    @property
    def turns(self) -> TurnBook: ...

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]: ...
