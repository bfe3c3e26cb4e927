"""``zeroclaw acp --attach … --session KEY`` (and ``--session-label``,
``--require-existing``, ``--reset-session``): the session flags through the bridge, to
a real daemon's ``acp.sock`` and to its gateway (two tenants, one key). The bridge is
a real ``zeroclaw acp --attach`` process driven over its stdio (:class:`Editor`)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.procs import host_env

from .gateway_helpers import TOKENS, GatewayDaemon, gateway_config
from .helpers import DaemonProc, short_dir
from .test_acp_socket import Editor

KEY = "agent:main:main"


def replayed(editor: Editor) -> list[str]:
    return [u["content"]["text"] for u in editor.updates
            if u["sessionUpdate"] == "user_message_chunk"]


def keyed(daemon: DaemonProc, *flags: str, prompt: str | None = None,
          params: dict[str, Any] | None = None) -> tuple[str, dict[str, Any], list[str]]:
    """One editor attached to ``daemon``'s acp.sock with ``flags``: its session/new's
    session id and ``_meta``, and the user turns replayed to it; then ``prompt``."""
    editor = Editor(daemon.config_dir, daemon.env, attach=flags)
    try:
        editor.request("initialize", {"protocolVersion": 1})
        answer = editor.request("session/new", {"cwd": str(daemon.work_dir), **(params or {})})
        sid = answer["sessionId"]
        if prompt is not None:
            editor.request("session/prompt", {"sessionId": sid, "prompt": prompt})
        return sid, answer.get("_meta", {}), replayed(editor)
    finally:
        assert editor.quit() == 0


def test_the_session_flags_work_through_the_daemons_acp_socket(daemons: Any) -> None:
    daemon = daemons()
    sid, meta, before = keyed(daemon, "--session", KEY, prompt="first")
    assert meta["sessionKey"] == KEY and before == []
    again, meta, before = keyed(daemon, "--session", KEY, prompt="second")
    assert (again, meta["zeroclaw"]["resumed"], before) == (sid, True, ["first"])
    other, meta, _ = keyed(daemon, "--session", KEY, params={"_meta": {"sessionKey": "own"}})
    assert other != sid and meta["sessionKey"] == "own"  # the editor's own key wins
    fresh, meta, before = keyed(daemon, "--session", KEY, "--reset-session", prompt="reset")
    assert fresh != sid and before == []
    assert meta["zeroclaw"]["parentSessionId"] == sid
    again, _, before = keyed(daemon, "--session", KEY, prompt="after")  # replay, then it
    assert (again, before) == (fresh, ["reset"])


def test_labels_and_require_existing_through_the_bridge(daemons: Any) -> None:
    daemon = daemons()
    sid, _, _ = keyed(daemon, params={"_meta": {"sessionKey": KEY, "sessionLabel": "inbox"}})
    again, meta, _ = keyed(daemon, "--session-label", "inbox")
    assert again == sid and meta["sessionLabel"] == "inbox"
    for flags, field in ((("--session-label", "nobody"), "sessionLabel"),
                         (("--session", "unused", "--require-existing"), "sessionKey")):
        editor = Editor(daemon.config_dir, daemon.env, attach=flags)
        try:
            editor.request("initialize", {"protocolVersion": 1})
            answer = editor.answer(editor.send("session/new", {"cwd": str(daemon.work_dir)}))
            assert answer["error"]["code"] == -32602 and field in answer["error"]["message"]
            status = editor.request("status", {})  # the connection goes on
            assert [s["sessionId"] for s in status["sessions"]] == [sid]
        finally:
            assert editor.quit() == 0


def test_reset_applies_to_the_first_session_new_of_the_process_only(daemons: Any) -> None:
    daemon = daemons()
    sid, _, _ = keyed(daemon, "--session", KEY, prompt="old")
    editor = Editor(daemon.config_dir, daemon.env,
                    attach=("--session", KEY, "--reset-session"))
    try:
        editor.request("initialize", {"protocolVersion": 1})
        cwd = str(daemon.work_dir)
        first = editor.request("session/new", {"cwd": cwd})["sessionId"]
        editor.request("session/close", {"sessionId": first})
        second = editor.request("session/new", {"cwd": cwd})
    finally:
        assert editor.quit() == 0
    assert first != sid and second["sessionId"] == first
    assert second["_meta"]["zeroclaw"]["resumed"] is True


@pytest.fixture
def editor_dir() -> Iterator[Path]:
    path = short_dir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_the_session_flags_through_the_gateway_are_per_tenant(
        daemons: Any, scratch_dir: Path, editor_dir: Path) -> None:
    gateway_config(scratch_dir)
    gateway = GatewayDaemon(daemons(scratch_dir, "--gateway", "127.0.0.1:0"))

    def turn(tenant: str, text: str, *flags: str) -> tuple[str, list[str]]:
        env = host_env({"ZEROCLAW_GATEWAY_TOKEN": TOKENS[tenant]})
        editor = Editor(editor_dir, env, attach=(f"{gateway.ws}/acp", "--session", KEY, *flags))
        try:
            editor.request("initialize", {"protocolVersion": 1})
            sid = editor.request("session/new", {"cwd": str(gateway.root(tenant))})["sessionId"]
            editor.request("session/prompt", {"sessionId": sid, "prompt": text})
            return sid, replayed(editor)
        finally:
            assert editor.quit() == 0

    alice, before = turn("alice", "alice first")
    bob, bob_before = turn("bob", "bob first")
    assert alice != bob and before == bob_before == []
    assert turn("alice", "alice second") == (alice, ["alice first"])
    assert turn("bob", "bob second") == (bob, ["bob first"])
    fresh, before = turn("bob", "bob reset", "--reset-session")
    assert fresh != bob and before == []
    assert turn("alice", "alice third")[0] == alice  # bob's reset left alice's key alone


def test_provenance_through_the_bridge_is_the_connections_own(daemons: Any) -> None:
    import socket

    daemon = daemons()
    editor = Editor(daemon.config_dir, daemon.env,
                    attach=("--session", KEY, "--provenance", "meta+receipt"))
    plain = Editor(daemon.config_dir, daemon.env)
    try:
        editor.request("initialize", {"protocolVersion": 1})
        sid = editor.request("session/new", {"cwd": str(daemon.work_dir)})["sessionId"]
        result = editor.request("session/prompt", {"sessionId": sid, "prompt": "from afar"})
        refused = plain.answer(plain.send("initialize", {
            "protocolVersion": 1, "_meta": {"zeroclaw": {"provenance": "loud"}}}))
        assert refused["error"]["code"] == -32602
        assert "_meta.zeroclaw.provenance" in refused["error"]["message"]
        plain.request("initialize", {"protocolVersion": 1})
        other = plain.request("session/new", {"cwd": str(daemon.work_dir)})["sessionId"]
        bare = plain.request("session/prompt", {"sessionId": other, "prompt": "plain"})
    finally:
        assert editor.quit() == 0 and plain.quit() == 0
    assert result["_meta"]["provenance"]["host"].startswith("zeroclaw/")
    for line in ("[Source Receipt]", f"originHost={socket.gethostname()}",
                 f"acpSessionId={sid}", f"targetSession={KEY}"):
        assert line in result["content"], result["content"]
    assert bare["content"] == "plain" and "provenance" not in bare.get("_meta", {})
