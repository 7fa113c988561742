"""The chat-only runtime: streams one chat completion per turn."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp

from agent_gateway import RuntimePolicy, TranscriptStrategy, Turn, TurnOutcome, WorkSlices

from .client_tools import ClientTools, ToolCallCollector

# A slice of parsing and emitting ends after this long or this many upstream lines, whichever
# comes first (or once a request arrives); the stream then yields to the loop.
SLICE_SECONDS = 0.0005
SLICE_LINES = 256


class UpstreamError(Exception):
    pass


class ChatOnlyRuntime:
    agent_id = "chat-only"
    display_name = "Chat only"
    provider = "openai-compatible"

    def __init__(
        self,
        *,
        base_url: str,
        api_key: str,
        model: str,
        system_prompt: str = "",
        connect_timeout: float = 10.0,
        idle_timeout: float = 120.0,
        max_history_turns: int = 20,
        max_history_chars: int = 64_000,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self.model = model
        self.system_prompt = system_prompt
        self.connect_timeout = connect_timeout
        self.idle_timeout = idle_timeout
        self.max_history_turns = max_history_turns
        self.max_history_chars = max_history_chars
        self.policy = RuntimePolicy(context_carrier="transcript_rebuild", can_rollback=True, client_tools=True)
        # The core's default `session_strategy` uses this: the transcript, bounded as configured.
        self.session_strategy = TranscriptStrategy(max_history_turns, max_history_chars)
        self._session: aiohttp.ClientSession | None = None

    def describe(self) -> dict[str, Any]:
        return {
            "capabilities": ["chat"],
            "toolAccess": False,
            "availability": {
                "available": bool(self.base_url),
                "upstreamConfigured": bool(self.base_url),
                "reason": None if self.base_url else "set chat_only.base_url or OPENAI_BASE_URL",
            },
            "fields": [
                {"key": "model", "label": "Model", "kind": "string", "default": self.model},
            ],
        }

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            timeout = aiohttp.ClientTimeout(total=None, sock_connect=self.connect_timeout, sock_read=self.idle_timeout)
            self._session = aiohttp.ClientSession(timeout=timeout)
        return self._session

    def build_messages(self, turn: Turn, client: ClientTools | None = None) -> list[dict[str, Any]]:
        messages: list[dict[str, Any]] = []
        if self.system_prompt:
            messages.append({"role": "system", "content": self.system_prompt})
        packet = turn.plan.packet
        if client is not None and client.messages and packet:
            last = packet[-1]
            if last.get("user") == turn.message and not last.get("assistant"):
                # The session's last turn is the one whose tool calls these results answer: it is
                # resent below, with the calls and the results after it.
                packet = packet[:-1]
        for entry in packet:
            messages.append({"role": "user", "content": entry["user"]})
            if entry.get("assistant"):
                messages.append({"role": "assistant", "content": entry["assistant"]})
        user = turn.message
        selection = ((turn.context.get("target") or {}).get("selection") or {}).get("text")
        if selection:
            user = f"{user}\n\n[Selected text]\n{selection}"
        messages.append({"role": "user", "content": user})
        if client is not None:
            messages.extend(client.messages)
        return messages

    async def run_turn(self, turn: Turn) -> TurnOutcome:
        if not self.base_url:
            return TurnOutcome("failed", "no upstream configured: set chat_only.base_url or OPENAI_BASE_URL")
        stream = asyncio.create_task(self._stream(turn))
        cancel = asyncio.create_task(turn.cancel_requested.wait())
        try:
            done, _ = await asyncio.wait({stream, cancel}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            cancel.cancel()
        if stream not in done:
            stream.cancel()  # closes the upstream response and its connection
            await asyncio.gather(stream, return_exceptions=True)
            if turn.assistant_text:  # what was streamed stays the run's (partial) answer
                await turn.emit("message.completed", {"text": turn.assistant_text, "partial": True})
            return TurnOutcome("cancelled", "cancelled by the client; upstream request closed")
        # The stream's error is looked at, not re-raised here: raised, its traceback would take
        # this frame, whose locals hold the task that holds the error (a reference cycle, freed
        # only by a full collection, keeping the turn and its text until then).
        error = stream.exception()
        if error is None:
            await turn.emit("message.completed", {"text": stream.result()})
            return TurnOutcome("completed")
        if isinstance(error, UpstreamError):
            return TurnOutcome("failed", str(error))
        if isinstance(error, TimeoutError):
            return TurnOutcome("failed", f"upstream sent nothing for {self.idle_timeout:g} s")
        if isinstance(error, aiohttp.ClientError):
            return TurnOutcome("failed", f"cannot reach upstream {self.base_url}: {error}")
        try:
            raise error
        finally:
            del error, stream, done  # (the same cycle, through the traceback of the raise)

    async def _stream(self, turn: Turn) -> str:
        client = ClientTools.from_options(turn.options)
        body: dict[str, Any] = {
            "model": turn.options.get("model") or self.model or "default",
            "messages": self.build_messages(turn, client),
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if client is not None:
            body.update(client.request_fields())
            for result in client.results():  # the client's tool results, forwarded
                await turn.emit("client_tool.answered", result)
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        # One `chat` span per model call when a tracing plugin follows the run (its traceparent
        # goes upstream); nothing per delta.
        call = turn.trace.model_call("chat", str(body["model"]), self.provider)
        usage: dict[str, int] | None = None
        try:
            text, usage = await self._request(turn, body, {**headers, **call.headers})
        except BaseException as exc:
            call.end(usage=usage, error=type(exc).__name__)
            raise
        call.end(usage=usage)
        return text

    async def _request(
        self, turn: Turn, body: dict[str, Any], headers: dict[str, str]
    ) -> tuple[str, dict[str, int] | None]:
        parts: list[str] = []
        last_usage: dict[str, int] | None = None
        tool_calls = ToolCallCollector()
        emit, emit_nowait = turn.emit, turn.emit_nowait
        async with self._http().post(f"{self.base_url}/chat/completions", json=body, headers=headers) as response:
            if response.status >= 400:
                raise UpstreamError(f"upstream answered {response.status}: {await _error_message(response)}")
            # An upstream that writes faster than we parse leaves the whole response buffered, and
            # reading a buffered line never suspends: yield to the loop after each slice of work.
            slices = WorkSlices(SLICE_SECONDS, SLICE_LINES)
            async for raw in response.content:
                if slices.over():
                    await slices.next()  # let other runs and requests in
                line = raw.decode("utf-8", "replace").strip()
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                try:
                    chunk = json.loads(data)
                except ValueError as exc:
                    raise UpstreamError(f"upstream sent a malformed chunk: {data[:200]}") from exc
                if chunk.get("error"):
                    raise UpstreamError(f"upstream error: {chunk['error'].get('message', chunk['error'])}")
                if chunk.get("usage"):
                    usage = token_usage(chunk["usage"])
                    if usage:
                        last_usage = usage
                        await emit("usage.updated", usage)
                for choice in chunk.get("choices") or ():
                    delta = choice.get("delta") or {}
                    if delta.get("reasoning_content"):
                        payload = {"text": delta["reasoning_content"]}
                        if not emit_nowait("thought.delta", payload):
                            await emit("thought.delta", payload)  # storage is behind: wait for room
                    if delta.get("content"):
                        parts.append(delta["content"])
                        payload = {"text": delta["content"]}
                        if not emit_nowait("message.delta", payload):
                            await emit("message.delta", payload)
                    if delta.get("tool_calls"):
                        tool_calls.add(delta["tool_calls"])
            else:
                raise UpstreamError("upstream closed the stream before [DONE]")
        for call in tool_calls.calls():  # the client runs them: the run ends asking for their results
            await emit("client_tool.requested", call)
        return "".join(parts), last_usage

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()


def token_usage(usage: Any) -> dict[str, int]:
    """An OpenAI ``usage`` object in the journal's ``usage.updated`` names (ACP's prompt usage):
    ``inputTokens`` (cached ones included, as OpenAI counts them), ``outputTokens``,
    ``totalTokens``, and ``cachedReadTokens`` / ``thoughtTokens`` when the upstream details them."""
    if not isinstance(usage, dict):
        return {}
    prompt = usage.get("prompt_tokens_details")
    completion = usage.get("completion_tokens_details")
    found = {
        "inputTokens": usage.get("prompt_tokens"),
        "outputTokens": usage.get("completion_tokens"),
        "totalTokens": usage.get("total_tokens"),
        "cachedReadTokens": prompt.get("cached_tokens") if isinstance(prompt, dict) else None,
        "thoughtTokens": completion.get("reasoning_tokens") if isinstance(completion, dict) else None,
    }
    return {k: v for k, v in found.items() if isinstance(v, int) and not isinstance(v, bool) and v >= 0}


async def _error_message(response: aiohttp.ClientResponse) -> str:
    text = await response.text()
    try:
        error = json.loads(text).get("error")
        if isinstance(error, dict):
            return str(error.get("message") or error)
        if error:
            return str(error)
    except ValueError:
        pass
    return text[:500] or response.reason or "no body"
