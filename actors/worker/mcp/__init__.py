"""MCP servers for zeroclaw's own model agent (the official ``mcp`` SDK's clients).

:class:`SessionMcp` holds one session's servers; :mod:`.connection` one server's
client, :mod:`.launch` a stdio server's sandboxed command line, :mod:`.tools` a
server's tool as a session tool, :mod:`.specs` the entries' shape, :mod:`.io` the
worker's MCP loop thread.

Imports nothing itself: the host reads :mod:`.specs` to check a config without
loading the clients.
"""
