"""Client (frontend) tools of an AG-UI ``RunAgentInput``.

For a runtime whose policy has ``client_tools`` (chat-only), the input's ``tools`` and the tool
calls and results after the last user message become the run's ``options.clientTools`` in the
OpenAI chat shape; the calls its model asks for come back as ``TOOL_CALL_START`` /
``TOOL_CALL_ARGS`` / ``TOOL_CALL_END`` (the client runs the tool and sends its result in the next
input, as AG-UI's frontend tools do). For another runtime, non-empty ``tools`` are refused with
400 ``tools_not_supported``, or with ``[ag_ui] client_tools = "ignore"`` left out, which
``RUN_STARTED``'s ``metadata.agentGateway.ignored`` and the ``X-Agent-Gateway-Ignored`` header say.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from agent_gateway import ApiError

from .declared import text_of

if TYPE_CHECKING:
    from .declared import AgUiRunInput

IGNORED_HEADER = "X-Agent-Gateway-Ignored"


def _last_user(run_input: AgUiRunInput) -> int:
    for index in range(len(run_input.messages) - 1, -1, -1):
        if run_input.messages[index].role == "user":
            return index
    return -1


def _exchange(run_input: AgUiRunInput) -> list[dict[str, Any]]:
    """The assistant tool calls and tool results after the last user message, in the chat shape."""
    out: list[dict[str, Any]] = []
    messages = run_input.messages
    for message in messages[_last_user(run_input) + 1 :]:
        if message.role == "assistant":
            calls = [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.function.name, "arguments": c.function.arguments},
                }
                for c in message.toolCalls or ()
            ]
            item: dict[str, Any] = {"role": "assistant", "content": message.content or None}
            if calls:
                item["tool_calls"] = calls
            out.append(item)
        elif message.role == "tool":
            out.append({"role": "tool", "tool_call_id": message.toolCallId, "content": text_of(message.content)})
    return out


def client_tools(
    run_input: AgUiRunInput, runtime: Any, mode: str, agent_id: str
) -> tuple[dict[str, Any] | None, list[str]]:
    """``(options.clientTools or None, ignored fields)`` of a valid ``RunAgentInput``."""
    if runtime is None:  # an unknown agent: the run's creation answers 404
        return None, []
    tools = [{"type": "function", "function": t.model_dump(exclude_none=True)} for t in run_input.tools or ()]
    exchange = _exchange(run_input)
    has_results = any(m["role"] == "tool" or m.get("tool_calls") for m in exchange)
    fields = (["tools"] if tools else []) + (["tool results"] if has_results else [])
    if not fields:
        return None, []
    if getattr(getattr(runtime, "policy", None), "client_tools", False):
        return {"tools": tools, "messages": exchange}, []
    if mode == "ignore":
        return None, fields
    raise ApiError(
        400,
        "tools_not_supported",
        f"the agent {agent_id!r} cannot take client tools ({', '.join(fields)}): it uses its own tools; "
        "send the input without them, or use an agent whose policy has clientTools (chat-only)",
        agentId=agent_id,
    )
