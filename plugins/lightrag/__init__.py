"""Built-in plugin: the knowledge facade over a LightRAG server (entry point ``lightrag``).

Tools (through the tool facade, so every runtime reaches them through the one MCP surface, each
call receipted): ``knowledge_rag.status``, ``knowledge_rag.query``, ``knowledge_rag.open_reference``
(capability ``knowledge_rag``). HTTP routes for hosts (``register_routes`` hook, each an
``agent_gateway.Route`` declared in ``declared.py``, from which ``/openapi.json`` lists it):
``/v1/knowledge/status``, ``/query``, ``/open_reference``, ``/documents`` (add, list, delete),
``/documents/track/{trackId}``. Settings fields (``register_setting_fields`` hook):
``ai.common.knowledge_rag.mode``, ``ai.common.knowledge_rag.topK``.

Configuration section ``[lightrag]``: ``enabled``, ``url`` (the LightRAG server, e.g.
``http://127.0.0.1:9621``; empty: the tools answer "not configured"), ``api_key`` (sent as
``X-API-Key``; empty: the environment variable named by ``api_key_env``), ``timeout_seconds`` (per
provider call), ``connect_timeout_seconds``, ``mode`` (default query mode), ``top_k`` (0: the
provider's default), ``citation_url`` (template of a citation link with ``{workspace}``, ``{path}``,
``{fragment}``; never a ``file://`` URL), ``max_document_bytes``, ``max_references``.
See docs/knowledge.md.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from agent_gateway import PluginRoutes, hookimpl

from .service import MODES, KnowledgeService, Settings, workspace_url_problems
from .tools import CAP_KNOWLEDGE, KnowledgeTools

if TYPE_CHECKING:
    from agent_gateway import Config, Tool

SECTION = "lightrag"
STATUS_TOOL = "knowledge_rag.status"
DEFAULTS: dict[str, Any] = {
    "enabled": True,
    "url": "",
    "api_key": "",
    "api_key_env": "LIGHTRAG_API_KEY",
    "timeout_seconds": 60.0,
    "connect_timeout_seconds": 5.0,
    "mode": "mix",
    "top_k": 0,
    "citation_url": "agent-gateway://workspace/{workspace}/{path}{fragment}",
    "max_document_bytes": 5 * 1024 * 1024,
    "max_references": 20,
    "workspace_urls": {},
}

__all__ = ["CAP_KNOWLEDGE", "DEFAULTS", "SECTION", "KnowledgeService", "service_of", "settings_from"]


def _validate(section: dict[str, Any]) -> list[tuple[str, str]]:
    problems = []
    url = section["url"]
    if url and not url.startswith(("http://", "https://")):
        problems.append(("url", "must start with http:// or https://"))
    if section["mode"] not in MODES:
        problems.append(("mode", f"must be one of {', '.join(MODES)}"))
    template = section["citation_url"]
    if "{path}" not in template:
        problems.append(("citation_url", "must contain {path}"))
    if template.lower().startswith("file:"):
        problems.append(("citation_url", "must not be a file:// URL (citations never point at local files)"))
    if url and template.startswith(url.rstrip("/")):
        problems.append(("citation_url", "must not point at the provider (its URL is never given to clients)"))
    for key in ("timeout_seconds", "connect_timeout_seconds", "max_document_bytes", "max_references"):
        if section[key] <= 0:
            problems.append((key, "must be positive"))
    if section["top_k"] < 0:
        problems.append(("top_k", "must be 0 (provider default) or positive"))
    problems.extend(workspace_url_problems(section["workspace_urls"], template))
    return problems


def settings_from(config: Config | None) -> tuple[bool, Settings]:
    values = dict(DEFAULTS)
    if config is not None and hasattr(config, "section"):
        values.update({k: v for k, v in config.section(SECTION).items() if k in DEFAULTS})
    api_key = values["api_key"] or os.environ.get(values["api_key_env"] or "", "")
    settings = Settings(
        url=str(values["url"]).rstrip("/"),
        api_key=api_key,
        timeout=float(values["timeout_seconds"]),
        connect_timeout=float(values["connect_timeout_seconds"]),
        mode=str(values["mode"]),
        top_k=int(values["top_k"]),
        citation_url=str(values["citation_url"]),
        max_document_bytes=int(values["max_document_bytes"]),
        max_references=int(values["max_references"]),
        workspace_urls={str(k): str(v).rstrip("/") for k, v in dict(values["workspace_urls"]).items()},
    )
    return bool(values["enabled"]), settings


def service_of(source: PluginRoutes | Any) -> KnowledgeService | None:
    """The service behind the registered knowledge tools (None when the plugin is off).
    ``source`` is the :class:`agent_gateway.PluginRoutes` of ``register_routes``, or anything
    holding the tool facade as ``.tools`` (tests pass the gateway)."""
    if isinstance(source, PluginRoutes):
        tool = source.tool(STATUS_TOOL)
    else:
        tools = getattr(source, "tools", None)
        tool = tools.tools.get(STATUS_TOOL) if tools is not None else None
    owner = getattr(getattr(tool, "handler", None), "__self__", None)
    return owner.service if isinstance(owner, KnowledgeTools) else None


@hookimpl
def config_sections(register: Callable[..., None]) -> None:
    register(SECTION, dict(DEFAULTS), _validate, "Knowledge facade over a LightRAG server.")


@hookimpl
def register_tools(register: Callable[[Tool], None], config: Config) -> None:
    enabled, settings = settings_from(config)
    if not enabled:
        return
    for tool in KnowledgeTools(KnowledgeService(settings)).tools():
        register(tool)


@hookimpl
def register_setting_fields(register: Callable[[dict[str, Any]], None], config: Config) -> None:
    enabled, settings = settings_from(config)
    if not enabled:
        return
    register(
        {
            "key": "ai.common.knowledge_rag.mode",
            "label": "Knowledge query mode",
            "kind": "select",
            "options": list(MODES),
            "default": settings.mode,
            "capabilityIds": [CAP_KNOWLEDGE],
            "description": "LightRAG retrieval mode used when an agent does not choose one.",
        }
    )
    register(
        {
            "key": "ai.common.knowledge_rag.topK",
            "label": "Knowledge results (top k)",
            "kind": "integer",
            "default": settings.top_k,
            "capabilityIds": [CAP_KNOWLEDGE],
            "description": "How many entities/chunks the provider retrieves; 0 uses its default.",
        }
    )


@hookimpl
def register_routes(routes: PluginRoutes) -> None:
    service = service_of(routes)
    if service is None:
        return
    from . import routes as knowledge_routes

    service.preferences = routes.preferences  # the tools read the actor's knowledge preferences
    knowledge_routes.setup(routes, service)
    routes.on_shutdown(service.close)
