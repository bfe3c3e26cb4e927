"""Session keys and labels with the store behind them (OpenClaw's bridge rules).

A key names one stored conversation of its tenant (``""``: the host's owner; a gateway
tenant's id otherwise, so two tenants with the same key have two sessions): the first
``session/new`` with it creates the session, later ones get that session back. A label
resolves an existing session (-32602 when none has it). A reset binds a new session to
the key (same key, fresh transcript; the label moves with it), the new one naming the
old as its ``parentSessionId``; the old session stays stored, listed and loadable.

:class:`SessionKeys` runs on the asyncio loop thread (one per host, on
:class:`supervisor.host.sessions.Sessions`, reading and writing through the host's
store); its reads are the store reader's few-ms queries.
Two ``session/new`` with one key wait for each other (a lock per name), so a key never
gets two sessions by a race.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from actors.persistence import SetLabel
from ipc.errors import InvalidParams, SessionNotFound
from ipc.session_names import PARENT_META_KEY, SessionNaming, listing_meta
from storage.models import SessionName

if TYPE_CHECKING:
    from storage.store import StoreReader
    from supervisor.core.routes import Route
    from supervisor.host.host import Host

__all__ = ["NO_NAMES", "NamedOpen", "SessionKeys", "SessionNames"]


@dataclass(frozen=True, slots=True)
class SessionNames:
    """The key, label and parent a new session is created with."""

    key: str | None = None
    label: str | None = None
    parent: str | None = None

    def row(self, sid: str, tenant: str) -> SessionName | None:
        """The session's ``session_keys`` row (None: it has neither key nor label)."""
        if self.key is None and self.label is None:
            return None
        return SessionName(sid, tenant, self.key, self.label, time.time())


NO_NAMES = SessionNames()


@dataclass(frozen=True, slots=True)
class NamedOpen:
    """What a named ``session/new`` opened: ``resumed`` when it is an existing session
    (the client gets its transcript replayed, as by ``session/load``)."""

    route: Route
    resumed: bool
    names: SessionNames

    def answer_meta(self) -> dict[str, Any]:
        """The ``_meta`` of the ``session/new`` answer."""
        names = self.names
        meta = listing_meta(names.key, names.label, True, names.parent)
        if self.resumed:
            meta.setdefault("zeroclaw", {})["resumed"] = True
        return meta


Create = Callable[[SessionNames], Awaitable["Route"]]
Resume = Callable[[str], Awaitable["Route"]]


class SessionKeys:
    """Resolving keys and labels to sessions; loop thread."""

    def __init__(self, host: Host) -> None:
        self._host = host
        self._locks: dict[tuple[str, str, str], tuple[asyncio.Lock, int]] = {}

    @property
    def _reader(self) -> StoreReader:
        return self._host.reader

    async def open(self, naming: SessionNaming, tenant: str, *, create: Create,
                   resume: Resume) -> NamedOpen:
        """The session ``naming`` names in ``tenant``, resumed (``resume``) or created
        (``create``, with the names to store); -32602 for a label nobody has, or a key
        nobody has under ``require_existing``."""
        held = ("key", naming.key) if naming.key is not None else ("label", naming.label or "")
        async with self._holding((tenant, *held)):
            target = self._target(naming, tenant)
            if target is not None and not naming.reset:
                route = await resume(target)
                if naming.key is not None and naming.label is not None:
                    await self._label(target, tenant, naming.label)
                return NamedOpen(route, True, self._names_of(target))
            names = self._new_names(naming, tenant, target)
            return NamedOpen(await create(names), False, names)

    def _target(self, naming: SessionNaming, tenant: str) -> str | None:
        reader = self._reader
        if naming.key is not None:
            found = reader.session_of_key(tenant, naming.key)
            if found is None and naming.require_existing:
                raise InvalidParams(f"_meta.sessionKey: no session has the key "
                                    f"{naming.key!r} (and an existing one is required)")
            return found
        assert naming.label is not None
        found = reader.session_of_label(tenant, naming.label)
        if found is None:
            raise InvalidParams(f"_meta.sessionLabel: no session is labelled "
                                f"{naming.label!r}; a label names an existing session "
                                "(use _meta.sessionKey to create one by name)")
        return found

    def _new_names(self, naming: SessionNaming, tenant: str,
                   replaced: str | None) -> SessionNames:
        """A new session's names: those asked for, else the replaced session's (a
        reset by label keeps its key); its label must be free, or the replaced one's."""
        old = self._reader.names_of([replaced]).get(replaced) if replaced else None
        key = naming.key if naming.key is not None else (old.key if old else None)
        label = naming.label if naming.label is not None else (old.label if old else None)
        if label is not None:
            self._check_free(tenant, label, allowed=replaced)
        return SessionNames(key, label, replaced)

    def _names_of(self, sid: str) -> SessionNames:
        name = self._reader.names_of([sid]).get(sid)
        info = self._reader.get_session(sid)
        parent = info.meta.get(PARENT_META_KEY) if info is not None else None
        return SessionNames(name.key if name else None, name.label if name else None,
                            parent if isinstance(parent, str) else None)

    def _check_free(self, tenant: str, label: str, *, allowed: str | None) -> None:
        holder = self._reader.session_of_label(tenant, label)
        if holder is not None and holder != allowed:
            raise InvalidParams(f"sessionLabel: {label!r} already labels session {holder}")

    async def set_label(self, sid: str, tenant: str, label: str | None) -> None:
        """Label ``sid`` (None: remove its label); -32602 when another session of the
        tenant has the label, -32000 for an unknown session."""
        async with self._holding((tenant, "label", label or "")):
            await self._label(sid, tenant, label)

    async def _label(self, sid: str, tenant: str, label: str | None) -> None:
        if label is not None:
            self._check_free(tenant, label, allowed=sid)
        if not await self._host.persist(SetLabel(sid, tenant, label)):
            raise SessionNotFound(f"Session not found: {sid}")

    @contextlib.asynccontextmanager
    async def _holding(self, name: tuple[str, str, str]) -> AsyncIterator[None]:
        """Hold the lock of one key or label (forgotten once nobody holds or awaits it)."""
        lock, users = self._locks.get(name, (asyncio.Lock(), 0))
        self._locks[name] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._locks[name]
            if users == 1:
                del self._locks[name]
            else:
                self._locks[name] = (lock, users - 1)
