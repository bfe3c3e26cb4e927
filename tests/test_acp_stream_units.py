"""A hosted agent's stdout read a whole read at a time: its lines, its runs of
``session/update`` notifications, and their relay into the turn."""

from __future__ import annotations

import asyncio
import concurrent.futures
import fcntl
import os
import queue
import signal
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import orjson
import psutil

from actors.worker.agents import TurnContext
from actors.worker.agents.acp_calls import AgentCalls, AgentInput
from actors.worker.agents.acp_client import HANDLERS, NOTIFICATIONS, on_updates
from actors.worker.agents.acp_process import AgentProcess, LaunchSpec, SessionLink, clean_env
from actors.worker.agents.acp_stdout import Line, LinesProtocol, enlarge_pipe
from actors.worker.agents.acp_turn import AcpTurn, UpdateRelay
from actors.worker.tools import PathPolicy
from ipc.events import MessageChunk
from ipc.framing import OVERSIZED
from ipc.jsonrpc import ConnectionLost, Endpoint, RemoteError
from tests.acp_doubles import RecordingStream

_FIXTURE_AGENT = Path(__file__).parent / "fixtures" / "acp_fixture_agent.py"


def _lines_of(reads: list[bytes], limit: int = 1024, eof: bool = True) -> list[Line]:
    """What a LinesProtocol hands on for ``reads``, one list per read, flattened."""
    got: list[Line] = []

    async def feed() -> None:
        protocol = LinesProtocol(limit, got.extend)
        for data in reads:
            protocol.data_received(data)
        if eof:
            protocol.eof_received()

    asyncio.run(feed())
    return got


def test_lines_are_split_across_reads_with_crs_dropped_and_the_last_partial_line_kept() -> None:
    assert _lines_of([b'{"a":1}\n{"b"', b':2}\r\n\n  \nx', b"yz\r\n", b"tail"]) == [
        b'{"a":1}', b'{"b":2}', b"", b"  ", b"xyz", b"tail"]
    assert _lines_of([b"one\n", b"par", b"tial"], eof=False) == [b"one"]
    assert _lines_of([b"a\rb\r\n"]) == [b"a\rb"]  # only a line's last "\r" goes


def test_a_line_over_the_limit_is_one_oversized_mark_and_the_next_lines_come_whole() -> None:
    assert _lines_of([b"x" * 20 + b"\nok\n"], limit=8) == [OVERSIZED, b"ok"]
    assert _lines_of([b"x" * 6, b"x" * 6, b"x" * 6, b"\nok\n"], limit=8) == [OVERSIZED, b"ok"]
    assert _lines_of([b"x" * 8 + b"\r\n", b"y" * 9 + b"\r\n"], limit=8) == [b"x" * 8, OVERSIZED]
    assert _lines_of([b"ok\n" + b"x" * 20], limit=8) == [b"ok", OVERSIZED]  # at the end


def test_an_over_long_line_is_never_held_whole() -> None:
    async def feed() -> int:
        protocol = LinesProtocol(8, lambda _lines: None)
        held = 0
        for _ in range(100):
            protocol.data_received(b"x" * 5)
            held = max(held, sum(map(len, protocol._held)))
        return held

    assert asyncio.run(feed()) <= 9


def _chunk(text: str, kind: str = "agent_message_chunk") -> dict[str, Any]:
    return {"sessionUpdate": kind, "content": {"type": "text", "text": text}}


def test_a_turns_first_run_of_updates_goes_at_once_and_later_ones_are_gathered() -> None:
    inbox: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
    stream = RecordingStream(room=3)
    relay = UpdateRelay(cast(TurnContext, stream), inbox)

    async def play() -> list[bool]:
        streams_on = [relay.updates([_chunk("a"), _chunk("b")])]
        first = [MessageChunk("a"), MessageChunk("b")]
        assert stream.events == first  # at once, not a loop step later
        streams_on.append(relay.updates([_chunk("c")]))
        streams_on.append(relay.updates([_chunk("d")]))
        assert stream.events == first  # gathered
        await asyncio.sleep(0.05)
        assert stream.events == [*first, MessageChunk("c"), MessageChunk("d")]  # window used up
        streams_on.append(relay.updates([_chunk("e")]))
        return streams_on

    assert asyncio.run(play()) == [False, True, True, True]
    assert inbox.get_nowait() == ("update", _chunk("e")) and inbox.empty()


class _Turn:
    """A turn that keeps the runs of updates it is handed (and the modes it heard of)."""

    def __init__(self) -> None:
        self.runs: list[list[Any]] = []

    def updates(self, updates: list[Any]) -> bool:
        self.runs.append(updates)
        return True

    def mode_switched(self, mode: str) -> None:
        self.runs.append([mode])


def _process_with_links(*sids: str) -> tuple[AgentProcess, dict[str, list[list[Any]]]]:
    """An AgentProcess (not started) with a session link per ``sids`` whose turn keeps
    the runs of updates it is handed."""
    process = AgentProcess(LaunchSpec("t", ("true",), {}, "/", 1.0), HANDLERS, NOTIFICATIONS,
                           on_updates)
    runs: dict[str, list[list[Any]]] = {}
    for sid in sids:
        turn = _Turn()
        link = SessionLink(sid, PathPolicy.build("/", "/", ()), lambda: "full",
                           mode_switched=turn.mode_switched)
        link.turn = cast(Any, turn)
        runs[sid] = turn.runs
        process.links[sid] = link
    return process, runs


def _note(sid: str, update: Any, **envelope: Any) -> bytes:
    message = {"jsonrpc": "2.0", "method": "session/update",
               "params": {"sessionId": sid, "update": update}, **envelope}
    return orjson.dumps(message)


def test_the_updates_of_a_read_go_to_their_turns_in_runs_and_the_rest_to_the_endpoint() -> None:
    process, runs = _process_with_links("s1", "s2")
    sent: list[bytes] = []
    process._endpoint = Endpoint(sent.append, process._bound(HANDLERS), require_initialize=False)
    mode = {"sessionUpdate": "current_mode_update", "currentModeId": "plan"}
    lines: list[Line] = [
        _note("s1", _chunk("a")), _note("s1", _chunk("b")), _note("s2", mode),
        _note("nobody", _chunk("x")), _note("s2", _chunk("c")), OVERSIZED, b"not json", b"",
        b"{broken", _note("s1", _chunk("d"), id=7), _note("s1", _chunk("e"))]
    process._receive(lines)
    assert runs["s1"] == [[_chunk("a"), _chunk("b")], [_chunk("e")]]
    assert runs["s2"] == [["plan"], [mode], [_chunk("c")]]
    # "{broken" gets a parse error; a session/update with an id is a request: the
    # endpoint's handler takes it as the agent wrote it and answers it
    assert [orjson.loads(frame).get("id") for frame in sent] == [None, 7]
    assert orjson.loads(sent[0])["error"]["code"] == -32700


def test_a_streaming_turn_has_its_agents_output_read_in_pauses() -> None:
    process, _runs = _process_with_links("s1")
    paused: list[float] = []
    process._endpoint = Endpoint(lambda _frame: None, {}, require_initialize=False)
    process._stdout = cast(Any, SimpleNamespace(pause_for=paused.append))
    process._receive([_note("s1", _chunk("a"))])
    assert len(paused) == 1  # the turn (here) says it streams on
    process.links["s1"].turn = None
    process._receive([_note("s1", _chunk("b"))])
    assert len(paused) == 1  # no turn took it: no pause


def test_a_read_that_ends_with_a_turns_answer_is_not_followed_by_a_pause() -> None:
    process, _runs = _process_with_links("s1")
    paused: list[float] = []
    process._endpoint = Endpoint(lambda _frame: None, {}, require_initialize=False)
    process._stdout = cast(Any, SimpleNamespace(pause_for=paused.append))
    sent: list[bytes] = []
    answer = concurrent.futures.Future[Any]()
    process._calls.send(sent.append, "session/prompt", {"sessionId": "s1"}, answer)
    request_id = orjson.loads(sent[0])["id"]
    process._receive([_note("s1", _chunk("a")), orjson.dumps(
        {"jsonrpc": "2.0", "id": request_id, "result": {"stopReason": "end_turn"}})])
    assert answer.result(0) == {"stopReason": "end_turn"}
    assert paused == []  # the stream it waited for is over
    process._receive([_note("s1", _chunk("b"))])
    assert len(paused) == 1


def test_a_call_is_answered_by_its_wellformed_response_and_anything_else_is_left_alone() -> None:
    calls = AgentCalls("agent t")
    sent: list[dict[str, Any]] = []
    futures = [concurrent.futures.Future[Any]() for _ in range(4)]
    for future in futures:
        calls.send(lambda frame: sent.append(orjson.loads(frame)), "m", {"n": 1}, future)
    ids = [message["id"] for message in sent]
    assert sent[0] == {"jsonrpc": "2.0", "id": ids[0], "method": "m", "params": {"n": 1}}
    malformed: list[dict[str, Any]] = [
        {"jsonrpc": "2.0", "id": ids[0]},  # neither result nor error
        {"jsonrpc": "2.0", "id": ids[0], "result": 1, "error": {"code": 1, "message": "x"}},
        {"jsonrpc": "2.0", "id": ids[0], "error": {"code": "1", "message": "x"}},
        {"jsonrpc": "1.0", "id": ids[0], "result": 1},
        {"jsonrpc": "2.0", "id": "zc-out-0", "result": 1},  # the endpoint's own
    ]
    assert not any(calls.answer(message) for message in malformed)
    assert calls.answer({"jsonrpc": "2.0", "id": ids[0], "result": {"stopReason": "end_turn"}})
    assert futures[0].result(0) == {"stopReason": "end_turn"}
    assert calls.answer({"jsonrpc": "2.0", "id": ids[1], "error": {"code": -32000,
                                                                   "message": "no"}})
    error = futures[1].exception(0)
    assert isinstance(error, RemoteError) and error.code == -32000
    futures[2].cancel()  # the turn gave up on it: its answer is dropped
    assert calls.answer({"jsonrpc": "2.0", "id": ids[2], "result": None})
    assert futures[2].cancelled()
    assert not calls.answer({"jsonrpc": "2.0", "id": ids[0], "result": 1})  # answered once
    calls.fail_all()
    assert isinstance(futures[3].exception(0), ConnectionLost)


def test_the_agents_stdin_takes_frames_whole_from_any_thread_past_a_full_pipe() -> None:
    big = b"x" * 200_000 + b"\n"  # more than a pipe holds

    def read_exactly(fd: int, size: int) -> bytes:
        data = b""
        while len(data) < size:
            data += os.read(fd, size - len(data))
        return data

    async def play() -> bytes:
        loop = asyncio.get_running_loop()
        read_end, write_end = os.pipe()
        agent_input = AgentInput(loop, write_end, len(big), lambda _waiting: None)
        try:
            await asyncio.to_thread(agent_input.write, big)  # the rest waits for the loop
            agent_input.write(b"small\n")  # behind it, never inside it
            data = await asyncio.to_thread(read_exactly, read_end, len(big) + 6)
            os.close(read_end)
            agent_input.write(b"after the agent is gone\n")  # dropped, no error
            return data
        finally:
            os.close(write_end)

    assert asyncio.run(play()) == big + b"small\n"


def test_the_agents_stdout_pipe_holds_more_than_a_pause_of_its_reader_lets_it_write() -> None:
    read_end, write_end = os.pipe()
    try:
        size = enlarge_pipe(read_end)
        assert size >= 64 * 1024
        assert size == fcntl.fcntl(write_end, fcntl.F_GETPIPE_SZ)  # one pipe, both ends
    finally:
        os.close(read_end)
        os.close(write_end)


def test_an_agent_that_stops_reading_its_stdin_is_killed_before_its_input_grows_unbounded(
        tmp_path: Path) -> None:
    spec = LaunchSpec("deaf", (sys.executable, str(_FIXTURE_AGENT)),
                      clean_env({"FIXTURE_MODE": "deaf"}), str(tmp_path), 10.0)
    process = AgentProcess(spec, HANDLERS, NOTIFICATIONS, on_updates)
    process.start({})
    try:
        blob = "x" * (4 * 1024 * 1024)
        futures = []
        for _ in range(48):  # 192 MiB: far more than the input may hold for it
            futures.append(process.call("_fixture/big", {"blob": blob}))  # never blocks
            if process.exited.is_set():
                break
        assert process.exited.wait(10), "the agent was left to hold up its input"
        assert "killed by signal 9" in process.failure_text("now")
        for future in futures:
            assert isinstance(future.exception(10), ConnectionLost)
    finally:
        process.stop()


def _fixture_turn(tmp_path: Path, name: str, client: Any,
                  autonomy: str) -> tuple[AgentProcess, SessionLink, AcpTurn]:
    """The fixture agent started as ``name``, one session on it, and a turn of that
    session whose context is ``client`` (the caller stops the process)."""
    spec = LaunchSpec(name, (sys.executable, str(_FIXTURE_AGENT)), clean_env({}),
                      str(tmp_path), 10.0)
    process = AgentProcess(spec, HANDLERS, NOTIFICATIONS, on_updates)
    process.start({})
    try:
        sid = process.call_and_wait("session/new", {"cwd": str(tmp_path),
                                                    "mcpServers": []})["sessionId"]
    except BaseException:
        process.stop()
        raise
    link = process.links[sid] = SessionLink(sid, PathPolicy.build("/", "/", ()),
                                            lambda: autonomy)
    turn = AcpTurn(process, link, cast(TurnContext, client), lambda: autonomy, 10.0)
    return process, link, turn


class _LaggingClient:
    """A turn's context whose client takes nothing until :attr:`window` is set: its
    stream window is used up at once (the turn's thread then waits in :meth:`emit`)."""

    def __init__(self) -> None:
        self.cancelled = threading.Event()
        self.window = threading.Event()
        self.events: list[Any] = []

    def emit_all_nowait(self, events: Sequence[Any]) -> bool:
        self.events += events
        return False

    def emit(self, event: Any) -> None:
        self.events.append(event)
        assert self.window.wait(30), "the test never let the client catch up"


def test_a_client_that_lags_holds_its_agents_output_once_a_bound_is_queued(
        tmp_path: Path) -> None:
    """The agent floods while the client takes nothing: the worker holds a bounded
    queue for the turn and stops reading the agent (which waits on its pipe); once the
    client catches up, the whole stream arrives in order and the turn ends."""
    client = _LaggingClient()
    process, link, turn = _fixture_turn(tmp_path, "flood", client, "full")
    try:
        marker, count = tmp_path / "flooded", 400_000  # ~32 MB of updates
        outcome: list[str | None] = []
        runner = threading.Thread(target=lambda: outcome.append(
            turn.run(f"flood {count} {marker}")))
        runner.start()
        bound = 8 * 1024 * 1024 // 60 + 5_000  # updates of ~80 bytes, and one read more
        deadline = time.monotonic() + 30
        while not (process._stdout is not None and getattr(process._stdout, "held", False)):
            assert link.inbox.qsize() <= bound, "the worker queued without bound"
            assert not marker.exists(), "the agent never had to wait"
            assert time.monotonic() < deadline
            time.sleep(0.01)  # the agent's own progress: nothing here to wait on
        client.window.set()
        runner.join(30)
        assert outcome == ["end_turn"] and marker.exists()
        text = "".join(event.text for event in client.events)
        assert text == "".join(f"{number} " for number in range(count))
    finally:
        client.window.set()
        process.stop()


class _UndecidedClient(_LaggingClient):
    """A client that decides no permission until :attr:`window` is set."""

    def ask_permission(self, *_ask: Any, **_request: Any) -> str | None:
        assert self.window.wait(30), "the test never let the client decide"
        return "allow_once"


def test_an_agent_with_too_many_requests_unanswered_is_read_no_further(
        tmp_path: Path) -> None:
    """The agent sends thousands of permission requests at once while the client decides
    none: the worker stops reading it at a bound of requests in its hands; once the
    client decides, every one is answered."""
    client = _UndecidedClient()
    client.window.set()  # the stream's window has room; only decisions wait
    decide = threading.Event()
    client.window = decide
    process, _link, turn = _fixture_turn(tmp_path, "asks", client, "supervised")
    try:
        count = 20_000
        outcome: list[str | None] = []
        runner = threading.Thread(target=lambda: outcome.append(turn.run(f"asks {count}")))
        runner.start()
        endpoint = process._endpoint
        assert endpoint is not None
        bound = 256 + 2_000  # and one read more (~200 bytes a request)
        deadline = time.monotonic() + 30
        while not (process._stdout is not None and getattr(process._stdout, "held", False)):
            assert endpoint.running_handlers <= bound, "the worker took requests unbounded"
            assert time.monotonic() < deadline
            time.sleep(0.01)  # the agent's own progress: nothing here to wait on
        decide.set()
        runner.join(60)
        assert outcome == ["end_turn"]
        assert "".join(event.text for event in client.events) == f"allowed {count}"
    finally:
        decide.set()
        process.stop()


def test_an_agent_that_died_is_not_alive_before_its_stdout_was_read_to_its_end(
        tmp_path: Path) -> None:
    """Its stdout held (a lagging client's turn holds it so), the agent is killed: no
    new turn may pick it, though the end of its output was not read yet."""
    spec = LaunchSpec("dies", (sys.executable, str(_FIXTURE_AGENT)), clean_env({}),
                      str(tmp_path), 10.0)
    process = AgentProcess(spec, HANDLERS, NOTIFICATIONS, on_updates)
    process.start({})
    try:
        assert process.pid is not None and process.alive
        process.hold_reading("a lagging turn", True)
        launcher = psutil.Process(process.pid).parent()  # the root of its process tree
        assert launcher is not None
        os.kill(process.pid, signal.SIGKILL)
        os.waitid(os.P_PID, launcher.pid, os.WEXITED | os.WNOWAIT)  # its tree ended, unreaped
        assert not process.alive
    finally:
        process.stop()
