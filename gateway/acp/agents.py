"""ACP agents declared by configuration alone: one ``[acp_agents.<agent-id>]`` table each.

Every enabled table registers a generic :class:`AcpRuntime` under its own agent id and display
name; the core's built-in plugin does it (``agent_gateway.builtin``), so no Python plugin is
needed. The keys are the shared ACP section keys (:data:`SECTION_DEFAULTS`) plus the ones a
plugin would otherwise hard-code (:data:`TABLE_DEFAULTS`). See docs/acp-runtimes.md.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agent_gateway.acp.runtime import SECTION_DEFAULTS, AcpAgentSpec, AcpRuntime, spec_options, validate_section
from agent_gateway.config import Config, SectionSpec

SECTION = "acp_agents"
# Agent ids appear in URLs' JSON bodies and in preference keys (`ai.agent.<agentId>.<name>`):
# lower-case letters, digits, `-` and `_`.
AGENT_ID_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,63}$"

TABLE_DEFAULTS: dict[str, Any] = {
    **SECTION_DEFAULTS,
    # The agent's command line; the first word is looked up on the agent's PATH. Required.
    "command": [],
    # The name clients show. Empty: the agent id.
    "display_name": "",
    # Who provides the agent (the descriptor's `provider`). Empty: the agent id.
    "provider": "",
    # Where the agent process runs: "workspace" (the run's workspace root), "gateway" (the agent's
    # per-actor home, <data_dir>/agent-homes/<agent-id>/<actor>) or an absolute directory (shared
    # by every actor; bound read-write into the sandbox).
    "process_dir": "workspace",
    # The default of the agent's `model` field (sent as its `model` config option when it offers one).
    "model": "",
    # Replayed user messages starting with one of these are the agent's own context, not history.
    "replay_ignore_prefixes": [],
}


def validate_table(table: dict[str, Any]) -> list[tuple[str, str]]:
    """Problems of one ``[acp_agents.<agent-id>]`` table beyond key names and types."""
    problems = validate_section(table)
    process_dir = table["process_dir"]
    if process_dir not in ("workspace", "gateway") and not Path(process_dir).expanduser().is_absolute():
        problems.append(("process_dir", 'must be "workspace", "gateway" or an absolute directory'))
    if not all(isinstance(prefix, str) and prefix for prefix in table["replay_ignore_prefixes"]):
        problems.append(("replay_ignore_prefixes", "must be a list of non-empty strings"))
    return problems


SECTION_SPEC = SectionSpec(
    SECTION,
    TABLE_DEFAULTS,
    validate_table,
    "ACP agents declared by configuration: one [acp_agents.<agent-id>] table per agent.",
    tables=True,
    table_id=AGENT_ID_PATTERN,
)


def configured_runtimes(config: Config) -> list[AcpRuntime]:
    """One :class:`AcpRuntime` per enabled table, in the file's order."""
    runtimes = []
    for agent_id, table in config.section(SECTION).items():
        if not table["enabled"]:
            continue
        process_dir: Path | None = None
        if table["process_dir"] not in ("workspace", "gateway"):
            process_dir = Path(table["process_dir"]).expanduser()
        spec = AcpAgentSpec(
            agent_id=agent_id,
            display_name=table["display_name"] or agent_id,
            provider=table["provider"] or agent_id,
            env={name: str(value) for name, value in table["env"].items()},
            process_dir=process_dir,
            process_in_home=table["process_dir"] == "gateway",
            replay_ignore_prefixes=tuple(table["replay_ignore_prefixes"]),
            install_hint=f"install it, or set [{SECTION}.{agent_id}] command to its full path",
            **spec_options(table, default_model=table["model"]),
        )
        runtimes.append(AcpRuntime(spec))
    return runtimes
