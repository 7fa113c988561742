"""Map ACP ``session/update`` payloads to gateway event kinds.

:func:`map_update` is a pure function: it takes the raw ``update`` object of a
``session/update`` notification (the dict under ``params.update``) and returns
``(kind, payload)`` for the run journal. It never drops anything: an update it
does not recognise becomes ``agent.update`` with the raw update kept whole.

=============================  ======================  ==============================================
ACP ``sessionUpdate``           gateway event kind      payload
=============================  ======================  ==============================================
``agent_message_chunk``         ``message.delta``       ``{text, content, ...}``
``agent_thought_chunk``         ``thought.delta``       ``{text, content, ...}``
``user_message_chunk``          ``user.message.delta``  ``{text, content, ...}`` (history replays)
``tool_call``                   ``tool.started``        every ACP field (toolCallId, title, kind,
                                                        status, content, locations, rawInput, ...)
``tool_call_update``            ``tool.updated``        every ACP field; status pending/in_progress
                                                        or absent
``tool_call_update``            ``tool.completed``      every ACP field; status ``completed`` or
                                                        ``failed``
``plan``                        ``plan.updated``        ``{entries, ...}``
``session_info_update``         ``session.info.updated``  ``{title, updatedAt, ...}``
``usage_update``                ``usage.updated``       ``{used, size, cost, ...}``
``available_commands_update``   ``commands.updated``    ``{availableCommands, ...}``
``current_mode_update``         ``mode.updated``        ``{currentModeId, ...}``
``config_option_update``        ``config.updated``      ``{configOptions, ...}``
anything else / malformed       ``agent.update``        ``{raw: <the update as received>}``
=============================  ======================  ==============================================

For the known kinds the payload is the ACP update itself minus its
``sessionUpdate`` discriminator (so ``_meta``, ``messageId`` and any future
fields survive). For the three chunk kinds a ``text`` field is added: the
concatenated ``text`` of the ``{"type": "text", "text": ...}`` content
block(s); it is ``""`` for non-text content (images, resources), whose block is
still in ``content``.
"""

from __future__ import annotations

from typing import Any

__all__ = ["UPDATE_KINDS", "extract_text", "map_update"]

#: ACP ``sessionUpdate`` kind → gateway event kind (``tool_call_update`` is
#: refined by status in :func:`map_update`).
UPDATE_KINDS: dict[str, str] = {
    "agent_message_chunk": "message.delta",
    "agent_thought_chunk": "thought.delta",
    "user_message_chunk": "user.message.delta",
    "tool_call": "tool.started",
    "tool_call_update": "tool.updated",
    "plan": "plan.updated",
    "session_info_update": "session.info.updated",
    "usage_update": "usage.updated",
    "available_commands_update": "commands.updated",
    "current_mode_update": "mode.updated",
    "config_option_update": "config.updated",
}

_CHUNK_KINDS = frozenset({"agent_message_chunk", "agent_thought_chunk", "user_message_chunk"})
_TOOL_TERMINAL_STATUSES = frozenset({"completed", "failed"})


def extract_text(content: Any) -> str:
    """Return the text of an ACP content block, or of a list of blocks.

    Only ``{"type": "text", "text": str}`` blocks contribute; anything else
    yields ``""``.
    """
    if isinstance(content, dict):
        text = content.get("text")
        return text if content.get("type") == "text" and isinstance(text, str) else ""
    if isinstance(content, list):
        return "".join(extract_text(block) for block in content)
    return ""


def map_update(update: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """Map one raw ACP ``session/update`` ``update`` object to ``(kind, payload)``.

    See the module docstring for the table. Pure: the input is not modified.
    """
    if not isinstance(update, dict):
        return "agent.update", {"raw": update}
    tag = update.get("sessionUpdate")
    kind = UPDATE_KINDS.get(tag) if isinstance(tag, str) else None
    if kind is None:
        return "agent.update", {"raw": update}
    payload = {key: value for key, value in update.items() if key != "sessionUpdate"}
    if tag in _CHUNK_KINDS:
        payload["text"] = extract_text(update.get("content"))
    elif tag == "tool_call_update" and update.get("status") in _TOOL_TERMINAL_STATUSES:
        kind = "tool.completed"
    return kind, payload
