"""Session keys and labels in the daemon's RPC dialect (``daemon.sock``).

The rules are those of the ACP dialect (:mod:`supervisor.session_keys`), in this
dialect's convention of plain params (camelCase, snake_case accepted) instead of
ACP's ``_meta``:

- ``session/new {…, sessionKey?, sessionLabel?, resetSession?, requireExisting?}``:
  the key's session (created on first use), the labelled one, or a reset key's new
  session. The answer adds ``sessionKey``, ``sessionLabel``, ``parentSessionId`` and
  ``resumed: true`` when an existing session was picked up. A resumed session's stored
  turns are replayed *before* the answer, as flat ``session/update`` notifications,
  as ``session/load`` does in this dialect.
- ``session/list`` entries add ``sessionKey`` (or ``formerSessionKey`` once a reset
  moved the key on), ``sessionLabel`` and ``parentSessionId``.
- ``session/set_label {sessionId, sessionLabel}`` labels a session this connection
  may use (``null`` removes the label) → ``{sessionId, sessionLabel}``: the ACP
  dialect's ``_zeroclaw/session_info_update``.

Keys on ``daemon.sock`` are the host owner's (tenant ``""``), the same as those of
``zeroclaw acp`` and ``acp.sock``. Everything here runs on the asyncio loop thread.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ipc.errors import InvalidParams
from ipc.session_names import PARENT_META_KEY, SessionNaming, check_name
from supervisor.session_keys import NamedOpen, SessionNames

if TYPE_CHECKING:
    from ipc.acp import NewSessionRequest
    from storage.models import SessionName
    from supervisor.routes import Peer, Route
    from supervisor.sessions import Sessions

__all__ = ["OWNER", "label_param", "listed_names", "named_answer", "open_named", "rpc_naming"]

OWNER = ""  # the tenant of daemon.sock's sessions: the host's owner


def _field(params: Mapping[str, Any], camel: str, snake: str) -> Any:
    return params.get(camel, params.get(snake))


def _flag(params: Mapping[str, Any], camel: str, snake: str) -> bool:
    value = _field(params, camel, snake)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise InvalidParams(f"{camel} must be a boolean")
    return value


def rpc_naming(params: Any) -> SessionNaming:
    """The key, label, reset and require-existing of a ``session/new``; -32602 for a
    wrong type, or a reset or require-existing without a key or label."""
    if not isinstance(params, Mapping):
        return SessionNaming()
    naming = SessionNaming(
        key=check_name(_field(params, "sessionKey", "session_key"), "sessionKey"),
        label=check_name(_field(params, "sessionLabel", "session_label"), "sessionLabel"),
        reset=_flag(params, "resetSession", "reset_session"),
        require_existing=_flag(params, "requireExisting", "require_existing"),
    )
    if (naming.reset or naming.require_existing) and not naming.named:
        raise InvalidParams("resetSession and requireExisting need sessionKey or sessionLabel")
    return naming


def label_param(params: Any) -> str | None:
    """``session/set_label``'s ``sessionLabel`` (None: remove the label); -32602 when
    it is missing or not a name."""
    if not isinstance(params, Mapping) or not ("sessionLabel" in params
                                               or "session_label" in params):
        raise InvalidParams("sessionLabel is required (null removes the label)")
    return check_name(_field(params, "sessionLabel", "session_label"), "sessionLabel")


async def open_named(sessions: Sessions, peer: Peer, request: NewSessionRequest,
                     naming: SessionNaming) -> NamedOpen:
    """The session ``naming`` names, restored with its turns replayed to ``peer`` (before
    the answer), or created with those names."""

    async def create(names: SessionNames) -> Route:
        return await sessions.new(peer, request, names=names)

    async def resume(sid: str) -> Route:
        return await sessions.restore(peer, sid, replay=True)

    return await sessions.keys.open(naming, OWNER, create=create, resume=resume)


def named_answer(opened: NamedOpen) -> dict[str, Any]:
    """The ``session/new`` answer's naming fields."""
    names = opened.names
    answer: dict[str, Any] = {}
    if names.key is not None:
        answer["sessionKey"] = names.key
    if names.label is not None:
        answer["sessionLabel"] = names.label
    if names.parent is not None:
        answer[PARENT_META_KEY] = names.parent
    if opened.resumed:
        answer["resumed"] = True
    return answer


def listed_names(entry: dict[str, Any], row: Any, name: SessionName | None) -> dict[str, Any]:
    """A ``session/list`` entry with its key, label and parent (flat)."""
    if name is not None and name.key is not None:
        entry["sessionKey" if name.current else "formerSessionKey"] = name.key
    if name is not None and name.label is not None:
        entry["sessionLabel"] = name.label
    parent = row.meta.get(PARENT_META_KEY)
    if isinstance(parent, str):
        entry[PARENT_META_KEY] = parent
    return entry
