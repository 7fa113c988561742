"""Hermes runtime: `hermes-acp`, an ACP agent over stdio.

Hermes keeps its state under `HERMES_HOME`. With `provider_base_url` set, the plugin gives it a
gateway-owned home and writes `config.yaml` there (a custom OpenAI-compatible provider);
otherwise Hermes uses the user's own home and configuration.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agent_gateway import (
    ACP_SECTION_DEFAULTS,
    AcpAgentSpec,
    AcpRuntime,
    RuntimePolicy,
    hookimpl,
    spec_options,
    validate_section,
)

SECTION = "hermes"
DEFAULTS: dict[str, Any] = {
    **ACP_SECTION_DEFAULTS,
    "command": ["hermes-acp"],
    # When set, the plugin writes Hermes' config.yaml for this OpenAI-compatible endpoint.
    "provider_base_url": "",
    "provider_model": "",
    # "" = the user's own HERMES_HOME; with provider_base_url: <data_dir>/runtimes/hermes/home.
    "hermes_home": "",
    "provider_api_key": "",
    # Hermes looks model metadata up online unless the context length is given.
    "context_length": 128000,
}


def _validate(section: dict[str, Any]) -> list[tuple[str, str]]:
    problems = validate_section(section)
    if section["context_length"] <= 0:
        problems.append(("context_length", "must be positive"))
    return problems


def write_hermes_config(home: Path, base_url: str, model: str, api_key: str, context_length: int) -> None:
    # JSON is valid YAML: no YAML library needed to write it.
    config = {
        "model": {
            "provider": "custom",
            "base_url": base_url,
            "default": model or "default",
            "api_key": api_key or "unused",
            "context_length": context_length,
        }
    }
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.yaml").write_text(
        "# Written by agent-gateway from its [hermes] section; edits are overwritten.\n" + json.dumps(config, indent=2),
        encoding="utf-8",
    )


@hookimpl
def config_sections(register: Callable[..., None]) -> None:
    register(SECTION, DEFAULTS, _validate, "Hermes over ACP (`hermes-acp`).")


@hookimpl
def register_runtimes(register: Callable[[Any], None], config: Any) -> None:
    section = config.section(SECTION)
    if not section["enabled"]:
        return
    env = {k: str(v) for k, v in section["env"].items()}
    prepare = None
    home = section["hermes_home"]
    if section["provider_base_url"]:
        home_path = Path(home).expanduser() if home else config.data_dir / "runtimes" / "hermes" / "home"

        def prepare(directory: Path) -> None:
            write_hermes_config(
                home_path,
                section["provider_base_url"],
                section["provider_model"],
                section["provider_api_key"],
                int(section["context_length"]),
            )

        env["HERMES_HOME"] = str(home_path)
    elif home:
        env["HERMES_HOME"] = str(Path(home).expanduser())
    spec = AcpAgentSpec(
        agent_id="hermes",
        display_name="Hermes",
        provider="hermes",
        env=env,
        process_dir=config.data_dir / "runtimes" / "hermes",
        policy=RuntimePolicy(context_carrier="agent_session", load_session=True),
        prepare=prepare,
        install_hint="install it with `pip install 'hermes-agent[acp,mcp]'` or set [hermes] command",
        **spec_options(section, default_model=section["provider_model"]),
    )
    register(AcpRuntime(spec))
