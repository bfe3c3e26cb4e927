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

Runs on the asyncio loop thread; :func:`receipt` reads the store (the session's key
and cwd: the reader's few-ms queries).
"""

from __future__ import annotations

import dataclasses
import os
import socket
from typing import TYPE_CHECKING

from supervisor.slash_commands import parse

if TYPE_CHECKING:
    from ipc.acp import PromptRequest
    from supervisor.sessions import Sessions

__all__ = ["receipt", "with_receipt"]

BRIDGE = "zeroclaw-acp"


def _home_short(path: str) -> str:
    home = os.path.expanduser("~")
    if home not in ("", "/") and (path == home or path.startswith(home + os.sep)):
        return "~" + path[len(home):]
    return path


def receipt(sessions: Sessions, sid: str) -> str | None:
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
        f"originHost={socket.gethostname()}",
        f"originCwd={_home_short(info.cwd)}",
        f"acpSessionId={sid}",
        f"targetSession={target}",
        "[/Source Receipt]",
    ])


def with_receipt(sessions: Sessions, request: PromptRequest) -> PromptRequest:
    """``request`` with its source receipt as a last part; unchanged for a slash
    command or a session the store does not have (the prompt fails as it would)."""
    first = next((text for text in request.texts if text is not None), "")
    if parse(first) is not None:
        return request
    block = receipt(sessions, request.session_id)
    if block is None:
        return request
    return dataclasses.replace(request, texts=(*request.texts, block))
