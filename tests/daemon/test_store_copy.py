"""``zeroclaw store copy --to postgresql://…``: an SQLite store made by a real daemon
(echo and model sessions, a tool call, session keys and a label) copied into an empty
PostgreSQL database; a daemon on that database lists the same sessions, replays every
turn of each exactly as the SQLite host did, resolves the same keys, and writes new
turns after the copied ones. A second copy into it is refused, and changes nothing.

Runs against the throw-away cluster of ``scripts/test`` (``tests/pg_support.py``).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.e2e.model_server import ModelServer
from tests.e2e.model_streams import openai_reply
from tests.e2e.procs import host_env, write_config

from .helpers import DaemonProc, RpcClient, work_dir, zeroclaw_argv

Daemons = Callable[..., DaemonProc]


@pytest.fixture
def model() -> Iterator[ModelServer]:
    server = ModelServer()
    yield server
    server.close()


def agents(model: ModelServer, root: Path) -> str:
    return ("[acp]\ndefault_agent = \"main\"\n[agents.main]\nprovider = \"echo\"\n"
            f'[agents.gpt]\nprovider = "openai"\nbase_url = "{model.url}/v1"\n'
            f'model = "gpt-test"\nworkspace = "{root / "aws"}"\n'
            '[autonomy]\nlevel = "read_only"\n')


def acp(daemon: DaemonProc) -> RpcClient:
    return RpcClient(daemon.socket_path.parent / "acp.sock")


def text(words: str) -> list[dict[str, str]]:
    return [{"type": "text", "text": words}]


def new(client: RpcClient, cwd: Path, **meta: Any) -> str:
    params = {"cwd": str(cwd), "mcpServers": [], "_meta": meta}
    sid: str = client.request("session/new", params)["sessionId"]
    return sid


def make_sessions(daemon: DaemonProc, model: ModelServer, cwd: Path) -> list[str]:
    """Three sessions of every kind the store keeps, their turns completed."""
    (cwd / "notes.txt").write_text("the notes")
    model.script(
        openai_reply({"content": "Looking."},
                     {"tool_calls": [{"index": 0, "id": "call_a", "type": "function",
                                      "function": {"name": "file_read",
                                                   "arguments": '{"path": "notes.txt"}'}}]},
                     finish="tool_calls"),
        openai_reply({"content": "It says: the notes."}),
    )
    with acp(daemon) as client:
        keyed = new(client, cwd, sessionKey="agent:main:one")
        for words in ("first turn", "second turn"):
            client.request("session/prompt", {"sessionId": keyed, "prompt": text(words)})
        modelled = new(client, cwd, zeroclaw={"agent": "gpt"})
        client.request("_zeroclaw/session_info_update",
                       {"sessionId": modelled, "_meta": {"sessionLabel": "the model one"}})
        answer = client.request("session/prompt", {"sessionId": modelled,
                                                   "prompt": text("read the notes")})
        assert answer["stopReason"] == "end_turn"
        plain = new(client, cwd)
        client.request("session/prompt", {"sessionId": plain, "prompt": text("plain")})
    return [keyed, modelled, plain]


def replays(daemon: DaemonProc, sids: list[str], cwd: Path) -> dict[str, Any]:
    """What ``session/load`` of each session sends."""
    seen: dict[str, Any] = {}
    for sid in sids:
        with acp(daemon) as client:
            client.request("session/load", {"sessionId": sid, "cwd": str(cwd),
                                            "mcpServers": []})
            seen[sid] = [u["update"] for u in client.updates() if u["sessionId"] == sid]
    return seen


def listing(daemon: DaemonProc) -> list[dict[str, Any]]:
    """``session/list`` (a load moves a session's ``updatedAt``: list before loading)."""
    with acp(daemon) as client:
        listed: list[dict[str, Any]] = client.request("session/list", {})["sessions"]
    return sorted(listed, key=lambda s: s["sessionId"])


def store_copy(config_dir: Path, env: dict[str, str],
               *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(zeroclaw_argv("store", "--config-dir", str(config_dir), "copy", *args),
                          capture_output=True, text=True, timeout=60, env=env)


def test_a_copied_store_replays_every_turn_on_postgresql(
        daemons: Daemons, database: str, model: ModelServer,
        host_dirs: Callable[[], Path]) -> None:
    first = host_dirs()
    write_config(first, agents(model, first))
    sqlite_host = daemons(first)
    cwd = work_dir(first)
    sids = make_sessions(sqlite_host, model, cwd)
    before = replays(sqlite_host, sids, cwd)
    listed_before = listing(sqlite_host)
    assert [u["sessionUpdate"] for u in before[sids[1]]].count("tool_call") == 1
    assert sqlite_host.terminate() == 0

    copied = store_copy(first, sqlite_host.env, "--to", database)
    assert copied.returncode == 0, copied.stderr
    assert "3 sessions" in copied.stdout and "1 tool_calls" in copied.stdout
    assert "1 session_keys" not in copied.stdout and "2 session_keys" in copied.stdout

    second = host_dirs()
    write_config(second, f'[store]\nurl = "{database}"\nhost_id = "pg"\n'
                 + agents(model, second))
    pg_host = daemons(second)
    assert listing(pg_host) == listed_before
    after = replays(pg_host, sids, cwd)
    assert json.dumps(after, sort_keys=True) == json.dumps(before, sort_keys=True)
    with acp(pg_host) as client:  # the key names the same session; new turns follow
        assert new(client, cwd, sessionKey="agent:main:one") == sids[0]
        client.request("session/prompt", {"sessionId": sids[0], "prompt": text("third turn")})
        again = new(client, cwd)
        client.request("session/prompt", {"sessionId": again, "prompt": text("a new one")})
    with psycopg.connect(database) as check:
        assert check.execute("SELECT turn_count FROM sessions WHERE id = %s",
                             (sids[0],)).fetchone() == (3,)

    refused = store_copy(first, sqlite_host.env, "--to", database)
    assert refused.returncode == 1
    assert "already has 4 session(s)" in refused.stderr and "nothing was copied" in refused.stderr


def test_copy_refuses_a_password_in_the_url_and_a_missing_source(
        database: str, host_dirs: Callable[[], Path]) -> None:
    config = host_dirs()
    write_config(config, "")
    env = host_env(None)
    secret = "s3cret-in-url"
    with_password = database.replace("://", f"://zeroclaw:{secret}@", 1)
    shown = store_copy(config, env, "--to", with_password)
    assert shown.returncode == 2 and secret not in shown.stdout + shown.stderr
    missing = store_copy(config, env, "--to", database, "--from", str(config / "none.db"))
    assert missing.returncode == 1 and "no SQLite store at" in missing.stderr


def test_the_targets_password_comes_from_a_variable_and_shows_nowhere(
        host_dirs: Callable[[], Path]) -> None:
    from tests.pg_support import password_role_login

    config = host_dirs()
    write_config(config, "")
    fixture = Path(__file__).resolve().parents[1] / "fixtures" / "stores" / "schema3"
    source = config / "schema3"  # a reader of a WAL file may add its -shm beside it
    source.mkdir()
    shutil.copyfile(fixture / "acp-sessions.db", source / "acp-sessions.db")
    with password_role_login() as (url, password):
        env = host_env({"ZC_COPY_PASSWORD": password[::-1]})  # a wrong one first
        wrong = store_copy(config, env, "--to", url, "--from",
                           str(source / "acp-sessions.db"), "--password-env", "ZC_COPY_PASSWORD")
        assert wrong.returncode == 1 and "password authentication failed" in wrong.stderr
        env["ZC_COPY_PASSWORD"] = password
        done = store_copy(config, env, "--to", url, "--from", str(source / "acp-sessions.db"),
                          "--password-env", "ZC_COPY_PASSWORD")
        assert done.returncode == 0, done.stderr
        assert f"into {url}:" in done.stdout
        unset = store_copy(config, host_env(None), "--to", url, "--password-env", "ZC_NOT_SET")
        assert unset.returncode == 1 and "ZC_NOT_SET, which is not set" in unset.stderr
        with psycopg.connect(url, password=password) as check:
            assert check.execute("SELECT count(*) FROM sessions").fetchone()[0] > 0
    for run in (wrong, done, unset):
        for secret in (password, password[::-1]):
            assert secret not in run.stdout + run.stderr
