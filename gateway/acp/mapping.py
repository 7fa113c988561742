"""Map ACP ``session/update`` payloads to gateway event kinds.

:func:`map_update` is a pure function: it takes the raw ``update`` object of a
``session/update`` notification (the dict under ``params.update``) and returns
``(kind, payload)`` for the run journal. It never drops anything: an update it
does not recognise becomes ``agent.update`` with the raw update kept whole.

=============================  ======================  ==============================================
ACP ``sessionUpdate``           gateway event kind      payload
=============================  ======================  ==============================================
``agent_message_chunk``         ``message.delta``       ``{text, ...}`` (see below)
``agent_thought_chunk``         ``thought.delta``       ``{text, ...}``
``user_message_chunk``          ``user.message.delta``  ``{text, ...}`` (history replays)
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
fields survive). The three chunk kinds are shaped like every other runtime's
deltas, so that consecutive ones merge for a client that falls behind (the bus
merges deltas whose payloads differ only in ``text``):

* a text block (``{"type": "text", "text": ...}``) becomes ``text``; the block
  itself is not repeated. Only if it carries more than its type and text
  (``annotations``, ``_meta``) is the rest of it kept as ``content``, without
  its text — equal from chunk to chunk, so merging still applies;
* any other block (image, audio, resource, resource link) stays whole in
  ``content``, with ``text`` ``""`` (so it merges only with a neighbour that
  carries the very same block);
* a list of blocks (not ACP, tolerated) stays whole in ``content``, with
  ``text`` the concatenation of its text blocks.

The update's own other fields (``messageId``, ``_meta``) are kept as they are.

:func:`coalesce_updates` maps the updates that arrived together (one read of the agent's stdout)
and joins consecutive ``message.delta`` / ``thought.delta`` payloads that differ only in ``text``
into one, as the stream merges deltas for a client that falls behind: the same text in the same
order, in fewer events. An agent that writes no faster than the gateway reads arrives one update
per read and keeps one event per update; one that is ahead (its updates wait in the pipe) gets
its backlog journalled in larger deltas.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["COALESCED_KINDS", "UPDATE_KINDS", "coalesce_updates", "extract_text", "map_update"]

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


def _chunk_payload(update: dict[str, Any]) -> dict[str, Any]:
    content = update.get("content")
    if type(content) is dict and content.get("type") == "text":
        text = content.get("text")
        if type(text) is str:
            if len(update) == 2 and len(content) == 2:  # {sessionUpdate, content: {type, text}}: most chunks
                return {"text": text}
            payload = {"text": text}
            for key, value in update.items():
                if key != "sessionUpdate" and key != "content":
                    payload[key] = value
            if len(content) > 2:
                payload["content"] = {key: value for key, value in content.items() if key != "text"}
            return payload
    payload = {"text": extract_text(content)}
    for key, value in update.items():
        if key != "sessionUpdate":
            payload[key] = value
    return payload


def _fields(update: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in update.items() if key != "sessionUpdate"}


def _map_message_chunk(update: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    return "message.delta", _chunk_payload(update)


def _map_thought_chunk(update: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    return "thought.delta", _chunk_payload(update)


def _map_user_chunk(update: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    return "user.message.delta", _chunk_payload(update)


def _map_tool_call_update(update: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    kind = "tool.completed" if update.get("status") in _TOOL_TERMINAL_STATUSES else "tool.updated"
    return kind, _fields(update)


def _map_fields(kind: str) -> Callable[[dict[str, Any]], tuple[str, dict[str, Any]]]:
    def map_fields(update: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        return kind, _fields(update)

    return map_fields


#: ``sessionUpdate`` → its mapper: one dict lookup per update (the hot path of a streaming turn).
_MAPPERS: dict[str, Callable[[dict[str, Any]], tuple[str, dict[str, Any]]]] = {
    tag: _map_fields(kind) for tag, kind in UPDATE_KINDS.items()
}
_MAPPERS.update(
    agent_message_chunk=_map_message_chunk,
    agent_thought_chunk=_map_thought_chunk,
    user_message_chunk=_map_user_chunk,
    tool_call_update=_map_tool_call_update,
)


#: Event kinds whose consecutive payloads that differ only in ``text`` are joined by
#: :func:`coalesce_updates` (the kinds the stream merges for a client that falls behind).
COALESCED_KINDS = frozenset({"message.delta", "thought.delta"})


def coalesce_updates(updates: list[Any]) -> list[tuple[str, dict[str, Any]]]:
    """Map raw ``update`` objects received together, in order, joining consecutive deltas of one
    kind whose payloads are equal apart from ``text`` (their texts concatenated, in order)."""
    mapped: list[tuple[str, dict[str, Any]]] = []
    texts: list[str] = []  # the texts of the delta being joined (the last of `mapped`)
    joined_kind: str | None = None
    joined_rest: dict[str, Any] | None = None  # its payload without `text` (None: only `text`)
    for update in updates:
        kind, payload = map_update(update)
        if kind in COALESCED_KINDS:
            rest = None if len(payload) == 1 else {key: value for key, value in payload.items() if key != "text"}
            if kind == joined_kind and rest == joined_rest:
                texts.append(payload["text"])
                continue
            if len(texts) > 1:
                mapped[-1][1]["text"] = "".join(texts)
            mapped.append((kind, payload))
            texts = [payload["text"]]
            joined_kind, joined_rest = kind, rest
            continue
        if len(texts) > 1:
            mapped[-1][1]["text"] = "".join(texts)
        texts, joined_kind = [], None
        mapped.append((kind, payload))
    if len(texts) > 1:
        mapped[-1][1]["text"] = "".join(texts)
    return mapped


def map_update(update: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """Map one raw ACP ``session/update`` ``update`` object to ``(kind, payload)``.

    See the module docstring for the table. Pure: the input is not modified.
    """
    if not isinstance(update, dict):
        return "agent.update", {"raw": update}
    tag = update.get("sessionUpdate")
    mapper = _MAPPERS.get(tag) if type(tag) is str else None
    if mapper is None:
        return "agent.update", {"raw": update}
    return mapper(update)
