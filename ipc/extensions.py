"""Method tables that also take ACP extension methods (names starting with ``_``).

ACP reserves ``_``-prefixed method names for extensions a peer may forward as it
likes. :class:`ExtensionMethods` is a plain method table for
:class:`ipc.jsonrpc.Endpoint` whose lookup of an unknown ``_name`` gives
``fallback(name, params, endpoint)``: one handler for every extension method.
Pure data; safe from any thread.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["ExtensionMethods", "is_extension"]


def is_extension(method: str) -> bool:
    """Whether ``method`` is an ACP extension method (``_`` and a name)."""
    return len(method) > 1 and method.startswith("_")


class ExtensionMethods(dict[str, Callable[..., Any]]):
    """A method table; an unknown extension method is looked up as ``fallback`` bound
    to its name."""

    def __init__(self, methods: Mapping[str, Callable[..., Any]],
                 fallback: Callable[..., Any]) -> None:
        super().__init__(methods)
        self._fallback = fallback

    def get(self, key: str, default: Any = None) -> Any:
        handler = super().get(key)
        if handler is None and isinstance(key, str) and is_extension(key):
            return functools.partial(self._fallback, key)
        return default if handler is None else handler
