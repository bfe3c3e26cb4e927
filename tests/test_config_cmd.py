"""``zeroclaw config get/set/list`` against real files in a temp config dir."""

from __future__ import annotations

import json
import stat
import tomllib
from pathlib import Path

import pytest

from supervisor.cli.config_cmd import format_value, parse_key, parse_value, run

SPEC_EXAMPLE = """\
# zeroclaw settings
[acp]
default_agent = "main"        # used when session/new names no agent
max_sessions = 10             # live sessions in memory, per host
session_timeout_secs = 3600   # idle eviction and permission-request timeout

[agents.main]
provider = "echo"             # echo (offline default) | openai | acp
model = "..."
workspace = "~/.zeroclaw/agents/main/workspace"
enabled = true

[autonomy]
level = "supervised"          # read_only | supervised | full
forbidden_paths = ["/etc", "~/.ssh"]
"""


@pytest.fixture
def config_dir(tmp_path: Path) -> Path:
    return tmp_path / "zeroclaw-config"


@pytest.fixture
def spec_config(config_dir: Path) -> Path:
    config_dir.mkdir(mode=0o700)
    path = config_dir / "config.toml"
    path.write_text(SPEC_EXAMPLE, encoding="utf-8")
    return path


def config_output(
    capsys: pytest.CaptureFixture[str], argv: list[str], config_dir: Path
) -> tuple[int, str, str]:
    code = run(argv, config_dir)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def read_toml(config_dir: Path) -> dict[str, object]:
    with (config_dir / "config.toml").open("rb") as config_file:
        return tomllib.load(config_file)


def test_set_creates_private_dir_and_file(config_dir: Path) -> None:
    assert run(["set", "acp.max_sessions", "20"], config_dir) == 0

    assert stat.S_IMODE(config_dir.stat().st_mode) == 0o700
    assert stat.S_IMODE((config_dir / "config.toml").stat().st_mode) == 0o600
    assert read_toml(config_dir) == {"acp": {"max_sessions": 20}}


def test_set_keeps_comments_and_layout(spec_config: Path, config_dir: Path) -> None:
    assert run(["set", "acp.max_sessions", "20"], config_dir) == 0

    expected = SPEC_EXAMPLE.replace("max_sessions = 10  ", "max_sessions = 20  ")
    assert spec_config.read_text(encoding="utf-8") == expected


def test_set_new_keys_keeps_existing_text(spec_config: Path, config_dir: Path) -> None:
    assert run(["set", "agents.second.provider", "echo"], config_dir) == 0
    assert run(["set", "workers.max", "4"], config_dir) == 0

    text = spec_config.read_text(encoding="utf-8")
    main_end = SPEC_EXAMPLE.index("[autonomy]")
    assert text == (
        SPEC_EXAMPLE[:main_end]
        + '[agents.second]\nprovider = "echo"\n\n'
        + SPEC_EXAMPLE[main_end:]
        + "\n[workers]\nmax = 4\n"
    )
    loaded = read_toml(config_dir)
    assert loaded["agents"] == {
        "main": {
            "provider": "echo",
            "model": "...",
            "workspace": "~/.zeroclaw/agents/main/workspace",
            "enabled": True,
        },
        "second": {"provider": "echo"},
    }


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("20", 20),
        ("-3", -3),
        ("true", True),
        ("false", False),
        ("1.5", 1.5),
        ('["/etc", "~/.ssh"]', ["/etc", "~/.ssh"]),
        ("[]", []),
        ('"quoted text"', "quoted text"),
        ('"20"', "20"),
        ("echo", "echo"),
        ("gpt-4o mini", "gpt-4o mini"),
        ("~/.zeroclaw/agents/main/workspace", "~/.zeroclaw/agents/main/workspace"),
        ("5 # five", "5 # five"),
        ("1\nsecond = 2", "1\nsecond = 2"),
        ("", ""),
        ("{ a = 1 }", {"a": 1}),
    ],
)
def test_set_value_types(config_dir: Path, raw: str, expected: object) -> None:
    assert run(["set", "section.key", raw], config_dir) == 0

    assert read_toml(config_dir) == {"section": {"key": expected}}


def test_set_replaces_value_of_other_type(spec_config: Path, config_dir: Path) -> None:
    assert run(["set", "autonomy.forbidden_paths", '["/srv"]'], config_dir) == 0
    assert run(["set", "agents.main.enabled", "false"], config_dir) == 0

    loaded = read_toml(config_dir)
    assert loaded["autonomy"] == {"level": "supervised", "forbidden_paths": ["/srv"]}
    assert loaded["agents"]["main"]["enabled"] is False  # type: ignore[index]


def test_get_prints_plain_strings_and_toml_values(
    spec_config: Path, config_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert config_output(capsys, ["get", "agents.main.provider"], config_dir) == (0, "echo\n", "")
    assert config_output(capsys, ["get", "acp.max_sessions"], config_dir) == (0, "10\n", "")
    assert config_output(capsys, ["get", "agents.main.enabled"], config_dir) == (0, "true\n", "")
    assert config_output(capsys, ["get", "autonomy.forbidden_paths"], config_dir) == (
        0,
        '["/etc", "~/.ssh"]\n',
        "",
    )


def test_get_json(spec_config: Path, config_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = config_output(capsys, ["get", "--json", "autonomy"], config_dir)

    assert code == 0
    assert json.loads(out) == {"level": "supervised", "forbidden_paths": ["/etc", "~/.ssh"]}


def test_get_table_lists_its_leaves(
    spec_config: Path, config_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = config_output(capsys, ["get", "agents"], config_dir)

    assert code == 0
    assert out.splitlines() == [
        'agents.main.provider = "echo"',
        'agents.main.model = "..."',
        'agents.main.workspace = "~/.zeroclaw/agents/main/workspace"',
        "agents.main.enabled = true",
    ]


@pytest.mark.parametrize("key", ["acp.missing", "nosuch.key", "acp.max_sessions.deeper"])
def test_get_missing_key_fails_on_stderr(
    spec_config: Path, config_dir: Path, capsys: pytest.CaptureFixture[str], key: str
) -> None:
    code, out, err = config_output(capsys, ["get", key], config_dir)

    assert code == 1
    assert out == ""
    assert f"key not found: {key}" in err


def test_get_without_config_file(config_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = config_output(capsys, ["get", "acp.max_sessions"], config_dir)

    assert (code, out) == (1, "")
    assert "key not found: acp.max_sessions" in err
    assert not config_dir.exists()


def test_list_prints_every_leaf(
    spec_config: Path, config_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = config_output(capsys, ["list"], config_dir)

    assert (code, err) == (0, "")
    assert out.splitlines() == [
        'acp.default_agent = "main"',
        "acp.max_sessions = 10",
        "acp.session_timeout_secs = 3600",
        'agents.main.provider = "echo"',
        'agents.main.model = "..."',
        'agents.main.workspace = "~/.zeroclaw/agents/main/workspace"',
        "agents.main.enabled = true",
        'autonomy.level = "supervised"',
        'autonomy.forbidden_paths = ["/etc", "~/.ssh"]',
    ]


def test_list_lines_are_valid_toml(
    spec_config: Path, config_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, out, _ = config_output(capsys, ["list"], config_dir)

    assert tomllib.loads(out) == tomllib.loads(SPEC_EXAMPLE)


def test_list_json(spec_config: Path, config_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = config_output(capsys, ["list", "--json"], config_dir)

    assert code == 0
    assert json.loads(out) == tomllib.loads(SPEC_EXAMPLE)


def test_list_without_config_file(config_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert config_output(capsys, ["list"], config_dir) == (0, "", "")
    assert config_output(capsys, ["list", "--json"], config_dir) == (0, "{}\n", "")


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["frobnicate"],
        ["get"],
        ["get", "a.b", "extra"],
        ["set", "acp.max_sessions"],
        ["set", "acp", "3"],
        ["set", "a..b", "3"],
        ["get", ".a"],
        ["get", 'a."unterminated'],
        ["list", "--yaml"],
    ],
)
def test_usage_errors_exit_2(
    config_dir: Path, capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    code, out, err = config_output(capsys, argv, config_dir)

    assert code == 2
    assert out == ""
    assert err != ""
    assert not config_dir.exists()


def test_set_over_a_table_is_refused(
    spec_config: Path, config_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = config_output(capsys, ["set", "agents.main", "x"], config_dir)

    assert code == 1
    assert "is a table" in err
    assert spec_config.read_text(encoding="utf-8") == SPEC_EXAMPLE


def test_set_below_a_value_is_refused(
    spec_config: Path, config_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = config_output(capsys, ["set", "acp.max_sessions.x", "1"], config_dir)

    assert code == 1
    assert "not a table" in err
    assert spec_config.read_text(encoding="utf-8") == SPEC_EXAMPLE


def test_invalid_toml_is_reported_and_left_alone(
    config_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config_dir.mkdir()
    path = config_dir / "config.toml"
    path.write_text("[acp\nmax_sessions = ", encoding="utf-8")

    for argv in (["list"], ["get", "acp.max_sessions"], ["set", "acp.max_sessions", "2"]):
        code, out, err = config_output(capsys, argv, config_dir)
        assert (code, out) == (1, "")
        assert "not valid TOML" in err
    assert path.read_text(encoding="utf-8") == "[acp\nmax_sessions = "


def test_set_keeps_existing_file_mode(spec_config: Path, config_dir: Path) -> None:
    spec_config.chmod(0o640)

    assert run(["set", "acp.max_sessions", "3"], config_dir) == 0

    assert stat.S_IMODE(spec_config.stat().st_mode) == 0o640
    assert [p.name for p in config_dir.iterdir()] == ["config.toml"]


def test_set_writes_through_a_symlink(tmp_path: Path, config_dir: Path) -> None:
    real_file = tmp_path / "dotfiles" / "zeroclaw.toml"
    real_file.parent.mkdir()
    real_file.write_text(SPEC_EXAMPLE, encoding="utf-8")
    config_dir.mkdir()
    (config_dir / "config.toml").symlink_to(real_file)

    assert run(["set", "autonomy.level", "full"], config_dir) == 0

    assert (config_dir / "config.toml").is_symlink()
    assert 'level = "full"          # read_only' in real_file.read_text(encoding="utf-8")


def test_quoted_key_segments(config_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["set", 'agents."my.agent".provider', "echo"], config_dir) == 0

    assert read_toml(config_dir) == {"agents": {"my.agent": {"provider": "echo"}}}
    assert config_output(capsys, ["get", "agents.'my.agent'.provider"], config_dir) == (
        0,
        "echo\n",
        "",
    )
    assert config_output(capsys, ["list"], config_dir)[1] == (
        'agents."my.agent".provider = "echo"\n'
    )


def test_parse_key() -> None:
    assert parse_key("acp.max_sessions") == ["acp", "max_sessions"]
    assert parse_key('agents."a.b".provider') == ["agents", "a.b", "provider"]
    assert parse_key('a."tab\\there"') == ["a", "tab\there"]


def test_parse_value_and_format_value_round_trip() -> None:
    for raw in ("20", "true", "1.5", '["a", "b"]', '"text"'):
        assert format_value(parse_value(raw)) == raw
    assert format_value(parse_value("plain words")) == '"plain words"'
    assert format_value({"a": [1, {"b": True}]}) == "{a = [1, {b = true}]}"


@pytest.mark.parametrize(
    ("key", "value"),
    [("acp.max_sessions", "0"), ("acp.max_sessions", "abc"), ("autonomy.level", "yolo")],
)
def test_set_refuses_a_value_the_host_could_not_start_with(tmp_path, capsys, key, value):
    config = tmp_path / "config.toml"
    config.write_text("# mine\n[acp]\nmax_sessions = 3\n")
    assert run(["set", key, value], tmp_path) == 2
    assert config.read_text() == "# mine\n[acp]\nmax_sessions = 3\n"
    assert "not saved" in capsys.readouterr().err
