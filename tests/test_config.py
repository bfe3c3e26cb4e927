"""Settings: file, env overrides, flags, path rules, the offline default agent."""

from __future__ import annotations

import pytest

from supervisor.config import ConfigError, load_settings


def test_no_config_file_gives_the_echo_default_agent(tmp_path):
    settings = load_settings(str(tmp_path), env={})
    assert list(settings.agents) == ["default"]
    assert settings.agents["default"].provider == "echo"
    assert settings.store_path == tmp_path / "data" / "sessions" / "acp-sessions.db"
    assert settings.max_sessions == 10 and settings.session_timeout_secs == 3600


def test_file_then_env_then_flags(tmp_path):
    (tmp_path / "config.toml").write_text(
        "# keep me\n[acp]\nmax_sessions = 3\nsession_timeout_secs = 50\n"
        '[agents.main]\nprovider = "echo"\nworkspace = "/tmp/ws"\n'
    )
    env = {"ZEROCLAW_acp__max_sessions": "20", "ZEROCLAW_autonomy__level": '"full"'}
    settings = load_settings(str(tmp_path), {"acp.session_timeout_secs": 7}, env=env)
    assert settings.max_sessions == 20
    assert settings.session_timeout_secs == 7
    assert settings.autonomy_level == "full"
    assert str(settings.agents["main"].workspace) == "/tmp/ws"


def test_data_dir_rules(tmp_path):
    data = tmp_path / "elsewhere"
    only_data = load_settings(None, env={"ZEROCLAW_DATA_DIR": str(data), "HOME": str(tmp_path)})
    assert only_data.data_dir == data
    both = load_settings(str(tmp_path), env={"ZEROCLAW_DATA_DIR": str(data)})
    assert both.data_dir == tmp_path / "data"
    sock = load_settings(str(tmp_path), env={"ZEROCLAW_SOCKET": "/tmp/x.sock"})
    assert str(sock.socket_path) == "/tmp/x.sock"


@pytest.mark.parametrize(
    "text",
    ["[acp]\nmax_sessions = 0\n", "[autonomy]\nlevel = \"yolo\"\n", "[acp\n",
     "[acp]\npartial_frame_timeout_secs = 0\n", "[acp]\npartial_frame_timeout_secs = \"x\"\n"],
)
def test_bad_config_is_a_clear_error(tmp_path, text):
    (tmp_path / "config.toml").write_text(text)
    with pytest.raises(ConfigError):
        load_settings(str(tmp_path), env={})


def test_partial_frame_timeout_defaults_to_60_s(tmp_path):
    assert load_settings(str(tmp_path), env={}).partial_frame_timeout_secs == 60
    env = {"ZEROCLAW_acp__partial_frame_timeout_secs": "2.5"}
    assert load_settings(str(tmp_path), env=env).partial_frame_timeout_secs == 2.5


def test_env_override_is_case_insensitive_for_sections_and_keys(tmp_path):
    settings = load_settings(str(tmp_path), env={"ZEROCLAW_ACP__MAX_SESSIONS": "7"})
    assert settings.max_sessions == 7


def test_default_agent_must_name_a_configured_agent(tmp_path):
    (tmp_path / "config.toml").write_text('[acp]\ndefault_agent = "ghost"\n')
    with pytest.raises(ConfigError, match="ghost"):
        load_settings(str(tmp_path), env={})
