"""``zeroclaw acp``: one ACP connection on stdin/stdout, with an embedded host.

Runs on the asyncio loop (main thread). At EOF the running turns are cancelled
(and persisted as cancelled), in-flight requests are answered, then the workers
and actors stop and the process exits. SIGHUP (the editor's terminal went away)
ends the input the same way. With a configuration that cannot be used,
:func:`serve_config_error` answers every request with the reason instead.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Iterator, Mapping

from ipc.errors import InternalError
from ipc.framing import DEFAULT_FRAME_LIMIT
from ipc.jsonrpc import Endpoint, Handler
from ipc.session_names import SessionNaming
from ipc.transports import open_stdio, serve_stream
from supervisor import __version__
from supervisor.config import Settings
from supervisor.servers.acp_server import AcpServer

__all__ = ["serve_acp_stdio", "serve_config_error"]

log = logging.getLogger("zeroclaw.stdio")


async def serve_acp_stdio(settings: Settings, naming: SessionNaming | None = None,
                          provenance: bool = False, receipt: bool = False) -> None:
    """``naming``: ``--session KEY`` and the like, for the editor's ``session/new``;
    ``provenance``: ``--provenance meta``; ``receipt``: ``--provenance meta+receipt``."""
    server = AcpServer(settings, __version__, default_naming=naming, provenance=provenance,
                       receipt=receipt)
    reader, writer = await open_stdio(settings.frame_limit)
    loop = asyncio.get_running_loop()
    hangup = asyncio.Event()
    loop.add_signal_handler(signal.SIGHUP, hangup.set)
    try:
        await serve_stream(reader, writer, lambda send: server.make_endpoint(send, "stdio"),
                           frame_limit=settings.frame_limit,
                           stall_timeout=settings.client_stall_timeout_secs, hangup=hangup)
    finally:
        await server.shutdown()
        loop.remove_signal_handler(signal.SIGHUP)


class _EveryMethod(Mapping[str, Handler]):
    """A method table that has ``handler`` under every name."""

    def __init__(self, handler: Handler) -> None:
        self._handler = handler

    def __getitem__(self, method: str) -> Handler:
        return self._handler

    def __iter__(self) -> Iterator[str]:
        return iter(())

    def __len__(self) -> int:
        return 0


async def serve_config_error(reason: str) -> None:
    """Answer every request (``initialize`` first of all, so the editor shows it) with
    -32603 ``configuration error: <reason>`` until EOF; notifications get nothing.
    An editor that spawns ``zeroclaw acp`` sees why it cannot work, instead of a
    process that died before its first answer."""
    error = InternalError(f"configuration error: {reason}")

    def refuse(params: object, endpoint: Endpoint) -> None:
        raise error

    methods = _EveryMethod(refuse)
    reader, writer = await open_stdio(DEFAULT_FRAME_LIMIT)
    await serve_stream(
        reader, writer,
        lambda send: Endpoint(send, methods, require_initialize=False, name="stdio"),
    )
