"""``zeroclaw acp --provenance off|meta|meta+receipt`` (OpenClaw's bridge modes).

- ``meta``: each ``session/prompt`` result's ``_meta.provenance`` names who answered
  (host, agent, model); see :func:`supervisor.servers.acp_server._prompt_result`.
- ``meta+receipt``: that, and each prompt the agent gets ends with a *source
  receipt*, a text block the agent can read, so it knows where the prompt came from
  (as OpenClaw's ``[Source Receipt]``):

  .. code-block:: text

      [Source Receipt]
      bridge=zeroclaw-acp
      originHost=<this machine's host name>
      originCwd=<the session's cwd, ~ for the home directory>
      acpSessionId=<the session id>
      targetSession=<the session's key, else its id>
      [/Source Receipt]

  The receipt is a part of the prompt (after the user's parts), so the stored turn
  keeps it as the record of where the prompt came from: ``session/load`` replays it
  with the user's text. A slash command (``/clear``, ``/mode …``) gets none: the host
  answers those itself.

The mode is the process's (``zeroclaw acp --provenance``), or a connection's own:
``initialize`` with ``_meta.zeroclaw.provenance`` (one of the modes) and, optionally,
``_meta.zeroclaw.originHost`` (the host the prompts come from). ``zeroclaw acp
--attach --provenance …`` sends both, so a daemon or gateway behind the bridge
receipts the editor's machine.

Runs on the asyncio loop thread; :func:`receipt` reads the store (the session's key
and cwd: the reader's few-ms queries).
"""

from __future__ import annotations

import dataclasses
import os
import socket
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ipc.errors import InvalidParams
from ipc.session_names import check_name
from supervisor.slash_commands import parse

if TYPE_CHECKING:
    from ipc.acp import PromptRequest
    from supervisor.sessions import Sessions

__all__ = ["MODES", "ProvenanceMode", "connection_mode", "receipt", "with_receipt"]

MODES = ("off", "meta", "meta+receipt")


@dataclasses.dataclass(frozen=True, slots=True)
class ProvenanceMode:
    """``meta``: the prompt result's ``_meta.provenance``; ``receipt``: a source receipt
    in each prompt, naming ``origin_host`` (None: this machine)."""

    meta: bool = False
    receipt: bool = False
    origin_host: str | None = None

    @classmethod
    def of(cls, mode: str, origin_host: str | None = None) -> ProvenanceMode:
        return cls(mode != "off", mode == "meta+receipt", origin_host)


def connection_mode(params: Any) -> ProvenanceMode | None:
    """The mode an ``initialize`` asks for in ``_meta.zeroclaw`` (None: none asked);
    -32602 for a mode that is not one of :data:`MODES`."""
    meta = params.get("_meta") if isinstance(params, Mapping) else None
    ours = meta.get("zeroclaw") if isinstance(meta, Mapping) else None
    if not isinstance(ours, Mapping) or ours.get("provenance") is None:
        return None
    mode = ours["provenance"]
    if mode not in MODES:
        raise InvalidParams(f"_meta.zeroclaw.provenance must be one of {', '.join(MODES)}")
    host = check_name(ours.get("originHost"), "_meta.zeroclaw.originHost")
    return ProvenanceMode.of(mode, host)

BRIDGE = "zeroclaw-acp"


def _home_short(path: str) -> str:
    home = os.path.expanduser("~")
    if home not in ("", "/") and (path == home or path.startswith(home + os.sep)):
        return "~" + path[len(home):]
    return path


def receipt(sessions: Sessions, sid: str, origin_host: str | None = None) -> str | None:
    """The source receipt of a prompt to ``sid`` (None: no such stored session)."""
    reader = sessions.host.reader
    info = reader.get_session(sid)
    if info is None:
        return None
    name = reader.names_of([sid]).get(sid)
    target = name.key if name is not None and name.key is not None and name.current else sid
    return "\n".join([
        "[Source Receipt]",
        f"bridge={BRIDGE}",
        f"originHost={_one_line(origin_host or socket.gethostname())}",
        f"originCwd={_home_short(info.cwd)}",
        f"acpSessionId={sid}",
        f"targetSession={target}",
        "[/Source Receipt]",
    ])


def _one_line(text: str) -> str:
    return " ".join(text.split())


def with_receipt(sessions: Sessions, request: PromptRequest,
                 origin_host: str | None = None) -> PromptRequest:
    """``request`` with its source receipt as a last part; unchanged for a slash
    command or a session the store does not have (the prompt fails as it would)."""
    first = next((text for text in request.texts if text is not None), "")
    if parse(first) is not None:
        return request
    block = receipt(sessions, request.session_id, origin_host)
    if block is None:
        return request
    return dataclasses.replace(request, texts=(*request.texts, block))
