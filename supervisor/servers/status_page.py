"""``GET /`` of the gateway: the status page, for people who would rather look than read.

Runs on the asyncio loop thread when requested (the gateway's HTTP routing,
:mod:`supervisor.servers.gateway`). The page is three static files shipped as package data
beside this module (``status_page.html``, ``.js``, ``.css``; no CDN, no external
asset), read once and served as they are.

Auth: the files hold no data and no secret, so they are served without a token.
The script asks ``/status`` for everything it shows, with the token in an
``Authorization: Bearer`` header, so the page shows exactly what ``/status`` shows
that token (a tenant: its own sessions and turns; an admin: everything, with the
host's processes). The token reaches the page as ``#token=`` (a fragment never
leaves the browser) or ``?token=``, or is typed into the page's form; the script
removes it from the address bar at once and keeps it in the tab's
``sessionStorage`` only. Everything shown is set as text (``textContent``), never
parsed as HTML, and the Content-Security-Policy allows no inline script, no other
origin and no frame around the page.
"""

from __future__ import annotations

from importlib.resources import files
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from websockets.http11 import Response

    from supervisor.servers.ws_transport import WsConnection

__all__ = ["PAGE_PATHS", "page_response"]

_FILES: Final = {
    "/": ("status_page.html", "text/html; charset=utf-8"),
    "/status_page.js": ("status_page.js", "text/javascript; charset=utf-8"),
    "/status_page.css": ("status_page.css", "text/css; charset=utf-8"),
}
PAGE_PATHS: Final = frozenset(_FILES)
"""The paths the page is made of (every other path is someone else's)."""

_SECURITY_HEADERS: Final = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
        "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"),
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}

_PACKAGE: Final = __name__.rpartition(".")[0]  # the files travel with this module
_bodies: dict[str, str] = {}


def _body(path: str) -> str:
    """The file behind ``path``, read from the package once."""
    body = _bodies.get(path)
    if body is None:
        name = _FILES[path][0]
        body = _bodies[path] = files(_PACKAGE).joinpath(name).read_text(encoding="utf-8")
    return body


def page_response(connection: WsConnection, path: str) -> Response:
    """The answer to ``GET path`` for one of :data:`PAGE_PATHS` (no token needed)."""
    response = connection.respond(200, _body(path))
    del response.headers["Content-Type"]
    response.headers["Content-Type"] = _FILES[path][1]
    for name, value in _SECURITY_HEADERS.items():
        response.headers[name] = value
    return response
