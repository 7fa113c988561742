"""OpenAI-compatible endpoints (entry point ``openai_compat = agent_gateway.plugins.openai_compat``).

``GET /v1/models`` lists the agents; ``POST /v1/chat/completions`` and ``POST /v1/responses``
(with ``GET /v1/responses/{id}``, resumable with ``?stream=true&starting_after=N``, and
``POST /v1/responses/{id}/cancel``) run them, so the official ``openai`` SDKs work against the
gateway with ``base_url``. Built only on the public hooks: ``register_routes`` and
:class:`agent_gateway.PluginRoutes`. See docs/openai-compatible.md.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from agent_gateway import hookimpl

if TYPE_CHECKING:
    from agent_gateway import PluginRoutes

SECTION = "openai_compat"
REASONING_CHOICES = ("omit", "reasoning_content")
CLIENT_TOOLS_CHOICES = ("reject", "ignore")
# client_tools: what a request with `tools` / `response_format` for an agent that cannot take
# them gets: a 400 `tools_not_supported`, or a run without them (the answer says what it ignored).
DEFAULTS: dict[str, Any] = {"enabled": True, "reasoning": "omit", "client_tools": "reject"}


def _validate(section: dict[str, Any]) -> list[tuple[str, str]]:
    problems = []
    if section["reasoning"] not in REASONING_CHOICES:
        problems.append(("reasoning", f"must be one of {', '.join(repr(c) for c in REASONING_CHOICES)}"))
    if section["client_tools"] not in CLIENT_TOOLS_CHOICES:
        problems.append(("client_tools", f"must be one of {', '.join(repr(c) for c in CLIENT_TOOLS_CHOICES)}"))
    return problems


@hookimpl
def config_sections(register: Callable[..., None]) -> None:
    register(SECTION, DEFAULTS, _validate, "OpenAI-compatible endpoints (/v1/chat/completions, /v1/responses).")


@hookimpl
def register_routes(routes: PluginRoutes) -> None:
    section = routes.config.section(SECTION)
    if not section["enabled"]:
        return
    from .routes import setup

    setup(routes, reasoning=section["reasoning"] == "reasoning_content", client_tools=section["client_tools"])
