"""``zeroclaw status [--json] [--watch]``: ask the daemon for its ``status`` and print it.

A plain blocking client on the main thread (no asyncio, no host imports):
connect to the socket, ``initialize``, then ``status``. Exit codes (documented
in the README): 0 running and healthy, 1 degraded (a worker not responsive, or
the daemon answered with an error), 3 not running (no socket, or nothing
listening), 4 no answer within 5 s. Usage errors (2) are argparse's.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any, Final, TextIO

__all__ = [
    "EXIT_DEGRADED",
    "EXIT_NOT_RUNNING",
    "EXIT_NO_ANSWER",
    "EXIT_OK",
    "NotRunning",
    "StatusClient",
    "exit_code",
    "render",
    "run_status",
]

EXIT_OK: Final = 0
EXIT_DEGRADED: Final = 1
EXIT_NOT_RUNNING: Final = 3
EXIT_NO_ANSWER: Final = 4
ANSWER_TIMEOUT: Final = 5.0
_MAX_LINE: Final = 64 * 1024 * 1024


class NotRunning(Exception):
    """Nothing listens on the socket."""


class NoAnswer(Exception):
    """The daemon did not answer in time (or hung up)."""


class DaemonError(Exception):
    """The daemon answered with a JSON-RPC error."""


class StatusClient:
    """One connection to ``daemon.sock``: ``initialize`` once, then ``status`` calls."""

    def __init__(self, path: Path, timeout: float = ANSWER_TIMEOUT) -> None:
        self.path = path
        self.timeout = timeout
        self._sock: socket.socket | None = None
        self._buffer = b""
        self._next_id = 1

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(os.fspath(self.path))
        except (FileNotFoundError, ConnectionRefusedError, NotADirectoryError) as exc:
            sock.close()
            raise NotRunning(f"no daemon is listening on {self.path}") from exc
        except TimeoutError as exc:
            sock.close()
            raise NoAnswer(f"connecting to {self.path} timed out") from exc
        except OSError as exc:
            sock.close()
            raise NotRunning(f"cannot connect to {self.path}: {exc.strerror}") from exc
        self._sock = sock
        self._buffer = b""
        self.call("initialize", {"protocolVersion": 1})

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def call(self, method: str, params: dict[str, Any]) -> Any:
        if self._sock is None:
            self.connect()
        assert self._sock is not None
        request_id = self._next_id
        self._next_id += 1
        frame = {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}
        deadline = time.monotonic() + self.timeout
        try:
            self._sock.sendall(json.dumps(frame).encode() + b"\n")
            while True:
                message = self._read_message(deadline)
                if message.get("id") == request_id and "method" not in message:
                    break
        except TimeoutError as exc:
            raise NoAnswer(f"no answer to {method} within {self.timeout:.0f} s") from exc
        except OSError as exc:
            raise NoAnswer(f"connection lost: {exc.strerror or exc}") from exc
        if "error" in message:
            error = message["error"] or {}
            raise DaemonError(f"{error.get('code')}: {error.get('message')}")
        return message.get("result")

    def _read_message(self, deadline: float) -> dict[str, Any]:
        assert self._sock is not None
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError
            self._sock.settimeout(remaining)
            chunk = self._sock.recv(65536)
            if not chunk:
                raise NoAnswer("the daemon closed the connection")
            self._buffer += chunk
            if len(self._buffer) > _MAX_LINE:
                raise NoAnswer("answer too large")
        line, self._buffer = self._buffer.split(b"\n", 1)
        try:
            message = json.loads(line)
        except ValueError as exc:
            raise NoAnswer("the daemon sent an unparsable frame") from exc
        return message if isinstance(message, dict) else {}


def exit_code(status: dict[str, Any]) -> int:
    """0 when every worker responds, else 1 (degraded)."""
    workers = status.get("workers") or []
    healthy = all(w.get("responsive", True) and w.get("rssBytes", 0) > 0 for w in workers)
    return EXIT_OK if healthy else EXIT_DEGRADED


def _ago(stamp: Any, now: float) -> str:
    if not isinstance(stamp, int | float):
        return "-"
    return _duration(max(0.0, now - stamp)) + " ago"


def _duration(secs: float) -> str:
    secs = int(secs)
    if secs < 60:
        return f"{secs}s"
    if secs < 3600:
        return f"{secs // 60}m{secs % 60:02d}s"
    return f"{secs // 3600}h{secs % 3600 // 60:02d}m"


def _mib(n: Any) -> str:
    return f"{(n or 0) / 1048576:.1f} MiB"


def _tokens(usage: Any) -> str:
    """``usage.totalTokens`` for the table (``-`` when a daemon does not report it)."""
    total = usage.get("totalTokens") if isinstance(usage, dict) else None
    return str(total) if isinstance(total, int) else "-"


def render(status: dict[str, Any], now: float | None = None) -> str:
    """The human table for a ``status`` result."""
    now = time.time() if now is None else now
    limits = status.get("limits") or {}
    store = status.get("store") or {}
    lines = [
        f"zeroclaw daemon {status.get('serverVersion')}  pid {status.get('pid')}  "
        f"up {_duration(float(status.get('uptimeSecs') or 0))}  "
        f"protocol {status.get('protocolVersion')}",
        f"sessions: {status.get('activeSessions', 0)} live (max {limits.get('maxSessions')}, "
        f"idle timeout {limits.get('sessionTimeoutSecs')} s)",
    ]
    if store:
        kind = store.get("backend", "sqlite") if store.get("persistent") else "in memory"
        committed = store.get("lastCommit")
        last = f", last commit {_duration(now - committed)} ago" if committed else ""
        lines.append(f"store: {store.get('path')} ({kind}{last})")
    lines += _host_lines(status)
    sandbox = status.get("sandbox")
    if isinstance(sandbox, dict):
        lines.append(f"sandbox: {sandbox.get('backend')} {sandbox.get('version') or ''}".rstrip()
                     + (f" ({sandbox['reason']})" if sandbox.get("reason") else ""))
    usage = status.get("usage")
    if isinstance(usage, dict):
        lines.append(f"usage: {_tokens(usage)} tokens in {usage.get('turns', 0)} turns "
                     "(every stored session)")
    lines += ["", f"{'SESSION':<36}  {'AGENT':<12} {'STATE':<5} {'CLIENTS':>7} {'TURNS':>5} "
              f"{'TOKENS':>9}  LAST ACTIVITY"]
    for s in status.get("sessions") or []:
        lines.append(f"{s.get('sessionId', '')!s:<36}  {str(s.get('agentAlias'))[:12]:<12} "
                     f"{s.get('state')!s:<5} {s.get('clients', 0):>7} {s.get('turns', 0):>5} "
                     f"{_tokens(s.get('usage')):>9}  {_ago(s.get('lastActivity'), now)}")
    if not status.get("sessions"):
        lines.append("(no live sessions)")
    lines += ["", f"{'WORKER PID':>10}  {'RSS':>10}  {'CPU%':>6}  {'SESSIONS':>8}  HEALTH"]
    for w in status.get("workers") or []:
        ok = w.get("responsive", True) and w.get("rssBytes", 0) > 0
        lines.append(f"{w.get('pid')!s:>10}  {_mib(w.get('rssBytes')):>10}  "
                     f"{float(w.get('cpuPercent') or 0):>6.1f}  {w.get('sessions', 0):>8}  "
                     f"{'ok' if ok else 'UNRESPONSIVE'}")
        lines += _agent_lines(w.get("agents") or [])
    return "\n".join(lines)


def _host_lines(status: dict[str, Any]) -> list[str]:
    """This host's id and, on a shared store, every host the database knows."""
    lines = [f"host: {status['hostId']}"] if status.get("hostId") else []
    for h in status.get("hosts") or []:
        state = "alive" if h.get("alive") else "NOT BEATING"
        lines.append(f"  {'*' if h.get('self') else ' '} {h.get('hostId')}: "
                     f"{h.get('liveSessions', 0)} live session(s), heartbeat "
                     f"{float(h.get('lastHeartbeatSecsAgo') or 0):.1f} s ago ({state})")
    return lines


def _agent_lines(agents: list[dict[str, Any]]) -> list[str]:
    """A worker's hosted agent processes, indented under its row."""
    return [f"{'└ ' + str(a.get('pid')):>10}  {_mib(a.get('rssBytes')):>10}  "
            f"{float(a.get('cpuPercent') or 0):>6.1f}  {a.get('sessions', 0):>8}  "
            f"agent {a.get('agentAlias')}, restarts {a.get('restarts', 0)}, "
            f"sandbox {a.get('sandbox', 'none')}" for a in agents]


def _once(client: StatusClient, as_json: bool, out: TextIO) -> int:
    try:
        status = client.call("status", {})
    except NotRunning as exc:
        client.close()
        print(f"zeroclaw status: not running ({exc})", file=sys.stderr)
        return EXIT_NOT_RUNNING
    except NoAnswer as exc:
        client.close()
        print(f"zeroclaw status: {exc}", file=sys.stderr)
        return EXIT_NO_ANSWER
    except DaemonError as exc:
        print(f"zeroclaw status: the daemon answered an error: {exc}", file=sys.stderr)
        return EXIT_DEGRADED
    if not isinstance(status, dict):
        print("zeroclaw status: the daemon sent an unexpected answer", file=sys.stderr)
        return EXIT_DEGRADED
    out.write(json.dumps(status) + "\n" if as_json else render(status) + "\n")
    out.flush()
    return exit_code(status)


def run_status(socket_path: Path, *, as_json: bool = False, watch: bool = False,
               out: TextIO | None = None) -> int:
    """Print the daemon's status once, or every second with ``watch`` until Ctrl-C."""
    out = out or sys.stdout
    client = StatusClient(socket_path)
    if not watch:
        try:
            return _once(client, as_json, out)
        finally:
            client.close()
    code = EXIT_OK
    redraw = out.isatty() and not as_json
    try:
        while True:
            if redraw:
                out.write("\x1b[H\x1b[2J")
            code = _once(client, as_json, out)
            time.sleep(1.0)
    except KeyboardInterrupt:
        return code
    finally:
        client.close()
