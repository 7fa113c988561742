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

from .common import MAX_TOOLS, TOOL_CHOICES
from .responses_api import (
    InputItem,
    ResponseContentPart,
    ResponseCreateRequest,
    ResponseFunctionCall,
    ResponseFunctionCallOutput,
    ResponseInputMessage,
    ResponseToolChoiceFunction,
)

CLIENT_TOOLS_CHOICES = ("reject", "ignore")


def _bad(message: str, param: str) -> ApiError:
    return ApiError(400, "invalid_request", message, param=param)


def _object(value: Any, param: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _bad(f"{param} must be an object", param)
    return value


def _name(value: Any, param: str) -> str:
    if not isinstance(value, str) or not value or len(value) > 200:
        raise _bad(f"{param} must be a tool name (1 to 200 characters)", param)
    return value


def _tool_list(value: Any) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list) or len(value) > MAX_TOOLS:
        raise _bad(f"tools must be a list of at most {MAX_TOOLS} tools", "tools")
    return value


def _parallel(body: dict[str, Any]) -> bool | None:
    value = body.get("parallel_tool_calls")
    if value is not None and not isinstance(value, bool):
        raise _bad("parallel_tool_calls must be a boolean", "parallel_tool_calls")
    return value


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

    # -- chat completions
    @classmethod
    def from_chat(cls, body: dict[str, Any], messages: list[dict[str, Any]], last_user: int) -> ClientToolsRequest:
        request = cls()
        for index, tool in enumerate(_tool_list(body.get("tools"))):
            param = f"tools[{index}]"
            tool = _object(tool, param)
            if tool.get("type", "function") != "function":
                raise _bad(f"{param}.type must be 'function'", f"{param}.type")
            function = _object(tool.get("function"), f"{param}.function")
            _name(function.get("name"), f"{param}.function.name")
            request.tools.append({"type": "function", "function": function})
        choice = body.get("tool_choice")
        if choice is not None:  # an object (a function, allowed tools, ...) is the upstream's to check
            if not isinstance(choice, dict) and choice not in TOOL_CHOICES:
                raise _bad("tool_choice must be 'auto', 'none', 'required' or an object", "tool_choice")
            request.tool_choice = choice
        request.parallel_tool_calls = _parallel(body)
        response_format = body.get("response_format")
        if response_format is not None:
            response_format = _object(response_format, "response_format")
            if response_format.get("type") not in ("text", "json_object", "json_schema"):
                raise _bad("response_format.type must be 'text', 'json_object' or 'json_schema'", "response_format")
            if response_format["type"] != "text":
                request.response_format = response_format
        for index in range(last_user + 1, len(messages)):
            message = messages[index]
            if message["role"] == "assistant":
                request.messages.append(_chat_assistant(message, f"messages[{index}]"))
            elif message["role"] == "tool":
                request.messages.append(_chat_tool(message, f"messages[{index}]"))
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


def _chat_assistant(message: dict[str, Any], param: str) -> dict[str, Any]:
    out: dict[str, Any] = {"role": "assistant", "content": _text_of(message.get("content")) or None}
    calls = message.get("tool_calls")
    if calls is not None:
        if not isinstance(calls, list):
            raise _bad(f"{param}.tool_calls must be a list", f"{param}.tool_calls")
        kept = []
        for index, call in enumerate(calls):
            where = f"{param}.tool_calls[{index}]"
            call = _object(call, where)
            function = _object(call.get("function"), f"{where}.function")
            arguments = function.get("arguments", "")
            if not isinstance(arguments, str):
                raise _bad(f"{where}.function.arguments must be a string", f"{where}.function.arguments")
            if not isinstance(call.get("id"), str):
                raise _bad(f"{where}.id must be a string", f"{where}.id")
            name = _name(function.get("name"), f"{where}.function.name")
            kept.append({"id": call["id"], "type": "function", "function": {"name": name, "arguments": arguments}})
        if kept:
            out["tool_calls"] = kept
    return out


def _chat_tool(message: dict[str, Any], param: str) -> dict[str, Any]:
    call_id = message.get("tool_call_id")
    if not isinstance(call_id, str) or not call_id:
        raise _bad(f"{param}.tool_call_id must be a string", f"{param}.tool_call_id")
    return {"role": "tool", "tool_call_id": call_id, "content": _text_of(message.get("content"))}
