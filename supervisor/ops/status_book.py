"""The ``sessions`` list of the ``status`` answer as JSON, encoded once per change.

Runs on the asyncio loop thread only. ``status`` is polled (every second by
``zeroclaw status --watch``) with thousands of live sessions, nearly all idle:
re-encoding every entry per call would cost milliseconds that nothing changed.
So each live session's entry is kept here as its encoded JSON, re-encoded only
when it changed (its route reports each change of its ``status`` entry, the
ownership table each change of its clients), and the joined list is kept until
something changes. The live table's ``routes_version`` says when sessions came
or went; the list then follows the table's order again.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import orjson

if TYPE_CHECKING:
    from supervisor.core.live import LiveTable
    from supervisor.core.ownership import Owners
    from supervisor.core.routes import Route

__all__ = ["SessionStatusBook"]


class SessionStatusBook:
    """One live table's session entries, encoded (see the module docstring)."""

    def __init__(self) -> None:
        self._routes: dict[str, Route] = {}  # in the live table's order
        self._encoded: dict[str, bytes] = {}  # sid -> its entry's JSON, while up to date
        self._joined: bytes | None = None  # the whole list, while nothing changed
        self._seen_version = -1  # the live table's routes_version encoded
        self._owners: Owners | None = None

    def changed(self, sid: str) -> None:
        """``sid``'s entry or clients changed: encode it again at the next call."""
        if self._encoded.pop(sid, None) is not None:
            self._joined = None

    def sessions_json(self, live: LiveTable, owners: Owners) -> bytes:
        """The ``sessions`` list of ``status`` as JSON, each entry's ``clients`` the
        connections ``owners`` has holding it."""
        if owners is not self._owners:
            self._watch(owners)
        if live.routes_version != self._seen_version:
            self._follow(live)
        if self._joined is None:
            encoded = self._encoded
            for sid, route in self._routes.items():
                if sid not in encoded:
                    route.status["clients"] = owners.count(sid)
                    # orjson's bytes keep their ~4 KiB buffer: keep an exact copy
                    encoded[sid] = bytes(memoryview(orjson.dumps(route.status)))
            self._joined = b"[" + b",".join(encoded[sid] for sid in self._routes) + b"]"
        return self._joined

    def __len__(self) -> int:
        return len(self._routes)

    def _watch(self, owners: Owners) -> None:
        owners.on_change = self.changed
        self._owners = owners
        self._encoded.clear()
        self._joined = None

    def _follow(self, live: LiveTable) -> None:
        """Take the table's sessions, in its order; a new route is encoded afresh."""
        old = self._routes
        self._routes = {route.sid: route for route in live.routes()}
        for sid, route in self._routes.items():
            if old.get(sid) is not route:
                route.on_status_change = self.changed
                self._encoded.pop(sid, None)
        for sid in old.keys() - self._routes.keys():
            self._encoded.pop(sid, None)
        self._seen_version = live.routes_version
        self._joined = None
