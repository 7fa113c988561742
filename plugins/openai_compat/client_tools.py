"""Client tools and structured output on the OpenAI-compatible endpoints.

A request's ``tools``, ``tool_choice``, ``parallel_tool_calls`` and ``response_format`` (chat) or
``tools``, ``tool_choice``, ``parallel_tool_calls`` and ``text.format`` (responses), and the tool
calls and results the client resends after its last user message, become the run's
``options.clientTools`` (the chat shape, whatever the route) for a runtime whose policy has
``client_tools``. For another runtime the request is refused with 400 ``tools_not_supported``
(``response_format_not_supported`` for structured output alone), or with
``[openai_compat] client_tools = "ignore"`` run without them, the answer saying what was dropped
(``X-Agent-Gateway-Ignored`` and ``agent_gateway.ignored``).
"""

from __future__ import annotations

from typing import Any

from agent_gateway import ApiError

from .responses_api import (
    InputItem,
    ResponseContentPart,
    ResponseCreateRequest,
    ResponseFunctionCall,
    ResponseFunctionCallOutput,
    ResponseInputMessage,
    ResponseToolChoiceFunction,
)


class ClientToolsRequest:
    """What a request asks of client tools and structured output, in the chat shape."""

    def __init__(self) -> None:
        self.tools: list[dict[str, Any]] = []
        self.tool_choice: Any = None
        self.parallel_tool_calls: bool | None = None
        self.response_format: dict[str, Any] | None = None
        self.messages: list[dict[str, Any]] = []  # the exchange after the last user message
        self.fields: list[str] = []  # the request fields that ask for them (what "ignored" names)

    def __bool__(self) -> bool:
        return bool(self.fields)

    def options(self) -> dict[str, Any]:
        """The run's ``options.clientTools``."""
        out: dict[str, Any] = {"tools": self.tools, "messages": self.messages}
        if self.tool_choice is not None:
            out["toolChoice"] = self.tool_choice
        if self.parallel_tool_calls is not None:
            out["parallelToolCalls"] = self.parallel_tool_calls
        if self.response_format is not None:
            out["responseFormat"] = self.response_format
        return out

    # -- chat completions (a body as sent, which its declaration has checked: chat_api)
    @classmethod
    def from_chat(cls, body: dict[str, Any], messages: list[dict[str, Any]], last_user: int) -> ClientToolsRequest:
        request = cls()
        for tool in body.get("tools") or ():
            request.tools.append({"type": "function", "function": tool["function"]})
        # (an object, a function or allowed tools, is the upstream's to check)
        request.tool_choice = body.get("tool_choice")
        request.parallel_tool_calls = body.get("parallel_tool_calls")
        response_format = body.get("response_format")
        if response_format is not None and response_format["type"] != "text":
            request.response_format = response_format
        for message in messages[last_user + 1 :]:
            if message["role"] == "assistant":
                request.messages.append(_chat_assistant(message))
            elif message["role"] == "tool":
                content = _text_of(message.get("content"))
                request.messages.append({"role": "tool", "tool_call_id": message["tool_call_id"], "content": content})
        request._note_fields("response_format")
        return request

    # -- responses (a body its declaration has checked: responses_api)
    @classmethod
    def from_responses(cls, body: ResponseCreateRequest, items: list[InputItem], last_user: int) -> ClientToolsRequest:
        request = cls()
        for tool in body.tools or ():
            function = tool.model_dump(include={"name", "description", "parameters", "strict"}, exclude_none=True)
            request.tools.append({"type": "function", "function": function})
        choice = body.tool_choice
        if isinstance(choice, ResponseToolChoiceFunction):
            request.tool_choice = {"type": "function", "function": {"name": choice.name}}
        else:
            request.tool_choice = choice
        request.parallel_tool_calls = body.parallel_tool_calls
        fmt = body.text.format if body.text is not None else None
        if fmt is not None and fmt.type == "json_schema":
            keys = {"name", "schema_", "strict", "description"}
            schema = fmt.model_dump(include=keys, exclude_unset=True, by_alias=True)
            request.response_format = {"type": "json_schema", "json_schema": schema}
        elif fmt is not None and fmt.type == "json_object":
            request.response_format = {"type": "json_object"}
        request._responses_exchange(items, last_user)
        request._note_fields("text.format")
        return request

    def _responses_exchange(self, items: list[InputItem], last_user: int) -> None:
        calls: list[dict[str, Any]] = []
        for item in items[last_user + 1 :]:
            if isinstance(item, ResponseFunctionCall):
                call = {"name": item.name, "arguments": item.arguments}
                calls.append({"id": item.call_id, "type": "function", "function": call})
                continue
            if calls:  # consecutive calls are one assistant message
                self.messages.append({"role": "assistant", "content": None, "tool_calls": calls})
                calls = []
            if isinstance(item, ResponseFunctionCallOutput):
                self.messages.append({"role": "tool", "tool_call_id": item.call_id, "content": _text_of(item.output)})
            elif isinstance(item, ResponseInputMessage) and item.role == "assistant":
                self.messages.append({"role": "assistant", "content": _text_of(item.content)})
        if calls:
            self.messages.append({"role": "assistant", "content": None, "tool_calls": calls})

    def _note_fields(self, format_field: str) -> None:
        if self.tools:
            self.fields.append("tools")
            if self.tool_choice is not None:
                self.fields.append("tool_choice")
        if self.response_format is not None:
            self.fields.append(format_field)
        if self.messages and any(m["role"] == "tool" or m.get("tool_calls") for m in self.messages):
            self.fields.append("tool results")

    # -- the decision
    def check(self, runtime: Any, mode: str, agent: str) -> list[str]:
        """What the run leaves out: ``[]`` when the runtime takes them (or none were asked for),
        the ignored fields with ``mode`` ``ignore``; else a 400 ``tools_not_supported``."""
        if not self or getattr(getattr(runtime, "policy", None), "client_tools", False):
            return []
        if mode == "ignore":
            return list(self.fields)
        tools = self.fields != ["response_format"] and self.fields != ["text.format"]
        code = "tools_not_supported" if tools else "response_format_not_supported"
        what = "client tools" if tools else "structured output"
        raise ApiError(
            400,
            code,
            f"the model {agent!r} cannot take {what} ({', '.join(self.fields)}): its agent uses its own tools; "
            "send the request without them, or use an agent whose policy has clientTools (chat-only)",
            param=self.fields[0] if self.fields[0] != "tool results" else None,
        )


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(_part_text(part) for part in content)
    return "" if content is None else str(content)


def _part_text(part: Any) -> str:
    if isinstance(part, ResponseContentPart):
        return part.text or ""
    return str(part.get("text", "")) if isinstance(part, dict) else ""


def _chat_assistant(message: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"role": "assistant", "content": _text_of(message.get("content")) or None}
    kept = []
    for call in message.get("tool_calls") or ():
        function = call["function"]
        name, arguments = function["name"], function.get("arguments", "")
        kept.append({"id": call["id"], "type": "function", "function": {"name": name, "arguments": arguments}})
    if kept:
        out["tool_calls"] = kept
    return out
