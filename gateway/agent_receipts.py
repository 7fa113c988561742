"""Receipts for the tool calls an agent runs itself (its own file reads, shell commands, ...).

The tool facade receipts every call that goes through the gateway (``source: "gateway"``,
:mod:`agent_gateway.tools`). An agent's native tools never reach the facade, but runtimes report
them as ``tool.started`` / ``tool.updated`` / ``tool.completed`` events (ACP ``tool_call`` /
``tool_call_update``, Pi's ``tool_execution_*``). :class:`AgentToolLedger` follows those events of
one run — every source but the facade's own (``tool``) and replayed history — and makes one receipt
per call (``source: "agent"``) when it reaches ``completed`` or ``failed``, or when the turn ends
with the call unfinished (its last status). The run manager feeds it from the journal and stores
its receipts with the run's next group commit, and all of them before the run's terminal event.

What an agent reports is untrusted text: each field is cut to a bound, locations are kept as
reported (never resolved on the host), raw output is never kept and raw input only as a short JSON
head. A run gets at most :data:`AGENT_RECEIPTS_PER_RUN` of them, then one receipt saying how many
calls were left out (``status: "truncated"``).
"""

from __future__ import annotations

import json
import logging
import secrets
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from agent_gateway.models import Event, Run, now_ms
from agent_gateway.storage import Storage
from agent_gateway.tools import RECEIPT_SCHEMA, clean_text

log = logging.getLogger("agent_gateway.agent_receipts")

AGENT_RECEIPTS_PER_RUN = 1000
ID_CHARS = 200
TITLE_CHARS = 500
TOOL_CHARS = 100
PATH_CHARS = 1000
LOCATIONS_KEPT = 10
INPUT_SUMMARY_CHARS = 200
LINE_MAX = 2**31 - 1

TOOL_EVENT_KINDS = frozenset({"tool.started", "tool.updated", "tool.completed"})
# Tool events that are not an agent's own calls: the facade's (already receipted) and history an
# agent replays when its session is loaded (calls of earlier runs).
NOT_AGENT_SOURCES = frozenset({"tool", "gateway", "adapter_replay"})
KINDS = frozenset({"read", "edit", "delete", "move", "search", "execute", "think", "fetch", "other"})
STATUSES = frozenset({"pending", "in_progress", "completed", "failed"})
FINAL_STATUSES = frozenset({"completed", "failed"})


def _cut(value: Any, limit: int) -> str | None:
    """``value`` cut to ``limit`` characters (``…`` marks a cut), valid UTF-8; None if not text."""
    if not isinstance(value, str):
        return None
    if len(value) > limit:
        value = value[:limit] + "…"
    return clean_text(value)


class _Full(Exception):
    pass


def json_head(value: Any, limit: int = INPUT_SUMMARY_CHARS) -> str:
    """The first ``limit`` characters of ``value`` as JSON (``…`` marks a cut). The work is bounded
    by ``limit``, however large or deep ``value`` is."""
    parts: list[str] = []
    size = 0

    def emit(text: str) -> None:
        nonlocal size
        parts.append(text)
        size += len(text)
        if size > limit:
            raise _Full

    def walk(item: Any, depth: int) -> None:
        if isinstance(item, str):
            emit(json.dumps(item[:limit], ensure_ascii=False))
        elif item is None or isinstance(item, (bool, int, float)):
            emit(json.dumps(item))
        elif depth >= 8:
            emit('"…"')
        elif isinstance(item, dict):
            emit("{")
            for index, (key, nested) in enumerate(item.items()):
                emit(("," if index else "") + json.dumps(str(key)[:limit], ensure_ascii=False) + ":")
                walk(nested, depth + 1)
            emit("}")
        elif isinstance(item, (list, tuple)):
            emit("[")
            for index, nested in enumerate(item):
                if index:
                    emit(",")
                walk(nested, depth + 1)
            emit("]")
        else:
            emit(json.dumps(str(item)[:limit], ensure_ascii=False))

    try:
        walk(value, 0)
    except _Full:
        return clean_text("".join(parts)[:limit] + "…")
    return clean_text("".join(parts))


def _locations(value: Any) -> list[dict[str, Any]] | None:
    """Reported locations ``[{path, line?}]``, bounded; None when the update has none."""
    if not isinstance(value, list):
        return None
    kept: list[dict[str, Any]] = []
    for entry in value[:LOCATIONS_KEPT]:
        if not isinstance(entry, dict):
            continue
        path = _cut(entry.get("path"), PATH_CHARS)
        if path is None:
            continue
        location: dict[str, Any] = {"path": path}
        line = entry.get("line")
        if isinstance(line, int) and not isinstance(line, bool) and 0 <= line <= LINE_MAX:
            location["line"] = line
        kept.append(location)
    return kept


@dataclass
class _Call:
    tool_call_id: str
    started_at: int
    title: str | None = None
    tool: str | None = None
    kind: str | None = None
    status: str = "pending"  # ACP's default for a tool_call that names none
    locations: list[dict[str, Any]] = field(default_factory=list)
    input_summary: str | None = None

    def update(self, payload: dict[str, Any]) -> None:
        """Take the fields this update carries (an ACP update repeats only what changed)."""
        title = _cut(payload.get("title"), TITLE_CHARS)
        if title is not None:
            self.title = title
        tool = _cut(payload.get("tool"), TOOL_CHARS)
        if tool is not None:
            self.tool = tool
        kind = payload.get("kind")
        if isinstance(kind, str):
            self.kind = kind if kind in KINDS else "other"
        status = payload.get("status")
        if isinstance(status, str) and status in STATUSES:
            self.status = status
        locations = _locations(payload.get("locations"))
        if locations is not None:
            self.locations = locations
        for key in ("rawInput", "arguments"):  # ACP's, Pi's
            if payload.get(key) is not None:
                self.input_summary = json_head(payload[key])
                break


class AgentToolLedger:
    """One run's agent-reported tool calls, turned into receipts (see the module docstring).

    ``observe`` runs on the event loop (from the journal's ``on_append``), ``store`` on a worker
    thread; ``pending`` (receipts made, not yet stored) is the only state they share."""

    def __init__(self, run: Run, limit: int = AGENT_RECEIPTS_PER_RUN) -> None:
        self.run = run
        self.limit = limit
        self.open: dict[str, _Call] = {}  # calls not finished yet, in the order they started
        self.made = 0  # receipts made for calls
        self.omitted = 0  # calls left out once the limit was reached
        self.closed = False
        self.pending: deque[dict[str, Any]] = deque()
        self.store_scheduled = False
        self._storing = threading.Lock()  # one `store` at a time (each takes the queue's head)

    def observe(self, event: Event) -> bool:
        """Follow one tool event of the run; True when it finished a call (a receipt is pending)."""
        if self.closed:
            return False
        payload = event.payload
        if not isinstance(payload, dict):
            return False
        call_id = _cut(payload.get("toolCallId"), ID_CHARS)
        if not call_id:
            return False  # nothing to tell its updates apart by
        call = self.open.get(call_id)
        if call is None:
            if self.made + len(self.open) >= self.limit:
                if event.kind == "tool.started":
                    self.omitted += 1
                return False
            call = self.open[call_id] = _Call(call_id, now_ms())
        call.update(payload)
        if event.kind == "tool.completed" and call.status not in FINAL_STATUSES:
            call.status = "completed"  # a runtime said it ended, without a status
        if call.status in FINAL_STATUSES:
            del self.open[call_id]
            self._make(call)
            return True
        return False

    def close(self) -> bool:
        """The turn ended: receipts for the calls left unfinished (their last status) and, past the
        limit, one for the calls left out. Later events are ignored. True if it made any."""
        if self.closed:
            return False
        self.closed = True
        unfinished = list(self.open.values())
        self.open.clear()
        for call in unfinished:
            self._make(call)
        if self.omitted:
            self.pending.append(
                {
                    **self._base(None),
                    "status": "truncated",
                    "limit": self.limit,
                    "omittedCalls": self.omitted,
                }
            )
        return bool(unfinished or self.omitted)

    def _base(self, call_id: str | None) -> dict[str, Any]:
        run = self.run
        return {
            "schema": RECEIPT_SCHEMA,
            "receiptId": "rcpt_" + secrets.token_hex(12),
            "source": "agent",
            "agentId": run.agent_id,
            "toolCallId": call_id,
            "hostRunId": run.host_run_id,
            "actorId": run.actor_id,
            "workspaceId": run.workspace_id,
            "agentSessionId": run.provider_run_id,
            "createdAt": now_ms(),
        }

    def _make(self, call: _Call) -> None:
        self.made += 1
        self.pending.append(
            {
                **self._base(call.tool_call_id),
                "tool": call.tool,
                "kind": call.kind,
                "title": call.title,
                "status": call.status,
                "locations": call.locations,
                "inputSummary": call.input_summary,
                "startedAt": call.started_at,
            }
        )

    def store(self, storage: Storage) -> None:
        """Store the pending receipts, oldest first (a worker thread). A receipt leaves the queue
        once stored, so a retry after a storage error stores the rest (a repeated insert is
        stored once); one storage refuses as malformed is logged and dropped."""
        with self._storing:
            self.store_scheduled = False
            pending = self.pending
            while pending:
                try:
                    storage.insert_receipt(pending[0])
                except (ValueError, TypeError):
                    log.exception("dropped an agent tool receipt of run %s that storage refused", self.run.host_run_id)
                pending.popleft()
