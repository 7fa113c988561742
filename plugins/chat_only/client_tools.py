"""Client tools and structured output for the chat-only runtime.

A protocol plugin (the OpenAI-compatible endpoints, AG-UI) puts what the client asked for in the
run's ``options.clientTools``, in the OpenAI chat shape:

- ``tools``, ``toolChoice``, ``parallelToolCalls``, ``responseFormat``: sent upstream as
  ``tools``, ``tool_choice``, ``parallel_tool_calls``, ``response_format``;
- ``messages``: the exchange after the user's message (assistant messages with ``tool_calls``
  and the client's ``tool`` results), sent after it.

The tool calls the upstream answers with are journalled as ``client_tool.requested``
(``{toolCallId, name, arguments}``), each result forwarded as ``client_tool.answered``
(``{toolCallId, content}``); the protocol plugin turns the former into the client's tool calls.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# What a forwarded tool result may hold in the journal (the upstream gets it whole).
JOURNAL_RESULT_LIMIT = 64_000
# Tool calls of one upstream answer kept at most (an upstream sending more is cut off).
MAX_CALLS = 128


@dataclass
class ClientTools:
    tools: list[dict[str, Any]] = field(default_factory=list)
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    response_format: dict[str, Any] | None = None
    messages: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def from_options(cls, options: dict[str, Any]) -> ClientTools | None:
        raw = options.get("clientTools")
        if not isinstance(raw, dict):
            return None
        tools = [t for t in raw.get("tools") or () if isinstance(t, dict)]
        parallel = raw.get("parallelToolCalls")
        response_format = raw.get("responseFormat")
        messages = [m for m in raw.get("messages") or () if isinstance(m, dict) and isinstance(m.get("role"), str)]
        return cls(
            tools=tools,
            tool_choice=raw.get("toolChoice"),
            parallel_tool_calls=parallel if isinstance(parallel, bool) else None,
            response_format=response_format if isinstance(response_format, dict) else None,
            messages=messages,
        )

    def request_fields(self) -> dict[str, Any]:
        """The upstream request's fields for them (none when the client sent none)."""
        fields: dict[str, Any] = {}
        if self.tools:
            fields["tools"] = self.tools
            if self.tool_choice is not None:
                fields["tool_choice"] = self.tool_choice
            if self.parallel_tool_calls is not None:
                fields["parallel_tool_calls"] = self.parallel_tool_calls
        if self.response_format is not None:
            fields["response_format"] = self.response_format
        return fields

    def results(self) -> list[dict[str, Any]]:
        """The ``client_tool.answered`` payloads of the forwarded tool results."""
        out = []
        for message in self.messages:
            if message["role"] != "tool":
                continue
            content = message.get("content")
            text = content if isinstance(content, str) else _parts_text(content)
            payload: dict[str, Any] = {"toolCallId": str(message.get("tool_call_id") or "")}
            payload["content"] = text[:JOURNAL_RESULT_LIMIT]
            if len(text) > JOURNAL_RESULT_LIMIT:
                payload["truncated"] = True
            out.append(payload)
        return out


def _parts_text(content: Any) -> str:
    if not isinstance(content, list):
        return "" if content is None else str(content)
    return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))


class ToolCallCollector:
    """Joins the ``delta.tool_calls`` pieces of a streamed chat completion into whole calls."""

    def __init__(self) -> None:
        self._calls: dict[int, dict[str, Any]] = {}

    def add(self, pieces: Any) -> None:
        if not isinstance(pieces, list):
            return
        for piece in pieces:
            if not isinstance(piece, dict):
                continue
            index = piece.get("index", len(self._calls))
            if not isinstance(index, int) or isinstance(index, bool):
                continue
            call = self._calls.get(index)
            if call is None:
                if len(self._calls) >= MAX_CALLS:
                    continue
                call = self._calls[index] = {"id": "", "name": "", "arguments": []}
            if isinstance(piece.get("id"), str) and piece["id"]:
                call["id"] = piece["id"]
            function = piece.get("function")
            if isinstance(function, dict):
                if isinstance(function.get("name"), str) and function["name"]:
                    call["name"] = function["name"]
                if isinstance(function.get("arguments"), str):
                    call["arguments"].append(function["arguments"])

    def calls(self) -> list[dict[str, Any]]:
        """The ``client_tool.requested`` payloads, in the upstream's order."""
        out = []
        for index in sorted(self._calls):
            call = self._calls[index]
            call_id = call["id"] or f"call_{index}"
            out.append({"toolCallId": call_id, "name": call["name"], "arguments": "".join(call["arguments"])})
        return out
