"""A run's journal as AG-UI events: the stateful translation and the resume prelude.

AG-UI is a stateful protocol: a text message is opened, filled and closed, so the events one
journal event becomes depend on what came before (a ``message.delta`` opens a message only if none
is open). :class:`AgUiTranslator` holds that state for one stream and turns each journal event into
its group of AG-UI events, built with the official ``ag_ui`` models. The ids it makes up (message,
reasoning and tool-result ids) are derived from the run id and the seq, so translating the same
journal again gives the same events: that is what makes a stream resumable.

Frames: every AG-UI event of the group made from the event with seq ``N`` is written with the
official encoder, preceded by an ``id:`` line. The group's last frame carries ``id: N`` (the
18-digit padded seq, as the native stream's); an earlier frame of the group carries ``id: N:k``
(the client then has the group's first ``k`` frames), so a connection cut inside a group resumes
at the exact frame. A resumed stream opens with a prelude (:func:`prelude`): ``RUN_STARTED``
again, the last state snapshot, and a start event for every step, reasoning span or message, text
message and tool call the client had open at the cut, so its state machine stays valid.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import orjson
from ag_ui.core import (
    BaseEvent,
    CustomEvent,
    EventType,
    ReasoningEndEvent,
    ReasoningMessageContentEvent,
    ReasoningMessageEndEvent,
    ReasoningMessageStartEvent,
    ReasoningStartEvent,
    RunErrorEvent,
    RunFinishedCancelledOutcome,
    RunFinishedEvent,
    RunFinishedSuccessOutcome,
    RunStartedEvent,
    StateSnapshotEvent,
    StepFinishedEvent,
    StepStartedEvent,
    TextMessageContentEvent,
    TextMessageEndEvent,
    TextMessageStartEvent,
    ToolCallArgsEvent,
    ToolCallEndEvent,
    ToolCallResultEvent,
    ToolCallStartEvent,
)
from ag_ui.encoder import EventEncoder

if TYPE_CHECKING:
    from agent_gateway import Event, Run

# CUSTOM event names (namespaced: a client can tell the gateway's apart from its agents').
PERMISSION_REQUESTED = "agent_gateway.permission_requested"
PERMISSION_RESOLVED = "agent_gateway.permission_resolved"
FILES_CHANGED = "agent_gateway.files_changed"
# The result text of a tool call is cut here: a UI card, not the agent's full output.
MAX_RESULT_CHARS = 20_000
# `Last-Event-ID` of an AG-UI stream: a seq (up to 18 digits), optionally `:<frames of its group>`.
CURSOR = re.compile(r"([0-9]{1,18})(?::([0-9]{1,6}))?")

_ENCODER = EventEncoder()
_TERMINAL_KINDS = frozenset({"run.completed", "run.failed", "run.cancelled", "run.interrupted"})
_TOOL_DONE = frozenset({"completed", "failed"})


def _json(value: Any) -> str:
    return orjson.dumps(value, default=str).decode()


def _text_of(value: Any, limit: int = MAX_RESULT_CHARS) -> str:
    """The readable text of a tool's ACP ``content`` / ``rawOutput`` (text blocks joined), else JSON."""
    parts: list[str] = []
    if isinstance(value, list):
        for block in value:
            inner = block.get("content") if isinstance(block, dict) else None
            if isinstance(inner, dict) and isinstance(inner.get("text"), str):
                parts.append(inner["text"])
            elif isinstance(block, dict) and isinstance(block.get("text"), str):
                parts.append(block["text"])
    text = "".join(parts) if parts else (value if isinstance(value, str) else _json(value))
    return text[:limit]


class AgUiTranslator:
    """Turns one run's journal events, in seq order, into AG-UI events (one translator per stream)."""

    def __init__(self, run: Run) -> None:
        self.thread_id = run.session_id
        self.session_id = run.session_id  # the gateway session (the thread, or the one its history continued)
        self.run_id = run.request_id  # the AG-UI runId the client sent
        self.host_run_id = run.host_run_id
        self.text_id: str | None = None  # the open text message
        self.reasoning_id: str | None = None  # the open reasoning span (and its one message)
        self.tools: dict[str, bool] = {}  # open tool calls -> whether their args were sent
        self.ended_tools: set[str] = set()
        self.steps: list[str] = []  # open steps (plan entries in progress), in order
        self.state: dict[str, Any] = {}
        self.finished = False
        self.ignored: list[str] = []  # input fields the run left out (`[ag_ui] client_tools`)

    # -- helpers ---------------------------------------------------------------------------------
    def _close_text(self, out: list[BaseEvent]) -> None:
        if self.text_id is not None:
            out.append(TextMessageEndEvent(message_id=self.text_id))
            self.text_id = None

    def _close_reasoning(self, out: list[BaseEvent]) -> None:
        if self.reasoning_id is not None:
            out.append(ReasoningMessageEndEvent(message_id=self.reasoning_id))
            out.append(ReasoningEndEvent(message_id=self.reasoning_id))
            self.reasoning_id = None

    def _close_all(self, out: list[BaseEvent]) -> None:
        self._close_reasoning(out)
        self._close_text(out)
        for tool_call_id in list(self.tools):
            self._end_tool(tool_call_id, None, out)
        for step in self.steps:
            out.append(StepFinishedEvent(step_name=step))
        self.steps = []

    def _end_tool(self, tool_call_id: str, payload: dict[str, Any] | None, out: list[BaseEvent]) -> None:
        self.tools.pop(tool_call_id, None)
        self.ended_tools.add(tool_call_id)
        out.append(ToolCallEndEvent(tool_call_id=tool_call_id))
        if payload is None:
            return
        result: Any = payload.get("content") or payload.get("rawOutput")
        if result is None:
            error = payload.get("error")
            result = error if error is not None else {"status": payload.get("status") or "completed"}
        out.append(
            ToolCallResultEvent(
                message_id=f"{self.host_run_id}-result-{tool_call_id}",
                tool_call_id=tool_call_id,
                content=_text_of(result) or "(no output)",
                role="tool",
            )
        )

    def _tool(self, kind: str, payload: dict[str, Any], out: list[BaseEvent]) -> None:
        call_id = payload.get("toolCallId")
        if not isinstance(call_id, str) or not call_id or call_id in self.ended_tools:
            return  # an update after the end has nothing left to say in AG-UI
        self._close_reasoning(out)
        if call_id not in self.tools:
            name = payload.get("title") or payload.get("tool") or payload.get("kind") or "tool"
            out.append(
                ToolCallStartEvent(tool_call_id=call_id, tool_call_name=str(name)[:200], parent_message_id=self.text_id)
            )
            self.tools[call_id] = False
        # A tool call comes after the text that announced it: the next text is a new message.
        self._close_text(out)
        arguments = payload.get("rawInput", payload.get("arguments"))
        if arguments is not None and not self.tools[call_id]:
            delta = arguments if isinstance(arguments, str) else _json(arguments)
            out.append(ToolCallArgsEvent(tool_call_id=call_id, delta=delta))
            self.tools[call_id] = True
        if kind == "tool.completed" or payload.get("status") in _TOOL_DONE:
            self._end_tool(call_id, payload, out)

    def _client_tool(self, payload: dict[str, Any], out: list[BaseEvent]) -> None:
        """A call of one of the client's own tools that the model asks for: the client runs it and
        sends the result in its next input, so it has no TOOL_CALL_RESULT here."""
        call_id, name, arguments = payload.get("toolCallId"), payload.get("name"), payload.get("arguments")
        if not isinstance(call_id, str) or not call_id or not isinstance(name, str) or call_id in self.ended_tools:
            return
        self._close_reasoning(out)
        out.append(ToolCallStartEvent(tool_call_id=call_id, tool_call_name=name, parent_message_id=self.text_id))
        self._close_text(out)
        if isinstance(arguments, str) and arguments:
            out.append(ToolCallArgsEvent(tool_call_id=call_id, delta=arguments))
        out.append(ToolCallEndEvent(tool_call_id=call_id))
        self.ended_tools.add(call_id)

    def _plan(self, payload: dict[str, Any], out: list[BaseEvent]) -> None:
        entries = payload.get("entries")
        if not isinstance(entries, list):
            entries = []
        running = [
            str(e.get("content"))[:200]
            for e in entries
            if isinstance(e, dict) and e.get("status") == "in_progress" and e.get("content")
        ]
        for step in [s for s in self.steps if s not in running]:
            out.append(StepFinishedEvent(step_name=step))
            self.steps.remove(step)
        for step in running:
            if step not in self.steps:
                out.append(StepStartedEvent(step_name=step))
                self.steps.append(step)
        self.state = {**self.state, "plan": entries}
        out.append(StateSnapshotEvent(snapshot=self.state))

    # -- the translation ---------------------------------------------------------------------------
    def content_frame(self, event: Event) -> bytes | None:
        """The hot path: a delta into the text message or reasoning already open is one
        TEXT_MESSAGE_CONTENT / REASONING_MESSAGE_CONTENT frame, written here byte for byte as the
        official encoder writes that model (a test holds them equal) without building the model,
        which costs several times the native stream's whole per-event work. None: not that case."""
        kind = event.kind
        if kind == "message.delta":
            open_id, event_type = self.text_id, b"TEXT_MESSAGE_CONTENT"
            if self.reasoning_id is not None:
                return None
        elif kind == "thought.delta":
            open_id, event_type = self.reasoning_id, b"REASONING_MESSAGE_CONTENT"
        else:
            return None
        text = event.payload.get("text")
        if (
            open_id is None
            or self.finished
            or event.source == "adapter_replay"
            or not isinstance(text, str)
            or not text
        ):
            return None
        return b'id: %018d\ndata: {"type":"%b","messageId":%b,"delta":%b}\n\n' % (
            event.seq,
            event_type,
            orjson.dumps(open_id),
            orjson.dumps(text),
        )

    def translate(self, event: Event) -> list[BaseEvent]:
        """The AG-UI events of one journal event (often none, sometimes several)."""
        if self.finished:
            return []
        kind, payload = event.kind, event.payload
        out: list[BaseEvent] = []
        if event.source == "adapter_replay":
            return out  # history an agent replays on load is not new output
        if kind == "message.delta":
            text = payload.get("text")
            if isinstance(text, str) and text:
                self._close_reasoning(out)
                if self.text_id is None:  # named after its first delta's seq, merged or not
                    self.text_id = f"{self.host_run_id}-msg-{merged_from(event) or event.seq}"
                    out.append(TextMessageStartEvent(message_id=self.text_id, role="assistant"))
                out.append(TextMessageContentEvent(message_id=self.text_id, delta=text))
        elif kind == "message.completed":
            text = payload.get("text")
            if self.text_id is None and isinstance(text, str) and text:
                # A final answer that came whole, without deltas.
                self._close_reasoning(out)
                self.text_id = f"{self.host_run_id}-msg-{event.seq}"
                out.append(TextMessageStartEvent(message_id=self.text_id, role="assistant"))
                out.append(TextMessageContentEvent(message_id=self.text_id, delta=text))
            self._close_text(out)
        elif kind == "thought.delta":
            text = payload.get("text")
            if isinstance(text, str) and text:
                self._close_text(out)
                if self.reasoning_id is None:
                    self.reasoning_id = f"{self.host_run_id}-reasoning-{merged_from(event) or event.seq}"
                    out.append(ReasoningStartEvent(message_id=self.reasoning_id))
                    out.append(ReasoningMessageStartEvent(message_id=self.reasoning_id, role="reasoning"))
                out.append(ReasoningMessageContentEvent(message_id=self.reasoning_id, delta=text))
        elif kind in ("tool.started", "tool.updated", "tool.completed"):
            self._tool(kind, payload, out)
        elif kind == "client_tool.requested":
            self._client_tool(payload, out)
        elif kind == "plan.updated":
            self._plan(payload, out)
        elif kind == "session.info.updated":
            mode = payload.get("sessionMode")
            if isinstance(mode, str):
                self.state = {**self.state, "sessionMode": mode}
                if isinstance(payload.get("agentSessionId"), str):
                    self.state["agentSessionId"] = payload["agentSessionId"]
                out.append(StateSnapshotEvent(snapshot=self.state))
        elif kind == "permission.requested":
            request_id = payload.get("requestId")
            value = {
                **payload,
                "hostRunId": self.host_run_id,
                "respondUrl": f"/v1/runs/{self.host_run_id}/permissions/{request_id}",
            }
            out.append(CustomEvent(name=PERMISSION_REQUESTED, value=value))
        elif kind == "permission.resolved":
            out.append(CustomEvent(name=PERMISSION_RESOLVED, value=payload))
        elif kind == "files.changed":
            out.append(CustomEvent(name=FILES_CHANGED, value=payload))
        elif kind == "run.created":
            out.append(self.run_started())
        elif kind in _TERMINAL_KINDS:
            self._close_all(out)
            out.append(self._terminal(kind, payload))
            self.finished = True
        return out

    def run_started(self, resumed: bool = False) -> RunStartedEvent:
        gateway: dict[str, Any] = {
            "hostRunId": self.host_run_id,
            "sessionId": self.session_id,
            "resumeUrl": f"/v1/ag-ui/runs/{self.host_run_id}/stream",
        }
        if resumed:
            gateway["resumed"] = True
        if self.ignored:
            gateway["ignored"] = self.ignored
        return RunStartedEvent(thread_id=self.thread_id, run_id=self.run_id, metadata={"agentGateway": gateway})

    def _terminal(self, kind: str, payload: dict[str, Any]) -> BaseEvent:
        reason = payload.get("reason")
        if kind == "run.completed":
            return RunFinishedEvent(
                thread_id=self.thread_id,
                run_id=self.run_id,
                result={"hostRunId": self.host_run_id, "status": "completed"},
                outcome=RunFinishedSuccessOutcome(type="success"),
            )
        if kind == "run.cancelled":
            return RunFinishedEvent(
                thread_id=self.thread_id,
                run_id=self.run_id,
                result={"hostRunId": self.host_run_id, "status": "cancelled", "reason": reason},
                outcome=RunFinishedCancelledOutcome(type="cancelled"),
            )
        status = kind.removeprefix("run.")
        message = reason if isinstance(reason, str) and reason else f"the run {status}"
        return RunErrorEvent(message=message, code=status)


# -- frames --------------------------------------------------------------------------------------


def frame(event: BaseEvent, frame_id: str) -> str:
    """One SSE frame: an ``id:`` line, then the official encoder's ``data:`` frame."""
    return f"id: {frame_id}\n{_ENCODER.encode(event)}"


def merged_from(event: Event) -> int | None:
    """The first seq of a delta the bus merged for a client that fell behind (None: not merged)."""
    first = event.payload.get("mergedFrom")
    return first if isinstance(first, int) and 0 < first < event.seq else None


def group_frames(seq: int, events: list[BaseEvent], skip: int = 0, first_seq: int | None = None) -> list[str]:
    """The frames of the AG-UI events made from the journal event ``seq`` (the first ``skip`` left
    out). A merged delta's group (``first_seq``: its first seq) opens as the group of its first
    delta would (a message start), so its earlier frames carry that delta's ids: a client cut
    there resumes exactly as from the unmerged journal."""
    last = len(events) - 1
    padded, opening = f"{seq:018d}", f"{seq if first_seq is None else first_seq:018d}"
    return [frame(event, padded if i == last else f"{opening}:{i + 1}") for i, event in enumerate(events) if i >= skip]


class Resumption:
    """Rebuilds a resumed stream's start: fed the journal up to the cursor's seq, in order, it
    translates it as the client's stream did and tracks what the client holds open."""

    def __init__(self, translator: AgUiTranslator, after: int, cut: int | None) -> None:
        self.translator = translator
        self.after = after
        self.cut = cut  # frames of the `after` group the client has (None: all of them)
        self.received = OpenItems()
        self.rest: list[str] = []

    def feed(self, event: Event) -> None:
        translated = self.translator.translate(event)
        if event.seq == self.after and self.cut is not None:
            self.received.feed(translated[: self.cut])
            self.rest = group_frames(event.seq, translated, skip=self.cut)
        else:
            self.received.feed(translated)

    def head(self, cursor: str) -> bytes:
        """The prelude (its frames carry ``cursor``), then the rest of the group the client was cut in."""
        frames = [frame(event, cursor) for event in prelude(self.translator, self.received)]
        return "".join(frames + self.rest).encode()


class OpenItems:
    """What a client has open after the AG-UI events it received: the prelude re-opens it."""

    def __init__(self) -> None:
        self.open: dict[tuple[str, str], BaseEvent] = {}  # (kind, id) -> its start event, in order
        self.state: StateSnapshotEvent | None = None
        self.started = False
        self.ended = False

    def feed(self, events: Iterable[BaseEvent]) -> None:
        for event in events:
            kind = event.type
            if kind == EventType.TEXT_MESSAGE_START:
                self.open[("text", event.message_id)] = event  # type: ignore[attr-defined]
            elif kind == EventType.TEXT_MESSAGE_END:
                self.open.pop(("text", event.message_id), None)  # type: ignore[attr-defined]
            elif kind == EventType.REASONING_START:
                self.open[("reasoning", event.message_id)] = event  # type: ignore[attr-defined]
            elif kind == EventType.REASONING_END:
                self.open.pop(("reasoning", event.message_id), None)  # type: ignore[attr-defined]
            elif kind == EventType.REASONING_MESSAGE_START:
                self.open[("reasoning_message", event.message_id)] = event  # type: ignore[attr-defined]
            elif kind == EventType.REASONING_MESSAGE_END:
                self.open.pop(("reasoning_message", event.message_id), None)  # type: ignore[attr-defined]
            elif kind == EventType.TOOL_CALL_START:
                self.open[("tool", event.tool_call_id)] = event  # type: ignore[attr-defined]
            elif kind == EventType.TOOL_CALL_END:
                self.open.pop(("tool", event.tool_call_id), None)  # type: ignore[attr-defined]
            elif kind == EventType.STEP_STARTED:
                self.open[("step", event.step_name)] = event  # type: ignore[attr-defined]
            elif kind == EventType.STEP_FINISHED:
                self.open.pop(("step", event.step_name), None)  # type: ignore[attr-defined]
            elif kind == EventType.STATE_SNAPSHOT:
                self.state = event  # type: ignore[assignment]
            elif kind == EventType.RUN_STARTED:
                self.started = True
            elif kind in (EventType.RUN_FINISHED, EventType.RUN_ERROR):
                self.ended = True


def prelude(translator: AgUiTranslator, received: OpenItems) -> list[BaseEvent]:
    """What a resumed stream sends first so the rest is valid on its own: nothing if the client saw
    the run end or never saw it start, else ``RUN_STARTED`` again, the last state and a start
    event for everything the client had open (a parent before what it holds)."""
    if received.ended or not received.started:
        return []
    events: list[BaseEvent] = [translator.run_started(resumed=True)]
    if received.state is not None:
        events.append(received.state)
    events.extend(received.open.values())
    return events
