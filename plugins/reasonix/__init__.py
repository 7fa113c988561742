"""Reasonix runtime: `reasonix acp`, an ACP agent over stdio.

Reasonix reads `./reasonix.toml` relative to the *session* directory (the workspace root given in
`session/new`, not its process directory), then `$REASONIX_HOME/config.toml`. With
`provider_base_url` set, the plugin runs it in its per-actor home
(`<data_dir>/agent-homes/reasonix/<actor>`), which is also its `REASONIX_HOME` (its sessions live
there, so no actor's sessions reach another's), and writes the provider into that `config.toml`
(and a `reasonix.toml` beside it, for `reasonix doctor` run there); otherwise it runs in the
workspace with whatever configuration is in its home.
"""

from __future__ import annotations

import os
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

SECTION = "reasonix"
DEFAULTS: dict[str, Any] = {
    **ACP_SECTION_DEFAULTS,
    "command": ["reasonix", "acp"],
    # When set, the plugin writes Reasonix's provider configuration for this OpenAI-compatible endpoint.
    "provider_base_url": "",
    "provider_model": "",
    # "gateway": run in the agent's per-actor home (needed for provider_base_url);
    # "workspace": run in the workspace root, using the user's own reasonix.toml there.
    "process_dir": "gateway",
    "provider_api_key_env": "OPENAI_API_KEY",
}


def _validate(section: dict[str, Any]) -> list[tuple[str, str]]:
    problems = validate_section(section)
    if section["process_dir"] not in ("gateway", "workspace"):
        problems.append(("process_dir", 'must be "gateway" or "workspace"'))
    if section["provider_base_url"] and section["process_dir"] != "gateway":
        problems.append(("provider_base_url", 'needs process_dir = "gateway" (the plugin writes reasonix.toml there)'))
    return problems


def _toml_string(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def write_reasonix_toml(
    directory: Path, base_url: str, model: str, api_key_env: str, name: str = "reasonix.toml"
) -> None:
    text = (
        "# Written by agent-gateway from its [reasonix] section; edits are overwritten.\n"
        'default_model = "gateway"\n\n'
        "[[providers]]\n"
        'name = "gateway"\n'
        'kind = "openai"\n'
        f"base_url = {_toml_string(base_url)}\n"
        f"model = {_toml_string(model or 'default')}\n"
        f"api_key_env = {_toml_string(api_key_env)}\n"
    )
    # The folder is the agent's home: write through a rename, never through what it left there.
    write_home_file(directory / name, text)


@hookimpl
def config_sections(register: Callable[..., None]) -> None:
    register(SECTION, DEFAULTS, _validate, "Reasonix over ACP (`reasonix acp`).")


@hookimpl
def register_runtimes(register: Callable[[Any], None], config: Any) -> None:
    section = config.section(SECTION)
    if not section["enabled"]:
        return
    in_home = section["process_dir"] == "gateway"
    prepare = None
    env = {k: str(v) for k, v in section["env"].items()}
    network = []
    home_env: tuple[str, ...] = ()
    if section["provider_base_url"] and in_home:
        # The key variable must be set (Reasonix refuses a provider without it): keep the gateway's own.
        env.setdefault(section["provider_api_key_env"], os.environ.get(section["provider_api_key_env"], "unused"))
        # Reasonix looks for ./reasonix.toml in the session's directory (the workspace), not in its
        # process directory: the provider must be in the user-level config.toml to apply there. Each
        # actor has its own REASONIX_HOME (its sessions live there), so nothing crosses actors.
        home_env = ("REASONIX_HOME",)
        endpoint = endpoint_of_url(section["provider_base_url"])
        network = [endpoint] if endpoint else []

        def prepare(home: Path) -> None:
            provider = (section["provider_base_url"], section["provider_model"], section["provider_api_key_env"])
            write_reasonix_toml(home, *provider)
            write_reasonix_toml(home, *provider, name="config.toml")

    options = spec_options(section, default_model=section["provider_model"])
    options["network"] = [*network, *options["network"]]
    spec = AcpAgentSpec(
        agent_id="reasonix",
        display_name="Reasonix",
        provider="reasonix",
        env={"REASONIX_TELEMETRY": "off", **env},
        process_in_home=in_home,
        home_env=home_env,
        policy=RuntimePolicy(context_carrier="agent_session", load_session=True),
        prepare=prepare,
        # Reasonix replays its own host-generated context snapshot as a user message.
        replay_ignore_prefixes=("<session-context",),
        install_hint="install it with `npm install -g reasonix` or set [reasonix] command",
        **options,
    )
    register(AcpRuntime(spec))
