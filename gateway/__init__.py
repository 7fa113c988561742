"""Agent Gateway: a small aiohttp core between host applications and agent runtimes.

The public API for plugin authors is what this module exports (``__all__``); import it from
here, ``from agent_gateway import hookimpl, Runtime, Turn, TurnOutcome``. Every other module
(``agent_gateway.journal``, ``agent_gateway.runs``, …) is internal and may change between
releases. Names are resolved on first use, so ``import agent_gateway`` stays cheap for the small
processes that only need one part (the MCP stdio bridge, the fake upstream).
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# public name -> the internal module that defines it
_EXPORTS: dict[str, str] = {
    # hooks
    "hookimpl": "agent_gateway.hookspecs",
    "PROJECT_NAME": "agent_gateway.hookspecs",
    # runtimes
    "Runtime": "agent_gateway.runtime",
    "RuntimePolicy": "agent_gateway.runtime",
    "Turn": "agent_gateway.runtime",
    "TurnOutcome": "agent_gateway.runtime",
    "SessionPlan": "agent_gateway.runtime",
    "SessionStrategy": "agent_gateway.sessions",
    "TranscriptStrategy": "agent_gateway.sessions",
    "yield_slice": "agent_gateway.server.fairness",
    "WorkSlices": "agent_gateway.server.fairness",
    # the generic ACP runtime
    "AcpAgentSpec": "agent_gateway.acp.runtime",
    "AcpRuntime": "agent_gateway.acp.runtime",
    "AcpSessionStrategy": "agent_gateway.acp.runtime",
    # tools
    "Tool": "agent_gateway.tools",
    "ToolCall": "agent_gateway.tools",
    "ToolError": "agent_gateway.tools",
    # journal, storage, config, errors
    "Event": "agent_gateway.models",
    "Run": "agent_gateway.models",
    "Storage": "agent_gateway.storage",
    "Config": "agent_gateway.config",
    "ApiError": "agent_gateway.errors",
    "PluginError": "agent_gateway.errors",
    # the door plugin routes go through (register_routes)
    "PluginRoutes": "agent_gateway.plugin_routes",
    # routes declared once: validation and /openapi.json from the same models
    "Route": "agent_gateway.declare",
    "RouteResponse": "agent_gateway.declare",
    "NonBlankText": "agent_gateway.declare",
    "Identifier": "agent_gateway.declare",
    "refuse": "agent_gateway.declare",
    "json_path": "agent_gateway.declare",
    "VISIBLE": "agent_gateway.declare",
    # what gateway_startup / gateway_shutdown get
    "GatewayContext": "agent_gateway.lifecycle",
    # who is calling (the authenticate and authorize hooks)
    "Actor": "agent_gateway.auth",
    "bearer_token": "agent_gateway.auth",
    # helpers for runtime, tool and route plugins
    "ConversationPlan": "agent_gateway.affinity",
    "SHORT_REPLY_WARNING": "agent_gateway.sessions",
    "cold_resume_packet": "agent_gateway.sessions",
    "has_context": "agent_gateway.sessions",
    "is_bare_short_reply": "agent_gateway.sessions",
    "prompt_text": "agent_gateway.sessions",
    "ACP_SECTION_DEFAULTS": "agent_gateway.acp.runtime",
    "spec_options": "agent_gateway.acp.runtime",
    "validate_section": "agent_gateway.acp.runtime",
    "agent_environment": "agent_gateway.environment",
    "ProcessCapacity": "agent_gateway.capacity",
    "ProcessUse": "agent_gateway.capacity",
    "CapacityTimeout": "agent_gateway.capacity",
    "RunScope": "agent_gateway.tools",
    "validate_schema": "agent_gateway.tools",
    "PathError": "agent_gateway.paths",
    "ResolvedPath": "agent_gateway.paths",
    "allowed_roots_of": "agent_gateway.paths",
    "read_file_safely": "agent_gateway.paths",
    "read_file_versioned": "agent_gateway.paths",
    "resolve_path": "agent_gateway.paths",
    "write_file_atomically": "agent_gateway.paths",
    "now_ms": "agent_gateway.models",
    "RequestConflict": "agent_gateway.storage",
    "StorageUnavailable": "agent_gateway.storage",
    "read_json": "agent_gateway.errors",
    # several instances on one database (the cluster_coordinator hook)
    "Coordinator": "agent_gateway.cluster",
    "NotOwner": "agent_gateway.cluster",
    "ClusterInstance": "agent_gateway.cluster",
    # confining agent processes (the sandbox_agent hook)
    "AgentLaunch": "agent_gateway.sandbox",
    "SandboxedCommand": "agent_gateway.sandbox",
    "SandboxUnavailable": "agent_gateway.sandbox",
    "SandboxError": "agent_gateway.sandbox",
    "endpoint_of_url": "agent_gateway.sandbox",
    "write_home_file": "agent_gateway.sandbox",
    "program_paths": "agent_gateway.sandbox",
    "parse_endpoint": "agent_gateway.sandbox",
    # following runs in a tracing system (the trace_run hook)
    "RunTrace": "agent_gateway.telemetry",
    "ModelCallTrace": "agent_gateway.telemetry",
}

# public names that differ from the internal one
_RENAMED = {"ACP_SECTION_DEFAULTS": "SECTION_DEFAULTS"}

__all__ = [  # noqa: RUF022  (grouped as _EXPORTS is)
    "__version__",
    "hookimpl",
    "PROJECT_NAME",
    "Runtime",
    "RuntimePolicy",
    "Turn",
    "TurnOutcome",
    "SessionPlan",
    "SessionStrategy",
    "TranscriptStrategy",
    "yield_slice",
    "WorkSlices",
    "AcpAgentSpec",
    "AcpRuntime",
    "AcpSessionStrategy",
    "Tool",
    "ToolCall",
    "ToolError",
    "Event",
    "Run",
    "Storage",
    "Config",
    "ApiError",
    "PluginError",
    "PluginRoutes",
    "Route",
    "RouteResponse",
    "NonBlankText",
    "Identifier",
    "refuse",
    "json_path",
    "VISIBLE",
    "GatewayContext",
    "Actor",
    "bearer_token",
    "ConversationPlan",
    "SHORT_REPLY_WARNING",
    "cold_resume_packet",
    "has_context",
    "is_bare_short_reply",
    "prompt_text",
    "ACP_SECTION_DEFAULTS",
    "spec_options",
    "validate_section",
    "agent_environment",
    "ProcessCapacity",
    "ProcessUse",
    "CapacityTimeout",
    "RunScope",
    "validate_schema",
    "PathError",
    "ResolvedPath",
    "allowed_roots_of",
    "read_file_safely",
    "read_file_versioned",
    "resolve_path",
    "write_file_atomically",
    "now_ms",
    "RequestConflict",
    "StorageUnavailable",
    "read_json",
    "Coordinator",
    "NotOwner",
    "ClusterInstance",
    "AgentLaunch",
    "SandboxedCommand",
    "SandboxUnavailable",
    "SandboxError",
    "endpoint_of_url",
    "write_home_file",
    "program_paths",
    "parse_endpoint",
    "RunTrace",
    "ModelCallTrace",
]

if TYPE_CHECKING:  # what type checkers and editors see; at run time __getattr__ resolves them
    from agent_gateway.acp.runtime import SECTION_DEFAULTS as ACP_SECTION_DEFAULTS
    from agent_gateway.acp.runtime import AcpAgentSpec, AcpRuntime, AcpSessionStrategy, spec_options, validate_section
    from agent_gateway.affinity import ConversationPlan
    from agent_gateway.auth import Actor, bearer_token
    from agent_gateway.capacity import CapacityTimeout, ProcessCapacity, ProcessUse
    from agent_gateway.cluster import ClusterInstance, Coordinator, NotOwner
    from agent_gateway.config import Config
    from agent_gateway.declare import VISIBLE, Identifier, NonBlankText, Route, RouteResponse, json_path, refuse
    from agent_gateway.environment import agent_environment
    from agent_gateway.errors import ApiError, PluginError, read_json
    from agent_gateway.hookspecs import PROJECT_NAME, hookimpl
    from agent_gateway.lifecycle import GatewayContext
    from agent_gateway.models import Event, Run, now_ms
    from agent_gateway.paths import (
        PathError,
        ResolvedPath,
        allowed_roots_of,
        read_file_safely,
        read_file_versioned,
        resolve_path,
        write_file_atomically,
    )
    from agent_gateway.plugin_routes import PluginRoutes
    from agent_gateway.runtime import Runtime, RuntimePolicy, SessionPlan, Turn, TurnOutcome
    from agent_gateway.sandbox import (
        AgentLaunch,
        SandboxedCommand,
        SandboxError,
        SandboxUnavailable,
        endpoint_of_url,
        parse_endpoint,
        program_paths,
        write_home_file,
    )
    from agent_gateway.server.fairness import WorkSlices, yield_slice
    from agent_gateway.sessions import (
        SHORT_REPLY_WARNING,
        SessionStrategy,
        TranscriptStrategy,
        cold_resume_packet,
        has_context,
        is_bare_short_reply,
        prompt_text,
    )
    from agent_gateway.storage import RequestConflict, Storage, StorageUnavailable
    from agent_gateway.telemetry import ModelCallTrace, RunTrace
    from agent_gateway.tools import RunScope, Tool, ToolCall, ToolError, validate_schema


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'agent_gateway' has no attribute {name!r}")
    value = getattr(import_module(module), _RENAMED.get(name, name))
    globals()[name] = value  # resolve once
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
