"""The host process: supervisor actor, worker pool, transports and the CLI."""

__version__ = "0.1.0"
