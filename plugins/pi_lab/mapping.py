"""Pi RPC events → gateway events.

- ``message_update`` ``text_delta`` → ``message.delta`` ``{text, contentIndex}``
- ``message_update`` ``thinking_delta`` → ``thought.delta`` ``{text, contentIndex}``
- ``message_update`` ``toolcall_start`` → ``tool.started`` ``{toolCallId, tool, status: pending}``
- ``message_update`` ``toolcall_end`` → ``tool.updated`` ``{toolCallId, tool, arguments, status: pending}``
- ``tool_execution_start`` / ``tool_execution_update`` → ``tool.updated``
  ``{toolCallId, tool, arguments, status: in_progress, partialResult?}``
- ``tool_execution_end`` → ``tool.completed``
  ``{toolCallId, tool, status: completed|failed, result, isError, durationMs}``
- ``message_end`` (assistant) → ``message.completed`` ``{text}`` and ``usage.updated`` (the run's
  token totals so far: ``{inputTokens, outputTokens, totalTokens, cachedReadTokens,
  cachedWriteTokens, cost: {amount, currency}, model}``)
- ``agent_settled`` → the run ends (``aborted`` → cancelled; a model error left standing → failed)
- retries, compaction, queue updates, anything unknown → ``agent.update`` ``{raw}``

Streaming scaffolding the table already covers is consumed on purpose and not journalled:
``agent_start``, ``turn_start``/``turn_end``, ``agent_end`` (whose ``messages`` repeat the run),
``message_start``, ``message_end`` of system/user/toolResult messages, and the ``*_start``,
``*_end``, ``toolcall_delta`` parts of ``message_update``.
"""

from __future__ import annotations

from typing import Any

RESULT_CHARS = 4000
# The run's token totals, in the journal's `usage.updated` names.
USAGE_FIELDS = ("inputTokens", "outputTokens", "totalTokens", "cachedReadTokens", "cachedWriteTokens")
RAW_CHARS = 20_000

SILENT = frozenset({"agent_start", "turn_start", "turn_end", "agent_end", "message_start", "response"})
SILENT_UPDATES = frozenset(
    {"start", "text_start", "text_end", "thinking_start", "thinking_end", "toolcall_delta", "done"}
)


def content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            str(part.get("text", "")) for part in content if isinstance(part, dict) and part.get("type") == "text"
        )
    return ""


def _cap(text: str, limit: int = RESULT_CHARS) -> str:
    return text if len(text) <= limit else text[:limit] + f"…({len(text)} chars)"


def _tokens(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _raw(record: dict[str, Any]) -> dict[str, Any]:
    import json

    blob = json.dumps(record, ensure_ascii=False, default=str)
    if len(blob) <= RAW_CHARS:
        return {"raw": record}
    return {"raw": {"type": record.get("type")}, "truncated": True, "rawHead": blob[:RAW_CHARS]}


class EventMapper:
    """Maps the records of one gateway run; remembers how the run is ending."""

    def __init__(self) -> None:
        self.error: str | None = None
        self.aborted = False
        self.settled = False
        self.started_tools: set[str] = set()
        self.tool_names: dict[str, str] = {}
        self.usage = dict.fromkeys(USAGE_FIELDS, 0)
        self.cost = 0.0

    def map(self, record: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
        kind = record.get("type")
        if kind == "message_update":
            return self._update(record)
        if kind == "message_end":
            return self._message_end(record.get("message") or {})
        if kind == "tool_execution_start":
            return self._tool(record, "in_progress")
        if kind == "tool_execution_update":
            return self._tool(record, "in_progress", partial=True)
        if kind == "tool_execution_end":
            return self._tool_end(record)
        if kind == "agent_settled":
            self.settled = True
            self.aborted = self.aborted or bool(record.get("aborted"))
            return []
        if kind == "auto_retry_start":
            # Pi retries on its own: the run goes on until agent_settled; an earlier error is moot
            # unless the retries fail too (auto_retry_end success: false).
            self.error = None
            return [("agent.update", _raw(record))]
        if kind == "auto_retry_end":
            if not record.get("success"):
                self.error = str(record.get("finalError") or self.error or "Pi's automatic retries failed")
            return [("agent.update", _raw(record))]
        if kind in SILENT:
            if kind == "response" and not record.get("success", True):
                return [("agent.update", _raw(record))]
            return []
        return [("agent.update", _raw(record))]

    def _update(self, record: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
        event = record.get("assistantMessageEvent") or {}
        sub = event.get("type")
        if sub == "text_delta":
            return [("message.delta", {"text": str(event.get("delta", "")), "contentIndex": event.get("contentIndex")})]
        if sub == "thinking_delta":
            return [("thought.delta", {"text": str(event.get("delta", "")), "contentIndex": event.get("contentIndex")})]
        if sub == "toolcall_start":
            call_id = str(event.get("id") or "")
            name = str(event.get("toolName") or "")
            self.started_tools.add(call_id)
            self.tool_names[call_id] = name
            return [("tool.started", {"toolCallId": call_id, "tool": name, "title": name, "status": "pending"})]
        if sub == "toolcall_end":
            call = event.get("toolCall") or {}
            call_id = str(call.get("id") or "")
            name = str(call.get("name") or self.tool_names.get(call_id, ""))
            out = self._ensure_started(call_id, name)
            out.append(
                (
                    "tool.updated",
                    {"toolCallId": call_id, "tool": name, "arguments": call.get("arguments"), "status": "pending"},
                )
            )
            return out
        if sub == "error":
            self.error = str(event.get("error") or event.get("reason") or "the model stream failed")
            return [("agent.update", _raw(record))]
        if sub in SILENT_UPDATES:
            return []
        return [("agent.update", _raw(record))]

    def _ensure_started(self, call_id: str, name: str) -> list[tuple[str, dict[str, Any]]]:
        if call_id in self.started_tools:
            return []
        self.started_tools.add(call_id)
        self.tool_names[call_id] = name
        return [("tool.started", {"toolCallId": call_id, "tool": name, "title": name, "status": "pending"})]

    def _tool(self, record: dict[str, Any], status: str, partial: bool = False) -> list[tuple[str, dict[str, Any]]]:
        call_id = str(record.get("toolCallId") or "")
        name = str(record.get("toolName") or self.tool_names.get(call_id, ""))
        out = self._ensure_started(call_id, name)
        payload: dict[str, Any] = {
            "toolCallId": call_id,
            "tool": name,
            "arguments": record.get("args"),
            "status": status,
        }
        if partial:
            result = record.get("partialResult") or {}
            payload["partialResult"] = _cap(content_text(result.get("content")) if isinstance(result, dict) else "")
        out.append(("tool.updated", payload))
        return out

    def _tool_end(self, record: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
        call_id = str(record.get("toolCallId") or "")
        name = str(record.get("toolName") or self.tool_names.get(call_id, ""))
        out = self._ensure_started(call_id, name)
        result = record.get("result") or {}
        is_error = bool(record.get("isError"))
        payload: dict[str, Any] = {
            "toolCallId": call_id,
            "tool": name,
            "status": "failed" if is_error else "completed",
            "isError": is_error,
            "result": _cap(content_text(result.get("content")) if isinstance(result, dict) else str(result)),
        }
        if isinstance(result, dict) and isinstance(result.get("details"), dict) and result["details"]:
            payload["details"] = {k: v for k, v in list(result["details"].items())[:20] if isinstance(k, str)}
        if record.get("durationMs") is not None:
            payload["durationMs"] = record.get("durationMs")
        out.append(("tool.completed", payload))
        return out

    def _message_end(self, message: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
        if message.get("role") != "assistant":
            return []
        out: list[tuple[str, dict[str, Any]]] = []
        stop = message.get("stopReason")
        if stop == "error":
            self.error = str(message.get("errorMessage") or "the model call failed")
        elif stop == "aborted":
            self.aborted = True
        else:
            self.error = None
        text = content_text(message.get("content"))
        if text:
            out.append(("message.completed", {"text": text, "stopReason": stop}))
        usage = message.get("usage")
        if isinstance(usage, dict) and usage:
            out.append(("usage.updated", self._add_usage(usage, message.get("model"))))
        return out

    def _add_usage(self, usage: dict[str, Any], model: Any) -> dict[str, Any]:
        """The run's totals so far, in the journal's `usage.updated` names: each assistant message
        is one model call with its own counts (Pi's `input` excludes the cached tokens, which
        `inputTokens` includes, as OpenAI's `prompt_tokens` does)."""
        read, write = _tokens(usage.get("cacheRead")), _tokens(usage.get("cacheWrite"))
        totals = self.usage
        totals["inputTokens"] += _tokens(usage.get("input")) + read + write
        totals["outputTokens"] += _tokens(usage.get("output"))
        totals["cachedReadTokens"] += read
        totals["cachedWriteTokens"] += write
        totals["totalTokens"] = totals["inputTokens"] + totals["outputTokens"]
        payload: dict[str, Any] = dict(totals)
        cost = usage.get("cost")
        if isinstance(cost, dict) and isinstance(cost.get("total"), int | float):
            self.cost += float(cost["total"])
            payload["cost"] = {"amount": self.cost, "currency": "USD"}  # Pi prices its models in USD
        if isinstance(model, str):
            payload["model"] = model
        return payload
