"""Relays between hosted ACP agents and their sessions' clients. Imports: workers, core, config."""
