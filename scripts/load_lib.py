"""Load plumbing for ``scripts/load``: a real daemon, N blocking clients, and the checks.

The daemon is a child process with its own short temp config dir (a Unix socket
path must stay under 107 bytes) and its stderr in a file there. Each client runs
on its own thread of the load process (blocking sockets, one session each); the
main thread starts them, reports progress, then checks the store and the
daemon's processes and file descriptors.

Result format (the JSON line)::

    {"load": "zeroclaw-daemon", "format": 1, "clients": 64, "turns": 50,
     "python": "3.11.7", "cpus": 2, "started": "<ISO time>", "elapsed_secs": ...,
     "turns_per_sec": ..., "p50_ms": ..., "p99_ms": ..., "answered": ..., "lost_turns": ...,
     "failures": [...], "leaks": [...], "fds_baseline": ..., "fds_after": ...,
     "workers": ..., "exit_code": 0, "ok": true}
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil
from bench_rpc_lib import NdjsonClient, percentile, wait_listening

from ipc.events import TextItem
from storage.store import StoreReader

__all__ = ["ClientResult", "LoadClient", "format_summary", "prompt_text", "run_load"]

REPO = Path(__file__).resolve().parent.parent
ENTRY_POINT = "import sys; from supervisor.cli.main import main; sys.exit(main())"
TURN_TIMEOUT = 60.0
FD_MARGIN = 8
SETTLE_SECS = 15.0


def progress(message: str) -> None:
    print(f"load: {message}", file=sys.stderr, flush=True)


def prompt_text(client_no: int, turn: int) -> str:
    """The unique text of one turn (the echo agent answers it back as is)."""
    return f"client {client_no} turn {turn} checks the store"


class LoadClient(NdjsonClient):
    """An :class:`NdjsonClient` on ``daemon.sock`` that records ``turn_complete`` updates."""

    def __init__(self, path: Path) -> None:
        super().__init__(path, timeout=TURN_TIMEOUT)
        self.completed: list[dict[str, Any]] = []  # turn_complete updates, in order

    def on_notification(self, frame: dict[str, Any]) -> None:
        params = frame.get("params") or {}
        if params.get("type") == "turn_complete":
            self.completed.append(params)

    def result(self, method: str, params: Any = None) -> Any:
        return self.request(method, params)


@dataclass
class ClientResult:
    """What one client saw: its session, per-turn latencies (ms), and what went wrong."""

    client_no: int
    session_id: str = ""
    latencies_ms: list[float] = field(default_factory=list)
    answered: set[int] = field(default_factory=set)  # turns answered right
    failures: list[str] = field(default_factory=list)


def check_turn(client: LoadClient, sid: str, text: str, reply: dict[str, Any],
               turn: int) -> str | None:
    """A description of what is wrong with one turn's answer, or None."""
    expected = {"sessionId": sid, "stopReason": "end_turn", "content": text}
    if reply.get("result") != expected:
        return f"turn {turn}: answer {reply.get('error') or reply.get('result')!r}"
    done = {"sessionId": sid, "type": "turn_complete", "outcome": "completed", "content": text}
    if len(client.completed) != turn + 1 or client.completed[-1] != done:
        return f"turn {turn}: turn_complete {client.completed[-1:]!r}"
    return None


def run_client(path: Path, client_no: int, turns: int, start: threading.Barrier | None,
               on_turn: Callable[[], None]) -> ClientResult:
    """One client on its own thread: a session, then ``turns`` checked echo turns."""
    outcome = ClientResult(client_no)
    try:
        client = LoadClient(path)
    except OSError as exc:
        outcome.failures.append(f"client {client_no}: connect: {exc}")
        if start is not None:
            start.abort()  # the others fail too, instead of waiting for this one
        return outcome
    try:
        client.result("initialize", {"protocolVersion": 1})
        sid = outcome.session_id = client.result("session/new", {"keep_siblings": True})[
            "sessionId"]
        if start is not None:
            start.wait(timeout=TURN_TIMEOUT)
        for turn in range(turns):
            text = prompt_text(client_no, turn)
            began = time.perf_counter()
            reply = client.call("session/prompt", {"sessionId": sid, "prompt": text})
            outcome.latencies_ms.append((time.perf_counter() - began) * 1000)
            problem = check_turn(client, sid, text, reply, turn)
            if problem:
                outcome.failures.append(f"client {client_no} {problem}")
            else:
                outcome.answered.add(turn)
            on_turn()
    except (OSError, ValueError, RuntimeError, threading.BrokenBarrierError) as exc:
        if start is not None:
            start.abort()
        outcome.failures.append(f"client {client_no}: {type(exc).__name__}: {exc}")
    finally:
        client.close()
    return outcome


def stored_user_messages(db_path: Path, session_ids: list[str]) -> dict[str, list[str]]:
    """User prompts per session, read back through the store's own read API."""
    reader = StoreReader(db_path)
    try:
        return {sid: [item.text for item in reader.load_items(sid)
                      if isinstance(item, TextItem) and item.role == "user"]
                for sid in session_ids}
    finally:
        reader.close()


def lost_turns(outcomes: list[ClientResult], turns: int,
               db_path: Path) -> tuple[int, list[str]]:
    """Turns not answered right or not stored; a line per client whose store is wrong."""
    stored = stored_user_messages(db_path, [o.session_id for o in outcomes])
    lost, lines = 0, []
    for outcome in outcomes:
        expected = [prompt_text(outcome.client_no, t) for t in range(turns)]
        have = stored.get(outcome.session_id, [])
        lost += sum(1 for t, text in enumerate(expected)
                    if t not in outcome.answered or text not in have)
        if have != expected:
            missing = len([text for text in expected if text not in have])
            lines.append(f"client {outcome.client_no}: {missing} of {turns} turns not stored,"
                         f" {len(have)} user rows (order or extra rows differ)")
    return lost, lines


class Daemon:
    """``zeroclaw daemon`` in a fresh short temp config dir, stderr to a file there."""

    def __init__(self, max_sessions: int, acp_config: str = "") -> None:
        """``acp_config``: more lines for the ``[acp]`` section of its config.toml."""
        self.config_dir = Path(tempfile.mkdtemp(prefix="zcl", dir="/tmp"))
        (self.config_dir / "config.toml").write_text(
            f"[acp]\nmax_sessions = {max_sessions}\n{acp_config}")
        data = self.config_dir / "data"
        self.socket_path = data / "daemon.sock"
        self.db_path = data / "sessions" / "acp-sessions.db"
        self.stderr_path = self.config_dir / "daemon.stderr"
        env = {k: v for k, v in os.environ.items() if not k.startswith("ZEROCLAW_")}
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", ""))
                                            if p)
        with self.stderr_path.open("ab") as stderr:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", ENTRY_POINT, "daemon", "--config-dir",
                 str(self.config_dir), "--log-level", "warning"],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr, env=env)
        self.process = psutil.Process(self.proc.pid)

    def wait_listening(self, timeout: float = 30.0) -> None:
        wait_listening(self.proc, self.socket_path, "the daemon", self.stderr, timeout)

    def stderr(self, limit: int = 4000) -> str:
        with contextlib.suppress(OSError):
            return self.stderr_path.read_bytes()[-limit:].decode("utf-8", "replace")
        return "(no stderr)"

    def worker_pids(self) -> set[int]:
        client = LoadClient(self.socket_path)
        try:
            client.result("initialize", {"protocolVersion": 1})
            return {int(w["pid"]) for w in client.result("status")["workers"]}
        finally:
            client.close()

    def children(self) -> list[psutil.Process]:
        with contextlib.suppress(psutil.NoSuchProcess):
            return [p for p in self.process.children(recursive=True) if _alive(p)]
        return []

    def children_are_workers(self) -> bool:
        return {p.pid for p in self.children()} == self.worker_pids()

    def terminate(self, timeout: float = 30.0) -> tuple[int | None, list[str]]:
        """SIGTERM; the exit code (None: had to be killed) and the processes left behind."""
        workers = self.children()
        self.proc.send_signal(signal.SIGTERM)
        try:
            code: int | None = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
            code = None
        deadline = time.monotonic() + 10
        while any(_alive(p) for p in workers) and time.monotonic() < deadline:
            time.sleep(0.05)
        left = [p for p in workers if _alive(p)]
        for proc in left:
            with contextlib.suppress(psutil.Error):
                proc.kill()
        return code, [f"pid {p.pid} outlived the daemon" for p in left]

    def cleanup(self, keep: bool) -> None:
        """Kill what still runs; remove the temp dir unless ``keep`` (for a post-mortem)."""
        if self.proc.poll() is None:
            for proc in self.children():
                with contextlib.suppress(psutil.Error):
                    proc.kill()
            self.proc.kill()
            self.proc.wait(10)
        if keep:
            progress(f"kept {self.config_dir} (daemon.stderr, data/) for a post-mortem")
        else:
            shutil.rmtree(self.config_dir, ignore_errors=True)


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def wait_for(predicate: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)
    return True


@contextlib.contextmanager
def started_daemon(max_sessions: int, failed: Callable[[], bool],
                   acp_config: str = "") -> Iterator[Daemon]:
    daemon = Daemon(max_sessions, acp_config)
    try:
        daemon.wait_listening()
        yield daemon
    finally:
        daemon.cleanup(keep=failed())


def drive_clients(daemon: Daemon, clients: int, turns: int) -> tuple[list[ClientResult], float]:
    """Every client at once (they start together); their results and the wall time."""
    done = [0]
    lock = threading.Lock()

    def count() -> None:
        with lock:
            done[0] += 1

    start = threading.Barrier(clients + 1)
    with ThreadPoolExecutor(clients) as pool:
        futures = [pool.submit(run_client, daemon.socket_path, n, turns, start, count)
                   for n in range(clients)]
        with contextlib.suppress(threading.BrokenBarrierError):
            start.wait(timeout=TURN_TIMEOUT)
        began = time.perf_counter()
        total = clients * turns
        while wait(futures, timeout=1.0).not_done:
            progress(f"{done[0]}/{total} turns ({done[0] / (time.perf_counter() - began):.0f}/s)")
        elapsed = time.perf_counter() - began
        return [f.result() for f in futures], elapsed


def check_leaks(daemon: Daemon, fds_baseline: int) -> tuple[list[str], int]:
    """After every client left: children are the workers, fds back near the baseline."""
    leaks = []
    if not wait_for(daemon.children_are_workers, SETTLE_SECS):
        extra = {p.pid for p in daemon.children()} - daemon.worker_pids()
        leaks.append(f"daemon children that are not workers: {sorted(extra)}")
    if not wait_for(lambda: daemon.process.num_fds() <= fds_baseline + FD_MARGIN, SETTLE_SECS):
        leaks.append(f"daemon fds {daemon.process.num_fds()} > baseline {fds_baseline}"
                     f" + {FD_MARGIN}")
    return leaks, daemon.process.num_fds()


def warm_up(daemon: Daemon) -> int:
    """One client, one turn, so that workers and the store are open; the fd baseline."""
    outcome = run_client(daemon.socket_path, -1, 1, None, lambda: None)
    if outcome.failures:
        raise RuntimeError(f"warm-up failed: {outcome.failures}\n{daemon.stderr()}")
    if not wait_for(daemon.children_are_workers, SETTLE_SECS):
        raise RuntimeError("after warm-up the daemon's children are not just its workers")
    return int(daemon.process.num_fds())


def run_load(clients: int, turns: int) -> dict[str, Any]:
    """The whole run: warm-up, load, store check, leak check, SIGTERM; the result."""
    result: dict[str, Any] = {
        "load": "zeroclaw-daemon", "format": 1, "clients": clients, "turns": turns,
        "python": ".".join(map(str, sys.version_info[:3])), "cpus": os.cpu_count(),
        "started": datetime.now(UTC).isoformat(timespec="seconds"), "ok": False}
    with started_daemon(clients + 8, lambda: not result["ok"]) as daemon:
        progress("warming up")
        result["fds_baseline"] = fds_baseline = warm_up(daemon)
        progress(f"{clients} clients x {turns} turns")
        outcomes, elapsed = drive_clients(daemon, clients, turns)
        latencies = [ms for o in outcomes for ms in o.latencies_ms]
        failures = [f for o in outcomes for f in o.failures]
        progress("checking the store")
        lost, unstored = lost_turns(outcomes, turns, daemon.db_path)
        progress("checking processes and file descriptors")
        leaks, result["fds_after"] = check_leaks(daemon, fds_baseline)
        result["workers"] = len(daemon.worker_pids())
        progress("SIGTERM")
        code, left = daemon.terminate()
        leaks += left
        if code != 0:
            leaks.append(f"daemon exit code {code} after SIGTERM (expected 0)")
        answered = sum(len(o.answered) for o in outcomes)
        result.update(
            elapsed_secs=round(elapsed, 3), turns_per_sec=round(answered / elapsed, 1),
            p50_ms=round(percentile(latencies, 0.5), 3),
            p99_ms=round(percentile(latencies, 0.99), 3),
            answered=answered, lost_turns=lost, failures=(failures + unstored)[:20],
            leaks=leaks, exit_code=code)
        result["ok"] = not failures and not unstored and not lost and not leaks
        if not result["ok"]:
            progress(f"daemon stderr tail:\n{daemon.stderr()}")
    return result


def format_summary(result: dict[str, Any]) -> str:
    rows = [
        ("clients x turns", f"{result['clients']} x {result['turns']}"),
        ("answered turns", f"{result['answered']} in {result['elapsed_secs']:.2f} s"),
        ("turns/s", f"{result['turns_per_sec']:.1f}"),
        ("turn latency p50 / p99", f"{result['p50_ms']:.2f} / {result['p99_ms']:.2f} ms"),
        ("lost turns", str(result["lost_turns"])),
        ("workers at the end", str(result["workers"])),
        ("daemon fds baseline / after", f"{result['fds_baseline']} / {result['fds_after']}"),
        ("SIGTERM exit code", str(result["exit_code"])),
        ("leaks", "; ".join(result["leaks"]) or "none"),
        ("verdict", "ok" if result["ok"] else "FAILED"),
    ]
    rows += [("failure", line) for line in result["failures"]]
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name.ljust(width)}  {value}" for name, value in rows)
