"""The default session strategy and the cold-resume packet.

A strategy answers, per run, how the agent gets the earlier turns of the gateway session. The
default knows only the gateway's own transcript: the first turn is `new_session`, later turns are
`cold_resumed` with a bounded packet. Runtimes with live agent sessions carry their own strategy
(``runtime.session_strategy``), which the core's default `session_strategy` hook returns; a
plugin's hook may still choose another.
"""

from __future__ import annotations

import re
from typing import Any, Protocol

from agent_gateway.runtime import SessionPlan

# Replies that only make sense with the previous turn in view.
SHORT_REPLIES = frozenset(
    {
        "ok",
        "okay",
        "yes",
        "y",
        "no",
        "sure",
        "go",
        "go on",
        "go ahead",
        "continue",
        "do it",
        "please",
        "可以",
        "好",
        "好的",
        "行",
        "嗯",
        "继续",
        "是",
        "对",
        "确定",
    }
)
PACKET_MAX_TURNS = 5
PACKET_MAX_CHARS = 16_000


class SessionStrategy(Protocol):
    async def plan(self, turn: Any, runtime: Any) -> SessionPlan: ...


def is_bare_short_reply(message: str) -> bool:
    text = re.sub(r"[\s。.!！,，?？~]+$", "", message.strip().lower())
    return text in SHORT_REPLIES


def has_context(context: dict[str, Any]) -> bool:
    target = context.get("target") or {}
    return bool(target.get("path") or (target.get("selection") or {}).get("text") or context.get("contextRefs"))


def cold_resume_packet(
    history: list[dict[str, Any]], max_turns: int = PACKET_MAX_TURNS, max_chars: int = PACKET_MAX_CHARS
) -> list[dict[str, Any]]:
    """The last finished turns, newest kept when over budget: user and assistant finals, a summary
    of the tools called and the files changed (never thoughts or raw tool output). A turn another
    run interrupted counts, with what it had answered (`interrupted`), unless it was rolled back."""
    packet: list[dict[str, Any]] = []
    used = 0
    for entry in reversed(history):
        status = entry.get("status")
        interrupted = status == "cancelled" and bool(entry.get("interruptedBy")) and not entry.get("rolledBack")
        if status != "completed" and not interrupted:
            continue
        item: dict[str, Any] = {"user": entry.get("user", ""), "assistant": entry.get("assistant", "")}
        if interrupted:
            item["interrupted"] = True
        tools = [
            f"{t.get('tool')} {t.get('path') or ''} ({t.get('status')})".replace("  ", " ")
            for t in entry.get("tools") or ()
        ][:10]
        if tools:
            item["tools"] = tools
        if entry.get("files"):
            item["files"] = list(entry["files"])[:20]
        size = len(item["user"]) + len(item["assistant"]) + sum(len(t) for t in tools)
        if packet and used + size > max_chars:
            break
        if size > max_chars:  # a single huge turn: keep its tail
            item["assistant"] = item["assistant"][-(max_chars - len(item["user"][: max_chars // 4])) :]
            item["user"] = item["user"][: max_chars // 4]
            size = max_chars
        packet.append(item)
        used += size
        if len(packet) >= max_turns:
            break
    packet.reverse()
    return packet


SHORT_REPLY_WARNING = (
    "The message is a bare short reply but this agent session has no earlier turns or context; "
    "the agent cannot know what it refers to."
)


class TranscriptStrategy:
    """Default: rebuild from the gateway transcript."""

    def __init__(self, max_turns: int = PACKET_MAX_TURNS, max_chars: int = PACKET_MAX_CHARS) -> None:
        self.max_turns = max_turns
        self.max_chars = max_chars

    async def plan(self, turn: Any, runtime: Any) -> SessionPlan:
        packet = cold_resume_packet(turn.history, self.max_turns, self.max_chars)
        if packet:
            return SessionPlan("cold_resumed", packet)
        warning = None
        if is_bare_short_reply(turn.message) and not has_context(turn.context):
            warning = SHORT_REPLY_WARNING
        return SessionPlan("new_session", [], warning)


def prompt_text(turn: Any) -> str:
    """The text an agent-session runtime sends for a turn: the cold-resume packet (when the plan
    is `cold_resumed`), the current page and selection from the frozen context, then the message."""
    parts: list[str] = []
    packet = turn.plan.packet if turn.plan.mode == "cold_resumed" else []
    if packet:
        lines = ["[Earlier turns of this conversation, restored by the gateway]"]
        for entry in packet:
            lines.append(f"User: {entry['user']}")
            if entry.get("assistant"):
                lines.append(f"Assistant: {entry['assistant']}")
            if entry.get("interrupted"):
                lines.append("(The user interrupted this answer with the next message.)")
            if entry.get("tools"):
                lines.append("Tools used: " + "; ".join(entry["tools"]))
            if entry.get("files"):
                lines.append("Files changed: " + ", ".join(entry["files"]))
        lines.append("[End of earlier turns]")
        parts.append("\n".join(lines))
    target = turn.context.get("target") or {}
    if target.get("path"):
        parts.append(f"[Current page: {target['path']}]")
    selection = (target.get("selection") or {}).get("text")
    if selection:
        parts.append(f"[Selected text]\n{selection}")
    parts.append(turn.message)
    return "\n\n".join(parts)
