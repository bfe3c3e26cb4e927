"""Fault injection over stdio (issue 4): a stopped worker, an editor that goes away
while a permission request waits, and idle eviction followed by a transparent restore.

Real ``zeroclaw acp`` processes. Workers are found through ``status`` and psutil and
signalled; every wait ends on something observable (a response, ``status``, a process
exit), never on a sleep alone. The SDK tests run on the test's event loop; the others,
and :class:`Editor`, on the test's thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import select
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import psutil
import pytest

from ipc.events import TextItem

from .conftest import RawHostFactory, SdkHostFactory
from .helpers import (
    CANCEL_MARKER,
    ReplayedTurn,
    assert_denied_and_cancelled,
    sdk_updates,
    split_turns,
    stored_session,
    tool,
    tool_result_text,
    words,
)
from .procs import alive, descendants, host_argv, host_env, reap_leaks, write_config
from .rawclient import RawHost
from .sdkhost import SdkHost, expect_error
from .test_acp_sdk_sessions import live_ids
from .test_crash_recovery import load_turns, wait_for_new_worker, worker_of_the_only_session

#: A worker silent for three 1 s heartbeats is killed: the turn fails within ~4 s.
HUNG_WORKER_FAILS_WITHIN = 15.0
EXIT_WITHIN = 10.0
FRAME_TIMEOUT = 10.0


# --- (c) a stopped worker ------------------------------------------------------------------


async def test_a_stopped_worker_is_killed_replaced_and_its_session_restored(
    host: SdkHost, workspace: Path
) -> None:
    """SIGSTOP: the heartbeats notice, the worker is killed (not left stopped), only its
    running turn fails, and the session comes back with its completed turns."""
    sid = await host.new_session(workspace)
    assert (await host.prompt(sid, "completed before the stop")).stop_reason == "end_turn"
    turn = asyncio.create_task(host.prompt(sid, "stalled here\n!sleep 30"))
    await host.client.wait_text(sid, "stalled")
    victim = psutil.Process(await worker_of_the_only_session(host))
    known = {p.pid for p in descendants(host.pid)}
    victim.suspend()
    try:
        exc = await expect_error(asyncio.wait_for(turn, HUNG_WORKER_FAILS_WITHIN), -32603)
        assert "session worker exited" in str(exc)
        await until(lambda: not alive(victim), "the stopped worker to be killed")
    finally:
        with contextlib.suppress(psutil.NoSuchProcess):
            victim.resume()
    await wait_for_new_worker(host, known, victim.pid)
    assert await load_turns(host, sid, workspace) == [
        ("completed before the stop", ["completed", "before", "the", "stop"])]
    out = await host.prompt(sid, "after the replacement")
    assert out.stop_reason == "end_turn" and words(out.content) == ["after", "the", "replacement"]


async def until(predicate: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        assert loop.time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


# --- (e) the editor goes away while a permission request waits ------------------------------


class Editor:
    """An editor's end of ``zeroclaw acp``'s pipes, read with deadlines (the test's thread).

    :meth:`vanish` closes both pipe ends at once, which is what the kernel does when
    the editor process dies.
    """

    def __init__(self, config_dir: Path, stderr: IO[bytes]) -> None:
        self.proc = subprocess.Popen(host_argv(config_dir), stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=stderr, env=host_env(),
                                     bufsize=0)
        self._buffer = b""
        self._ids = itertools.count(1)

    def send(self, method: str, params: dict[str, Any]) -> int:
        assert self.proc.stdin is not None
        request_id = next(self._ids)
        frame = {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}
        self.proc.stdin.write(json.dumps(frame).encode() + b"\n")
        return request_id

    def read_until(self, predicate: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
        """The next frame from the host that satisfies ``predicate`` (others are skipped)."""
        assert self.proc.stdout is not None
        deadline = time.monotonic() + FRAME_TIMEOUT
        while True:
            while b"\n" in self._buffer:
                line, self._buffer = self._buffer.split(b"\n", 1)
                frame: dict[str, Any] = json.loads(line)
                if predicate(frame):
                    return frame
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"no such frame from the host within {FRAME_TIMEOUT}s"
            readable, _, _ = select.select([self.proc.stdout], [], [], remaining)
            if readable:
                chunk = os.read(self.proc.stdout.fileno(), 65536)
                assert chunk, f"the host closed its stdout (exit code {self.proc.poll()})"
                self._buffer += chunk

    def response(self, request_id: int) -> dict[str, Any]:
        return self.read_until(lambda f: f.get("id") == request_id and "method" not in f)

    def call(self, method: str, params: dict[str, Any]) -> Any:
        answer = self.response(self.send(method, params))
        assert "result" in answer, answer
        return answer["result"]

    def vanish(self, *, keep_reading: bool) -> None:
        """End the host's input; unless ``keep_reading``, stop reading its output too."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.close()
        if not keep_reading:
            self.proc.stdout.close()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def replayed_turns(host: RawHost, sid: str, cwd: Path) -> list[ReplayedTurn]:
    """``session/load`` on a raw host; the replay grouped by turn."""
    mark = len(host.notifications)
    host.call("session/load", {"sessionId": sid, "cwd": str(cwd), "mcpServers": []})
    return split_turns(sdk_updates(n["params"] for n in host.notifications[mark:]
                                   if n.get("method") == "session/update"))


@pytest.mark.parametrize("how", ["dies", "closes_stdin"])
def test_editor_gone_while_a_permission_request_waits(
    raw_hosts: RawHostFactory, config_dir: Path, workspace: Path, tmp_path: Path, how: str
) -> None:
    """The tool is denied, the turn is kept as cancelled, the host exits at once and leaves
    no worker behind; a new host loads every turn and the session goes on."""
    marker = workspace / "never-ran"
    asking = tool("shell", {"command": f"touch {marker}"}) + "\n!sleep 30"
    with (tmp_path / "editor-host.stderr").open("ab") as stderr:
        editor = Editor(config_dir, stderr)
        try:
            editor.call("initialize", {"protocolVersion": 1})
            sid = editor.call("session/new", {"cwd": str(workspace), "mcpServers": []})[
                "sessionId"]
            kept = editor.call("session/prompt", {"sessionId": sid, "prompt": "kept one"})
            assert kept["stopReason"] == "end_turn"
            waiting = editor.send("session/prompt", {"sessionId": sid, "prompt": asking})
            ask = editor.read_until(lambda f: f.get("method") == "session/request_permission")
            assert ask["params"]["sessionId"] == sid
            workers = descendants(editor.proc.pid)
            assert workers, "the host has no worker"
            editor.vanish(keep_reading=how == "closes_stdin")
            if how == "closes_stdin":
                assert editor.response(waiting)["result"]["stopReason"] == "cancelled"
            assert editor.proc.wait(EXIT_WITHIN) == 0
        finally:
            editor.kill()
    assert reap_leaks(workers, EXIT_WITHIN) == [], "workers outlived their host"
    assert not marker.exists(), "the shell command ran without permission"
    assert_denied_and_cancelled(config_dir, sid, turns=2)

    second = raw_hosts()
    second.initialize()
    first_turn, interrupted = replayed_turns(second, sid, workspace)
    assert (first_turn.user, first_turn.agent) == ("kept one", "kept one")
    assert interrupted.user == asking and interrupted.agent.endswith(CANCEL_MARKER)
    [updates] = interrupted.tools.values()
    assert updates[-1].status == "failed" and "denied" in tool_result_text(updates)
    result = second.call("session/prompt", {"sessionId": sid, "prompt": "usable again"})
    assert (result["stopReason"], result["content"]) == ("end_turn", "usable again")


# --- (g) idle eviction, then a transparent restore -------------------------------------------


async def used_tokens(host: SdkHost, sid: str, text: str) -> int:
    """Prompt ``text``; the context the agent reported using (history included)."""
    mark = host.client.mark()
    out = await host.prompt(sid, text)
    assert out.stop_reason == "end_turn" and words(out.content) == words(text)
    return int(host.client.of(sid, "usage_update", mark)[-1].used)


async def test_idle_eviction_then_a_prompt_restores_the_whole_history(
    sdk_hosts: SdkHostFactory, config_dir: Path, workspace: Path
) -> None:
    write_config(config_dir, "[acp]\nsession_timeout_secs = 1\n")
    earlier = ["first words kept", "second words kept"]
    async with sdk_hosts() as host:
        await host.initialize()
        sid = await host.new_session(workspace)
        for text in earlier:
            await used_tokens(host, sid, text)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 10
        while sid in await live_ids(host):  # the idle sweep runs every 0.5 s here
            assert loop.time() < deadline, "the idle session was never evicted"
            await asyncio.sleep(0.1)
        restored = await used_tokens(host, sid, "words after the eviction")
        fresh = await used_tokens(host, await host.new_session(workspace),
                                  "words after the eviction")
        assert restored > fresh, "the restored session's agent lost its history"
    _, items = stored_session(config_dir, sid)
    assert [i.text for i in items if isinstance(i, TextItem) and i.role == "user"] == [
        *earlier, "words after the eviction"]
