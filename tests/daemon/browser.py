"""A headless Chromium (Debian's ``chromium`` package) driven over the DevTools protocol.

The protocol is JSON over one WebSocket, spoken here with the ``websockets`` package the
project depends on anyway: no browser download, no driver, no second runtime. Only
stable protocol domains are used (Target, Page, Runtime, Log). Every wait is bounded:
a condition is awaited inside the page (a promise settled by DOM mutations and the
page's own events, with a deadline), never by sleeping. Runs on the test's thread.

``scripts/test`` installs the package; :func:`chromium_or_skip` fails the test when
it is missing under CI (``CI=true``) and skips it elsewhere.
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest
from websockets.sync.client import ClientConnection, connect

__all__ = ["Browser", "BrowserError", "chromium_or_skip"]

_DEVTOOLS_LINE = re.compile(r"DevTools listening on (ws://\S+)")
_WAIT_FOR = """(predicate, timeoutMs) => new Promise((resolve, reject) => {
  const observer = new MutationObserver(() => check());
  const timer = setTimeout(() => finish(() => reject(new Error("condition not met in time"))),
                           timeoutMs);
  function finish(settle) {
    observer.disconnect();
    clearTimeout(timer);
    document.removeEventListener("zeroclaw:rendered", check);
    settle();
  }
  function check() {
    let value;
    try { value = predicate(); } catch (error) { finish(() => reject(error)); return; }
    if (value) finish(() => resolve(value));
  }
  observer.observe(document, {subtree: true, childList: true, attributes: true,
                              characterData: true});
  document.addEventListener("zeroclaw:rendered", check);
  check();
})"""


class BrowserError(AssertionError):
    """The browser did not start, a command failed, or a condition was not met."""


def chromium_or_skip() -> str:
    """The chromium executable (``ZEROCLAW_CHROMIUM`` or ``chromium`` on PATH); when there
    is none, the test fails under CI and is skipped elsewhere."""
    found = os.environ.get("ZEROCLAW_CHROMIUM") or shutil.which("chromium")
    if found:
        return found
    why = ("chromium is not installed: scripts/test installs Debian's chromium package "
           "with apt-get (as root or with passwordless sudo)")
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(why)
    pytest.skip(why)


class Browser:
    """One headless Chromium with a fresh profile in ``profile_dir`` and one page."""

    def __init__(self, executable: str, profile_dir: Path, *, timeout: float = 20.0) -> None:
        self.timeout = timeout
        self.exceptions: list[str] = []
        self.log_errors: list[str] = []
        self._events: list[dict[str, Any]] = []
        self._ids = itertools.count(1)
        self._stderr_lines: list[str] = []
        self._listening = threading.Event()
        self._url = ""
        # --no-sandbox: CI runs as root, where Chromium refuses its sandbox, and containers
        # lack the namespaces it needs; the only page it opens is the test's own.
        self.proc = subprocess.Popen(
            [executable, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
             "--no-default-browser-check", "--disable-extensions", "--mute-audio",
             "--remote-debugging-address=127.0.0.1", "--remote-debugging-port=0",
             f"--user-data-dir={profile_dir}", "--window-size=1280,1000", "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            start_new_session=True, text=True, errors="replace")
        threading.Thread(target=self._read_stderr, daemon=True).start()
        try:
            self._connection = self._connect()
            self.session = self._open_page()
        except BaseException:
            self.close()
            raise

    # --- start and stop -----------------------------------------------------------

    def _read_stderr(self) -> None:
        """Drains the browser's stderr (so it never blocks) and finds its DevTools URL."""
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self._stderr_lines.append(line.rstrip())
            del self._stderr_lines[:-50]
            match = _DEVTOOLS_LINE.search(line)
            if match and not self._listening.is_set():
                self._url = match.group(1)
                self._listening.set()
        self._listening.set()  # exited: the waiter sees no URL

    def _connect(self) -> ClientConnection:
        if not self._listening.wait(self.timeout) or not self._url:
            raise BrowserError(f"chromium did not start:\n{self.stderr()}")
        return connect(self._url, max_size=None, open_timeout=self.timeout,
                       close_timeout=2, legacy=True)

    def _open_page(self) -> str:
        target = self.command("Target.createTarget", {"url": "about:blank"})["targetId"]
        attached = self.command("Target.attachToTarget", {"targetId": target, "flatten": True})
        session: str = attached["sessionId"]
        for domain in ("Page", "Runtime", "Log"):
            self.command(f"{domain}.enable", session=session)
        return session

    def stderr(self) -> str:
        return "\n".join(self._stderr_lines)

    def close(self) -> None:
        """Ends the browser and every process it started (its own process group)."""
        with contextlib.suppress(Exception):
            self._connection.close()
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- the protocol ---------------------------------------------------------------

    def command(self, method: str, params: dict[str, Any] | None = None, *,
                session: str | None = None, timeout: float | None = None) -> dict[str, Any]:
        """Send one command (to the page's session unless another is named) and return
        its result; events that arrive meanwhile are kept."""
        message_id = next(self._ids)
        message: dict[str, Any] = {"id": message_id, "method": method, "params": params or {}}
        target = session if session is not None else getattr(self, "session", None)
        if target is not None:
            message["sessionId"] = target
        self._connection.send(json.dumps(message))
        while True:
            reply = self._receive(timeout or self.timeout, f"an answer to {method}")
            if reply.get("id") == message_id:
                if "error" in reply:
                    raise BrowserError(f"{method}: {reply['error']}")
                result: dict[str, Any] = reply.get("result", {})
                return result

    def _receive(self, timeout: float, waiting_for: str) -> dict[str, Any]:
        try:
            message: dict[str, Any] = json.loads(self._connection.recv(timeout=timeout))
        except TimeoutError:
            raise BrowserError(f"no {waiting_for} within {timeout} s") from None
        if "method" in message:
            self._note(message)
        return message

    def _note(self, event: dict[str, Any]) -> None:
        params = event.get("params", {})
        if event["method"] == "Runtime.exceptionThrown":
            details = params.get("exceptionDetails", {})
            self.exceptions.append(str(details.get("exception", {}).get("description")
                                       or details.get("text")))
        elif event["method"] == "Log.entryAdded":
            entry = params.get("entry", {})
            if entry.get("level") == "error":
                self.log_errors.append(f"{entry.get('source')}: {entry.get('text')}")
        self._events.append(event)

    def wait_event(self, method: str) -> dict[str, Any]:
        """The first kept event named ``method`` (taken), else the next one to come."""
        for index, event in enumerate(self._events):
            if event["method"] == method:
                return self._events.pop(index)
        while True:
            message = self._receive(self.timeout, f"{method} event")
            if message.get("method") == method:
                self._events.remove(message)
                return message

    # --- what a test does ------------------------------------------------------------

    def goto(self, url: str) -> None:
        """Load ``url`` and wait for its load event."""
        self._events.clear()
        result = self.command("Page.navigate", {"url": url})
        if result.get("errorText"):
            raise BrowserError(f"cannot load {url}: {result['errorText']}")
        self.wait_event("Page.loadEventFired")

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (a promise is awaited)."""
        result = self.command("Runtime.evaluate", {
            "expression": expression, "awaitPromise": True, "returnByValue": True})
        if "exceptionDetails" in result:
            details = result["exceptionDetails"]
            raise BrowserError(str(details.get("exception", {}).get("description")
                                   or details.get("text")))
        return result.get("result", {}).get("value")

    def wait_until(self, predicate: str, timeout: float | None = None) -> Any:
        """Until the JavaScript arrow function ``predicate`` returns a truthy value in the
        page, checked on every DOM change and every page render: that value.
        :class:`BrowserError` (with the page's text) when it is not met in time."""
        limit = timeout or self.timeout
        result = self.command("Runtime.evaluate", {
            "expression": f"({_WAIT_FOR})({predicate}, {int(limit * 1000)})",
            "awaitPromise": True, "returnByValue": True,
        }, timeout=limit + 5)
        if "exceptionDetails" in result:
            text = self.evaluate("document.body ? document.body.innerText : ''")
            raise BrowserError(f"not met within {limit} s: {predicate}\npage text:\n{text}")
        return result.get("result", {}).get("value")

    def screenshot(self, path: Path) -> Path:
        """A PNG of the whole page, saved at ``path``."""
        shot = self.command("Page.captureScreenshot",
                            {"format": "png", "captureBeyondViewport": True})
        path.write_bytes(base64.b64decode(shot["data"]))
        return path
