"""TOML configuration: core sections plus one section per plugin (declared via `config_sections`).

Precedence: defaults < the TOML file < environment ``AGENT_GATEWAY__<SECTION>__<KEY>=value``
(value parsed as a TOML value when it parses, else taken as a string).
"""

from __future__ import annotations

import math
import os
import re
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

ENV_PREFIX = "AGENT_GATEWAY__"
CONFIG_ENV = "AGENT_GATEWAY_CONFIG"
# A retention longer than this (100 years) is a typo, not a policy.
MAX_RETAIN_DAYS = 36_500
# [gateway] gil_switch_interval_ms: below 0.1 ms threads would hand the GIL over more than they run.
MIN_SWITCH_INTERVAL_MS = 0.1
MAX_SWITCH_INTERVAL_MS = 100.0

Validator = Callable[[dict[str, Any]], list[tuple[str, str]]]


@dataclass
class SectionSpec:
    name: str
    defaults: dict[str, Any]
    validate: Validator | None = None
    doc: str = ""
    # True: the section is a set of named tables (`[name.<id>]`), each one checked against
    # `defaults` and `validate` like a section of its own; `table_id` is the pattern ids match.
    tables: bool = False
    table_id: str = r"^[a-z0-9][a-z0-9_-]{0,63}$"


def _default_data_dir() -> str:
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return str(Path(base) / "agent-gateway")


def _validate_gateway(section: dict[str, Any]) -> list[tuple[str, str]]:
    problems = []
    if not 0 <= section["port"] <= 65535:
        problems.append(("port", f"must be 0..65535, got {section['port']}"))
    for key in (
        "max_body_bytes",
        "heartbeat_seconds",
        "stream_buffer_events",
        "journal_batch_events",
        "max_active_runs_per_actor",
        "header_timeout_seconds",
        "idle_timeout_seconds",
        "max_connections",
        "stream_send_timeout_seconds",
    ):
        if section[key] <= 0:
            problems.append((key, "must be positive"))
    for key in (
        "max_queued_runs_per_session",
        "journal_memory_mb",
        "max_run_journal_bytes",
        "max_actor_journal_bytes_per_day",
    ):
        if section[key] < 0:
            problems.append((key, "must be 0 or more"))
    if not all(isinstance(name, str) and name and "/" not in name for name in section["allowed_hosts"]):
        problems.append(("allowed_hosts", "must be a list of host names (no scheme, no port)"))
    for origin in section["cors_origins"]:
        if not isinstance(origin, str) or not origin.startswith(("http://", "https://")) or origin.count("/") != 2:
            problems.append(("cors_origins", f"{origin!r} is not an origin like https://app.example:8443"))
    if bool(section["tls_cert"]) != bool(section["tls_key"]):
        problems.append(("tls_cert", "set tls_cert and tls_key together (PEM files), or neither"))
    for name in ("tls_cert", "tls_key"):
        if section[name] and not Path(section[name]).expanduser().is_file():
            problems.append((name, f"file {section[name]} does not exist"))
    if section["shutdown_grace_seconds"] < 0:
        problems.append(("shutdown_grace_seconds", "must be 0 or more"))
    if section["loop_lag_warn_ms"] < 0:
        problems.append(("loop_lag_warn_ms", "must be 0 (no log line) or more"))
    switch_ms = section["gil_switch_interval_ms"]
    if switch_ms != 0 and not MIN_SWITCH_INTERVAL_MS <= switch_ms <= MAX_SWITCH_INTERVAL_MS:
        problems.append(
            (
                "gil_switch_interval_ms",
                f"must be 0 (Python's default) or {MIN_SWITCH_INTERVAL_MS:g}..{MAX_SWITCH_INTERVAL_MS:g}",
            )
        )
    strategies = ("enqueue", "reject", "interrupt", "rollback")  # (gateway/runs.py MULTITASK_STRATEGIES)
    if section["multitask_strategy"] not in strategies:
        problems.append(("multitask_strategy", f"must be one of {', '.join(strategies)}"))
    for agent_id, strategy in section["multitask_strategy_by_agent"].items():
        if strategy not in strategies:
            problems.append((f"multitask_strategy_by_agent.{agent_id}", f"must be one of {', '.join(strategies)}"))
    public_url = section["public_url"]
    if public_url and (not public_url.startswith(("http://", "https://")) or "?" in public_url or "#" in public_url):
        problems.append(("public_url", "must be an http:// or https:// URL without query or fragment"))
    return problems


def _validate_auth(section: dict[str, Any]) -> list[tuple[str, str]]:
    problems = []
    if not all(isinstance(a, str) and a for a in section["admins"]):
        problems.append(("admins", "must be a list of actor ids"))
    for token, actor in section["tokens"].items():
        if not isinstance(actor, str) or not actor:
            problems.append((f"tokens.{token[:4]}…", "must map a token to a non-empty actor id"))
        if len(token) < 16:
            problems.append((f"tokens.{token[:4]}…", "token must be at least 16 characters"))
    return problems


def _validate_workspaces(section: dict[str, Any]) -> list[tuple[str, str]]:
    problems = []
    for workspace_id, directory in section["roots"].items():
        if not isinstance(directory, str) or not directory:
            problems.append((f"roots.{workspace_id}", "must be a directory path"))
        elif not Path(directory).expanduser().is_dir():
            problems.append((f"roots.{workspace_id}", f"directory {directory} does not exist"))
    known = ", ".join(sorted(section["roots"])) or "none"
    for workspace_id, actors in section["owners"].items():
        where = f"owners.{workspace_id}"
        if workspace_id not in section["roots"]:
            problems.append((where, f"{workspace_id!r} is not a workspace in roots (known: {known})"))
        if not isinstance(actors, list) or not all(isinstance(actor, str) and actor for actor in actors):
            problems.append((where, 'must be a list of actor ids, e.g. ["alice", "bob"]'))
        elif not actors:
            problems.append((where, "must name at least one actor (to close a workspace, remove it from roots)"))
    return problems


def _validate_storage(section: dict[str, Any]) -> list[tuple[str, str]]:
    problems = []
    retain_days = section["retain_days"]
    if not math.isfinite(retain_days) or not 0 <= retain_days <= MAX_RETAIN_DAYS:
        problems.append(("retain_days", f"must be 0 (keep everything) or a number of days up to {MAX_RETAIN_DAYS}"))
    interval = section["maintenance_interval_seconds"]
    if not math.isfinite(interval) or interval <= 0:
        problems.append(("maintenance_interval_seconds", "must be a positive number of seconds"))
    return problems


def _validate_webhooks(section: dict[str, Any]) -> list[tuple[str, str]]:
    from agent_gateway.webhooks import validate_section  # imports the HTTP client: only when used

    return validate_section(section)


CORE_SECTIONS = [
    SectionSpec(
        "gateway",
        {
            "host": "127.0.0.1",
            "port": 8787,
            "data_dir": "",
            "max_body_bytes": 1_048_576,
            "heartbeat_seconds": 15.0,
            "stream_buffer_events": 1024,
            "journal_batch_events": 5000,
            "journal_memory_mb": 32,
            "run_timeout_seconds": 3600.0,
            "max_queued_runs_per_session": 16,
            "max_active_runs_per_actor": 64,
            "multitask_strategy": "enqueue",
            "multitask_strategy_by_agent": {},
            "max_run_journal_bytes": 64 * 1024 * 1024,
            "max_actor_journal_bytes_per_day": 16 * 1024 * 1024 * 1024,
            "header_timeout_seconds": 10.0,
            "idle_timeout_seconds": 75.0,
            "max_connections": 1000,
            "stream_send_timeout_seconds": 60.0,
            "shutdown_grace_seconds": 5.0,
            "loop_lag_warn_ms": 100.0,
            "gil_switch_interval_ms": 0.0,
            "allowed_hosts": [],
            "cors_origins": [],
            "public_url": "",
            "tls_cert": "",
            "tls_key": "",
        },
        _validate_gateway,
        "Listening address, data directory, limits.",
    ),
    SectionSpec(
        "auth",
        {"tokens": {}, "admins": [], "public_metrics": False},
        _validate_auth,
        "Bearer tokens mapped to actor ids. None: one local actor, loopback only.",
    ),
    SectionSpec(
        "storage",
        {"url": "", "compact_after_terminal": False, "retain_days": 0.0, "maintenance_interval_seconds": 3600.0},
        _validate_storage,
        "Storage URL (empty: SQLite in the data directory), compaction and retention.",
    ),
    SectionSpec(
        "workspaces",
        {"roots": {}, "owners": {}, "allow_shell": False},
        _validate_workspaces,
        "Workspace ids mapped to directories, and which actors may use them; tools reach files only "
        "below a run's allowed roots there.",
    ),
    SectionSpec(
        "webhooks",
        {
            "secret": "",
            "previous_secrets": [],
            "url_by_agent": {},
            "url_by_actor": {},
            "allowed_hosts": [],
            "retry_for_seconds": 86400.0,
            "timeout_seconds": 15.0,
            "backoff_seconds": 5.0,
            "max_backoff_seconds": 3600.0,
            "poll_seconds": 5.0,
        },
        _validate_webhooks,
        "Run webhooks: the signing secret, default URLs per agent or actor, retries, allowed private hosts.",
    ),
]


class ConfigError(Exception):
    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


@dataclass
class Config:
    raw: dict[str, Any]
    path: str | None
    specs: dict[str, SectionSpec] = field(default_factory=dict)
    env_overrides: dict[str, dict[str, Any]] = field(default_factory=dict)
    # What problems name as the origin of `raw` when it is not read from a file (a test's overrides).
    label: str | None = None

    @property
    def where(self) -> str:
        """The origin of `raw` in problems: the file, else the label, else ``<defaults>``."""
        return self.path or self.label or "<defaults>"

    @classmethod
    def load(
        cls,
        path: str | os.PathLike[str] | None = None,
        specs: list[SectionSpec] | None = None,
        env: Mapping[str, str] | None = None,
        overrides: dict[str, dict[str, Any]] | None = None,
    ) -> Config:
        env = os.environ if env is None else env
        path = path or env.get(CONFIG_ENV) or None
        raw: dict[str, Any] = {}
        if path is not None:
            try:
                raw = tomllib.loads(Path(path).read_text(encoding="utf-8"))
            except FileNotFoundError as exc:
                raise ConfigError([f"{path}: file not found"]) from exc
            except tomllib.TOMLDecodeError as exc:
                raise ConfigError([f"{path}: invalid TOML: {exc}"]) from exc
        env_overrides: dict[str, dict[str, Any]] = {}
        for name, value in env.items():
            if not name.startswith(ENV_PREFIX):
                continue
            section, _, key = name[len(ENV_PREFIX) :].lower().partition("__")
            if section and key:
                env_overrides.setdefault(section, {})[key] = _parse_env_value(value)
        for section, values in (overrides or {}).items():
            env_overrides.setdefault(section, {}).update(values)
        config = cls(raw, str(path) if path else None, {}, env_overrides)
        for spec in CORE_SECTIONS + list(specs or []):
            config.specs[spec.name] = spec
        return config

    def add_section(self, spec: SectionSpec) -> None:
        self.specs[spec.name] = spec

    def section(self, name: str) -> dict[str, Any]:
        """The merged section: defaults, then the file, then environment overrides. A section of
        tables is ``{id: merged table}``."""
        spec = self.specs.get(name)
        if spec is not None and spec.tables:
            return {
                table_id: {**spec.defaults, **given, **env}
                for table_id, (given, env) in self._tables(name).items()
                if isinstance(given, dict)
            }
        merged: dict[str, Any] = dict(spec.defaults) if spec else {}
        merged.update(self.raw.get(name, {}) or {})
        merged.update(self.env_overrides.get(name, {}))
        return merged

    def _tables(self, name: str) -> dict[str, tuple[Any, dict[str, Any]]]:
        """The tables of a section of tables: ``{id: (table in the file, environment overrides)}``.
        ``AGENT_GATEWAY__<SECTION>__<ID>__<KEY>`` overrides a key of one table."""
        given = self.raw.get(name, {})
        tables: dict[str, tuple[Any, dict[str, Any]]] = {
            table_id: (table, {}) for table_id, table in (given.items() if isinstance(given, dict) else ())
        }
        for env_key, value in self.env_overrides.get(name, {}).items():
            table_id, _, key = env_key.partition("__")
            tables.setdefault(table_id, ({}, {}))[1][key] = value
        return tables

    # -- well-known core values --------------------------------------------------------------
    @property
    def data_dir(self) -> Path:
        return Path(self.section("gateway")["data_dir"] or _default_data_dir()).expanduser()

    @property
    def storage_url(self) -> str:
        return self.section("storage")["url"] or f"sqlite:///{self.data_dir / 'gateway.db'}"

    @property
    def workspace_roots(self) -> dict[str, Path]:
        return {k: Path(v).expanduser() for k, v in self.section("workspaces")["roots"].items()}

    @property
    def workspace_owners(self) -> dict[str, frozenset[str]]:
        """``[workspaces] owners``: workspace id -> the actors that may use it (unlisted: every actor)."""
        return {k: frozenset(v) for k, v in self.section("workspaces")["owners"].items()}

    @property
    def tokens(self) -> dict[str, str]:
        return dict(self.section("auth")["tokens"])

    # -- checking -------------------------------------------------------------------------------
    def problems(self) -> list[str]:
        """Every problem as ``file: section.key: what is wrong``."""
        where = self.where
        found: list[str] = []
        for name in self.raw:
            if name not in self.specs:
                if not isinstance(self.raw[name], dict):
                    found.append(f"{where}: {name}: top-level keys must be sections")
                else:
                    known = ", ".join(sorted(self.specs))
                    found.append(f"{where}: {name}: unknown section (known: {known})")
        for name in self.env_overrides:
            if name not in self.specs:
                found.append(f"environment: {ENV_PREFIX}{name.upper()}: unknown section")
        for name, spec in self.specs.items():
            given = self.raw.get(name, {})
            if not isinstance(given, dict):
                found.append(f"{where}: {name}: must be a table")
                continue
            if not spec.tables:
                found.extend(self._check_table(spec, name, given, self.env_overrides.get(name, {})))
                continue
            for table_id, (table, env) in self._tables(name).items():
                dotted = f"{name}.{table_id}"
                origin = where if table_id in given else "environment"
                if not isinstance(table, dict):
                    found.append(f"{origin}: {dotted}: must be a table ([{dotted}])")
                    continue
                if "" in env:
                    variable = f"{ENV_PREFIX}{name.upper()}__{table_id.upper()}"
                    found.append(f"environment: {variable}: name a key too ({variable}__<KEY>)")
                    continue
                if not re.fullmatch(spec.table_id, table_id):
                    found.append(f"{origin}: {dotted}: {table_id!r} is not a valid name (must match {spec.table_id})")
                    continue
                found.extend(self._check_table(spec, dotted, table, env))
        return found

    def _check_table(self, spec: SectionSpec, name: str, given: dict[str, Any], env: dict[str, Any]) -> list[str]:
        """Problems of one section (or one table of a section of tables) named `name`."""
        where = self.where
        found: list[str] = []
        origin = {**{k: where for k in given}, **{k: "environment" for k in env}}
        values = {**given, **env}
        bad_keys = set()
        for key, value in values.items():
            if key not in spec.defaults:
                found.append(f"{origin[key]}: {name}.{key}: unknown key")
                bad_keys.add(key)
                continue
            expected = type(spec.defaults[key])
            if not _type_ok(value, expected):
                found.append(f"{origin[key]}: {name}.{key}: expected {expected.__name__}, got {type(value).__name__}")
                bad_keys.add(key)
        if spec.validate:
            # Validate the keys that are well-typed too (every problem, not just the first
            # kind): bad keys are checked with their defaults and not reported twice.
            checked = {**spec.defaults, **{k: v for k, v in values.items() if k in spec.defaults}}
            checked.update({k: spec.defaults[k] for k in bad_keys if k in spec.defaults})
            try:
                validated = spec.validate(checked)
            except Exception as exc:  # a plugin's validator must not hide the other problems
                validated = [("", f"validator failed: {type(exc).__name__}: {exc}")]
            for key, problem in validated:
                if key.split(".")[0].split("[")[0] in bad_keys:
                    continue
                dotted = f"{name}.{key}" if key else name
                found.append(f"{origin.get(key.split('.')[0].split('[')[0], where)}: {dotted}: {problem}")
        return found

    def check(self) -> None:
        problems = self.problems()
        if problems:
            raise ConfigError(problems)


class BackendHooks(Protocol):
    """The hooks ``agent-gateway config check`` asks (the plugin host's facades)."""

    def storage_backend(self, url: str, config: Config | None) -> Any: ...

    def cluster_coordinator(self, config: Config) -> Any: ...


def check_problems(config: Config, plugins: BackendHooks) -> list[str]:
    """Every problem ``agent-gateway config check`` reports, as ``origin: key: what is wrong``:
    the sections' keys, types and validators (plugins' sections included, once registered in
    `config`), whether a storage plugin takes ``[storage] url`` (without opening it), and whether
    a cluster plugin can serve the configuration."""
    problems = config.problems()
    # A bad [cluster] value is reported already: the cluster plugin would fail on it again.
    return problems + _storage_problems(config, plugins) + ([] if problems else _cluster_problems(config, plugins))


def _storage_problems(config: Config, plugins: BackendHooks) -> list[str]:
    where = f"{config.where}: storage.url"
    try:
        storage = plugins.storage_backend(config.storage_url, config)
    except Exception as exc:  # the plugin's own reason, e.g. a missing driver
        return [f"{where}: {' '.join(str(exc).split())}"]
    if storage is None:
        return [f"{where}: no storage plugin handles {redact_url(config.storage_url)!r}"]
    return []


def _cluster_problems(config: Config, plugins: BackendHooks) -> list[str]:
    try:
        plugins.cluster_coordinator(config)
    except Exception as exc:  # the plugin's own one-line reason
        return [f"{config.where}: cluster: {' '.join(str(exc).split())}"]
    return []


def _type_ok(value: Any, expected: type) -> bool:
    if expected is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if expected is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, expected)


def redact_url(url: str) -> str:
    """``url`` with its password (if any) masked, for messages and logs."""
    if "@" in url and "://" in url:
        scheme, rest = url.split("://", 1)
        creds, host = rest.rsplit("@", 1)
        return f"{scheme}://{creds.split(':')[0]}:***@{host}" if ":" in creds else url
    return url


def _parse_env_value(value: str) -> Any:
    try:
        return tomllib.loads(f"v = {value}")["v"]
    except tomllib.TOMLDecodeError:
        return value


def section_specs_from_hook(registered: list[tuple[tuple[Any, ...], dict[str, Any]]]) -> list[SectionSpec]:
    specs = []
    for args, kwargs in registered:
        specs.append(SectionSpec(*args, **kwargs))
    return specs
