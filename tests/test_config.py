"""Configuration: defaults < TOML file < environment (AGENT_GATEWAY__SECTION__KEY), plugin sections,
and `agent-gateway config check` reporting every problem as `file: section.key: problem`.

Also keeps config/default.toml, config/examples/ and docs/configuration.md in step with the specs
the code declares: every key, its type and its default.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import sys
import tomllib
from pathlib import Path

import pytest
from click.testing import CliRunner

from agent_gateway.cli import cli
from agent_gateway.config import CORE_SECTIONS, Config, ConfigError, SectionSpec
from tests._config import builtin_specs, load, write

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_TOML = ROOT / "config" / "default.toml"
EXAMPLES = sorted((ROOT / "config" / "examples").glob("*.toml"))
# `file: section.key: problem` (or `file: section: problem` for a whole section).
PROBLEM = re.compile(r"^(?P<file>[^:]+): (?P<key>[a-z0-9_]+(\.[^:\s]+)*): (?P<problem>\S.*)$")
TOKEN = "0123456789abcdef-token"


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Neither the developer's gateway settings nor their data directory leak into a test."""
    for name in list(os.environ):
        if name.startswith("AGENT_GATEWAY"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))


# -- precedence -------------------------------------------------------------------------------------


def test_defaults(tmp_path: Path) -> None:
    config = load()
    gw = config.section("gateway")
    assert (gw["host"], gw["port"], gw["max_body_bytes"]) == ("127.0.0.1", 8787, 1_048_576)
    assert config.data_dir == tmp_path / "xdg" / "agent-gateway"
    assert config.storage_url == f"sqlite:///{tmp_path / 'xdg' / 'agent-gateway' / 'gateway.db'}"
    assert config.tokens == {}
    assert config.section("chat_only")["max_history_turns"] == 20
    assert config.path is None
    assert config.problems() == []


def test_file_values_override_defaults_and_keep_the_rest(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        f"""
[gateway]
port = 9000
data_dir = "{tmp_path / "data"}"

[auth]
tokens = {{ "{TOKEN}" = "alice" }}

[storage]
url = "postgresql://gw@db:5432/gw"

[chat_only]
model = "gpt-test"
""",
    )
    config = load(path)
    assert config.section("gateway")["port"] == 9000
    assert config.section("gateway")["host"] == "127.0.0.1"
    assert config.data_dir == tmp_path / "data"
    assert config.tokens == {TOKEN: "alice"}
    assert config.storage_url == "postgresql://gw@db:5432/gw"
    assert config.section("chat_only")["model"] == "gpt-test"
    assert config.section("chat_only")["enabled"] is True
    assert config.problems() == []


def test_config_path_from_environment(tmp_path: Path) -> None:
    path = write(tmp_path, "[gateway]\nport = 9100\n")
    config = Config.load(None, env={"AGENT_GATEWAY_CONFIG": str(path)})
    assert config.path == str(path) and config.section("gateway")["port"] == 9100


def test_environment_overrides_win_and_are_parsed_as_toml_values(tmp_path: Path) -> None:
    path = write(tmp_path, '[gateway]\nport = 9000\nhost = "127.0.0.1"\n[chat_only]\nmodel = "file"\n')
    env = {
        "AGENT_GATEWAY__GATEWAY__PORT": "9001",  # int
        "AGENT_GATEWAY__GATEWAY__HEARTBEAT_SECONDS": "2.5",  # float
        "AGENT_GATEWAY__GATEWAY__RUN_TIMEOUT_SECONDS": "60",  # an int where a float is expected
        "AGENT_GATEWAY__GATEWAY__HOST": "::1",  # not TOML: kept as a string
        "AGENT_GATEWAY__CHAT_ONLY__ENABLED": "false",  # bool
        "AGENT_GATEWAY__CHAT_ONLY__BASE_URL": "http://127.0.0.1:9/v1",  # plain string
        "AGENT_GATEWAY__CHAT_ONLY__MODEL": '"quoted model"',  # a TOML string
        "AGENT_GATEWAY__AUTH__TOKENS": f'{{ "{TOKEN}" = "bob" }}',  # inline table
        "OTHER__GATEWAY__PORT": "1",  # not ours
    }
    config = load(path, env)
    gw = config.section("gateway")
    assert gw["port"] == 9001 and isinstance(gw["port"], int)
    assert gw["heartbeat_seconds"] == 2.5
    assert gw["run_timeout_seconds"] == 60
    assert gw["host"] == "::1"
    chat = config.section("chat_only")
    assert chat["enabled"] is False
    assert chat["base_url"] == "http://127.0.0.1:9/v1"
    assert chat["model"] == "quoted model"
    assert config.tokens == {TOKEN: "bob"}
    assert config.problems() == []


def test_programmatic_overrides_win_over_environment() -> None:
    """`serve --port/--host/--data-dir` pass their values as overrides."""
    config = Config.load(None, env={"AGENT_GATEWAY__GATEWAY__PORT": "9001"}, overrides={"gateway": {"port": 0}})
    assert config.section("gateway")["port"] == 0


# -- problems ---------------------------------------------------------------------------------------


def test_unknown_section_and_unknown_key(tmp_path: Path) -> None:
    path = write(tmp_path, '[gatway]\nport = 1\n[gateway]\nprot = 1\n[chat_only]\nbase_ulr = "x"\n')
    problems = load(path).problems()
    known = "acp_agents, ag_ui, auth, auth_jwt, chat_only, cluster, gateway, "
    assert problems[0].startswith(f"{path}: gatway: unknown section (known: {known}")
    assert problems[1:] == [f"{path}: gateway.prot: unknown key", f"{path}: chat_only.base_ulr: unknown key"]


def test_top_level_keys_must_be_sections(tmp_path: Path) -> None:
    path = write(tmp_path, "port = 8080\ngateway = 3\n")
    assert load(path).problems() == [
        f"{path}: port: top-level keys must be sections",
        f"{path}: gateway: must be a table",
    ]


def test_wrong_types(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
[gateway]
port = "8080"
heartbeat_seconds = 5
max_body_bytes = 1.5
stream_buffer_events = true

[auth]
tokens = ["not", "a", "table"]

[chat_only]
enabled = "yes"
""",
    )
    assert load(path).problems() == [
        f"{path}: gateway.port: expected int, got str",
        f"{path}: gateway.max_body_bytes: expected int, got float",
        f"{path}: gateway.stream_buffer_events: expected int, got bool",
        f"{path}: auth.tokens: expected dict, got list",
        f"{path}: chat_only.enabled: expected bool, got str",
    ]


def test_validator_problems(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
[gateway]
port = 70000
heartbeat_seconds = 0
journal_batch_events = -1
journal_memory_mb = -1

[auth]
tokens = { "short" = "alice", "0123456789abcdef" = "" }

[chat_only]
base_url = "ftp://example.com"
max_history_turns = 0
""",
    )
    assert load(path).problems() == [
        f"{path}: gateway.port: must be 0..65535, got 70000",
        f"{path}: gateway.heartbeat_seconds: must be positive",
        f"{path}: gateway.journal_batch_events: must be positive",
        f"{path}: gateway.journal_memory_mb: must be 0 or more",
        f"{path}: auth.tokens.shor…: token must be at least 16 characters",
        f"{path}: auth.tokens.0123…: must map a token to a non-empty actor id",
        f"{path}: chat_only.base_url: must start with http:// or https://",
        f"{path}: chat_only.max_history_turns: must be positive",
    ]


def test_environment_problems_name_the_environment(tmp_path: Path) -> None:
    env = {
        "AGENT_GATEWAY__GATEWAY__PORT": "eighty",
        "AGENT_GATEWAY__GATEWAY__NOPE": "1",
        "AGENT_GATEWAY__CHAT_ONLY__BASE_URL": "localhost:1234",
        "AGENT_GATEWAY__NOSUCH__KEY": "1",
    }
    assert load(None, env).problems() == [
        "environment: AGENT_GATEWAY__NOSUCH: unknown section",
        "environment: gateway.port: expected int, got str",
        "environment: gateway.nope: unknown key",
        "environment: chat_only.base_url: must start with http:// or https://",
    ]


def test_every_problem_is_file_key_problem(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        '[nope]\na = 1\n[gateway]\nport = -1\nhost = 1\nx = 2\n[auth]\ntokens = { "t" = "a" }\n'
        '[chat_only]\nbase_url = "x"\n',
    )
    problems = load(path, {"AGENT_GATEWAY__STORAGE__URL": "1"}).problems()
    assert len(problems) == 7, problems
    for problem in problems:
        match = PROBLEM.match(problem)
        assert match, problem
        assert match["file"] in (str(path), "environment")


def test_a_type_problem_does_not_hide_the_sections_other_problems(tmp_path: Path) -> None:
    path = write(tmp_path, "[gateway]\nhost = 5\nport = 70000\nbogus = 1\n")
    assert load(path).problems() == [
        f"{path}: gateway.host: expected str, got int",
        f"{path}: gateway.bogus: unknown key",
        f"{path}: gateway.port: must be 0..65535, got 70000",
    ]


def test_a_crashing_validator_is_reported_not_raised(tmp_path: Path) -> None:
    def broken(section: dict) -> list:
        raise KeyError("oops")

    config = Config.load(write(tmp_path, "[x]\na = 2\n"), [SectionSpec("x", {"a": 1}, broken)], env={})
    assert config.problems() == [f"{tmp_path / 'gateway.toml'}: x: validator failed: KeyError: 'oops'"]


def test_unreadable_files_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as missing:
        Config.load(tmp_path / "missing.toml", env={})
    assert missing.value.problems == [f"{tmp_path / 'missing.toml'}: file not found"]
    broken = write(tmp_path, "[gateway\nport = 1\n")
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(broken))}: invalid TOML: "):
        Config.load(broken, env={})


# -- agent-gateway config check / show -------------------------------------------------------------------


BAD_TOML = """
[gateway]
port = 70000
host = 5

[auth]
tokens = { "short" = "alice" }

[chat_only]
base_url = "ftp://x"
colour = "blue"

[nope]
x = 1
"""


def test_config_check_lists_every_problem_and_exits_1(tmp_path: Path) -> None:
    path = write(tmp_path, BAD_TOML, "bad.toml")
    result = CliRunner().invoke(cli, ["config", "check", "--config", str(path)])
    assert result.exit_code == 1
    expected = load(path).problems()
    assert len(expected) == 6
    assert result.output.splitlines() == expected


async def test_config_check_console_script_exits_1(tmp_path: Path) -> None:
    """The real launcher, as a user runs it."""
    path = write(tmp_path, BAD_TOML, "bad.toml")
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_GATEWAY")}
    script = shutil.which("agent-gateway", path=str(Path(sys.executable).parent)) or shutil.which("agent-gateway")
    assert script, "the agent-gateway console script is not installed"
    proc = await asyncio.create_subprocess_exec(
        script, "config", "check", "--config", str(path),
        env=env, cwd=tmp_path, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 1, err
    lines = out.decode().splitlines()
    assert lines == load(path).problems()
    assert all(PROBLEM.match(line) for line in lines)


def test_config_check_missing_or_broken_file_exits_non_zero(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["config", "check", "--config", str(tmp_path / "missing.toml")])
    assert result.exit_code != 0 and f"{tmp_path / 'missing.toml'}: file not found" in result.output
    broken = write(tmp_path, "port = = 1\n")
    result = CliRunner().invoke(cli, ["config", "check", "--config", str(broken)])
    assert result.exit_code != 0 and "invalid TOML" in result.output


def test_config_check_reports_environment_problems_too() -> None:
    result = CliRunner().invoke(cli, ["config", "check"], env={"AGENT_GATEWAY__GATEWAY__PORT": "x"})
    assert (result.exit_code, result.output) == (1, "environment: gateway.port: expected int, got str\n")


def test_config_check_without_file_checks_defaults() -> None:
    result = CliRunner().invoke(cli, ["config", "check"])
    assert (result.exit_code, result.output) == (0, "<defaults>: ok\n")


def test_config_show_prints_merged_values_with_secrets_masked(tmp_path: Path) -> None:
    path = write(tmp_path, f'[chat_only]\napi_key = "sk-secret"\n[auth]\ntokens = {{ "{TOKEN}" = "alice" }}\n')
    result = CliRunner().invoke(cli, ["config", "show", "--config", str(path)])
    assert result.exit_code == 0, result.output
    assert "sk-secret" not in result.output and TOKEN not in result.output
    assert '"api_key": "***"' in result.output and '"alice"' in result.output


# -- config/ and docs/ agree with the code --------------------------------------------------------------


def test_default_toml_passes_config_check() -> None:
    result = CliRunner().invoke(cli, ["config", "check", "--config", str(DEFAULT_TOML)])
    assert (result.exit_code, result.output) == (0, f"{DEFAULT_TOML}: ok\n")


@pytest.mark.parametrize("example", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_examples_pass_config_check(example: Path) -> None:
    result = CliRunner().invoke(cli, ["config", "check", "--config", str(example)])
    assert (result.exit_code, result.output) == (0, f"{example}: ok\n")


def test_examples_exist() -> None:
    assert {"postgresql.toml", "tokens.toml", "demo.toml"} <= {p.name for p in EXAMPLES}


def test_default_toml_lists_every_key_with_its_default() -> None:
    """config/default.toml holds every core and built-in plugin key, set to the code's default."""
    written = tomllib.loads(DEFAULT_TOML.read_text(encoding="utf-8"))
    specs = {spec.name: spec for spec in CORE_SECTIONS + builtin_specs()}
    assert sorted(written) == sorted(specs), "sections of config/default.toml vs the declared specs"
    for name, spec in specs.items():
        if spec.tables:  # a section of named tables has no defaults of its own: an empty table there
            assert written[name] == {}, f"[{name}] in config/default.toml must be empty (its example is commented)"
            continue
        assert written[name] == spec.defaults, f"[{name}] in config/default.toml differs from its defaults"
        for key, value in written[name].items():
            assert type(value) is type(spec.defaults[key]), f"{name}.{key}"


def test_default_toml_comments_every_key() -> None:
    lines = DEFAULT_TOML.read_text(encoding="utf-8").splitlines()
    for i, line in enumerate(lines):
        if re.match(r"^[a-z_]+ = ", line):
            assert lines[i - 1].startswith("#"), f"config/default.toml:{i + 1}: {line!r} has no comment above it"


def test_docs_configuration_documents_every_section_and_key() -> None:
    doc = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    for spec in CORE_SECTIONS + builtin_specs():
        assert f"### `[{spec.name}]`" in doc, f"docs/configuration.md lacks the [{spec.name}] section"
        section = doc.split(f"### `[{spec.name}]`", 1)[1].split("\n### ", 1)[0]
        for key in spec.defaults:
            assert re.search(rf"^\| `{key}` \|", section, re.M), f"docs/configuration.md: {spec.name}.{key}"


def test_docs_configuration_shows_the_env_override_syntax_and_config_check() -> None:
    doc = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    assert "AGENT_GATEWAY__GATEWAY__PORT" in doc and "agent-gateway config check" in doc


def test_a_spec_loaded_twice_keeps_the_last_registration() -> None:
    """Plugins are loaded before config; a section spec is replaced, not merged."""
    config = Config.load(None, [SectionSpec("x", {"a": 1})], env={})
    config.add_section(SectionSpec("x", {"b": "two"}))
    assert config.section("x") == {"b": "two"}


def test_config_show_masks_agent_env_and_url_credentials_at_any_depth(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "[acp_agents.my-agent]\n"
        'command = ["my-agent", "acp"]\n'
        'env = { MY_PROVIDER_KEY = "sk-agent-secret", REGION = "eu" }\n'
        "[reasonix]\n"
        'env = { DEEPSEEK_API_KEY = "sk-reasonix-secret" }\n'
        "[storage]\n"
        'url = "postgresql://gw:pg-password@127.0.0.1/test"\n',
    )
    result = CliRunner().invoke(cli, ["config", "show", "--config", str(path)])
    assert result.exit_code == 0, result.output
    for secret in ("sk-agent-secret", "sk-reasonix-secret", "pg-password"):
        assert secret not in result.output
    shown = json.loads(result.output)
    assert shown["acp_agents"]["my-agent"]["env"] == {"MY_PROVIDER_KEY": "***", "REGION": "***"}
    assert shown["acp_agents"]["my-agent"]["command"] == ["my-agent", "acp"]  # the rest stays readable


def test_gil_switch_interval_is_checked_and_applied_by_serve(tmp_path: Path) -> None:
    import sys

    from agent_gateway.cli import set_gil_switch_interval

    for value, ok in ((0, True), (0.5, True), (100, True), (0.01, False), (-1, False), (1000, False)):
        path = write(tmp_path, f"[gateway]\ngil_switch_interval_ms = {value}\n")
        problems = load(path).problems()
        assert (
            problems == []
            if ok
            else problems == [f"{path}: gateway.gil_switch_interval_ms: must be 0 (Python's default) or 0.1..100"]
        ), value
    before = sys.getswitchinterval()
    try:
        set_gil_switch_interval(0.0)  # 0: Python's own
        assert sys.getswitchinterval() == before
        set_gil_switch_interval(0.5)
        assert sys.getswitchinterval() == 0.0005
    finally:
        sys.setswitchinterval(before)
