"""Streams the host cannot pass on as they come: a huge stream to a reading client
over stdio, and turn updates that cannot be encoded at all."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import orjson
import pytest

from ipc.events import TextItem
from storage.store import StoreReader

from .procs import descendants, host_argv, host_env, reap_leaks
from .rawclient import RawHost

BIG_PROMPT = "w " * 1_000_000  # 2 MB, streamed back word by word: 1M updates
CANCEL_MARKER = "[turn cancelled via client]"


def prompt_frame(host: RawHost, sid: str, text: str) -> int:
    """Send ``session/prompt`` without waiting; its request id."""
    request_id = host.new_id()
    host.send({"jsonrpc": "2.0", "id": request_id, "method": "session/prompt",
               "params": {"sessionId": sid, "prompt": text}})
    return request_id


def answers_and_chunks(host: RawHost, ids: set[int], timeout: float) -> tuple[
        dict[int, dict[str, Any]], dict[str, list[str]]]:
    """Read until every id in ``ids`` is answered: the answers, and the streamed
    message text per session (updates are consumed here, not kept)."""
    answers: dict[int, dict[str, Any]] = {}
    chunks: dict[str, list[str]] = {}
    while len(answers) < len(ids):
        frame = host.next_frame(timeout)
        if frame.get("method") == "session/update":
            update = frame["params"]["update"]
            if update["sessionUpdate"] == "agent_message_chunk":
                chunks.setdefault(frame["params"]["sessionId"], []).append(
                    update["content"]["text"])
        elif frame.get("id") in ids and "method" not in frame:
            answers[frame["id"]] = frame
    return answers, chunks


@pytest.mark.timeout(180)
def test_a_2mb_prompt_streams_back_to_a_reading_client_and_the_host_stays_up(
    raw_host: RawHost, workspace: Path
) -> None:
    """Before: the write buffer passed its high-water mark, the host closed its own
    stdout, and every in-flight request (the sibling's too) went unanswered."""
    raw_host.initialize()
    big, sibling = raw_host.new_session(workspace), raw_host.new_session(workspace)
    sibling_id = prompt_frame(raw_host, sibling, "!sleep 1\nsibling answers")
    big_id = prompt_frame(raw_host, big, BIG_PROMPT)
    answers, chunks = answers_and_chunks(raw_host, {big_id, sibling_id}, timeout=120)
    result = answers[big_id]["result"]
    assert result["stopReason"] == "end_turn"
    assert result["content"].split() == ["w"] * 1_000_000
    assert "".join(chunks[big]) == result["content"]  # merged or not, nothing lost
    assert answers[sibling_id]["result"]["content"] == "sibling answers"
    after = raw_host.call("session/prompt", {"sessionId": big, "prompt": "still here"})
    assert after["content"] == "still here"


def nested_arguments(levels: int) -> str:
    return '{"path": "x", "deep": ' + "[" * levels + "]" * levels + "}"


@pytest.mark.parametrize("levels", [300, 251], ids=["past-the-worker", "past-the-host-only"])
def test_tool_arguments_nested_too_deep_fail_the_turn_and_the_session_goes_on(
    raw_host: RawHost, workspace: Path, levels: int
) -> None:
    """Before: the worker (300 levels) or the host (251: the worker's envelope still
    fits the encoder's limit, the client's frame does not) dropped the update, the
    prompt was never answered, later prompts got -32002, close never answered and
    the host did not exit on EOF."""
    raw_host.initialize()
    sid = raw_host.new_session(workspace)
    failed = raw_host.request("session/prompt", {
        "sessionId": sid, "prompt": f"!tool file_read {nested_arguments(levels)}"}, timeout=20)
    assert failed["error"]["code"] == -32603
    assert "cannot be encoded" in failed["error"]["message"]
    again = raw_host.call("session/prompt", {"sessionId": sid, "prompt": "usable again"})
    assert again["content"] == "usable again"
    running = prompt_frame(raw_host, sid, "!sleep 30")
    raw_host.send({"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": sid}})
    cancelled = raw_host.next_response(timeout=20)
    assert cancelled["id"] == running and cancelled["result"]["stopReason"] == "cancelled"
    assert raw_host.call("session/close", {"sessionId": sid}) == {}


def write_request(proc: subprocess.Popen[bytes], request_id: int, method: str,
                  params: dict[str, Any]) -> None:
    assert proc.stdin is not None
    proc.stdin.write(orjson.dumps({"jsonrpc": "2.0", "id": request_id, "method": method,
                                   "params": params}) + b"\n")


def read_result(proc: subprocess.Popen[bytes]) -> Any:
    assert proc.stdout is not None
    return orjson.loads(proc.stdout.readline())["result"]


def test_an_editor_that_stops_reading_is_cut_off_after_the_stall_limit(
    tmp_path: Path, workspace: Path
) -> None:
    """``zeroclaw acp`` under an editor that stopped reading stdout: after
    ``client_stall_timeout_secs`` the host gives up on it, keeps the cancelled turn,
    and exits 0 with its workers."""
    env = host_env({"ZEROCLAW_acp__client_stall_timeout_secs": "2"})
    with (tmp_path / "stalled.stderr").open("wb") as stderr:
        proc = subprocess.Popen(host_argv(tmp_path / "cfg"), stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=stderr, env=env, bufsize=0)
    try:
        write_request(proc, 1, "initialize", {"protocolVersion": 1})
        read_result(proc)
        write_request(proc, 2, "session/new", {"cwd": str(workspace), "mcpServers": []})
        sid = read_result(proc)["sessionId"]
        workers = descendants(proc.pid)
        write_request(proc, 3, "session/prompt", {"sessionId": sid, "prompt": BIG_PROMPT})
        assert proc.wait(30) == 0  # stdout is never read again
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert reap_leaks(workers, 15.0) == []
    assert "client stalled" in (tmp_path / "stalled.stderr").read_text()
    reader = StoreReader(tmp_path / "cfg" / "data" / "sessions" / "acp-sessions.db")
    try:
        items = reader.load_items(sid)
    finally:
        reader.close()
    assert isinstance(items[0], TextItem) and items[0].text == BIG_PROMPT
    assert isinstance(items[-1], TextItem) and items[-1].text.endswith(CANCEL_MARKER)
