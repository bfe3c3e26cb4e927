"""Session keys and labels on the wire (OpenClaw's bridge rules, seed 003).

An editor names the conversation a ``session/new`` continues with ``_meta.sessionKey``
(a stable key: created on first use, reused after), ``_meta.sessionLabel`` (a label that
resolves an existing session) and ``_meta.resetSession`` (the key gets a fresh
transcript); ``zeroclaw acp --session KEY | --session-label LABEL [--require-existing]
[--reset-session]`` gives the same for editors that cannot send ``_meta``. This module
reads those fields and writes the ``_meta`` of a ``session/list`` entry. Pure data;
safe from any thread.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ipc.errors import InvalidParams

__all__ = [
    "MAX_NAME_CHARS",
    "PARENT_META_KEY",
    "SessionNaming",
    "check_name",
    "listing_meta",
    "naming_of",
]

#: A key or label longer than this is refused (-32602).
MAX_NAME_CHARS = 200

#: The stored session ``meta`` key (and ``_meta.zeroclaw`` key on the wire) of the
#: session a session was started for (a reset key's new session: the one it replaced).
PARENT_META_KEY = "parentSessionId"


@dataclass(frozen=True, slots=True)
class SessionNaming:
    """What a ``session/new`` asked for by name; all empty: an unnamed new session."""

    key: str | None = None
    label: str | None = None
    reset: bool = False
    require_existing: bool = False

    @property
    def named(self) -> bool:
        return self.key is not None or self.label is not None

    def over(self, defaults: SessionNaming) -> SessionNaming:
        """This request's naming, the process's defaults (``zeroclaw acp --session``)
        filling in what it leaves out: a request that names a key or label of its own
        takes none of the defaults."""
        if self.named:
            return self
        if self.reset or self.require_existing:
            return SessionNaming(defaults.key, defaults.label, self.reset or defaults.reset,
                                 self.require_existing or defaults.require_existing)
        return defaults


def check_name(value: Any, field: str) -> str | None:
    """A key or label as given (None when absent); -32602 when it is not a non-empty
    string of at most :data:`MAX_NAME_CHARS` characters."""
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise InvalidParams(f"{field} must be a non-empty string")
    if len(value) > MAX_NAME_CHARS:
        raise InvalidParams(f"{field} is longer than {MAX_NAME_CHARS} characters")
    return value


def _flag(meta: Mapping[str, Any], name: str, field: str) -> bool:
    value = meta.get(name, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise InvalidParams(f"{field} must be a boolean")
    return value


def naming_of(params: Mapping[str, Any]) -> SessionNaming:
    """``_meta.sessionKey``, ``_meta.sessionLabel``, ``_meta.resetSession`` (and
    ``_meta.zeroclaw.requireExisting``) of a ``session/new``; -32602 for a wrong type."""
    meta = params.get("_meta")
    if meta is None:
        return SessionNaming()
    if not isinstance(meta, Mapping):
        raise InvalidParams("_meta must be an object")
    ours = meta.get("zeroclaw")
    require = (_flag(ours, "requireExisting", "_meta.zeroclaw.requireExisting")
               if isinstance(ours, Mapping) else False)
    return SessionNaming(
        key=check_name(meta.get("sessionKey"), "_meta.sessionKey"),
        label=check_name(meta.get("sessionLabel"), "_meta.sessionLabel"),
        reset=_flag(meta, "resetSession", "_meta.resetSession"),
        require_existing=require,
    )


def listing_meta(key: str | None, label: str | None, current: bool,
                 parent: str | None) -> dict[str, Any]:
    """The ``_meta`` of a ``session/list`` entry or a ``session/new`` answer: its key
    (``sessionKey`` while the key names it; ``zeroclaw.formerSessionKey`` once a reset
    gave the key a newer session), its label, and ``zeroclaw.parentSessionId``."""
    meta: dict[str, Any] = {}
    ours: dict[str, Any] = {}
    if key is not None:
        if current:
            meta["sessionKey"] = key
        else:
            ours["formerSessionKey"] = key
    if label is not None:
        meta["sessionLabel"] = label
    if parent is not None:
        ours[PARENT_META_KEY] = parent
    if ours:
        meta["zeroclaw"] = ours
    return meta
