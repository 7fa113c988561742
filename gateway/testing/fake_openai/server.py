"""A scriptable fake OpenAI-compatible HTTP server built on aiohttp.

Serves ``POST /v1/chat/completions`` (streaming and not, with tool calls),
``POST /v1/embeddings`` and ``GET /v1/models`` (also without the ``/v1``
prefix), on 127.0.0.1 only.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import hashlib
import itertools
import json
import math
import struct
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

from aiohttp import web

HOST = "127.0.0.1"

_ERROR_TYPES: dict[int, str] = {
    400: "invalid_request_error",
    401: "invalid_request_error",
    403: "permission_error",
    404: "not_found_error",
    408: "timeout_error",
    429: "rate_limit_error",
}


@dataclass
class Reply:
    """One scripted assistant answer."""

    text: str = ""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    reasoning: str = ""
    chunk_size: int = 8
    delay: float = 0.0
    hang: bool = False
    status: int = 200
    error_message: str = ""
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None

    @classmethod
    def coerce(cls, value: Reply | str | dict[str, Any]) -> Reply:
        """Turn a string, a dict of Reply fields or a Reply into a Reply."""
        if isinstance(value, Reply):
            return value
        if isinstance(value, str):
            return cls(text=value)
        if isinstance(value, dict):
            names = {f.name for f in dataclasses.fields(cls)}
            unknown = set(value) - names
            if unknown:
                raise ValueError(f"unknown Reply fields: {sorted(unknown)}")
            return cls(**value)
        raise TypeError(f"cannot make a Reply from {type(value).__name__}")


ReplySource = Reply | str
DefaultReply = Reply | str | Callable[[dict[str, Any]], Reply | str]


def load_script(path: str | Path) -> tuple[list[Reply], Reply | None]:
    """Read a JSON script: a list of replies, or ``{"replies": [...], "default": ...}``."""
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    default: Reply | None = None
    if isinstance(data, dict):
        if data.get("default") is not None:
            default = Reply.coerce(data["default"])
        data = data.get("replies", [])
    if not isinstance(data, list):
        raise TypeError("a script must be a JSON list of replies")
    return [Reply.coerce(item) for item in data], default


def _error_body(status: int, message: str, code: str | None = None) -> dict[str, Any]:
    kind = _ERROR_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


def _error_response(status: int, message: str, code: str | None = None) -> web.Response:
    return web.json_response(_error_body(status, message, code), status=status)


def _message_text(content: Any) -> str:
    """Text of a chat message ``content`` (a string or a list of parts)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, dict) and isinstance(part.get("text"), str):
                parts.append(part["text"])
        return "".join(parts)
    return str(content)


def _echo_reply(body: dict[str, Any]) -> Reply:
    messages = body.get("messages") or []
    for message in reversed(messages):
        if isinstance(message, dict) and message.get("role") == "user":
            return Reply(text="echo: " + _message_text(message.get("content")))
    return Reply(text="echo: ")


def _pieces(text: str, size: int) -> list[str]:
    if not text:
        return []
    if size <= 0:
        return [text]
    return [text[i : i + size] for i in range(0, len(text), size)]


def _embedding(text: str, dim: int) -> list[float]:
    """A deterministic unit vector (values exactly representable as float32)."""
    raw = b""
    for block in itertools.count():
        if len(raw) >= 4 * dim:
            break
        raw += hashlib.sha256(f"{block}:{text}".encode()).digest()
    ints = struct.unpack(f"<{dim}I", raw[: 4 * dim])
    values = [(i / 0xFFFFFFFF) * 2.0 - 1.0 for i in ints]
    norm = math.sqrt(sum(v * v for v in values)) or 1.0
    as_f32 = struct.pack(f"<{dim}f", *(v / norm for v in values))
    return list(struct.unpack(f"<{dim}f", as_f32))


def _approx_tokens(text: str) -> int:
    return max(1, len(text) // 4) if text else 0


class FakeOpenAI:
    """A scriptable fake OpenAI-compatible server.

    ``replies`` is a FIFO consumed by chat completion requests; when it is empty,
    ``default`` is used (a callable gets the request body); if that is None the
    reply echoes the last user message as ``"echo: <text>"``.
    """

    def __init__(
        self,
        replies: Iterable[Reply | str] | None = None,
        *,
        default: DefaultReply | None = None,
        embedding_dim: int = 16,
        model_ids: Sequence[str] = ("m",),
        api_key: str | None = None,
        hang_timeout: float = 60.0,
    ) -> None:
        self._queue: deque[Reply] = deque(Reply.coerce(r) for r in replies or ())
        self.default = default
        self.embedding_dim = embedding_dim
        self.model_ids = list(model_ids)
        self.api_key = api_key
        self.hang_timeout = hang_timeout
        self.requests: list[dict[str, Any]] = []
        # The HTTP headers of each chat request, in the order of `requests` (a traceparent, say).
        self.request_headers: list[dict[str, str]] = []
        self.embedding_requests: list[dict[str, Any]] = []
        self._waiters: list[tuple[int, asyncio.AbstractEventLoop, asyncio.Future[None]]] = []
        self._lock = threading.Lock()
        self._call_ids = itertools.count(1)
        self._closing: asyncio.Event | None = None
        self._runner: web.AppRunner | None = None
        self._port: int | None = None
        self._thread: threading.Thread | None = None
        self._thread_loop: asyncio.AbstractEventLoop | None = None

    # ----------------------------------------------------------------- script

    def add(self, *replies: Reply | str) -> None:
        """Append replies to the queue."""
        self._queue.extend(Reply.coerce(r) for r in replies)

    @property
    def pending(self) -> int:
        """Number of queued replies not yet consumed."""
        return len(self._queue)

    def _next_reply(self, body: dict[str, Any]) -> Reply:
        if self._queue:
            return self._queue.popleft()
        default = self.default
        if callable(default):
            default = default(body)
        if default is None:
            return _echo_reply(body)
        return Reply.coerce(default)

    # ---------------------------------------------------------------- waiting

    def _record(self, body: dict[str, Any]) -> None:
        self.requests.append(body)
        count = len(self.requests)
        with self._lock:
            ready = [w for w in self._waiters if w[0] <= count]
            self._waiters = [w for w in self._waiters if w[0] > count]
        for _, loop, future in ready:
            with contextlib.suppress(RuntimeError):  # the waiter's loop is closed
                loop.call_soon_threadsafe(_resolve, future)

    async def wait_for_requests(self, n: int, timeout: float = 5.0) -> list[dict[str, Any]]:
        """Wait until at least ``n`` chat requests were received; return them.

        Works from any event loop, also when the server runs in a thread.
        Raises ``TimeoutError`` after ``timeout`` seconds.
        """
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        with self._lock:
            if len(self.requests) >= n:
                return list(self.requests)
            entry = (n, loop, future)
            self._waiters.append(entry)
        try:
            await asyncio.wait_for(future, timeout)
        finally:
            with self._lock:
                if entry in self._waiters:
                    self._waiters.remove(entry)
        return list(self.requests)

    # ------------------------------------------------------------------- app

    def app(self) -> web.Application:
        """A new aiohttp application serving this fake (for ``aiohttp_client``)."""
        app = web.Application(middlewares=[self._auth_middleware])
        closing = asyncio.Event()
        self._closing = closing

        async def on_shutdown(_app: web.Application) -> None:
            closing.set()

        app.on_shutdown.append(on_shutdown)
        for prefix in ("/v1", ""):
            app.router.add_post(f"{prefix}/chat/completions", self._chat)
            app.router.add_post(f"{prefix}/embeddings", self._embeddings)
            app.router.add_get(f"{prefix}/models", self._models)
            app.router.add_get(f"{prefix}/models/{{model_id}}", self._model)
        return app

    @web.middleware
    async def _auth_middleware(self, request: web.Request, handler: Callable[[web.Request], Any]) -> web.StreamResponse:
        expected = f"Bearer {self.api_key}"
        if self.api_key is not None and request.headers.get("Authorization") != expected:
            return _error_response(401, "Incorrect API key provided.", code="invalid_api_key")
        result: web.StreamResponse = await handler(request)
        return result

    # -------------------------------------------------------------- lifecycle

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:PORT/v1`` once started."""
        if self._port is None:
            raise RuntimeError("FakeOpenAI is not started")
        return f"http://{HOST}:{self._port}/v1"

    @property
    def port(self) -> int:
        """The bound port once started."""
        if self._port is None:
            raise RuntimeError("FakeOpenAI is not started")
        return self._port

    async def start(self, port: int = 0) -> str:
        """Bind 127.0.0.1:``port`` (0 picks a free one) and return ``base_url``."""
        if self._runner is not None:
            raise RuntimeError("FakeOpenAI is already started")
        runner = web.AppRunner(self.app(), access_log=None, shutdown_timeout=5.0)
        await runner.setup()
        site = web.TCPSite(runner, HOST, port)
        try:
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        self._port = int(runner.addresses[0][1])
        return self.base_url

    async def stop(self) -> None:
        """Stop serving; hanging streams are ended."""
        runner, self._runner = self._runner, None
        if runner is None:
            return
        if self._closing is not None:
            self._closing.set()
        await runner.cleanup()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    def start_in_thread(self, port: int = 0) -> str:
        """Run the server on its own event loop in a daemon thread; return ``base_url``."""
        if self._thread is not None:
            raise RuntimeError("FakeOpenAI is already running in a thread")
        started = threading.Event()
        failure: list[BaseException] = []
        loop = asyncio.new_event_loop()

        def run() -> None:
            asyncio.set_event_loop(loop)
            try:
                loop.run_until_complete(self.start(port))
            except BaseException as exc:
                failure.append(exc)
                started.set()
                loop.close()
                return
            started.set()
            try:
                loop.run_forever()
            finally:
                loop.close()

        thread = threading.Thread(target=run, name="fake-openai", daemon=True)
        thread.start()
        started.wait()
        if failure:
            thread.join()
            raise failure[0]
        self._thread, self._thread_loop = thread, loop
        return self.base_url

    def stop_thread(self, timeout: float = 10.0) -> None:
        """Stop a server started with :meth:`start_in_thread`."""
        thread, loop = self._thread, self._thread_loop
        if thread is None or loop is None:
            return
        self._thread = self._thread_loop = None
        future = asyncio.run_coroutine_threadsafe(self.stop(), loop)
        try:
            future.result(timeout)
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout)

    # -------------------------------------------------------------- handlers

    async def _json_body(self, request: web.Request) -> dict[str, Any] | web.Response:
        try:
            body = await request.json()
        except (ValueError, UnicodeDecodeError):
            return _error_response(400, "We could not parse the JSON body of your request.")
        if not isinstance(body, dict):
            return _error_response(400, "The request body must be a JSON object.")
        return body

    def _model_name(self, body: dict[str, Any]) -> str:
        model = body.get("model")
        if isinstance(model, str) and model:
            return model
        return self.model_ids[0] if self.model_ids else "m"

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [self._model_obj(m) for m in self.model_ids]})

    async def _model(self, request: web.Request) -> web.Response:
        model_id = request.match_info["model_id"]
        if model_id not in self.model_ids:
            return _error_response(404, f"The model '{model_id}' does not exist", code="model_not_found")
        return web.json_response(self._model_obj(model_id))

    @staticmethod
    def _model_obj(model_id: str) -> dict[str, Any]:
        return {
            "id": model_id,
            "object": "model",
            "created": 0,
            "owned_by": "fake-openai",
        }

    async def _embeddings(self, request: web.Request) -> web.Response:
        body = await self._json_body(request)
        if isinstance(body, web.Response):
            return body
        self.embedding_requests.append(body)
        raw = body.get("input")
        inputs: list[Any]
        if isinstance(raw, str):
            inputs = [raw]
        elif isinstance(raw, list) and raw and all(isinstance(x, int) for x in raw):
            inputs = [raw]  # one input given as token ids
        elif isinstance(raw, list) and raw:
            inputs = raw
        else:
            return _error_response(400, "'input' must be a non-empty string or list.")
        dim = body.get("dimensions") or self.embedding_dim
        if not isinstance(dim, int) or dim <= 0:
            return _error_response(400, "'dimensions' must be a positive integer.")
        as_base64 = body.get("encoding_format") == "base64"
        data = []
        tokens = 0
        for index, item in enumerate(inputs):
            text = item if isinstance(item, str) else json.dumps(item)
            tokens += max(1, _approx_tokens(text))
            vector = _embedding(text, dim)
            embedding: list[float] | str = (
                base64.b64encode(struct.pack(f"<{dim}f", *vector)).decode("ascii") if as_base64 else vector
            )
            data.append({"object": "embedding", "index": index, "embedding": embedding})
        return web.json_response(
            {
                "object": "list",
                "data": data,
                "model": self._model_name(body),
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
            }
        )

    def _tool_calls(self, reply: Reply) -> list[dict[str, Any]]:
        """Normalise scripted tool calls to ``{"id", "name", "arguments": str}``."""
        calls = []
        for call in reply.tool_calls:
            nested = call.get("function")
            function: dict[str, Any] = nested if isinstance(nested, dict) else call
            arguments = function.get("arguments", {})
            if not isinstance(arguments, str):
                arguments = json.dumps(arguments)
            calls.append(
                {
                    "id": call.get("id") or f"call_{next(self._call_ids)}",
                    "name": function.get("name", ""),
                    "arguments": arguments,
                }
            )
        return calls

    @staticmethod
    def _usage(body: dict[str, Any], reply: Reply, calls: list[dict[str, Any]]) -> dict[str, Any]:
        if reply.usage is not None:
            return reply.usage
        prompt = _approx_tokens(json.dumps(body.get("messages", [])))
        completion = _approx_tokens(reply.text + reply.reasoning + "".join(c["name"] + c["arguments"] for c in calls))
        return {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        }

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body = await self._json_body(request)
        if isinstance(body, web.Response):
            return body
        self.request_headers.append(dict(request.headers))
        self._record(body)
        try:
            reply = self._next_reply(body)
        except Exception as exc:
            return _error_response(500, f"fake-openai: default reply failed: {exc!r}")
        if reply.status != 200:
            error = reply.error_message or f"fake-openai scripted error {reply.status}"
            return _error_response(reply.status, error)
        calls = self._tool_calls(reply)
        finish = reply.finish_reason or ("tool_calls" if calls else "stop")
        if body.get("stream"):
            return await self._stream(request, body, reply, calls, finish)
        if reply.delay:
            await asyncio.sleep(reply.delay)
        if reply.hang:
            await self._hang(request)
            return web.Response(status=504)
        message: dict[str, Any] = {
            "role": "assistant",
            "content": reply.text if reply.text or not calls else None,
        }
        if reply.reasoning:
            message["reasoning_content"] = reply.reasoning
        if calls:
            message["tool_calls"] = [
                {
                    "id": c["id"],
                    "type": "function",
                    "function": {"name": c["name"], "arguments": c["arguments"]},
                }
                for c in calls
            ]
        return web.json_response(
            {
                "id": f"chatcmpl-{uuid.uuid4().hex[:24]}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": self._model_name(body),
                "system_fingerprint": None,
                "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                "usage": self._usage(body, reply, calls),
            }
        )

    @staticmethod
    def _deltas(reply: Reply, calls: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        yield {"role": "assistant", "content": ""}
        for piece in _pieces(reply.reasoning, reply.chunk_size):
            yield {"reasoning_content": piece}
        for piece in _pieces(reply.text, reply.chunk_size):
            yield {"content": piece}
        for index, call in enumerate(calls):
            yield {
                "tool_calls": [
                    {
                        "index": index,
                        "id": call["id"],
                        "type": "function",
                        "function": {"name": call["name"], "arguments": ""},
                    }
                ]
            }
            for piece in _pieces(call["arguments"], reply.chunk_size):
                yield {"tool_calls": [{"index": index, "function": {"arguments": piece}}]}

    async def _stream(
        self,
        request: web.Request,
        body: dict[str, Any],
        reply: Reply,
        calls: list[dict[str, Any]],
        finish: str,
    ) -> web.StreamResponse:
        response = web.StreamResponse(
            headers={
                "Content-Type": "text/event-stream; charset=utf-8",
                "Cache-Control": "no-cache",
            }
        )
        options = body.get("stream_options")
        include_usage = isinstance(options, dict) and bool(options.get("include_usage"))
        base: dict[str, Any] = {
            "id": f"chatcmpl-{uuid.uuid4().hex[:24]}",
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": self._model_name(body),
            "system_fingerprint": None,
        }

        def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> bytes:
            payload = dict(base)
            payload["choices"] = [
                {
                    "index": 0,
                    "delta": delta,
                    "logprobs": None,
                    "finish_reason": finish_reason,
                }
            ]
            if include_usage:
                payload["usage"] = None
            return b"data: " + json.dumps(payload).encode() + b"\n\n"

        try:
            await response.prepare(request)
            deltas = list(self._deltas(reply, calls))
            if reply.hang:
                # the role chunk and the first content-bearing chunk, then nothing
                for delta in deltas[:2]:
                    await response.write(chunk(delta))
                await self._hang(request)
                return response
            for number, delta in enumerate(deltas):
                if reply.delay and number > 0:
                    await asyncio.sleep(reply.delay)
                await response.write(chunk(delta))
            if reply.delay:
                await asyncio.sleep(reply.delay)
            await response.write(chunk({}, finish))
            if include_usage:
                payload = dict(base)
                payload["choices"] = []
                payload["usage"] = self._usage(body, reply, calls)
                await response.write(b"data: " + json.dumps(payload).encode() + b"\n\n")
            await response.write(b"data: [DONE]\n\n")
            await response.write_eof()
        except ConnectionError:
            # the client went away mid-stream; nothing to report
            pass
        return response

    async def _hang(self, request: web.Request) -> None:
        """Wait until the client disconnects, the server stops or ``hang_timeout`` passes."""
        closing = self._closing
        deadline = time.monotonic() + self.hang_timeout
        while time.monotonic() < deadline:
            transport = request.transport
            if transport is None or transport.is_closing():
                return
            if closing is not None and closing.is_set():
                return
            await asyncio.sleep(0.05)


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
