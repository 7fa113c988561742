"""The one SSE reader of the test helpers: an incremental parser of ``text/event-stream`` bytes
into :class:`~agent_gateway.testing.sse.SseEvent` frames, used by the synchronous
:class:`~agent_gateway.testing.client.GatewayClient` and, through :func:`sse_events`, by async
tests reading an aiohttp response.

Fields ``id:``, ``event:`` and ``data:`` (several ``data:`` lines join with newlines); a blank
line ends a frame; ``:`` lines (heartbeats, comments) are skipped; ``data`` is decoded JSON when it
parses, else kept as text.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import aiohttp

__all__ = ["SseEvent", "SseParser", "sse_events"]

TERMINAL_KINDS = frozenset({"run.completed", "run.failed", "run.cancelled", "run.interrupted"})


@dataclass(frozen=True)
class SseEvent:
    """One SSE frame of a run's stream: ``id:`` (the event's seq), ``event:`` (its kind) and
    ``data:`` (the event's wire JSON, decoded: ``hostRunId``, ``seq``, ``kind``, ``source``,
    ``payload``, ``createdAt``)."""

    id: str | None
    event: str
    data: Any

    @property
    def payload(self) -> dict[str, Any]:
        """The payload the runtime (or the gateway) emitted."""
        if isinstance(self.data, dict) and isinstance(self.data.get("payload"), dict):
            return self.data["payload"]
        return {}

    @property
    def source(self) -> str | None:
        """Who emitted it: the runtime's agent id, ``gateway``, or ``adapter_replay``."""
        return self.data.get("source") if isinstance(self.data, dict) else None

    @property
    def seq(self) -> int:
        return int(self.id or 0)

    @property
    def is_terminal(self) -> bool:
        return self.event in TERMINAL_KINDS


class SseParser:
    """Feed bytes as they arrive (any split); get the frames they complete."""

    def __init__(self) -> None:
        self._pending = b""
        self._id: str | None = None
        self._kind = "message"
        self._data: list[str] = []

    def feed(self, chunk: bytes) -> list[SseEvent]:
        self._pending += chunk
        out: list[SseEvent] = []
        while True:
            line, sep, rest = self._pending.partition(b"\n")
            if not sep:
                return out
            self._pending = rest
            event = self.feed_line(line)
            if event is not None:
                out.append(event)

    def feed_line(self, raw: bytes) -> SseEvent | None:
        """One line (with or without its line break); the frame it ends, if any."""
        line = raw.decode("utf-8").rstrip("\r\n")
        if not line:
            event = None
            if self._data:
                text = "\n".join(self._data)
                try:
                    value: Any = json.loads(text)
                except ValueError:
                    value = text
                event = SseEvent(self._id, self._kind, value)
            self._id, self._kind, self._data = None, "message", []
            return event
        if line.startswith(":"):
            return None
        name, _, value_text = line.partition(":")
        value_text = value_text.removeprefix(" ")
        if name == "id":
            self._id = value_text
        elif name == "event":
            self._kind = value_text
        elif name == "data":
            self._data.append(value_text)
        return None


async def sse_events(response: aiohttp.ClientResponse) -> AsyncIterator[SseEvent]:
    """The frames of an aiohttp response, until the server closes the stream."""
    parser = SseParser()
    async for raw in response.content:
        event = parser.feed_line(raw)
        if event is not None:
            yield event
