"""Journal events → OpenAI wire objects: chat-completion chunks and Responses stream events.

Both encoders are fed a run's events in seq order (replay, then the live tail) and keep the little
state each protocol needs (is the message open, which output index a tool call has). The
Responses stream is opened with ``merge_deltas=False``, so it gets every journal event, never a
merged delta (``PluginRoutes.stream`` replays a slow client from the journal instead) and
``sequence_number`` depends on the journal alone: dense, and a resumed stream numbers every event
as the first stream did. A delta the journal compacted after the run ended (``mergedCount``
deltas in one, keeping the last one's seq) takes as many numbers and is sent under the last, so
numbers keep their meaning (a resume of a compacted run skips the inner ones). Chat chunks are
not numbered: a merged delta there is just longer text.

Tool activity is summarised (id, tool name or title, kind, status): never the tool's arguments,
results, receipt ids or paths.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import Any

import orjson

from agent_gateway import Event, Run

REPLAY_SOURCE = "adapter_replay"  # history an agent replays on load: never new output
TERMINAL_STATUS = {
    "run.completed": "completed",
    "run.failed": "failed",
    "run.cancelled": "cancelled",
    "run.interrupted": "interrupted",
}
TOOL_KINDS = frozenset({"tool.started", "tool.updated", "tool.completed"})
# A call of a client-defined tool the model asks for (chat-only with `tools`): given to the client.
CLIENT_TOOL_CALL = "client_tool.requested"
SUMMARY_TEXT_LIMIT = 200
# What the Responses API calls a run's status.
RESPONSE_STATUS = {
    "pending": "queued",
    "queued": "queued",
    "running": "in_progress",
    "awaiting_permission": "in_progress",
    "completed": "completed",
    "failed": "failed",
    "cancelled": "cancelled",
    "interrupted": "incomplete",
}
RESPONSE_PREFIX = "resp_"
COMPLETION_PREFIX = "chatcmpl-"


def dumps(value: Any) -> bytes:
    return orjson.dumps(value)


def _text(payload: dict[str, Any]) -> str:
    text = payload.get("text")
    return text if isinstance(text, str) else ""


def _span(payload: dict[str, Any]) -> int:
    """How many journal seqs a text delta stands for: 1, or ``mergedCount`` for a delta the
    journal compacted after the run ended (it keeps the seq of the last delta it covers)."""
    count = payload.get("mergedCount", 1)
    return count if isinstance(count, int) and not isinstance(count, bool) and count > 1 else 1


def tool_summary(event: Event) -> dict[str, Any] | None:
    """What a client may see of a tool event: never arguments, results, receipts or paths."""
    payload = event.payload
    call_id = payload.get("toolCallId")
    if not isinstance(call_id, str) or not call_id:
        return None
    name = payload.get("tool") if isinstance(payload.get("tool"), str) else payload.get("title")
    status = payload.get("status")
    if not isinstance(status, str):
        status = "completed" if event.kind == "tool.completed" else "in_progress"
    if event.kind == "tool.completed" and payload.get("error") is not None:
        status = "failed"
    summary: dict[str, Any] = {
        "id": call_id[:SUMMARY_TEXT_LIMIT],
        "name": name[:SUMMARY_TEXT_LIMIT] if isinstance(name, str) else "tool",
        "status": status[:40],
    }
    if isinstance(payload.get("kind"), str):
        summary["kind"] = payload["kind"][:40]
    return summary


def client_tool_call(payload: dict[str, Any]) -> dict[str, str] | None:
    """A ``client_tool.requested`` payload's call ``{id, name, arguments}`` (None if malformed)."""
    call_id, name, arguments = payload.get("toolCallId"), payload.get("name"), payload.get("arguments", "")
    if not isinstance(call_id, str) or not call_id or not isinstance(name, str):
        return None
    return {"id": call_id, "name": name, "arguments": arguments if isinstance(arguments, str) else ""}


def _tool_finished(status: str) -> bool:
    return status in ("completed", "failed")


# The token counts of a `usage.updated` payload (the names of ACP's prompt `usage`); a payload
# with none of them (ACP `usage_update`: the session's context `used`/`size`) counts no tokens.
TOKEN_FIELDS = ("inputTokens", "outputTokens", "totalTokens", "thoughtTokens", "cachedReadTokens", "cachedWriteTokens")


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


class RunUsage:
    """The run's token counts from its ``usage.updated`` events: each event carrying counts holds
    the run's totals so far (a later one replaces an earlier one, field by field)."""

    __slots__ = ("tokens",)

    def __init__(self) -> None:
        self.tokens: dict[str, int] = {}

    def add(self, payload: dict[str, Any]) -> None:
        for name in TOKEN_FIELDS:
            count = _count(payload.get(name))
            if count is not None:
                self.tokens[name] = count

    def _counts(self) -> tuple[int, int, int] | None:
        tokens = self.tokens
        if "inputTokens" not in tokens and "outputTokens" not in tokens and "totalTokens" not in tokens:
            return None
        given, taken = tokens.get("inputTokens", 0), tokens.get("outputTokens", 0)
        return given, taken, tokens.get("totalTokens", given + taken)

    def chat(self) -> dict[str, Any] | None:
        """The chat completion's ``usage`` (None: the runtime reported no token counts)."""
        counts = self._counts()
        if counts is None:
            return None
        usage: dict[str, Any] = {"prompt_tokens": counts[0], "completion_tokens": counts[1], "total_tokens": counts[2]}
        if "cachedReadTokens" in self.tokens:
            usage["prompt_tokens_details"] = {"cached_tokens": self.tokens["cachedReadTokens"]}
        if "thoughtTokens" in self.tokens:
            usage["completion_tokens_details"] = {"reasoning_tokens": self.tokens["thoughtTokens"]}
        return usage

    def responses(self) -> dict[str, Any] | None:
        """The Responses API ``usage`` (None: the runtime reported no token counts)."""
        counts = self._counts()
        if counts is None:
            return None
        return {
            "input_tokens": counts[0],
            "input_tokens_details": {"cached_tokens": self.tokens.get("cachedReadTokens", 0)},
            "output_tokens": counts[1],
            "output_tokens_details": {"reasoning_tokens": self.tokens.get("thoughtTokens", 0)},
            "total_tokens": counts[2],
        }


def run_failure(payload: dict[str, Any]) -> str:
    reason = payload.get("reason")
    return reason[:2000] if isinstance(reason, str) and reason else "the agent run did not complete"


# -- chat completions -------------------------------------------------------------------------------


class ChatCompletion:
    """Folds a run's events into chat-completion chunks (``encode``) or one completion (``result``)."""

    def __init__(
        self, run: Run, *, reasoning: bool, include_usage: bool = False, ignored: list[str] | None = None
    ) -> None:
        self.id = COMPLETION_PREFIX + run.host_run_id
        self.ignored = ignored or []  # request fields the run left out (`[openai_compat] client_tools`)
        self.client_calls: list[dict[str, Any]] = []  # the client tools the model asks to call
        self.model = run.agent_id
        self.created = run.created_at // 1000
        self.run = run
        self.reasoning = reasoning
        self.include_usage = include_usage
        self.parts: list[str] = []
        self.thoughts: list[str] = []
        self.final_text: str | None = None
        self.tools: dict[str, dict[str, Any]] = {}
        self.status: str | None = None
        self.failure: str | None = None
        self.session_mode: str | None = None
        self.usage = RunUsage()
        self._started = False
        head = b'{"id":%b,"object":"chat.completion.chunk","created":%d,"model":%b,"choices":[{"index":0,"delta":'
        self._head = head % (dumps(self.id), self.created, dumps(self.model))
        # A delta's whole frame but its JSON text, for `%`: one bytes operation per delta.
        tail = b'},"finish_reason":null}]}\n\n'
        escaped = b"data: " + self._head.replace(b"%", b"%%")
        self._content_frame = escaped + b'{"content":%b' + tail
        self._thought_frame = escaped + b'{"reasoning_content":%b' + tail

    def _chunk(self, delta: dict[str, Any], finish: str | None = None, **extra: Any) -> bytes:
        chunk = {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
            **extra,
        }
        return b"data: " + dumps(chunk) + b"\n\n"

    def _gateway_extension(self) -> dict[str, Any]:
        extension: dict[str, Any] = {
            "hostRunId": self.run.host_run_id,
            "sessionId": self.run.session_id,
            "sessionMode": self.session_mode,
            "status": self.status,
            "tools": list(self.tools.values()),
        }
        if self.ignored:
            extension["ignored"] = self.ignored
        return extension

    def _client_call(self, event: Event) -> bytes:
        call = client_tool_call(event.payload)
        if call is None:
            return b""
        index = len(self.client_calls)
        function = {"name": call["name"], "arguments": call["arguments"]}
        wire = {"id": call["id"], "type": "function", "function": function}
        self.client_calls.append(wire)
        return self._chunk({"tool_calls": [{"index": index, **wire}]})

    def encode(self, events: list[Event]) -> bytes:
        """The SSE bytes of a batch (``data: <chunk>`` frames; ``data: [DONE]`` after the end)."""
        out: list[bytes] = []
        append, to_json, content_frame, keep = out.append, orjson.dumps, self._content_frame, self.parts.append
        for event in events:
            kind = event.kind
            if kind == "message.delta" and event.source != REPLAY_SOURCE:  # the hot path
                text = event.payload.get("text")
                if text and isinstance(text, str):
                    keep(text)
                    append(content_frame % to_json(text))
                continue
            if event.source == REPLAY_SOURCE:
                continue
            if kind == "thought.delta":
                text = _text(event.payload)
                self.thoughts.append(text)
                if self.reasoning and text:
                    append(self._thought_frame % to_json(text))
            elif kind == "run.created" and not self._started:
                self._started = True
                out.append(self._chunk({"role": "assistant", "content": ""}))
            elif kind in TOOL_KINDS:
                summary = tool_summary(event)
                if summary is not None and self.tools.get(summary["id"]) != summary:
                    self.tools[summary["id"]] = summary
                    out.append(self._chunk({}, agent_gateway={"tool": summary}))
            elif kind == CLIENT_TOOL_CALL:
                out.append(self._client_call(event))
            elif kind == "message.completed":
                final = event.payload.get("text")
                if isinstance(final, str):
                    streamed = "".join(self.parts)
                    self.final_text = final
                    if final.startswith(streamed) and len(final) > len(streamed):
                        # An answer given only (or partly) in the completed event: send the rest.
                        rest = final[len(streamed) :]
                        self.parts.append(rest)
                        out.append(self._chunk({"content": rest}))
            elif kind == "session.info.updated":
                mode = event.payload.get("sessionMode")
                self.session_mode = mode if isinstance(mode, str) else self.session_mode
            elif kind == "usage.updated":
                self.usage.add(event.payload)
            elif kind in TERMINAL_STATUS:
                out.extend(self._end(event))
        return b"".join(out)

    def _end(self, event: Event) -> list[bytes]:
        self.status = TERMINAL_STATUS[event.kind]
        out: list[bytes] = []
        if self.status in ("failed", "interrupted"):
            self.failure = run_failure(event.payload)
            error = {"message": self.failure, "type": "server_error", "param": None, "code": f"run_{self.status}"}
            out.append(b"data: " + dumps({"error": error, "agent_gateway": self._gateway_extension()}) + b"\n\n")
        else:
            finish = "tool_calls" if self.client_calls and self.status == "completed" else "stop"
            out.append(self._chunk({}, finish, agent_gateway=self._gateway_extension()))
            if self.include_usage:
                usage = {"id": self.id, "object": "chat.completion.chunk", "created": self.created}
                usage.update(model=self.model, choices=[], usage=self.usage.chat())
                out.append(b"data: " + dumps(usage) + b"\n\n")
        out.append(b"data: [DONE]\n\n")
        return out

    def result(self, events: Iterable[Event]) -> dict[str, Any]:
        """The ``chat.completion`` object of a finished run's events."""
        for event in events:
            self.encode([event])
        text = self.final_text if self.final_text is not None else "".join(self.parts)
        message: dict[str, Any] = {"role": "assistant", "content": text, "refusal": None}
        finish = "stop"
        if self.client_calls:
            message["tool_calls"] = self.client_calls
            message["content"] = text or None
            finish = "tool_calls" if self.status == "completed" else finish
        if self.reasoning:
            message["reasoning_content"] = "".join(self.thoughts)
        return {
            "id": self.id,
            "object": "chat.completion",
            "created": self.created,
            "model": self.model,
            "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
            "usage": self.usage.chat(),
            "agent_gateway": self._gateway_extension(),
        }


# -- responses ------------------------------------------------------------------------------------------


class ResponseStream:
    """Folds a run's events into Responses stream events, numbered densely from 0, and into the
    ``response`` object. ``starting_after``: events numbered up to it are counted, not sent."""

    def __init__(
        self, run: Run, *, reasoning: bool, starting_after: int = -1, ignored: list[str] | None = None
    ) -> None:
        self.run = run
        self.ignored = ignored or []  # request fields the run left out (`[openai_compat] client_tools`)
        self.id = RESPONSE_PREFIX + run.host_run_id
        self.reasoning = reasoning
        self.starting_after = starting_after
        self.number = -1  # the last sequence_number given
        self.output: list[dict[str, Any]] = []
        self.status = RESPONSE_STATUS["pending"]
        self.error: dict[str, Any] | None = None
        self.incomplete: dict[str, Any] | None = None
        self.session_mode: str | None = None
        self.usage = RunUsage()
        self.tools: dict[str, int] = {}  # toolCallId -> output index
        self._message: int | None = None  # output index of the open message item
        self._message_parts: list[str] = []
        self._final_text: str | None = None
        self._reasoning: int | None = None  # output index of the open reasoning item
        self._reasoning_parts: list[str] = []
        self._delta_frame = b""  # set when the message item opens
        # A resume inside a compacted delta: its seq -> the text after the client's point.
        self.cut_texts: dict[int, str] = {}

    # -- the response object
    def response(self) -> dict[str, Any]:
        """The ``response`` object as of the events folded so far."""
        output = [dict(item) for item in self.output]
        if self._message is not None:  # still streaming: its text so far
            output[self._message] = self._message_item("in_progress")
        if self._reasoning is not None:
            output[self._reasoning] = self._reasoning_item("in_progress")
        run = self.run
        return {
            "id": self.id,
            "object": "response",
            "created_at": run.created_at // 1000,
            "status": self.status,
            "background": None,
            "model": run.agent_id,
            "output": output,
            "error": self.error,
            "incomplete_details": self.incomplete,
            "instructions": None,
            "metadata": {"session_id": run.session_id},
            "parallel_tool_calls": False,
            "temperature": None,
            "top_p": None,
            "tool_choice": "auto",
            "tools": [],
            "usage": self.usage.responses(),
            "agent_gateway": {
                "hostRunId": run.host_run_id,
                "sessionId": run.session_id,
                "sessionMode": self.session_mode,
                **({"ignored": self.ignored} if self.ignored else {}),
            },
        }

    def _message_item(self, status: str) -> dict[str, Any]:
        text = self._final_text if self._final_text is not None else "".join(self._message_parts)
        return {
            "type": "message",
            "id": "msg_" + self.run.host_run_id,
            "role": "assistant",
            "status": status,
            "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}],
        }

    def _reasoning_item(self, status: str) -> dict[str, Any]:
        text = "".join(self._reasoning_parts)
        item: dict[str, Any] = {"type": "reasoning", "id": "rs_" + self.run.host_run_id, "summary": []}
        item["content"] = [{"type": "reasoning_text", "text": text}]
        item["status"] = status
        return item

    # -- stream events
    def _emit(self, out: list[bytes], kind: str, fields: dict[str, Any]) -> None:
        self.number += 1
        if self.number > self.starting_after:
            body = {"type": kind, **fields, "sequence_number": self.number}
            out.append(b"event: %b\ndata: %b\n\n" % (kind.encode(), dumps(body)))

    def _open_message(self, out: list[bytes]) -> None:
        self._close_reasoning(out)
        index = self._message = len(self.output)
        self.output.append({})
        item = self._message_item("in_progress")
        item["content"] = []
        self._emit(out, "response.output_item.added", {"output_index": index, "item": item})
        part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        self._emit(out, "response.content_part.added", self._at(index, part=part))
        head = (
            b'event: response.output_text.delta\ndata: {"type":"response.output_text.delta","item_id":%b,'
            b'"output_index":%d,"content_index":0,"logprobs":[],"delta":' % (dumps(item["id"]), index)
        )
        # The delta frame but its JSON text and number, for `%`: one bytes operation per delta.
        self._delta_frame = head.replace(b"%", b"%%") + b'%b,"sequence_number":%d}\n\n'

    def _at(self, index: int, **fields: Any) -> dict[str, Any]:
        return {"item_id": self.output_id(index), "output_index": index, "content_index": 0, **fields}

    def output_id(self, index: int) -> str:
        if index == self._message:
            return "msg_" + self.run.host_run_id
        if index == self._reasoning:
            return "rs_" + self.run.host_run_id
        item_id: str = self.output[index]["id"]
        return item_id

    def _close_message(self, out: list[bytes]) -> None:
        index = self._message
        if index is None:
            return
        item = self._message_item("completed")
        text = item["content"][0]["text"]
        self._emit(out, "response.output_text.done", self._at(index, text=text, logprobs=[]))
        self._emit(out, "response.content_part.done", self._at(index, part=item["content"][0]))
        self._emit(out, "response.output_item.done", {"output_index": index, "item": item})
        self.output[index] = item
        self._message = None

    def _open_reasoning(self, out: list[bytes]) -> None:
        index = self._reasoning = len(self.output)
        self.output.append({})
        item = self._reasoning_item("in_progress")
        item["content"] = []
        self._emit(out, "response.output_item.added", {"output_index": index, "item": item})
        part = {"type": "reasoning_text", "text": ""}
        self._emit(out, "response.content_part.added", self._at(index, part=part))

    def _close_reasoning(self, out: list[bytes]) -> None:
        index = self._reasoning
        if index is None:
            return
        item = self._reasoning_item("completed")
        text = item["content"][0]["text"]
        self._emit(out, "response.reasoning_text.done", self._at(index, text=text))
        self._emit(out, "response.content_part.done", self._at(index, part=item["content"][0]))
        self._emit(out, "response.output_item.done", {"output_index": index, "item": item})
        self.output[index] = item
        self._reasoning = None

    def _tool(self, out: list[bytes], event: Event) -> None:
        summary = tool_summary(event)
        if summary is None:
            return
        call_id = summary["id"]
        finished = _tool_finished(summary["status"])
        index = self.tools.get(call_id)
        if index is None:
            index = self.tools[call_id] = len(self.output)
            item = self._tool_item(summary, "in_progress")
            self.output.append(item)
            self._emit(out, "response.output_item.added", {"output_index": index, "item": item})
        if finished and self.output[index]["status"] == "in_progress":
            item = self.output[index] = self._tool_item(summary, summary["status"])
            self._emit(out, "response.output_item.done", {"output_index": index, "item": item})

    def _client_call(self, out: list[bytes], event: Event) -> None:
        """A client tool the model asks to call: a ``function_call`` output item, whole."""
        call = client_tool_call(event.payload)
        if call is None:
            return
        self._close_reasoning(out)  # (an open message item stays open: its text may go on)
        index = len(self.output)
        item = {"type": "function_call", "id": "fc_" + call["id"], "call_id": call["id"], "name": call["name"]}
        item.update(arguments=call["arguments"], status="in_progress")
        self.output.append(item)
        self._emit(out, "response.output_item.added", {"output_index": index, "item": {**item, "arguments": ""}})
        at = {"item_id": item["id"], "output_index": index}
        self._emit(out, "response.function_call_arguments.delta", {**at, "delta": call["arguments"]})
        self._emit(out, "response.function_call_arguments.done", {**at, "arguments": call["arguments"]})
        item = self.output[index] = {**item, "status": "completed"}
        self._emit(out, "response.output_item.done", {"output_index": index, "item": item})

    @staticmethod
    def _tool_item(summary: dict[str, Any], status: str) -> dict[str, Any]:
        # A server-side tool call, as the Responses API reports its remote MCP calls: the name
        # only, never the arguments or the output (receipts and paths stay in the gateway).
        return {
            "type": "mcp_call",
            "id": "mcp_" + summary["id"],
            "name": summary["name"],
            "server_label": "agent_gateway",
            "arguments": "",
            "output": None,
            "error": "the tool call failed" if status == "failed" else None,
            "status": status,
        }

    def encode(self, events: list[Event]) -> bytes:
        """The SSE bytes of a batch (``event: <type>`` + ``data: <json>`` frames)."""
        out: list[bytes] = []
        append, to_json, keep = out.append, orjson.dumps, self._message_parts.append
        # The hot path keeps its state in locals: `number` is written back before any other
        # branch (they number their frames through `_emit`) and read again after it.
        number, starting_after, cut_texts = self.number, self.starting_after, self.cut_texts
        frame = self._delta_frame if self._message is not None else None
        for event in events:
            kind = event.kind
            if kind == "message.delta" and event.source != REPLAY_SOURCE:  # the hot path
                if frame is None:
                    self.number = number
                    self._open_message(out)
                    number, frame = self.number, self._delta_frame
                payload = event.payload
                text = payload.get("text")
                if not isinstance(text, str):
                    text = ""
                keep(text)
                number += _span(payload) if "mergedCount" in payload else 1
                if number > starting_after:
                    if cut_texts:
                        text = cut_texts.pop(event.seq, text)  # what a resumed client lacks of it
                    append(frame % (to_json(text), number))
                continue
            if event.source == REPLAY_SOURCE:
                continue
            self.number = number
            self._encode_other(out, kind, event)
            number = self.number
            frame = self._delta_frame if self._message is not None else None
        self.number = number
        return b"".join(out)

    def _encode_other(self, out: list[bytes], kind: str, event: Event) -> None:
        """The frames of any event but a text delta (`encode` has that hot path)."""
        if kind == "thought.delta":
            if not self.reasoning:
                return
            if self._reasoning is None:
                self._open_reasoning(out)
            text = _text(event.payload)
            self._reasoning_parts.append(text)
            self.number += _span(event.payload) - 1  # `_emit` counts the last seq it covers
            sent = self.cut_texts.pop(event.seq, text) if self.number + 1 > self.starting_after else text
            fields = self._at(self._reasoning, delta=sent)  # type: ignore[arg-type]
            self._emit(out, "response.reasoning_text.delta", fields)
        elif kind in TOOL_KINDS:
            self._tool(out, event)
        elif kind == CLIENT_TOOL_CALL:
            self._client_call(out, event)
        elif kind == "message.completed":
            final = event.payload.get("text")
            if isinstance(final, str):
                self._final_text = final
        elif kind == "session.info.updated":
            mode = event.payload.get("sessionMode")
            self.session_mode = mode if isinstance(mode, str) else self.session_mode
        elif kind == "usage.updated":
            self.usage.add(event.payload)
        elif kind == "run.created":
            self.status = "queued"
            self._emit(out, "response.created", {"response": self.response()})
        elif kind == "run.started":
            self.status = "in_progress"
            self._emit(out, "response.in_progress", {"response": self.response()})
        elif kind in TERMINAL_STATUS:
            self._end(out, event)

    def _end(self, out: list[bytes], event: Event) -> None:
        self._close_reasoning(out)
        if self._message is None and self._final_text:
            self._open_message(out)  # an answer given only in the completed event
        self._close_message(out)
        for index in self.tools.values():
            item = self.output[index]
            if item["status"] == "in_progress":
                done = {**item, "status": "incomplete"}
                self.output[index] = done
                self._emit(out, "response.output_item.done", {"output_index": index, "item": done})
        status = TERMINAL_STATUS[event.kind]
        if status == "completed":
            self.status = "completed"
            self._emit(out, "response.completed", {"response": self.response()})
        elif status == "failed":
            self.status = "failed"
            self.error = {"code": "server_error", "message": run_failure(event.payload)}
            self._emit(out, "response.failed", {"response": self.response()})
        else:  # cancelled (by the client) or interrupted (a gateway or agent crash)
            self.status = "cancelled" if status == "cancelled" else "incomplete"
            self.incomplete = {"reason": status}
            self._emit(out, "response.incomplete", {"response": self.response()})

    def resume_point(self, events: Iterable[Event], starting_after: int) -> tuple[int, int] | None:
        """Where ``starting_after`` falls inside a compacted delta (one event standing for several
        seqs, each of which had its own number when first streamed): ``(seq the client has, seq of
        the compacted event)``, so the caller can read the text after it; None otherwise."""
        self.starting_after = sys.maxsize
        for event in events:
            before = self.number
            self.encode([event])
            if event.kind in ("message.delta", "thought.delta") and before < starting_after < self.number:
                return event.seq - (self.number - starting_after), event.seq
        return None

    def fold(self, events: Iterable[Event]) -> None:
        """Fold ``events`` into the response object without building any frame."""
        starting_after, self.starting_after = self.starting_after, sys.maxsize
        try:
            for event in events:
                self.encode([event])
        finally:
            self.starting_after = starting_after
