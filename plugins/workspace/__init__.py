"""Built-in plugin: workspace tools for agents (entry point ``workspace = agent_gateway.plugins.workspace``).

Tools (all through the tool facade, so every call is path-checked, version-checked, vetoable and
receipted): ``workspace.read_current_page``, ``workspace.read_selection``,
``workspace.describe_roots``, ``workspace.read_file``, ``workspace.patch_file``,
``workspace.write_file``, ``workspace.write_receipt_note``. There is no shell tool: shell access
stays off (``[workspaces] allow_shell`` is not acted on by this plugin).

Configuration section ``[workspace_tools]``: ``enabled`` (register the tools at all),
``max_read_bytes`` (largest file read or patched), ``max_write_bytes`` (largest content written),
``max_edits`` (search/replace blocks per patch).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from agent_gateway import hookimpl

from .tools import CAP_NOTE, CAP_READ, CAP_WRITE, Settings, WorkspaceTools

SECTION = "workspace_tools"
DEFAULTS: dict[str, Any] = {
    "enabled": True,
    "max_read_bytes": 1_048_576,
    "max_write_bytes": 1_048_576,
    "max_edits": 100,
}

__all__ = ["CAP_NOTE", "CAP_READ", "CAP_WRITE", "DEFAULTS", "SECTION", "WorkspaceTools", "settings_from"]


def _validate(section: dict[str, Any]) -> list[tuple[str, str]]:
    return [
        (key, "must be positive") for key in ("max_read_bytes", "max_write_bytes", "max_edits") if section[key] <= 0
    ]


def settings_from(config: Any) -> tuple[bool, Settings]:
    values = dict(DEFAULTS)
    if config is not None and hasattr(config, "section"):
        values.update({k: v for k, v in config.section(SECTION).items() if k in DEFAULTS})
    settings = Settings(int(values["max_read_bytes"]), int(values["max_write_bytes"]), int(values["max_edits"]))
    return bool(values["enabled"]), settings


@hookimpl
def config_sections(register: Callable[..., None]) -> None:
    register(SECTION, dict(DEFAULTS), _validate, "Workspace tools for agents: on/off and size limits.")


@hookimpl
def register_tools(register: Callable[[Any], None], config: Any) -> None:
    enabled, settings = settings_from(config)
    if not enabled:
        return
    for tool in WorkspaceTools(settings).tools():
        register(tool)
