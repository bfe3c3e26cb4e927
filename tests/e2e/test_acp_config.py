"""SPEC §1 (paths, settings precedence) and §3 (agent alias resolution, store fallback).

Each test starts real ``zeroclaw acp`` processes with its own config dir.
"""

from __future__ import annotations

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
