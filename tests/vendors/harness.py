"""An editor-like ACP client for the vendor tests: the same client drives a vendor's
adapter directly and through zeroclaw, so what each run delivered can be compared.

:class:`EditorClient` spawns any ACP command over stdio (:meth:`EditorClient.spawn`) or
connects to a Unix socket such as the daemon's ``acp.sock`` (:meth:`EditorClient.connect`).
It initializes offering what Zed offers (``fs.readTextFile``, ``fs.writeTextFile``,
``terminal``), and records in arrival order every ``session/update`` notification and
every request from the agent. It answers ``fs/*`` on the real disk, ``terminal/*`` with
real subprocesses, and ``session/request_permission`` by choosing the first option of the
configured kinds (``allow_once``, else ``allow_always``), recording the ``optionId`` chosen.

Threads: the test's thread sends and waits (every wait bounded); one reader thread parses
frames, records them and answers permission requests; a small pool answers ``fs/*`` and
``terminal/*`` (``terminal/wait_for_exit`` blocks until its command exits); one thread per
terminal collects its output.
"""

from __future__ import annotations

import contextlib
import difflib
import json
import os
import signal
import socket
import subprocess
import threading
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from tests.e2e.procs import descendants, reap_leaks, tail

__all__ = [
    "ZED_CAPABILITIES",
    "AcpError",
    "EditorClient",
    "Received",
    "Streams",
    "closed_cleanly",
    "diff_records",
    "live_as_replayed",
    "normalised",
    "replayed",
    "said",
    "streams",
]

WAIT = 30.0
#: What Zed offers an agent in ``initialize`` (``clientCapabilities``).
ZED_CAPABILITIES: dict[str, Any] = {
    "fs": {"readTextFile": True, "writeTextFile": True},
    "terminal": True,
}
DEFAULT_PERMISSION_KINDS = ("allow_once", "allow_always")


class AcpError(Exception):
    """An error response to one of the client's requests: ``code``, ``message``, ``data``."""

    def __init__(self, method: str, error: dict[str, Any]) -> None:
        self.code = error.get("code")
        self.message = str(error.get("message"))
        self.data = error.get("data")
        super().__init__(f"{method}: {self.code}: {self.message} (data: {self.data!r})")


@dataclass(frozen=True)
class Received:
    """One frame from the agent the tests compare: a ``session/update`` notification
    (``request_id`` None) or a request from the agent. ``chosen`` is the ``optionId``
    the client answered a permission request with (None: cancelled, or not one)."""

    method: str
    params: dict[str, Any]
    request_id: Any = None
    chosen: str | None = None

    @property
    def update(self) -> dict[str, Any]:
        """The ``update`` of a ``session/update`` (empty for a request)."""
        value: dict[str, Any] = self.params.get("update") or {}
        return value


# --- comparison ----------------------------------------------------------------------


def _without_meta(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_meta(v) for k, v in value.items() if k != "_meta"}
    if isinstance(value, list):
        return [_without_meta(v) for v in value]
    return value


def normalised(records: Iterable[Received]) -> list[dict[str, Any]]:
    """``records`` as plain dicts without what may differ between hosts: the params'
    ``sessionId`` and every ``_meta`` key at any depth (nothing else)."""
    out = []
    for record in records:
        params = {k: v for k, v in record.params.items() if k != "sessionId"}
        entry: dict[str, Any] = {"method": record.method, "params": _without_meta(params)}
        if record.method == "session/request_permission":
            entry["chosen"] = record.chosen
        out.append(entry)
    return out


def diff_records(expected: Sequence[dict[str, Any]], actual: Sequence[dict[str, Any]],
                 expected_label: str = "direct", actual_label: str = "hosted",
                 limit: int = 200) -> str:
    """A unified diff of two :func:`normalised` lists (one JSON line per record), cut
    to ``limit`` lines, for an assertion message."""
    def lines(items: Sequence[dict[str, Any]]) -> list[str]:
        return [json.dumps(item, sort_keys=True) for item in items]

    diff = list(difflib.unified_diff(lines(expected), lines(actual), expected_label,
                                     actual_label, n=1, lineterm=""))
    if len(diff) > limit:
        diff = [*diff[:limit], f"... ({len(diff) - limit} more diff lines)"]
    return "\n".join(diff)


#: Updates about the session rather than the turn: an agent sends them when it likes
#: (after ``session/new``, when a title is ready), so their place among the turn's
#: updates is timing, not content.
SESSION_LEVEL_UPDATES = frozenset({"available_commands_update", "session_info_update",
                                   "current_mode_update", "config_option_update",
                                   "usage_update"})
"""Updates about the session, not the turn's content. Where a ``usage_update`` falls
among a tool call's updates is the agent's timing: it moved by one between two runs
of Claude Code's adapter (it comes from the model stream's task, the tool's updates
from another)."""


def only_meta(update: dict[str, Any]) -> bool:
    """Whether a :func:`normalised` update is a ``tool_call_update`` that carried
    nothing but ``_meta``. Claude Code's adapter sends one from its PostToolUse hook
    (the ``toolResponse``) when the hook's callback runs before the turn moves on; the
    hook and the stream come from two tasks of the Claude Code process, so whether and
    where it lands is that process's timing (present in one direct run, absent in
    another)."""
    return (update.get("sessionUpdate") == "tool_call_update"
            and set(update) <= {"sessionUpdate", "toolCallId"})


def _drop_timing(update: dict[str, Any]) -> None:
    """Take out of a session-level update what the agent's timing decides: a
    ``session_info_update``'s ``updatedAt`` (a wall-clock time), and the last bits of a
    ``usage_update``'s cost (Claude Code's adapter sums its costs in the order its tasks
    ran: 0.0354165 in one run, 0.035416500000000004 in another)."""
    if update.get("sessionUpdate") == "session_info_update":
        update.pop("updatedAt", None)
    cost = update.get("cost")
    if isinstance(cost, dict) and isinstance(cost.get("amount"), float):
        cost["amount"] = round(cost["amount"], 12)


@dataclass(frozen=True)
class Streams:
    """What a client received, as the vendor tests compare it (each :func:`normalised`):
    the turn's updates in order, the session-level updates in order within each kind
    (an agent sends its commands, title and modes from tasks of their own, so their
    interleaving is timing; what :func:`_drop_timing` takes out, left out), and the
    permission requests in order."""

    turn: list[dict[str, Any]]
    session: list[dict[str, Any]]
    permissions: list[dict[str, Any]]

    def diff(self, other: Streams, labels: tuple[str, str] = ("direct", "hosted")) -> str:
        """The differences from ``other``, stream by stream ("" when equal)."""
        parts = []
        for name in ("turn", "session", "permissions"):
            mine, theirs = getattr(self, name), getattr(other, name)
            if mine != theirs:
                parts.append(f"== {name} ==\n{diff_records(mine, theirs, *labels)}")
        return "\n".join(parts)


def streams(records: Iterable[Received]) -> Streams:
    """``records`` split as :class:`Streams` compares them."""
    turn, session, permissions = [], [], []
    for entry in normalised(records):
        update = entry["params"].get("update") or {}
        if entry["method"] == "session/request_permission":
            permissions.append(entry)
        elif entry["method"] != "session/update" or only_meta(update):
            continue
        elif update.get("sessionUpdate") in SESSION_LEVEL_UPDATES:
            _drop_timing(update)
            session.append(entry)
        else:
            turn.append(entry)
    session.sort(key=lambda entry: entry["params"]["update"]["sessionUpdate"])  # stable
    return Streams(turn, session, permissions)


def said(records: Iterable[Received]) -> str:
    """The agent's message text in ``records`` (its ``agent_message_chunk`` texts)."""
    return "".join(r.update.get("content", {}).get("text", "") for r in records
                   if r.update.get("sessionUpdate") == "agent_message_chunk")


def replayed(records: Iterable[Received]) -> tuple[str, Streams]:
    """A ``session/load`` replay: the user's text, and the rest as :class:`Streams`
    without ``available_commands_update`` (the agent's state, not the turn)."""
    records = list(records)
    user = "".join(r.update["content"].get("text", "") for r in records
                   if r.update.get("sessionUpdate") == "user_message_chunk")
    rest = [r for r in records if r.update.get("sessionUpdate")
            not in ("user_message_chunk", "available_commands_update")]
    return user, streams(rest)


def live_as_replayed(records: Iterable[Received]) -> Streams:
    """What a replay of a live run's ``records`` must hold: its updates (no permission
    requests: those were answered live)."""
    _, live = replayed(records)
    return Streams(live.turn, live.session, [])


# --- answering the agent's requests ----------------------------------------------------


def _permission_choice(params: dict[str, Any], kinds: Sequence[str]) -> str | None:
    options = params.get("options") or []
    for kind in kinds:
        for option in options:
            if option.get("kind") == kind:
                return str(option["optionId"])
    return None


def _read_text_file(params: dict[str, Any]) -> dict[str, Any]:
    text = Path(params["path"]).read_text(encoding="utf-8")
    line, limit = params.get("line"), params.get("limit")
    if line is None and limit is None:
        return {"content": text}
    lines = text.splitlines(keepends=True)
    start = max(int(line or 1) - 1, 0)
    end = None if limit is None else start + int(limit)
    return {"content": "".join(lines[start:end])}


def _write_text_file(params: dict[str, Any]) -> None:
    Path(params["path"]).write_text(params["content"], encoding="utf-8")


@dataclass
class _Terminal:
    proc: subprocess.Popen[bytes]
    limit: int | None
    output: bytearray = field(default_factory=bytearray)
    truncated: bool = False
    done: threading.Event = field(default_factory=threading.Event)

    def collect(self) -> None:
        """Runs on the terminal's own thread: its output until EOF, then its exit."""
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        for chunk in iter(lambda: os.read(fd, 65536), b""):
            self.output += chunk
            if self.limit is not None and len(self.output) > self.limit:
                del self.output[: len(self.output) - self.limit]
                self.truncated = True
        self.proc.stdout.close()
        self.proc.wait()
        self.done.set()

    def exit_status(self) -> dict[str, Any]:
        code = self.proc.returncode
        if code is not None and code < 0:
            return {"exitCode": None, "signal": signal.Signals(-code).name}
        return {"exitCode": code, "signal": None}


class Terminals:
    """``terminal/*`` answered with real subprocesses (ids ``term-1``, ``term-2``...)."""

    def __init__(self) -> None:
        self._terminals: dict[str, _Terminal] = {}
        self._lock = threading.Lock()

    def handle(self, method: str, params: dict[str, Any]) -> Any:
        if method == "terminal/create":
            return self._create(params)
        terminal = self._terminals[params["terminalId"]]
        if method == "terminal/output":
            result: dict[str, Any] = {"output": terminal.output.decode("utf-8", "replace"),
                                      "truncated": terminal.truncated}
            if terminal.done.is_set():
                result["exitStatus"] = terminal.exit_status()
            return result
        if method == "terminal/wait_for_exit":
            terminal.done.wait(WAIT * 4)
            return terminal.exit_status()
        if method in ("terminal/kill", "terminal/release"):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(terminal.proc.pid, signal.SIGKILL)
            if method == "terminal/release":
                terminal.done.wait(WAIT)
                self._terminals.pop(params["terminalId"], None)
            return {}
        raise KeyError(method)

    def _create(self, params: dict[str, Any]) -> dict[str, Any]:
        env = dict(os.environ)
        env.update({e["name"]: e["value"] for e in params.get("env") or []})
        argv = [params["command"], *(params.get("args") or [])]
        proc = subprocess.Popen(
            argv if params.get("args") else ["/bin/sh", "-c", params["command"]],
            cwd=params.get("cwd"), env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, start_new_session=True,
        )
        terminal = _Terminal(proc, params.get("outputByteLimit"))
        threading.Thread(target=terminal.collect, daemon=True).start()
        with self._lock:
            terminal_id = f"term-{len(self._terminals) + 1}"
            while terminal_id in self._terminals:
                terminal_id += "x"
            self._terminals[terminal_id] = terminal
        return {"terminalId": terminal_id}

    def close(self) -> None:
        for terminal in list(self._terminals.values()):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(terminal.proc.pid, signal.SIGKILL)
            terminal.done.wait(WAIT)
        self._terminals.clear()


# --- the client ----------------------------------------------------------------------


class EditorClient:
    """One ACP connection, as an editor holds it. Build with :meth:`spawn` or
    :meth:`connect`; :meth:`close` after the test (it reports leftover processes)."""

    def __init__(self, reader: IO[bytes], write: Callable[[bytes], None],
                 closer: Callable[[float], list[str]], label: str, *,
                 permission_kinds: Sequence[str] = DEFAULT_PERMISSION_KINDS,
                 answers_permissions: bool = True,
                 stderr_path: Path | None = None) -> None:
        self.label = label
        self.pid: int | None = None  # a spawned child's
        self.permission_kinds = tuple(permission_kinds)
        self.answers_permissions = answers_permissions  # False: an editor whose user is away
        self.stderr_path = stderr_path
        self.wire: list[tuple[str, bytes]] = []  # ("->" | "<-", line), for diagnostics
        self.problems: list[str] = []
        self.terminals = Terminals()
        self._reader_file, self._write_raw, self._closer = reader, write, closer
        self._records: list[Received] = []
        self._responses: dict[Any, dict[str, Any]] = {}
        self._changed = threading.Condition()
        self._write_lock = threading.Lock()
        self._eof = False
        self._next_id = 0
        self._closed = False
        self._pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix=f"{label}-answers")
        self._reader = threading.Thread(target=self._read, name=f"{label}-reader", daemon=True)
        self._reader.start()

    # -- construction -------------------------------------------------------------

    @classmethod
    def spawn(cls, argv: Sequence[str], *, env: dict[str, str], cwd: Path | None = None,
              stderr_path: Path, label: str = "agent", **kwargs: Any) -> EditorClient:
        """Start ``argv`` (its stderr to ``stderr_path``) and speak ACP on its stdio."""
        stderr = stderr_path.open("ab")
        proc = subprocess.Popen(list(argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=stderr, env=env, cwd=cwd, bufsize=0)
        assert proc.stdin is not None and proc.stdout is not None
        stdin = proc.stdin

        def write(data: bytes) -> None:
            stdin.write(data)
            stdin.flush()

        def close(timeout: float) -> list[str]:
            children = descendants(proc.pid)
            with contextlib.suppress(BrokenPipeError):
                stdin.close()
            problems = []
            try:
                code = proc.wait(timeout)
                if code != 0:
                    problems.append(f"{label} pid {proc.pid} exited {code} on EOF")
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout)
                problems.append(f"{label} pid {proc.pid} did not exit within {timeout}s of EOF")
            stderr.close()
            leaks = reap_leaks(children, timeout)
            return problems + [f"left behind by {label}: {leak}" for leak in leaks]

        client = cls(proc.stdout, write, close, label, stderr_path=stderr_path, **kwargs)
        client.pid = proc.pid
        return client

    @classmethod
    def connect(cls, socket_path: Path, *, label: str = "editor", **kwargs: Any
                ) -> EditorClient:
        """Connect to a Unix socket speaking ACP as NDJSON (the daemon's ``acp.sock``)."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(WAIT)
        sock.connect(str(socket_path))
        sock.settimeout(None)
        reader = sock.makefile("rb")

        def close(timeout: float) -> list[str]:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            reader.close()
            sock.close()
            return []

        return cls(reader, sock.sendall, close, label, **kwargs)

    # -- the reader thread ----------------------------------------------------------

    def _read(self) -> None:
        try:
            for line in iter(self._reader_file.readline, b""):
                self.wire.append(("<-", line[:4000]))
                try:
                    frame = json.loads(line)
                except ValueError:
                    self.problems.append(f"{self.label}: not JSON: {line[:300]!r}")
                    continue
                self._dispatch(frame)
        except (OSError, ValueError):
            pass  # the connection closed under the reader
        with self._changed:
            self._eof = True
            self._changed.notify_all()

    def _dispatch(self, frame: dict[str, Any]) -> None:
        method = frame.get("method")
        if method is None:
            with self._changed:
                self._responses[frame.get("id")] = frame
                self._changed.notify_all()
            return
        params = frame.get("params") or {}
        if "id" not in frame:
            if method == "session/update":
                self._record(Received(method, params))
            return
        if method == "session/request_permission":
            chosen = _permission_choice(params, self.permission_kinds)
            self._record(Received(method, params, frame["id"], chosen))
            if not self.answers_permissions:
                return
            outcome = ({"outcome": "selected", "optionId": chosen} if chosen is not None
                       else {"outcome": "cancelled"})
            self._send({"jsonrpc": "2.0", "id": frame["id"], "result": {"outcome": outcome}})
            return
        self._record(Received(method, params, frame["id"]))
        self._pool.submit(self._answer, frame["id"], method, params)

    def _record(self, record: Received) -> None:
        with self._changed:
            self._records.append(record)
            self._changed.notify_all()

    def _answer(self, request_id: Any, method: str, params: dict[str, Any]) -> None:
        """Runs on the pool: one ``fs/*`` or ``terminal/*`` request, answered."""
        reply: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id}
        try:
            if method == "fs/read_text_file":
                reply["result"] = _read_text_file(params)
            elif method == "fs/write_text_file":
                _write_text_file(params)
                reply["result"] = {}
            elif method.startswith("terminal/"):
                reply["result"] = self.terminals.handle(method, params)
            else:
                reply["error"] = {"code": -32601, "message": f"method not found: {method}"}
        except (OSError, KeyError, ValueError) as exc:
            reply["error"] = {"code": -32603, "message": f"{type(exc).__name__}: {exc}"}
        with contextlib.suppress(OSError, ValueError):
            self._send(reply)

    # -- sending and waiting ----------------------------------------------------------

    def _send(self, frame: dict[str, Any]) -> None:
        data = json.dumps(frame).encode() + b"\n"
        with self._write_lock:
            self.wire.append(("->", data[:4000]))
            self._write_raw(data)

    def request(self, method: str, params: dict[str, Any], timeout: float = WAIT) -> Any:
        """Send a request and wait (bounded) for its answer: the result, or
        :class:`AcpError`."""
        with self._changed:
            self._next_id += 1
            request_id = self._next_id
        self._send({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params})
        with self._changed:
            got = self._changed.wait_for(
                lambda: request_id in self._responses or self._eof, timeout)
            response = self._responses.pop(request_id, None)
        if response is None:
            why = "closed the connection" if got else f"did not answer within {timeout}s"
            raise AssertionError(f"{self.label}: {method} {why}\n{self.diagnostics()}")
        if "error" in response:
            raise AcpError(method, response["error"])
        return response.get("result")

    def notify(self, method: str, params: dict[str, Any]) -> None:
        self._send({"jsonrpc": "2.0", "method": method, "params": params})

    def initialize(self, capabilities: dict[str, Any] | None = None,
                   timeout: float = WAIT) -> dict[str, Any]:
        result: dict[str, Any] = self.request("initialize", {
            "protocolVersion": 1,
            "clientCapabilities": ZED_CAPABILITIES if capabilities is None else capabilities,
            "clientInfo": {"name": "zed", "title": "Zed", "version": "0.200.0"},
        }, timeout)
        return result

    def new_session(self, cwd: Path, timeout: float = WAIT, **extra: Any) -> str:
        result = self.request("session/new", {"cwd": str(cwd), "mcpServers": [], **extra},
                              timeout)
        return str(result["sessionId"])

    def prompt(self, session_id: str, text: str, timeout: float = WAIT * 4) -> dict[str, Any]:
        result: dict[str, Any] = self.request("session/prompt", {
            "sessionId": session_id, "prompt": [{"type": "text", "text": text}]}, timeout)
        return result

    def load_session(self, session_id: str, cwd: Path, timeout: float = WAIT) -> Any:
        return self.request("session/load", {"sessionId": session_id, "cwd": str(cwd),
                                             "mcpServers": []}, timeout)

    # -- what was received --------------------------------------------------------------

    @property
    def records(self) -> list[Received]:
        """Everything recorded so far, in arrival order (a copy)."""
        with self._changed:
            return list(self._records)

    def mark(self) -> int:
        """A position in :attr:`records`, for :meth:`since`."""
        with self._changed:
            return len(self._records)

    def since(self, mark: int) -> list[Received]:
        with self._changed:
            return self._records[mark:]

    def updates(self, start: int = 0) -> list[Received]:
        return [r for r in self.since(start) if r.method == "session/update"]

    def requests(self, method: str | None = None, start: int = 0) -> list[Received]:
        return [r for r in self.since(start) if r.request_id is not None
                and (method is None or r.method == method)]

    def wait_for(self, predicate: Callable[[list[Received]], bool],
                 timeout: float = WAIT) -> list[Received]:
        """Until ``predicate(records)`` holds (bounded); the records then."""
        with self._changed:
            ok = self._changed.wait_for(lambda: predicate(self._records) or self._eof,
                                        timeout)
            records = list(self._records)
        assert ok and predicate(records), (
            f"{self.label}: condition not met within {timeout}s\n{self.diagnostics()}")
        return records

    def settle(self, predicate: Callable[[list[Received]], bool],
               timeout: float = 10.0) -> bool:
        """Wait (bounded) until ``predicate(records)`` holds; whether it did. For what a
        faithful host delivers but one under test may not: the comparison then says."""
        with self._changed:
            return self._changed.wait_for(lambda: predicate(self._records) or self._eof,
                                          timeout) and predicate(self._records)

    # -- the end ------------------------------------------------------------------------

    def close(self, timeout: float = 15.0) -> list[str]:
        """Close the connection (EOF on a child's stdin), end the terminals; the problems
        seen (a child that did not exit 0, processes left behind, non-JSON lines).
        Idempotent."""
        if self._closed:
            return self.problems
        self._closed = True
        self.terminals.close()
        self.problems += self._closer(timeout)
        self._reader.join(timeout)
        self._reader_file.close()
        self._pool.shutdown(wait=False, cancel_futures=True)
        return self.problems

    def diagnostics(self, frames: int = 30) -> str:
        wire = "\n".join(f"{d} {line[:800]!r}" for d, line in self.wire[-frames:])
        stderr = tail(self.stderr_path) if self.stderr_path else "(no stderr: a socket)"
        return f"--- {self.label}: last frames ---\n{wire}\n--- stderr tail ---\n{stderr}"


def closed_cleanly(*clients: EditorClient) -> None:
    """Close ``clients``; fail on any problem one saw (see :meth:`EditorClient.close`)."""
    problems = [p for client in clients for p in client.close()]
    assert not problems, "\n".join(problems)
