"""The response projection: one run's journal folded into a transcript a UI can render.

Two layers, so the live stream and the stored history can never disagree:

- :func:`transcript_ops` maps ONE event to a list of small operations (``{"op": ..., ...}``),
  looking at nothing but that event. It is the ``transcript`` projection a client gets on
  ``?projection=transcript`` (wrapped as a ``gateway.transcript_patch.v1`` object per event).
- :func:`apply_op` applies one operation to a transcript (a plain JSON object). Folding every
  event's operations in order (:func:`project_transcript`) is the transcript the session detail
  and the export show.

The transcript is plain JSON with no hidden state, so folding a prefix, storing the result, and
folding the rest onto it gives the same transcript as folding the whole journal at once.

Rules (seed §8.4): the answer is built only from ``message.delta`` and ``message.completed`` (whose
text, when given, is the final answer); thoughts are a separate folded block; each tool call is a
card keyed by ``toolCallId``; ``plan.updated`` replaces the plan panel; permission requests are
cards carrying the decision taken; citations come from tools' ``citationMarkdown`` /
``citationUrl``; ``files.changed`` are notices; the session mode is a status; an event sourced
``adapter_replay`` (history an agent replays on load) is counted, never shown as new output.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from agent_gateway.models import STATUS_BY_TERMINAL_KIND, Event, Run, loads

TRANSCRIPT_SCHEMA = "gateway.transcript.v1"
PATCH_SCHEMA = "gateway.transcript_patch.v1"
REPLAY_SOURCE = "adapter_replay"

# Fields of a tool event kept on its card (ACP tool_call fields and the gateway tools' own).
_TOOL_CARD_FIELDS = (
    "title",
    "kind",
    "tool",
    "status",
    "locations",
    "receiptId",
    "auditId",
    "path",
    "diffSummary",
    "error",
)
# How deep to look for citations inside a tool payload (rawOutput / content blocks).
_CITATION_DEPTH = 6
_CITATIONS_PER_EVENT = 50


def empty_transcript(host_run_id: str | None = None) -> dict[str, Any]:
    """A transcript before any event."""
    return {
        "schema": TRANSCRIPT_SCHEMA,
        "hostRunId": host_run_id,
        "agentId": None,
        "question": None,
        "status": "pending",
        "terminal": None,
        "answer": {"text": "", "final": False},
        "thoughts": {"text": "", "chunks": 0},
        "tools": [],
        "plan": None,
        "permissions": [],
        "citations": [],
        "files": [],
        "sessionMode": None,
        "agentSessionId": None,
        "modeHistory": [],
        "replayed": {"events": 0, "messages": 0},
        "usage": None,
        "lastSeq": 0,
    }


def run_transcript(run: Run) -> dict[str, Any]:
    """The starting transcript of a run: its id, agent and the user's question (the question is in
    the run record, not in the journal)."""
    state = empty_transcript(run.host_run_id)
    state["agentId"] = run.agent_id
    message = run.request.get("message")
    state["question"] = message if isinstance(message, str) else None
    return state


# -- event → operations (stateless) ----------------------------------------------------------------


def _text(payload: dict[str, Any]) -> str:
    text = payload.get("text")
    return text if isinstance(text, str) else ""


def _citations(value: Any, depth: int, out: list[dict[str, Any]]) -> None:
    if depth <= 0 or len(out) >= _CITATIONS_PER_EVENT:
        return
    if isinstance(value, dict):
        markdown, url = value.get("citationMarkdown"), value.get("citationUrl")
        if isinstance(markdown, str) or isinstance(url, str):
            citation: dict[str, Any] = {
                "markdown": markdown if isinstance(markdown, str) else None,
                "url": url if isinstance(url, str) else None,
            }
            for key in ("title", "path", "filePath"):
                if isinstance(value.get(key), str):
                    citation[key] = value[key]
            out.append(citation)
        for key, item in value.items():
            if key == "text" and isinstance(item, str) and item[:1] in "{[":
                # MCP text content often carries the tool's JSON result as a string.
                try:
                    item = loads(item)
                except ValueError:
                    continue
            _citations(item, depth - 1, out)
    elif isinstance(value, list):
        for item in value[:200]:
            _citations(item, depth - 1, out)


def _tool_ops(event: Event) -> list[dict[str, Any]]:
    payload = event.payload
    call_id = payload.get("toolCallId")
    if not isinstance(call_id, str) or not call_id:
        return []
    card: dict[str, Any] = {"toolCallId": call_id}
    for key in _TOOL_CARD_FIELDS:
        if payload.get(key) is not None:
            card[key] = payload[key]
    if "status" not in card:
        card["status"] = "completed" if event.kind == "tool.completed" else "pending"
    card["seq"] = event.seq
    ops: list[dict[str, Any]] = [{"op": "tool.upsert", "card": card}]
    found: list[dict[str, Any]] = []
    _citations({k: v for k, v in payload.items() if k not in ("toolCallId",)}, _CITATION_DEPTH, found)
    for citation in found:
        ops.append({"op": "citation.add", "citation": {**citation, "toolCallId": call_id}})
    return ops


def transcript_ops(event: Event) -> list[dict[str, Any]]:
    """The operations one event contributes to its run's transcript (empty: nothing to show)."""
    kind = event.kind
    if event.source == REPLAY_SOURCE:
        # History the agent replayed on load: already in the gateway's transcript, never new output.
        return [{"op": "replay.note", "message": kind == "replay.message", "seq": event.seq}]
    payload = event.payload
    if kind == "message.delta":
        text = _text(payload)
        return [{"op": "answer.append", "text": text}] if text else []
    if kind == "message.completed":
        text = payload.get("text")
        return [{"op": "answer.final", "text": text if isinstance(text, str) else None}]
    if kind == "thought.delta":
        text = _text(payload)
        return [{"op": "thought.append", "text": text}] if text else []
    if kind in ("tool.started", "tool.updated", "tool.completed"):
        return _tool_ops(event)
    if kind == "client_tool.requested":  # a call of a tool the client runs itself: a card, no output
        call_id, name = payload.get("toolCallId"), payload.get("name")
        if not isinstance(call_id, str) or not call_id:
            return []
        card = {"toolCallId": call_id, "title": name if isinstance(name, str) else None, "kind": "client"}
        return [{"op": "tool.upsert", "card": {**card, "tool": card["title"], "status": "client", "seq": event.seq}}]
    if kind == "plan.updated":
        entries = payload.get("entries")
        return [{"op": "plan.set", "entries": entries if isinstance(entries, list) else []}]
    if kind == "permission.requested":
        tool_call = payload.get("toolCall") if isinstance(payload.get("toolCall"), dict) else {}
        card = {
            "requestId": payload.get("requestId"),
            "status": "pending",
            "toolCallId": tool_call.get("toolCallId"),
            "title": tool_call.get("title"),
            "kind": tool_call.get("kind"),
            "options": payload.get("options") if isinstance(payload.get("options"), list) else [],
            "seq": event.seq,
        }
        return [{"op": "permission.upsert", "card": card}, {"op": "status.set", "status": "awaiting_permission"}]
    if kind == "permission.resolved":
        card = {
            "requestId": payload.get("requestId"),
            "status": "resolved",
            "outcome": payload.get("outcome"),
            "optionId": payload.get("optionId"),
            "by": payload.get("by"),
        }
        return [{"op": "permission.upsert", "card": card}]
    if kind == "files.changed":
        changes = [c for c in payload.get("changes") or () if isinstance(c, dict) and c.get("path")]
        return [{"op": "files.add", "changes": changes, "seq": event.seq}] if changes else []
    if kind == "session.info.updated":
        mode = payload.get("sessionMode")
        if not isinstance(mode, str):
            return []
        agent_session = payload.get("agentSessionId")
        return [
            {
                "op": "mode.set",
                "mode": mode,
                "agentSessionId": agent_session if isinstance(agent_session, str) else None,
                "seq": event.seq,
            }
        ]
    if kind == "usage.updated":
        return [{"op": "usage.set", "usage": payload}]
    if kind == "run.created":
        receipt = payload.get("receipt") if isinstance(payload.get("receipt"), dict) else {}
        return [{"op": "run.begin", "hostRunId": event.host_run_id, "agentId": receipt.get("agentId")}]
    if kind == "run.queued":
        return [{"op": "status.set", "status": "queued"}]
    if kind == "run.started":
        return [{"op": "status.set", "status": "running"}]
    if kind in STATUS_BY_TERMINAL_KIND:
        return [
            {
                "op": "run.end",
                "status": STATUS_BY_TERMINAL_KIND[kind],
                "reason": payload.get("reason"),
                "synthetic": bool(payload.get("synthetic")),
            }
        ]
    return []


def transcript_projection(event: Event) -> dict[str, Any] | None:
    """The ``transcript`` projection hook: the event's operations as one patch (None: hidden).
    A client applies each patch's ``ops`` in order with the rules of :func:`apply_op`."""
    ops = transcript_ops(event)
    if not ops:
        return None
    return {"schema": PATCH_SCHEMA, "hostRunId": event.host_run_id, "seq": event.seq, "kind": event.kind, "ops": ops}


# -- operations → transcript ------------------------------------------------------------------------


def _find(items: list[dict[str, Any]], key: str, value: Any) -> dict[str, Any] | None:
    for item in items:
        if item.get(key) == value:
            return item
    return None


def apply_op(state: dict[str, Any], op: dict[str, Any]) -> None:
    """Apply one operation to ``state`` in place."""
    name = op["op"]
    if name == "answer.append":
        state["answer"]["text"] += op["text"]
    elif name == "answer.final":
        if op["text"] is not None:
            state["answer"]["text"] = op["text"]
        state["answer"]["final"] = True
    elif name == "thought.append":
        state["thoughts"]["text"] += op["text"]
        state["thoughts"]["chunks"] += 1
    elif name == "tool.upsert":
        card = op["card"]
        existing = _find(state["tools"], "toolCallId", card["toolCallId"])
        if existing is None:
            state["tools"].append({**card, "firstSeq": card["seq"]})
        else:
            existing.update(card)
    elif name == "citation.add":
        citation = op["citation"]
        known = any(c["url"] == citation["url"] and c["markdown"] == citation["markdown"] for c in state["citations"])
        if not known:
            state["citations"].append(dict(citation))
    elif name == "plan.set":
        state["plan"] = {"entries": op["entries"]}
    elif name == "permission.upsert":
        card = op["card"]
        existing = _find(state["permissions"], "requestId", card["requestId"])
        if existing is None:
            state["permissions"].append(dict(card))
        else:
            existing.update(card)
    elif name == "files.add":
        for change in op["changes"]:
            state["files"].append({**change, "seq": op["seq"]})
    elif name == "mode.set":
        state["sessionMode"] = op["mode"]
        if op["agentSessionId"]:
            state["agentSessionId"] = op["agentSessionId"]
        state["modeHistory"].append({"mode": op["mode"], "agentSessionId": op["agentSessionId"], "seq": op["seq"]})
    elif name == "usage.set":  # token counts and context size may come in separate events
        state["usage"] = {**(state["usage"] or {}), **op["usage"]}
    elif name == "run.begin":
        state["hostRunId"] = state["hostRunId"] or op["hostRunId"]
        state["agentId"] = state["agentId"] or op["agentId"]
    elif name == "status.set":
        if state["terminal"] is None:
            state["status"] = op["status"]
    elif name == "run.end":
        if state["terminal"] is None:  # the first terminal event is the end; a later one changes nothing
            state["status"] = op["status"]
            state["terminal"] = {"status": op["status"], "reason": op["reason"], "synthetic": op["synthetic"]}
    elif name == "replay.note":
        state["replayed"]["events"] += 1
        if op["message"]:
            state["replayed"]["messages"] += 1


def fold(state: dict[str, Any], event: Event) -> dict[str, Any]:
    """Apply one event to ``state`` in place and return it."""
    for op in transcript_ops(event):
        apply_op(state, op)
    if event.seq > state["lastSeq"]:
        state["lastSeq"] = event.seq
    return state


def project_transcript(events: Iterable[Event], state: dict[str, Any] | None = None) -> dict[str, Any]:
    """The transcript of ``events`` folded onto ``state`` (a fresh one when None; a given state is
    updated in place). Same result as :func:`fold` per event, in linear time: the answer and
    thought text is collected in lists and joined once (appending to a string held in a dict
    copies it each time)."""
    if state is None:
        state = empty_transcript()
    answer, thoughts = state["answer"], state["thoughts"]
    answer_parts: list[str] = [answer["text"]]
    thought_parts: list[str] = [thoughts["text"]]
    last_seq = state["lastSeq"]
    for event in events:
        for op in transcript_ops(event):
            name = op["op"]
            if name == "answer.append":
                answer_parts.append(op["text"])
            elif name == "thought.append":
                thought_parts.append(op["text"])
                thoughts["chunks"] += 1
            elif name == "answer.final":
                if op["text"] is not None:
                    answer_parts = [op["text"]]
                answer["final"] = True
            else:
                apply_op(state, op)
        if event.seq > last_seq:
            last_seq = event.seq
    answer["text"] = "".join(answer_parts)
    thoughts["text"] = "".join(thought_parts)
    state["lastSeq"] = last_seq
    return state
