"""Settings: file, env overrides, flags, path rules, the offline default agent."""

from __future__ import annotations

import pytest

from supervisor.config.config import ConfigError, load_settings


def test_no_config_file_gives_the_echo_default_agent(tmp_path):
    settings = load_settings(str(tmp_path), env={})
    assert list(settings.agents) == ["default"]
    assert settings.agents["default"].provider == "echo"
    assert settings.store_path == tmp_path / "data" / "sessions" / "acp-sessions.db"
    assert settings.max_sessions == 10 and settings.session_timeout_secs == 3600
    assert settings.client_stall_timeout_secs == 30


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
     "[acp]\nclient_stall_timeout_secs = 0\n",
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


def test_forbidden_paths_expand_home_and_variables_and_refuse_the_rest(tmp_path):
    env = {"HOME": "/home/me", "SECRETS": "/srv/keys"}
    (tmp_path / "config.toml").write_text(
        '[autonomy]\nforbidden_paths = ["~/.ssh", "$HOME/.aws", "${SECRETS}/x", "/etc/"]\n')
    assert load_settings(str(tmp_path), env=env).forbidden_paths == (
        "/home/me/.ssh", "/home/me/.aws", "/srv/keys/x", "/etc")
    for entry, message in (("secret-rel", "not an absolute path"),
                           ("./x", "not an absolute path"),
                           ("$NOPE/.aws", r"\$NOPE is not set")):
        (tmp_path / "config.toml").write_text(f'[autonomy]\nforbidden_paths = ["{entry}"]\n')
        with pytest.raises(ConfigError, match=message):
            load_settings(str(tmp_path), env=env)


def test_agent_env_is_a_table_of_strings(tmp_path):
    (tmp_path / "config.toml").write_text('[agents.a]\nenv = {RUST_LOG = "debug"}\n')
    agent = load_settings(str(tmp_path), env={}).agents["a"]
    assert agent.to_wire()["env"] == {"RUST_LOG": "debug"}
    for bad in ('"x"', "{A = 1}", '{"A B" = "x"}'):
        (tmp_path / "config.toml").write_text(f"[agents.a]\nenv = {bad}\n")
        with pytest.raises(ConfigError, match=r"agents\.a\.env"):
            load_settings(str(tmp_path), env={})


def test_an_empty_env_override_counts_as_unset(tmp_path):
    (tmp_path / "config.toml").write_text(
        '[acp]\ndefault_agent = "main"\nmax_sessions = 4\n[agents.main]\n[agents.b]\n')
    env = {"ZEROCLAW_acp__default_agent": "", "ZEROCLAW_acp__max_sessions": "  "}
    settings = load_settings(str(tmp_path), env=env)
    assert settings.default_agent == "main" and settings.max_sessions == 4


@pytest.mark.parametrize("value", ['["main"]', "{ a = 1 }", "3"])
def test_default_agent_that_is_no_string_is_a_config_error(tmp_path, value):
    (tmp_path / "config.toml").write_text(f"[acp]\ndefault_agent = {value}\n[agents.main]\n")
    with pytest.raises(ConfigError, match="default_agent"):
        load_settings(str(tmp_path), env={})


def test_whole_session_timeouts_are_integers(tmp_path):
    """Clients read ``sessionTimeoutSecs`` as an integer: a flag's 120.0 becomes 120."""
    whole = load_settings(str(tmp_path), {"acp.session_timeout_secs": 120.0}, env={})
    assert type(whole.session_timeout_secs) is int and whole.session_timeout_secs == 120
    assert load_settings(str(tmp_path), {"acp.session_timeout_secs": 0.5},
                         env={}).session_timeout_secs == 0.5
