"""An example third-party runtime plugin for Agent Gateway.

It provides one runtime, ``example-upper``, that answers every message with the message itself
upper-cased (after an optional ``prefix``), streamed as ``message.delta`` chunks and closed with a
``message.completed``. It needs no upstream, no API key and no agent process, which makes it a
readable template: copy this package, replace :meth:`UpperRuntime.run_turn` with calls to your
agent, and keep the rest.

The gateway finds it through the ``agent_gateway`` entry point declared in this distribution's
``setup.cfg``; see ``docs/writing-a-runtime-plugin.md`` in the gateway repository.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

from agent_gateway import Config, RuntimePolicy, Turn, TurnOutcome, hookimpl

__version__ = "0.1.0"

SECTION = "example_upper"
DEFAULTS: dict[str, Any] = {
    # Register the runtime at all.
    "enabled": True,
    # Text put in front of every reply.
    "prefix": "",
    # Characters per message.delta event.
    "chunk_size": 4,
    # Seconds to wait after each chunk (0: none), as a real agent's output arrives over time.
    "delay": 0.0,
}


class UpperRuntime:
    """The runtime object the gateway drives: an id, a policy, ``describe()``, ``run_turn()``,
    ``close()`` (the ``agent_gateway.Runtime`` protocol)."""

    agent_id = "example-upper"
    display_name = "Example: upper-case echo"
    provider = "example"

    def __init__(self, prefix: str = "", chunk_size: int = 4, delay: float = 0.0) -> None:
        self.prefix = prefix
        self.chunk_size = chunk_size
        self.delay = delay
        # The agent keeps no memory: the gateway's transcript is the only context there is.
        self.policy = RuntimePolicy(context_carrier="transcript_rebuild")

    def describe(self) -> dict[str, Any]:
        return {
            "capabilities": ["chat"],
            "availability": {"available": True},
            "fields": [{"key": "prefix", "label": "Prefix", "kind": "string", "default": self.prefix}],
        }

    async def run_turn(self, turn: Turn) -> TurnOutcome:
        text = self.prefix + turn.message.upper()
        for start in range(0, len(text), self.chunk_size):
            if turn.cancel_requested.is_set():
                return TurnOutcome("cancelled", "cancelled by the client")
            await turn.emit("message.delta", {"text": text[start : start + self.chunk_size]})
            if self.delay:
                # Pace the output; a cancel ends the wait at once.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(turn.cancel_requested.wait(), self.delay)
        await turn.emit("message.completed", {"text": text})
        return TurnOutcome("completed")

    async def close(self) -> None:
        """Nothing to release: no process, no connection."""


def _validate(section: dict[str, Any]) -> list[tuple[str, str]]:
    problems = []
    if section["chunk_size"] <= 0:
        problems.append(("chunk_size", "must be positive"))
    if section["delay"] < 0:
        problems.append(("delay", "must not be negative"))
    return problems


@hookimpl
def config_sections(register: Callable[..., None]) -> None:
    register(SECTION, DEFAULTS, _validate, "Example runtime: echoes the message upper-cased.")


@hookimpl
def register_runtimes(register: Callable[[Any], None], config: Config) -> None:
    section = config.section(SECTION)
    if section["enabled"]:
        register(UpperRuntime(section["prefix"], int(section["chunk_size"]), float(section["delay"])))
