"""``zeroclaw acp --attach ws://HOST:PORT/acp?agent=…``: the editor's stdio bridged to a
remote gateway's ``/acp`` (:mod:`supervisor.servers.gateway`).

The bridge, its replay of a connection that ended unanswered and its ending rules are
:mod:`supervisor.cli.attach`'s; this module is the
:class:`~supervisor.cli.attach_channel.Channel` over a WebSocket (the ``websockets``
library's threading client) and its dialer.

- Each line the editor writes goes out as one text frame (a line that is not UTF-8
  as a binary frame, which the gateway answers -32700); each frame the gateway sends
  comes out as one line. A line over the frame limit is not sent: the editor gets
  -32600 ``id: null`` ("frame too large"), as ``acp.sock`` would answer it.
- A frame of the gateway over the frame limit (decompressed) fails the connection
  (close 1009) before its payload is read, as the gateway does for the editor's: a
  hostile gateway holds at most :data:`_QUEUED_FRAMES` frames of the limit's size in
  the editor's memory. The bridge then ends as when the gateway goes away.
- A WebSocket cannot be half-closed: when the editor closes stdin, the gateway's
  requests to it (permission questions) are answered with an error, as the daemon
  does for a client whose input ended, and the connection is closed normally once
  every request of the editor was answered.
- The token comes from ``--token-file PATH`` or ``ZEROCLAW_GATEWAY_TOKEN``, never
  from the command line or the URL, and goes only in the ``Authorization`` header:
  no log line or error text holds it. A refused token (HTTP 401) ends the bridge
  with a clear message and exit status 1, without dialling again.
- ``wss://`` verifies the gateway's certificate and host name against the system's
  CAs, or ``--ca-file PATH`` (a self-signed gateway's certificate). ``ws://`` to a
  host other than this machine works but warns: the token travels in clear text.

Threads: as in :mod:`supervisor.cli.attach` (stdin thread sends, main thread receives);
the library's own thread reads the socket. Sends from both threads (the main thread
answers the gateway's requests after the input ended) take :attr:`_send_lock`.
"""

from __future__ import annotations

import codecs
import contextlib
import logging
import os
import ssl
import stat
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit

import orjson

from ipc.errors import InternalError, InvalidRequest
from supervisor.cli.attach_channel import AttachRefused, EditorOutput, LineSplitter

if TYPE_CHECKING:
    from websockets.sync.client import ClientConnection

__all__ = ["TOKEN_ENV", "GatewayDialer", "WebSocketChannel", "read_token"]

log = logging.getLogger("zeroclaw.attach")

TOKEN_ENV = "ZEROCLAW_GATEWAY_TOKEN"
DIAL_SECS = 10.0  # a gateway that does not answer (restarting, say) is tried this long
_RETRY_SECS = 0.2
#: Frames of the gateway read ahead of the editor (each at most the frame limit).
_QUEUED_FRAMES = 2
_MESSAGE_TOO_BIG = 1009
_TOO_LARGE = orjson.dumps({"jsonrpc": "2.0", "id": None,
                           "error": InvalidRequest("frame too large").to_error()}) + b"\n"
_INPUT_ENDED = InternalError("the client's input ended").to_error()


def read_token(token_file: str | None, env: dict[str, str] | None = None) -> str:
    """The gateway token: the first line of ``token_file``, else ``ZEROCLAW_GATEWAY_TOKEN``.

    Raises :class:`AttachRefused` (naming the file or variable, never the token)."""
    if token_file is not None:
        path = Path(token_file).expanduser()
        try:
            text = path.read_text(encoding="utf-8")
            mode = stat.S_IMODE(path.stat().st_mode)
        except (OSError, UnicodeDecodeError) as error:
            raise AttachRefused(f"cannot read the token file {path}: "
                                f"{getattr(error, 'strerror', None) or type(error).__name__}"
                                ) from None
        if mode & 0o077:
            log.warning("the token file %s can be read by other users (mode %o)", path, mode)
        token = text.strip().splitlines()[0].strip() if text.strip() else ""
        if not token:
            raise AttachRefused(f"the token file {path} is empty")
        return token
    token = (os.environ if env is None else env).get(TOKEN_ENV, "").strip()
    if not token:
        raise AttachRefused(f"no gateway token: set {TOKEN_ENV} or pass --token-file PATH")
    return token


def _checked_url(url: str) -> str:
    """``url`` if it is a usable ``ws://`` / ``wss://`` address without a token in it."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError on a malformed port
    except ValueError:
        raise AttachRefused("the --attach URL is malformed") from None
    if parts.scheme not in ("ws", "wss") or not parts.hostname:
        raise AttachRefused("--attach takes ws://HOST:PORT/acp or wss://HOST:PORT/acp "
                            "(or nothing, for the local daemon)")
    if "token" in parse_qs(parts.query) or parts.password is not None:
        raise AttachRefused(f"do not put the token in the URL (command lines are visible to "
                            f"other users): use {TOKEN_ENV} or --token-file")
    return url


def _warn_plaintext(url: str, ca_file: str | None) -> None:
    """Say so when a ``ws://`` URL sends the token in clear text off this machine."""
    from supervisor.config.gateway_config import is_loopback

    if ca_file is not None:
        log.warning("--ca-file is ignored for a ws:// URL (no TLS)")
    host = urlsplit(url).hostname or ""
    if not is_loopback(host):
        log.warning("the token goes unencrypted over ws:// to %s: anyone on the way can "
                    "read and reuse it; use wss:// unless the network is yours", host)


def _shown(url: str) -> str:
    """The URL for messages: scheme, host, port and path (no query)."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}{parts.path}"


class GatewayDialer:
    """Opens WebSocket channels to one gateway URL (main thread)."""

    def __init__(self, url: str, token: str, tls: ssl.SSLContext | None, frame_limit: int,
                 output: EditorOutput) -> None:
        self.url = url
        self.where = _shown(url)
        self.hint = ""
        self._token = token
        self._tls = tls
        self._frame_limit = frame_limit
        self._output = output

    @classmethod
    def from_options(cls, url: str, token_file: str | None, ca_file: str | None,
                     frame_limit: int, output: EditorOutput) -> GatewayDialer:
        url = _checked_url(url)
        tls = None
        if urlsplit(url).scheme == "wss":
            try:
                tls = ssl.create_default_context(cafile=ca_file)
            except (OSError, ssl.SSLError) as error:
                raise AttachRefused(f"cannot use the CA file {ca_file}: {error}") from None
        else:
            _warn_plaintext(url, ca_file)
        return cls(url, read_token(token_file), tls, frame_limit, output)

    def dial(self, timeout: float = DIAL_SECS) -> WebSocketChannel | None:
        """A connected channel; None when the gateway did not answer in ``timeout``.

        Raises :class:`AttachRefused` when it answered with a refusal."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                return WebSocketChannel(self._connect(), self._frame_limit, self._output)
            except OSError as error:  # refused, unreachable, timed out: may come up
                if time.monotonic() + _RETRY_SECS >= deadline:
                    log.error("cannot reach the gateway at %s: %s", self.where,
                              error.strerror or type(error).__name__)
                    return None
                time.sleep(_RETRY_SECS)

    def _connect(self) -> ClientConnection:
        from websockets.exceptions import InvalidHandshake, InvalidStatus, InvalidURI
        from websockets.sync.client import connect
        from websockets.typing import Subprotocol

        try:
            return connect(self.url, additional_headers={"Authorization": f"Bearer {self._token}"},
                           subprotocols=[Subprotocol("acp")], ssl=self._tls, open_timeout=DIAL_SECS,
                           max_size=self._frame_limit, max_queue=_QUEUED_FRAMES,
                           logger=_library_logger())
        except InvalidStatus as error:
            raise AttachRefused(_refusal(self.where, error.response.status_code,
                                         bytes(error.response.body))) from None
        except ssl.SSLCertVerificationError as error:
            raise AttachRefused(f"the gateway at {self.where} has a certificate we cannot "
                                f"verify ({error.verify_message}); pass --ca-file for a "
                                "self-signed one") from None
        except (InvalidURI, InvalidHandshake) as error:
            raise AttachRefused(f"no WebSocket at {self.where}: {type(error).__name__}") from None


def _library_logger() -> logging.Logger:
    """The library's logger, never at debug level: its debug lines show our headers."""
    logger = logging.getLogger("zeroclaw.attach.ws")
    logger.setLevel(max(logging.INFO, logging.getLogger().getEffectiveLevel()))
    return logger


def _refusal(where: str, status: int, body: bytes) -> str:
    """The message for a gateway that answered ``status`` instead of upgrading."""
    reason = ""
    try:
        decoded = orjson.loads(body)
        if isinstance(decoded, dict) and isinstance(decoded.get("error"), str):
            reason = decoded["error"][:200]
    except orjson.JSONDecodeError:
        pass
    what = {401: "refused the token", 403: "does not allow this token here",
            404: "has no /acp here (is the path right?)",
            429: "refuses us for now after too many failed attempts"}.get(
        status, "refused the connection")
    detail = f"HTTP {status}" + (f": {reason}" if reason else "")
    return f"the gateway at {where} {what} ({detail})"


class WebSocketChannel:
    """One ``/acp`` connection as a :class:`~supervisor.cli.attach_channel.Channel`."""

    def __init__(self, connection: ClientConnection, frame_limit: int,
                 output: EditorOutput) -> None:
        self._connection = connection
        self._output = output
        self._lines = LineSplitter(self._send_line, frame_limit, self._too_large)
        self._send_lock = threading.Lock()  # one send at a time (the library's rule)
        self._state_lock = threading.Lock()
        self._input_ended = False
        self._asked: set[str] = set()  # the gateway's requests the editor has not answered

    # --- the stdin thread ---------------------------------------------------------

    def send(self, data: bytes) -> None:
        self._lines.feed(data)

    def _send_line(self, line: bytes) -> None:
        if b'"result"' in line or b'"error"' in line:
            self._note_answer(line)
        self._send(line.rstrip(b"\r"))

    def _too_large(self, head: bytes) -> None:
        """A line over the frame limit, skipped unsent: answered here."""
        log.warning("a line of the editor over the frame limit was not sent")
        self._output.write(_TOO_LARGE)

    def _note_answer(self, line: bytes) -> None:
        try:
            frame = orjson.loads(line)
        except orjson.JSONDecodeError:
            return
        if isinstance(frame, dict) and isinstance(frame.get("id"), str):
            with self._state_lock:
                self._asked.discard(frame["id"])

    def end_input(self) -> None:
        """Answer the gateway's open questions for the editor, who cannot any more."""
        with self._state_lock:
            self._input_ended = True
            asked, self._asked = sorted(self._asked), set()
        for request_id in asked:
            self._refuse(request_id)

    # --- either thread --------------------------------------------------------------

    def _send(self, message: bytes) -> None:
        from websockets.exceptions import ConnectionClosed

        try:
            codecs.decode(message, "utf-8")
            text = True
        except UnicodeDecodeError:
            text = False  # the gateway answers -32700, as acp.sock would
        try:
            with self._send_lock:
                self._connection.send(message, text=text)
        except ConnectionClosed:
            raise ConnectionResetError("the gateway closed the connection") from None

    def _refuse(self, request_id: Any) -> None:
        answer = {"jsonrpc": "2.0", "id": request_id, "error": _INPUT_ENDED}
        with contextlib.suppress(OSError):  # the connection is gone: the reader sees it
            self._send(orjson.dumps(answer))

    def input_settled(self) -> None:
        self._connection.close()  # 1000: the editor is done and has every answer

    def close(self) -> None:
        self._connection.close()

    # --- the main thread -------------------------------------------------------------

    def recv(self) -> bytes:
        """The next frame of the gateway as one line; b"" once it closed."""
        from websockets.exceptions import ConnectionClosed

        while True:
            try:
                frame = self._connection.recv(decode=False)
            except ConnectionClosed as closed:
                if closed.sent is not None and closed.sent.code == _MESSAGE_TOO_BIG:
                    log.error("the gateway sent a frame over the frame limit; closed the "
                              "connection (WebSocket close 1009: %s)", closed.sent.reason)
                return b""
            if b'"method"' in frame and b'"id"' in frame and not self._asked_editor(frame):
                continue
            return frame + b"\n"

    def _asked_editor(self, frame: bytes) -> bool:
        """Note a request of the gateway; False when it was answered here instead
        (the editor's input ended: it can answer nothing)."""
        try:
            message = orjson.loads(frame)
        except orjson.JSONDecodeError:
            return True
        if not isinstance(message, dict) or not isinstance(message.get("id"), str):
            return True  # a notification (the gateway's request ids are strings)
        with self._state_lock:
            if not self._input_ended:
                self._asked.add(message["id"])
                return True
        self._refuse(message["id"])
        return False

    def ending(self) -> str:
        """The close code and reason the gateway gave, if it gave one."""
        code, reason = self._connection.close_code, self._connection.close_reason
        if code is None or code == 1006:  # 1006: no close frame at all
            return ""
        return f"WebSocket close {code}" + (f": {reason}" if reason else "")
