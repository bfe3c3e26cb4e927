"""The host's dialect servers and sockets: ``zeroclaw acp`` on stdio, ``zeroclaw
daemon`` with ``daemon.sock`` (RPC dialect), ``acp.sock`` and the gateway.

Everything here runs on the host process's asyncio loop thread. Imports: ops and the
packages below it (host, hosted, workers, core, config), never cli.
"""
