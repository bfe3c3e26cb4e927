"""A hosted agent's plain text chunks, read by their bytes (the agent process's loop
thread, :mod:`actors.worker.agents.acp_process`).

Most of a streaming agent's output is one line per text chunk: a ``session/update``
notification whose update is an ``agent_message_chunk`` of one text block, written
compactly with its keys in the order ACP's SDKs write them. Such a line's params are
built from its bytes, without decoding it as JSON: what a match proves is exactly
that shape, with a session id and a text that hold no quote, backslash or control
character (nothing a JSON string would escape) and are valid UTF-8. Any other line
(other keys or key order, whitespace, an escape) is left to the full decode; either
way the params are those ``orjson.loads(line)["params"]`` gives.
"""

from __future__ import annotations

import re
from typing import Any, Final

__all__ = ["chunk_params"]

_PLAIN: Final = rb'([^"\\\x00-\x1f]*)'  # a JSON string's bytes that need no unescaping
_CHUNK_LINE: Final = re.compile(
    rb'\{"jsonrpc":"2\.0","method":"session/update","params":\{"sessionId":"' + _PLAIN
    + rb'","update":\{"sessionUpdate":"agent_message_chunk","content":\{"type":"text",'
    rb'"text":"' + _PLAIN + rb'"\}\}\}\}').fullmatch


def chunk_params(line: bytes) -> dict[str, Any] | None:
    """The params of ``line`` when it is a plain text chunk's notification; None for
    any other line."""
    match = _CHUNK_LINE(line)
    if match is None:
        return None
    session_id, text = match.groups()
    try:
        return {"sessionId": session_id.decode(), "update": {
            "sessionUpdate": "agent_message_chunk",
            "content": {"type": "text", "text": text.decode()}}}
    except UnicodeDecodeError:  # not UTF-8: left to the full decode, which refuses it
        return None
