"""The core's own defaults, registered as the `core` plugin and overridable (trylast): the
session strategy, the projections, the ACP agents declared by `[acp_agents.<agent-id>]`
configuration tables, and the static `[auth] tokens` authenticator."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from agent_gateway import sandbox
from agent_gateway.acp import agents as acp_agents
from agent_gateway.auth import AUTH_KEY, Actor
from agent_gateway.hookspecs import hookimpl
from agent_gateway.models import Event, now_ms
from agent_gateway.sessions import TranscriptStrategy
from agent_gateway.transcript import transcript_projection


def ui_projection(event: Event) -> dict[str, Any]:
    """The default projection: the journal event as it is (`gateway.run_event.v1`)."""
    return event.to_wire()


def openai_chunk_projection(event: Event) -> dict[str, Any] | None:
    """Text as OpenAI `chat.completion.chunk` objects, for clients that only speak that."""
    if event.kind == "message.delta":
        delta: dict[str, Any] = {"content": event.payload.get("text", "")}
        finish = None
    elif event.kind == "thought.delta":
        delta = {"reasoning_content": event.payload.get("text", "")}
        finish = None
    elif event.is_terminal:
        delta, finish = {}, ("stop" if event.kind == "run.completed" else "error")
    else:
        return None
    return {
        "id": event.host_run_id,
        "object": "chat.completion.chunk",
        "created": (event.created_at or now_ms()) // 1000,
        "model": "agent-gateway",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


@hookimpl(trylast=True)
def session_strategy(runtime: Any, config: Any) -> Any:
    """The runtime's own strategy when it carries one (``runtime.session_strategy``), else the
    gateway transcript (`new_session`, then `cold_resumed`)."""
    return getattr(runtime, "session_strategy", None) or TranscriptStrategy()


@hookimpl(trylast=True)
def config_sections(register: Callable[..., None]) -> None:
    spec = acp_agents.SECTION_SPEC
    register(spec.name, spec.defaults, spec.validate, spec.doc, tables=True, table_id=spec.table_id)
    register(
        sandbox.SECTION,
        sandbox.SECTION_DEFAULTS,
        sandbox.validate_section,
        "How agent processes are confined (the sandbox_agent hook; bubblewrap built in).",
    )


@hookimpl(trylast=True)
def register_runtimes(register: Callable[[Any], None], config: Any) -> None:
    """A generic ACP runtime for every enabled `[acp_agents.<agent-id>]` table."""
    for runtime in acp_agents.configured_runtimes(config):
        register(runtime)


@hookimpl(trylast=True)
def authenticate(request: Any) -> Actor | None:
    """The actor of a configured `[auth] tokens` bearer token (tried after every plugin)."""
    return request.config_dict[AUTH_KEY].static_token_actor(request)


@hookimpl
def authentication_enabled(config: Any) -> bool:
    """The static tokens are in use when `[auth] tokens` lists any."""
    return bool(config.tokens)


@hookimpl(trylast=True)
def register_projections(register: Callable[[str, Callable[[Event], Any]], None]) -> None:
    register("ui", ui_projection)
    register("openai", openai_chunk_projection)
    register("transcript", transcript_projection)
