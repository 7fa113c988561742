"""Hermes runtime: `hermes-acp`, an ACP agent over stdio.

Hermes keeps its state (sessions, memory, its session-search index) under `HERMES_HOME`: the plugin
gives it one home per actor (`<data_dir>/agent-homes/hermes/<actor>`, or `<hermes_home>/<actor>`),
so nothing Hermes remembers crosses actors. With `provider_base_url` set it writes `config.yaml`
there (a custom OpenAI-compatible provider).
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
    endpoint_of_url,
    hookimpl,
    spec_options,
    validate_section,
    write_home_file,
)

SECTION = "hermes"
DEFAULTS: dict[str, Any] = {
    **ACP_SECTION_DEFAULTS,
    "command": ["hermes-acp"],
    # When set, the plugin writes Hermes' config.yaml for this OpenAI-compatible endpoint.
    "provider_base_url": "",
    "provider_model": "",
    # The folder holding one Hermes home per actor ("": <data_dir>/agent-homes/hermes).
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
    # The home is the agent's: write through a rename, never through what it left there.
    write_home_file(
        home / "config.yaml",
        "# Written by agent-gateway from its [hermes] section; edits are overwritten.\n" + json.dumps(config, indent=2),
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
    network = []
    if section["provider_base_url"]:
        endpoint = endpoint_of_url(section["provider_base_url"])
        network = [endpoint] if endpoint else []

        def prepare(home: Path) -> None:
            write_hermes_config(
                home,
                section["provider_base_url"],
                section["provider_model"],
                section["provider_api_key"],
                int(section["context_length"]),
            )

    options = spec_options(section, default_model=section["provider_model"])
    options["network"] = [*network, *options["network"]]
    homes = Path(section["hermes_home"]).expanduser() if section["hermes_home"] else None
    spec = AcpAgentSpec(
        agent_id="hermes",
        display_name="Hermes",
        provider="hermes",
        env=env,
        # HERMES_HOME is the per-actor home: its sessions, memory and session search never cross actors.
        process_in_home=True,
        home_env=("HERMES_HOME",),
        homes_root=homes,
        policy=RuntimePolicy(context_carrier="agent_session", load_session=True),
        prepare=prepare,
        install_hint="install it with `pip install 'hermes-agent[acp,mcp]'` or set [hermes] command",
        **options,
    )
    register(AcpRuntime(spec))
