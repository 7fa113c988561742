"""Helpers for configuration tests: write a TOML file and load it as `agent-gateway` does."""

from __future__ import annotations

from importlib import metadata
from pathlib import Path

from agent_gateway.config import Config, SectionSpec, section_specs_from_hook
from agent_gateway.plugin_host import LOAD_ENV, PluginHost


def builtin_plugin_names() -> str:
    """Entry points shipped by agent-gateway itself (not third-party plugins that may be installed)."""
    return ",".join(
        ep.name
        for ep in metadata.entry_points(group="agent_gateway")
        if ep.dist is not None and ep.dist.name == "agent-gateway"
    )


def builtin_specs() -> list[SectionSpec]:
    host = PluginHost.load(env={LOAD_ENV: builtin_plugin_names()})
    return section_specs_from_hook(host.config_sections())


def load(path: Path | None = None, env: dict[str, str] | None = None) -> Config:
    return Config.load(path, builtin_specs(), env=env or {})


def write(tmp_path: Path, text: str, name: str = "gateway.toml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path
