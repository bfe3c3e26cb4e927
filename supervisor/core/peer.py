"""A client connection as the host sees it, whatever its dialect: what a route, a turn's
stream, a relay or the ownership table may ask of it. Called on the asyncio loop thread.

Below :mod:`supervisor.core.routes` and :mod:`supervisor.core.pacing`: both hold a peer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from ipc.events import Event
    from ipc.transports import WriteFlow
    from ipc.worker_wire import PermissionAsk

__all__ = ["Peer"]


class Peer(Protocol):
    """A client connection in some dialect; the host talks to it through this."""

    name: str

    @property
    def flow(self) -> WriteFlow | None:
        """The pace of this peer's connection (None: never behind)."""

    def send_event(self, sid: str, event: Event) -> None:
        """Render ``event`` for this peer (a notification; never blocks). Raises
        TypeError (orjson's encode error) when it cannot be encoded."""

    async def ask_permission(self, sid: str, ask: PermissionAsk, timeout: float) -> str | None:
        """Ask the user; ``allow_once``/``allow_always``/``reject_once`` or None (denied)."""

    async def ask_user(
        self, sid: str, message: str, schema: dict[str, Any], timeout: float
    ) -> dict[str, Any] | None:
        """Ask the user a question (``elicitation/create``); None if it cannot be asked."""

    def offers(self, method: str) -> bool:
        """Whether this client advertised what a hosted agent's ``method`` (``fs/*``,
        ``terminal/*``) needs, so it can be relayed to it."""

    async def call_client(self, sid: str, method: str, params: dict[str, Any],
                          timeout: float) -> Any:
        """Send a hosted agent's request; its result. Raises TimeoutError,
        :class:`ipc.jsonrpc.ConnectionLost` or :class:`ipc.jsonrpc.RemoteError`."""

    def notify_client(self, sid: str, method: str, params: dict[str, Any]) -> None:
        """Send a hosted agent's notification (an extension ``_name``); never blocks."""
