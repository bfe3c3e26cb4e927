"""The error of a configuration that cannot be used, raised wherever a section is read.

Below every settings module (:mod:`supervisor.config.config` and the sections it
delegates to, such as :mod:`supervisor.config.gateway_config`), so each may raise it.
"""

__all__ = ["ConfigError"]


class ConfigError(ValueError):
    """The configuration cannot be used; the message says which key and why."""
