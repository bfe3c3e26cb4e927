"""``zeroclaw acp``: one ACP connection on stdin/stdout, with an embedded host.

Runs on the asyncio loop (main thread). At EOF the running turns are cancelled
(and persisted as cancelled), in-flight requests are answered, then the workers
and actors stop and the process exits. SIGHUP (the editor's terminal went away)
ends the input the same way.
"""

from __future__ import annotations

import asyncio
import logging
import signal

from ipc.transports import open_stdio, serve_stream
from supervisor import __version__
from supervisor.acp_server import AcpServer
from supervisor.config import Settings

__all__ = ["serve_acp_stdio"]

log = logging.getLogger("zeroclaw.stdio")


async def serve_acp_stdio(settings: Settings) -> None:
    server = AcpServer(settings, __version__)
    reader, writer = await open_stdio(settings.frame_limit)
    loop = asyncio.get_running_loop()
    hangup = asyncio.Event()
    loop.add_signal_handler(signal.SIGHUP, hangup.set)
    try:
        await serve_stream(reader, writer, lambda send: server.make_endpoint(send, "stdio"),
                           frame_limit=settings.frame_limit, hangup=hangup)
    finally:
        await server.shutdown()
        loop.remove_signal_handler(signal.SIGHUP)
