"""Pi-lab runtime plugin (agent id ``pi-lab``; entry point ``pi_lab = agent_gateway.plugins.pi_lab``).

Hosts ``pi --mode rpc`` (``@earendil-works/pi-coding-agent`` 1.x on Node ≥ 22), confined by the
gateway's sandbox like every agent, with one home per actor (``<data_dir>/agent-homes/pi-lab/<actor>``)
holding its agent directory (``agent/``: ``models.json``, ``mcp.json``) and a session directory
per workspace (``sessions/<workspace>``), never Pi's global ones. Pi runs with no built-in tools,
no extensions but MCP, no context files and no project trust: the only tools it sees are the
gateway's, through MCP. See docs/pi-lab.md.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent_gateway import hookimpl, parse_endpoint

from .runtime import AGENT_ID, PiRuntime, PiSessionStrategy, PiSettings

if TYPE_CHECKING:
    from agent_gateway import PluginRoutes

SECTION = "pi_lab"
DEFAULTS: dict[str, Any] = {
    "enabled": True,
    "command": ["pi"],
    "env": {},
    "inherit_env": False,
    "provider_base_url": "",
    "provider_model": "",
    "provider_api_key": "",
    "idle_seconds": 900.0,
    "max_processes": 4,
    "max_processes_per_actor": 2,
    "process_wait_seconds": 300.0,
    "extra_args": [],
    "mcp_servers": {},
    # host:port endpoints Pi may reach from its sandbox besides its model endpoint and the MCP surface.
    "network": [],
    # More paths Pi may read inside its sandbox (its install is found from `command`).
    "sandbox_read_only": [],
}

__all__ = ["AGENT_ID", "DEFAULTS", "SECTION", "PiRuntime", "PiSessionStrategy", "PiSettings", "settings_from"]


def _validate(section: dict[str, Any]) -> list[tuple[str, str]]:
    problems = []
    if not section["command"] or not all(isinstance(p, str) for p in section["command"]):
        problems.append(("command", "must be a non-empty list of strings"))
    if not all(isinstance(p, str) for p in section["extra_args"]):
        problems.append(("extra_args", "must be a list of strings"))
    if section["idle_seconds"] <= 0:
        problems.append(("idle_seconds", "must be positive"))
    if section["max_processes"] < 1:
        problems.append(("max_processes", "must be at least 1"))
    if section["max_processes_per_actor"] < 0:
        problems.append(("max_processes_per_actor", "must be 0 (no per-actor limit) or more"))
    if section["process_wait_seconds"] <= 0:
        problems.append(("process_wait_seconds", "must be positive"))
    for index, endpoint in enumerate(section["network"]):
        try:
            parse_endpoint(str(endpoint))
        except ValueError as exc:
            problems.append((f"network[{index}]", str(exc)))
    if not all(isinstance(p, str) and os.path.isabs(os.path.expanduser(p)) for p in section["sandbox_read_only"]):
        problems.append(("sandbox_read_only", "must be a list of absolute paths"))
    for name, entry in section["mcp_servers"].items():
        if not isinstance(entry, dict) or not (entry.get("command") or entry.get("url")):
            problems.append((f"mcp_servers.{name}", "must be a table with `command` or `url` (Pi's mcp.json format)"))
    return problems


def settings_from(config: Any) -> PiSettings:
    section = config.section(SECTION)
    return PiSettings(
        command=list(section["command"]),
        env={k: str(v) for k, v in section["env"].items()},
        inherit_env=bool(section["inherit_env"]),
        root=config.data_dir / "runtimes" / "pi",
        provider_base_url=section["provider_base_url"],
        provider_model=section["provider_model"],
        provider_api_key=section["provider_api_key"],
        idle_seconds=float(section["idle_seconds"]),
        extra_args=list(section["extra_args"]),
        max_processes=int(section["max_processes"]),
        max_processes_per_actor=int(section["max_processes_per_actor"]),
        process_wait_seconds=float(section["process_wait_seconds"]),
        mcp_servers=dict(section["mcp_servers"]),
        network=[parse_endpoint(str(e)) for e in section["network"]],
        read_only=[Path(os.path.expanduser(p)) for p in section["sandbox_read_only"]],
    )


@hookimpl
def config_sections(register: Callable[..., None]) -> None:
    register(SECTION, DEFAULTS, _validate, "Pi over its RPC mode (`pi --mode rpc`).")


@hookimpl
def register_runtimes(register: Callable[[Any], None], config: Any) -> None:
    if not config.section(SECTION)["enabled"]:
        return
    # models.json is written into each actor's own agent directory when its first process starts.
    register(PiRuntime(settings_from(config)))


@hookimpl
def register_routes(routes: PluginRoutes) -> None:
    from .routes import setup

    setup(routes)
