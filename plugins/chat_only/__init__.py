"""Chat-only runtime: any OpenAI-compatible `/v1/chat/completions` upstream, with streaming.

The agent keeps no session: the gateway rebuilds the context from its own transcript each turn.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from agent_gateway import hookimpl

from .runtime import ChatOnlyRuntime

SECTION = "chat_only"
DEFAULTS: dict[str, Any] = {
    "enabled": True,
    "base_url": "",
    "api_key": "",
    "model": "",
    "system_prompt": "You are a helpful assistant inside a host application.",
    "connect_timeout_seconds": 10.0,
    "idle_timeout_seconds": 120.0,
    "max_history_turns": 20,
    "max_history_chars": 64_000,
}


def _validate(section: dict[str, Any]) -> list[tuple[str, str]]:
    problems = []
    url = section["base_url"]
    if url and not url.startswith(("http://", "https://")):
        problems.append(("base_url", "must start with http:// or https://"))
    for key in ("connect_timeout_seconds", "idle_timeout_seconds", "max_history_turns", "max_history_chars"):
        if section[key] <= 0:
            problems.append((key, "must be positive"))
    return problems


@hookimpl
def config_sections(register: Callable[..., None]) -> None:
    register(SECTION, DEFAULTS, _validate, "Chat-only runtime: an OpenAI-compatible upstream.")


@hookimpl
def register_runtimes(register: Callable[[Any], None], config: Any) -> None:
    section = config.section(SECTION)
    if not section["enabled"]:
        return
    register(
        ChatOnlyRuntime(
            base_url=section["base_url"] or os.environ.get("OPENAI_BASE_URL", ""),
            api_key=section["api_key"] or os.environ.get("OPENAI_API_KEY", ""),
            model=section["model"] or os.environ.get("OPENAI_MODEL", ""),
            system_prompt=section["system_prompt"],
            connect_timeout=float(section["connect_timeout_seconds"]),
            idle_timeout=float(section["idle_timeout_seconds"]),
            max_history_turns=int(section["max_history_turns"]),
            max_history_chars=int(section["max_history_chars"]),
        )
    )
