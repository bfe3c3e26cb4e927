"""SPEC §1 (paths, settings precedence) and §3 (agent alias resolution, store fallback).

Each test starts real ``zeroclaw acp`` processes with its own config dir.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from .conftest import RawHostFactory, SdkHostFactory
from .procs import write_config
from .rawclient import RawError, RawHost

STORE = Path("sessions") / "acp-sessions.db"


def agent_of(raw: RawHost, session_id: str) -> str:
    sessions = raw.call("status", {})["sessions"]
    return str(next(s["agentAlias"] for s in sessions if s["sessionId"] == session_id))


async def test_settings_precedence_file_then_env_then_flag(
    sdk_hosts: SdkHostFactory, config_dir: Path
) -> None:
    write_config(config_dir, "[acp]\nmax_sessions = 5\nsession_timeout_secs = 77\n")
    cases: list[tuple[tuple[str, ...], dict[str, str], int, float]] = [
        ((), {}, 5, 77),
        ((), {"ZEROCLAW_acp__max_sessions": "7", "ZEROCLAW_acp__session_timeout_secs": "8"}, 7, 8),
        (("--max-sessions", "3", "--session-timeout", "9"),
         {"ZEROCLAW_acp__max_sessions": "7"}, 3, 9),
    ]
    for args, env, sessions, timeout in cases:
        async with sdk_hosts(config_dir, *args, env_extra=env) as host:
            response = await host.initialize()
            meta = (response.field_meta or {})["zeroclaw"]
            assert (meta["maxSessions"], meta["sessionTimeoutSecs"]) == (sessions, timeout), args


def test_config_dir_from_env_holds_the_store(
    raw_hosts: RawHostFactory, tmp_path: Path, workspace: Path
) -> None:
    from_env = tmp_path / "env-config"
    raw = raw_hosts(None, env_extra={"ZEROCLAW_CONFIG_DIR": str(from_env)}, config_flag=False)
    raw.initialize()
    raw.new_session(workspace)
    assert (from_env / "data" / STORE).is_file()


def test_data_dir_env_and_config_dir_precedence(
    raw_hosts: RawHostFactory, tmp_path: Path, config_dir: Path, workspace: Path
) -> None:
    data = tmp_path / "env-data"
    only_data = raw_hosts(None, env_extra={"ZEROCLAW_DATA_DIR": str(data)}, config_flag=False)
    only_data.initialize()
    only_data.new_session(workspace)
    assert (data / STORE).is_file()
    only_data.close()

    both = raw_hosts(config_dir, env_extra={"ZEROCLAW_DATA_DIR": str(tmp_path / "ignored")})
    both.initialize()
    both.new_session(workspace)
    both.close()
    assert (config_dir / "data" / STORE).is_file()
    assert not (tmp_path / "ignored" / STORE).exists()
    assert "ZEROCLAW_DATA_DIR" in both.stderr_path.read_text(), "no warning about the conflict"


def test_without_a_config_file_there_is_one_echo_agent_named_default(
    raw_host: RawHost, workspace: Path
) -> None:
    raw_host.initialize()
    sid = raw_host.new_session(workspace)
    assert agent_of(raw_host, sid) == "default"
    result = raw_host.call("session/prompt", {"sessionId": sid, "prompt": "echo me"})
    assert result["content"].split() == ["echo", "me"]


def test_agent_alias_resolution(
    raw_hosts: RawHostFactory, config_dir: Path, workspace: Path
) -> None:
    agents = ('[agents.alpha]\nprovider = "echo"\n[agents.beta]\nprovider = "echo"\n'
              '[agents.off]\nprovider = "echo"\nenabled = false\n')
    write_config(config_dir, agents)
    raw = raw_hosts()
    raw.initialize()
    for params in ({"cwd": str(workspace)}, {"cwd": str(workspace), "agentAlias": "off"},
                   {"cwd": str(workspace), "agentAlias": "nobody"}):
        try:
            raw.call("session/new", params)
        except RawError as exc:
            assert exc.code == -32602, params
        else:
            raise AssertionError(f"session/new {params} should be -32602")
    for key in ("agentAlias", "agent_alias", "agent"):
        sid = raw.call("session/new", {"cwd": str(workspace), key: "beta"})["sessionId"]
        assert agent_of(raw, sid) == "beta", key
    raw.close()

    write_config(config_dir, '[acp]\ndefault_agent = "beta"\n' + agents)
    with_default = raw_hosts()
    with_default.initialize()
    assert agent_of(with_default, with_default.new_session(workspace)) == "beta"


def test_an_editor_names_its_agent_through_meta_or_env_and_is_told_how(
    raw_hosts: RawHostFactory, config_dir: Path, workspace: Path
) -> None:
    """An ACP client sends no ``agentAlias``: ``_meta.zeroclaw.agent`` and the editor's
    ``env`` choose one, and without either the error names every way to choose."""
    write_config(config_dir, '[agents.alpha]\nprovider = "echo"\n'
                             '[agents.beta]\nprovider = "echo"\n')
    raw = raw_hosts()
    raw.initialize()
    try:
        raw.call("session/new", {"cwd": str(workspace), "mcpServers": []})
    except RawError as exc:
        assert exc.code == -32602
        for fix in ("alpha, beta", "[acp] default_agent", "ZEROCLAW_acp__default_agent",
                    "_meta.zeroclaw.agent", "?agent="):
            assert fix in exc.message, (fix, exc.message)
    else:
        raise AssertionError("session/new naming no agent should be -32602")
    meta = {"zeroclaw": {"agent": "beta"}, "other": {"kept": True}}
    sid = raw.call("session/new", {"cwd": str(workspace), "_meta": meta})["sessionId"]
    assert agent_of(raw, sid) == "beta"
    explicit = {"cwd": str(workspace), "agentAlias": "alpha", "_meta": meta}
    assert agent_of(raw, raw.call("session/new", explicit)["sessionId"]) == "alpha"
    try:
        raw.call("session/new", {"cwd": str(workspace), "_meta": {"zeroclaw": {"agent": 7}}})
    except RawError as exc:
        assert exc.code == -32602 and "_meta.zeroclaw.agent" in exc.message
    else:
        raise AssertionError("a non-string _meta.zeroclaw.agent should be -32602")
    raw.close()

    from_env = raw_hosts(env_extra={"ZEROCLAW_acp__default_agent": "alpha"})
    from_env.initialize()
    assert agent_of(from_env, from_env.new_session(workspace)) == "alpha"


def test_unopenable_store_means_in_memory_sessions(
    raw_host: RawHost, config_dir: Path, workspace: Path
) -> None:
    (config_dir / "data" / STORE).mkdir(parents=True)  # a directory where the db file goes
    caps = raw_host.initialize()["agentCapabilities"]
    assert caps["loadSession"] is False
    for name in ("list", "resume", "close", "delete"):
        assert name not in caps.get("sessionCapabilities", {}), name
    sid = raw_host.new_session(workspace)
    result = raw_host.call("session/prompt", {"sessionId": sid, "prompt": "still works"})
    assert result["stopReason"] == "end_turn"


def test_an_empty_env_override_counts_as_unset(
    raw_hosts: RawHostFactory, config_dir: Path, workspace: Path
) -> None:
    """``export ZEROCLAW_acp__default_agent=`` used to stop ``zeroclaw acp`` before it
    answered initialize; the file's value stands."""
    write_config(config_dir, '[acp]\ndefault_agent = "beta"\n[agents.alpha]\n[agents.beta]\n')
    raw = raw_hosts(env_extra={"ZEROCLAW_acp__default_agent": "",
                               "ZEROCLAW_acp__max_sessions": " "})
    assert raw.initialize()["_meta"]["zeroclaw"]["maxSessions"] == 10
    assert agent_of(raw, raw.new_session(workspace)) == "beta"


def test_a_bad_config_answers_every_request_with_the_reason(
    raw_hosts: RawHostFactory, config_dir: Path
) -> None:
    """The editor sees why: initialize and everything after it get -32603
    ``configuration error: ...``; stderr says it too; EOF ends it (exit 2)."""
    write_config(config_dir, "[acp]\nmax_sessions = 0\n")
    raw = raw_hosts()
    for method in ("initialize", "session/new", "status"):
        try:
            raw.call(method, {"protocolVersion": 1})
        except RawError as exc:
            assert exc.code == -32603 and exc.message.startswith("configuration error: "), exc
            assert "max_sessions" in exc.message
        else:
            raise AssertionError(f"{method} answered with a bad config")
    raw.send({"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": "x"}})
    frame = raw.request("initialize", {"protocolVersion": 1})  # nothing for the notification
    assert frame["error"]["code"] == -32603
    raw.close()
    assert raw.proc.returncode == 2
    raw.problems.remove(f"host pid {raw.pid} exited with 2 on EOF")
    assert "configuration error: max_sessions" in raw.stderr_path.read_text()


def test_sessions_of_a_disabled_or_removed_agent_fall_back_to_the_default(
    raw_hosts: RawHostFactory, config_dir: Path, workspace: Path
) -> None:
    """Seed 000: a restored session keeps its agent only while that agent can run;
    else ``[acp].default_agent`` (else the only enabled agent) takes it, as the log
    and ``_meta.zeroclaw.agentFallback`` of the load/resume/prompt result say."""
    write_config(config_dir, '[acp]\ndefault_agent = "main"\n[agents.main]\n[agents.other]\n')
    first = raw_hosts()
    first.initialize()
    sid = first.call("session/new", {"cwd": str(workspace), "agentAlias": "other"})["sessionId"]
    first.call("session/prompt", {"sessionId": sid, "prompt": "before the change"})
    first.close()
    fallback = {"agentFallback": {"from": "other", "to": "main"}}

    write_config(config_dir, '[acp]\ndefault_agent = "main"\n[agents.main]\n'
                             '[agents.other]\nenabled = false\n')
    disabled = raw_hosts()
    disabled.initialize()
    loaded = disabled.call("session/load", {"sessionId": sid, "cwd": str(workspace)})
    assert loaded["_meta"]["zeroclaw"] == fallback
    assert [n["params"]["update"]["content"]["text"] for n in disabled.notifications
            if n["params"]["update"]["sessionUpdate"] == "user_message_chunk"] == [
        "before the change"]
    assert agent_of(disabled, sid) == "main"
    result = disabled.call("session/prompt", {"sessionId": sid, "prompt": "on main now"})
    assert result["content"] == "on main now" and result["_meta"]["zeroclaw"] == fallback
    disabled.close()
    assert "agent other is disabled; it runs on main" in disabled.stderr_path.read_text()

    write_config(config_dir, "[agents.main]\n")  # removed, and no default_agent: the sole one
    removed = raw_hosts()
    removed.initialize()
    result = removed.call("session/prompt", {"sessionId": sid, "prompt": "restored by a prompt"})
    assert result["stopReason"] == "end_turn" and result["_meta"]["zeroclaw"] == fallback
    removed.call("session/close", {"sessionId": sid})
    resumed = removed.call("session/resume", {"sessionId": sid, "cwd": str(workspace)})
    assert resumed["_meta"]["zeroclaw"] == fallback
    removed.close()

    write_config(config_dir, "[agents.main]\n[agents.third]\n")  # nobody to take it over
    stuck = raw_hosts()
    stuck.initialize()
    try:
        stuck.call("session/resume", {"sessionId": sid, "cwd": str(workspace)})
    except RawError as exc:
        assert exc.code == -32602 and "agent other is no longer configured" in exc.message
    else:
        raise AssertionError("resumed with no agent to run it")


def _readme_zed_entries() -> dict[str, dict[str, object]]:
    """The README's Zed entries for one zeroclaw serving three agents."""
    readme = (Path(__file__).resolve().parents[2] / "docs" / "agents.md").read_text(
        encoding="utf-8")
    blocks = re.findall(r"```json\n(.*?)```", readme, flags=re.S)
    servers = [json.loads(b)["agent_servers"] for b in blocks if "Codex (zeroclaw)" in b]
    assert len(servers) == 1, "the README's three-agent Zed entries are gone"
    entries: dict[str, dict[str, object]] = servers[0]
    return entries


def test_the_readmes_three_zed_entries_each_open_their_own_agent(
    raw_hosts: RawHostFactory, config_dir: Path, workspace: Path
) -> None:
    """Each entry's env alone picks its agent from one config of three (echo agents
    here, standing in for the hosted ones the README configures)."""
    write_config(config_dir, "[agents.claude]\n[agents.codex]\n[agents.gemini]\n")
    chosen = []
    for entry in _readme_zed_entries().values():
        assert entry["command"] == "/path/to/zeroclaw/scripts/run" and entry["args"] == ["acp"]
        env = entry["env"]
        assert isinstance(env, dict)
        raw = raw_hosts(env_extra=env)
        raw.initialize()
        chosen.append(agent_of(raw, raw.new_session(workspace)))
        raw.close()
    assert chosen == ["claude", "codex", "gemini"]
