"""The earlier turns of a chat completion's ``messages`` or a response's ``input``: what the
gateway matches against its sessions when a request names none (conversation affinity,
docs/sessions.md). Only text counts: a message's string content or its text parts."""

from __future__ import annotations

from typing import Any

from .responses_api import InputItem, ResponseInputMessage

CHAT_TEXT_PARTS = frozenset({"text"})
INPUT_TEXT_PARTS = frozenset({"input_text", "output_text", "text"})


def _text(content: Any, part_types: frozenset[str]) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    return "\n".join(
        part["text"]
        for part in content
        if isinstance(part, dict) and part.get("type") in part_types and isinstance(part.get("text"), str)
    )


def chat_earlier(messages: list[Any], last_user: int) -> list[tuple[str, str]]:
    """``(role, text)`` of the chat messages before the last user message (index ``last_user``)."""
    return [
        (str(item.get("role")), _text(item.get("content"), CHAT_TEXT_PARTS))
        for item in messages[:last_user]
        if isinstance(item, dict)
    ]


def input_earlier(items: list[InputItem]) -> list[tuple[str, str]]:
    """``(role, text)`` of the message items of a response's ``input`` before its last user
    message (none for a string input: no items)."""
    messages = [item for item in items if isinstance(item, ResponseInputMessage)]
    last_user = max((i for i, item in enumerate(messages) if item.role == "user"), default=0)
    return [(item.role, item.text(INPUT_TEXT_PARTS)) for item in messages[:last_user]]
