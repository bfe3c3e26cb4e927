"""The ACP v1 handshake: the ``initialize`` answer and the session modes.

Kept apart from :mod:`ipc.acp` so the path to the first answer imports almost
nothing (``zeroclaw acp`` cold start is measured to the ``initialize`` reply).
Pure functions: safe from any thread.
"""

from __future__ import annotations

from typing import Any

from ipc.errors import InvalidParams
from ipc.modes import MODES

__all__ = [
    "PROTOCOL_VERSION", "check_protocol_version", "initialize_result", "modes_state",
]

PROTOCOL_VERSION = 1


def check_protocol_version(value: Any) -> None:
    """-32602 unless ``protocolVersion`` is a whole number (or absent, as from older
    clients). Any number is answered with :data:`PROTOCOL_VERSION` (0 gets 1); the
    client decides whether it can speak it."""
    if value is None or type(value) is int or (type(value) is float and value.is_integer()):
        return
    raise InvalidParams(f"protocolVersion must be an integer (zeroclaw speaks ACP "
                        f"{PROTOCOL_VERSION}), got {value!r}")


def initialize_result(
    *, version: str, persistent: bool, default_model: str, max_sessions: int, timeout: float,
    sandbox: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The ``initialize`` answer; without a store, no load/list/resume/close/delete.
    ``sandbox`` is how shell commands are confined (``_meta.zeroclaw.sandbox``)."""
    session_caps: dict[str, Any] = (
        {"list": {}, "resume": {}, "close": {}, "delete": {}} if persistent else {}
    )
    return {
        "protocolVersion": PROTOCOL_VERSION,
        "agentCapabilities": {
            "loadSession": persistent,
            "promptCapabilities": {"image": False, "audio": False, "embeddedContext": True},
            "mcpCapabilities": {"http": True, "sse": True},
            "sessionCapabilities": session_caps,
        },
        "agentInfo": {"name": "zeroclaw-acp", "title": "ZeroClaw ACP", "version": version},
        "authMethods": [],
        "_meta": {
            "zeroclaw": {
                "defaultModel": default_model,
                "maxSessions": max_sessions,
                "sessionTimeoutSecs": timeout,
                **({"sandbox": sandbox} if sandbox is not None else {}),
            }
        },
    }


def modes_state(current: str) -> dict[str, Any]:
    return {
        "currentModeId": current,
        "availableModes": [
            {"id": mode.id, "name": mode.name, "description": mode.description}
            for mode in MODES
        ],
    }
