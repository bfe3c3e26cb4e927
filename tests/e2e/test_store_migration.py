"""A store written by the previous release keeps loading: ``tests/fixtures/stores/
schema2`` was made by ``make_store.py`` there (sessions of the echo, model and hosted
agents, two turns each) with what its ``session/load`` replayed. Today's ``zeroclaw
acp`` opens it (schema 2 → 3), replays the same, goes on with each session, and a new
process replays the old turns as before and the new ones as they were sent live."""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path
from typing import Any

from storage import SCHEMA_VERSION
from tests.fixtures.stores.make_store import HOSTED_AGENT, MODEL_KEY_ENV, config_text
from tests.vendors.harness import SESSION_LEVEL_UPDATES, EditorClient, Received

from .model_server import ModelServer
from .model_streams import openai_reply
from .procs import host_argv, host_env, write_config

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "stores" / "schema2"
ENV = {MODEL_KEY_ENV: "fixture-key"}


def install_store(config_dir: Path, workspace: Path, fixture: Path = FIXTURE) -> Path:
    """The fixture store as this host's, its sessions' directories moved to ``workspace``
    (the directories it was made in are gone)."""
    db = config_dir / "data" / "sessions" / "acp-sessions.db"
    db.parent.mkdir(parents=True)
    shutil.copyfile(fixture / "acp-sessions.db", db)
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE sessions SET cwd = ?, workspace_dir = ?",
                     (str(workspace), str(workspace)))
    conn.close()
    return db


def previous_replays(fixture: Path = FIXTURE) -> dict[str, dict[str, Any]]:
    sessions = json.loads((fixture / "sessions.json").read_text())["sessions"]
    return {s["sessionId"]: s for s in sessions}


def as_acp_now(update: dict[str, Any]) -> dict[str, Any]:
    """An update the previous release replayed, as this one sends it: a tool call's
    end no longer carries the non-ACP ``name``."""
    return {k: v for k, v in update.items()
            if not (k == "name" and update["sessionUpdate"] == "tool_call_update")}


def without_tool_meta(update: dict[str, Any]) -> dict[str, Any]:
    """An update this release replays, without what the previous one did not send: a
    zeroclaw tool call's ``_meta.zeroclaw.tool`` (its tool's name, checked here)."""
    if update["sessionUpdate"] != "tool_call" or "_meta" not in update:
        return update
    assert isinstance(update["_meta"]["zeroclaw"]["tool"], str), update
    return {k: v for k, v in update.items() if k != "_meta"}


def turn_updates(records: list[Received], sid: str) -> list[dict[str, Any]]:
    """The updates of ``sid`` a turn made (not the session-level ones, sent on their own
    schedule), as received."""
    return [r.update for r in records if r.method == "session/update"
            and r.params["sessionId"] == sid
            and r.update["sessionUpdate"] not in SESSION_LEVEL_UPDATES]


def load_all(client: EditorClient, sids: list[str], cwd: Path) -> dict[str, list[Any]]:
    replayed = {}
    for sid in sids:
        mark = client.mark()
        client.load_session(sid, cwd)
        replayed[sid] = turn_updates(client.since(mark), sid)
    return replayed


def start_host(config_dir: Path, tmp_path: Path, label: str) -> EditorClient:
    client = EditorClient.spawn(host_argv(config_dir), env=host_env(ENV),
                                stderr_path=tmp_path / f"{label}.stderr", label=label)
    client.initialize()
    return client


def test_a_schema_2_store_loads_replays_as_before_and_goes_on(
        tmp_path: Path, config_dir: Path, workspace: Path) -> None:
    db = install_store(config_dir, workspace)
    (workspace / "notes.txt").write_text("hello\n")
    before = previous_replays()
    server = ModelServer()
    server.script(openai_reply({"content": "third answer"}))
    agent = tmp_path / "hosted_agent.py"
    shutil.copyfile(HOSTED_AGENT, agent)
    write_config(config_dir, config_text(server, agent, workspace))
    agents = {sid: s["agent"] for sid, s in before.items()}
    client = start_host(config_dir, tmp_path, "first")
    try:
        listed = client.request("session/list", {})["sessions"]
        assert {s["sessionId"] for s in listed} == set(before)
        replayed = load_all(client, list(before), workspace)
        for sid, session in before.items():
            assert [without_tool_meta(u) for u in replayed[sid]] == [
                as_acp_now(u) for u in session["replayed"]], agents[sid]
        live = {}
        for sid, agent_name in agents.items():
            mark = client.mark()
            client.prompt(sid, "three" if agent_name != "echo" else "after the upgrade")
            live[sid] = turn_updates(client.since(mark), sid)
    finally:
        problems = client.close()
        server.close()
    assert not problems, problems
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    conn.close()
    assert any(u["sessionUpdate"] == "plan" for sid in live for u in live[sid])
    second = start_host(config_dir, tmp_path, "second")
    try:
        again = load_all(second, list(before), workspace)
    finally:
        problems = second.close()
    assert not problems, problems
    for sid, session in before.items():
        prompt = {"sessionUpdate": "user_message_chunk", "content": {
            "type": "text", "text": "three" if agents[sid] != "echo" else "after the upgrade"}}
        expected = [as_acp_now(u) for u in session["replayed"]] + [prompt] + live[sid]
        assert [without_tool_meta(u) for u in again[sid]] == [
            without_tool_meta(u) for u in expected], agents[sid]


SCHEMA3 = FIXTURE.parent / "schema3"


def test_a_schema_3_store_gets_session_keys_and_keeps_its_sessions(
        tmp_path: Path, config_dir: Path, workspace: Path) -> None:
    """``tests/fixtures/stores/schema3`` was made by ``make_store.py`` before session keys:
    today's host opens it (3 → 4: the ``session_keys`` table), replays its sessions as
    that release did, lists them without names, and a key and a reset work on it."""
    db = install_store(config_dir, workspace, SCHEMA3)
    (workspace / "notes.txt").write_text("hello\n")
    before = previous_replays(SCHEMA3)
    server = ModelServer()
    agent = tmp_path / "hosted_agent.py"
    shutil.copyfile(HOSTED_AGENT, agent)
    write_config(config_dir, config_text(server, agent, workspace))
    client = start_host(config_dir, tmp_path, "upgraded")
    try:
        listed = client.request("session/list", {})["sessions"]
        assert {s["sessionId"] for s in listed} == set(before)
        assert not any("_meta" in s for s in listed)
        replayed = load_all(client, list(before), workspace)
        for sid, session in before.items():
            assert replayed[sid] == [u for u in session["replayed"]
                                     if u["sessionUpdate"] not in SESSION_LEVEL_UPDATES], sid
        echo_new = {"cwd": str(workspace), "_meta": {"sessionKey": "after-upgrade",
                                                      "zeroclaw": {"agent": "echo"}}}
        keyed = client.request("session/new", echo_new)
        reset = client.request("session/new", {**echo_new, "_meta": {
            **echo_new["_meta"], "resetSession": True}})
        again = client.request("session/new", echo_new)
    finally:
        problems = client.close()
        server.close()
    assert not problems, problems
    assert again["sessionId"] == reset["sessionId"] != keyed["sessionId"]
    assert reset["_meta"]["zeroclaw"] == {"parentSessionId": keyed["sessionId"]}
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 4
        rows = conn.execute("SELECT session_id, key FROM session_keys ORDER BY bound_at").fetchall()
    conn.close()
    assert rows == [(keyed["sessionId"], "after-upgrade"), (reset["sessionId"], "after-upgrade")]
