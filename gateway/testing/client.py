"""A small synchronous HTTP/SSE client for a running gateway, for plugin tests.

It speaks the gateway's public HTTP API only (``/v1/runs``, its stream, events pages and cancel,
``/v1/agents``) with the standard library's ``http.client``, so it works the same from plain
test functions, from async tests (it never touches their event loop) and from scripts. Every
call is bounded in time: a stream that does not reach its terminal event in time raises
``TimeoutError`` naming the events it did get.
"""

from __future__ import annotations

import http.client
import json
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

from agent_gateway.testing.sse import SseEvent, SseParser

# The kinds that end a run; the gateway writes exactly one of them, last.
DEFAULT_TIMEOUT = 30.0


@dataclass
class RunResult:
    """A run streamed to its end: the creation receipt and every SSE event, terminal last."""

    receipt: dict[str, Any]
    events: list[SseEvent] = field(default_factory=list)

    @property
    def host_run_id(self) -> str:
        return str(self.receipt["hostRunId"])

    @property
    def kinds(self) -> list[str]:
        return [event.event for event in self.events]

    @property
    def terminal(self) -> SseEvent:
        return self.events[-1]

    @property
    def status(self) -> str:
        """``completed``, ``failed``, ``cancelled`` or ``interrupted``."""
        return self.terminal.event.removeprefix("run.")

    @property
    def text(self) -> str:
        """The reply as a client shows it: the ``message.delta`` texts joined (replayed history
        left out)."""
        return "".join(
            str(event.payload.get("text", ""))
            for event in self.events
            if event.event == "message.delta" and event.source != "adapter_replay"
        )

    def payloads(self, kind: str) -> list[dict[str, Any]]:
        """The payloads of every event of one kind, in order."""
        return [event.payload for event in self.events if event.event == kind]


class GatewayHTTPError(Exception):
    """The gateway answered with an unexpected status; ``code`` and ``message`` come from its
    ``{"error": {"code", "message"}}`` body when there is one."""

    def __init__(self, method: str, path: str, status: int, body: Any) -> None:
        error = body.get("error") if isinstance(body, dict) else None
        self.method, self.path, self.status, self.body = method, path, status, body
        self.code = error.get("code") if isinstance(error, dict) else None
        self.message = error.get("message") if isinstance(error, dict) else None
        detail = f"{self.code}: {self.message}" if self.code else str(body)[:500]
        super().__init__(f"{method} {path} -> {status} {detail}")


class GatewayClient:
    """Drive a gateway at ``base_url`` (``http://127.0.0.1:PORT``) over HTTP.

    ``token`` is sent as ``Authorization: Bearer`` (for gateways with ``[auth] tokens``);
    ``timeout`` bounds every call that does not take its own."""

    def __init__(self, base_url: str, *, token: str | None = None, timeout: float = DEFAULT_TIMEOUT) -> None:
        parts = urlsplit(base_url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"base_url must be http://host:port, not {base_url!r}")
        self.base_url = base_url.rstrip("/")
        self.host = parts.hostname
        self.port = parts.port or 80
        self.token = token
        self.timeout = timeout

    # -- plain requests ---------------------------------------------------------------------------
    def _headers(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        # The client header lets a body-less POST (cancel) through the gateway's browser guard.
        headers = {"Accept": "application/json", "X-Agent-Gateway-Client": "agent-gateway-testing"}
        if self.token is not None:
            headers["Authorization"] = f"Bearer {self.token}"
        headers.update(extra or {})
        return headers

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        headers: dict[str, str] | None = None,
        timeout: float | None = None,
    ) -> tuple[int, Any]:
        """One request; returns ``(status, decoded JSON body or text)``, whatever the status."""
        all_headers = self._headers(headers)
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            all_headers["Content-Type"] = "application/json"
        connection = http.client.HTTPConnection(self.host, self.port, timeout=timeout or self.timeout)
        try:
            connection.request(method, path, body=data, headers=all_headers)
            response = connection.getresponse()
            raw = response.read()
        finally:
            connection.close()
        text = raw.decode("utf-8", errors="replace")
        try:
            return response.status, json.loads(text) if text else None
        except ValueError:
            return response.status, text

    def _json(self, method: str, path: str, body: Any = None, ok: tuple[int, ...] = (200,)) -> Any:
        status, answer = self.request(method, path, body)
        if status not in ok:
            raise GatewayHTTPError(method, path, status, answer)
        return answer

    # -- agents -----------------------------------------------------------------------------------
    def agents(self) -> list[dict[str, Any]]:
        """Every agent's descriptor (``GET /v1/agents``)."""
        return list(self._json("GET", "/v1/agents")["agents"])

    def agent(self, agent_id: str) -> dict[str, Any]:
        """One agent's descriptor (``GET /v1/agents/{agentId}``)."""
        return dict(self._json("GET", f"/v1/agents/{quote(agent_id, safe='')}"))

    # -- runs -------------------------------------------------------------------------------------
    def create_run(
        self,
        message: str,
        *,
        agent_id: str,
        session_id: str | None = None,
        request_id: str | None = None,
        **fields: Any,
    ) -> dict[str, Any]:
        """``POST /v1/runs``; returns the receipt (``hostRunId``, ``status``, …). ``session_id``
        and ``request_id`` default to fresh ids; ``fields`` are further body fields as the API
        spells them (``workspaceId``, ``context``, ``options``, ``parentRunId``)."""
        body: dict[str, Any] = {
            "requestId": request_id or f"req-{uuid.uuid4().hex[:12]}",
            "agentId": agent_id,
            "sessionId": session_id or f"s-{uuid.uuid4().hex[:12]}",
            "message": message,
            **fields,
        }
        return dict(self._json("POST", "/v1/runs", body, ok=(200, 201)))

    def get_run(self, host_run_id: str) -> dict[str, Any]:
        """The run's receipt as it is now (``GET /v1/runs/{hostRunId}``)."""
        return dict(self._json("GET", f"/v1/runs/{quote(host_run_id, safe='')}"))

    def cancel(self, host_run_id: str) -> dict[str, Any]:
        """``POST /v1/runs/{hostRunId}/cancel``; returns the receipt (202 while the runtime is
        still stopping, 200 once the run has ended)."""
        return dict(self._json("POST", f"/v1/runs/{quote(host_run_id, safe='')}/cancel", ok=(200, 202)))

    def events_page(self, host_run_id: str, *, after_seq: int = 0, limit: int = 500) -> dict[str, Any]:
        """One page of ``GET /v1/runs/{hostRunId}/events``: ``events``, ``nextCursor``,
        ``complete``."""
        query = urlencode({"afterSeq": str(after_seq), "limit": str(limit)})
        return dict(self._json("GET", f"/v1/runs/{quote(host_run_id, safe='')}/events?{query}"))

    def events(self, host_run_id: str, *, after_seq: int = 0, limit: int = 500, max_pages: int = 1000) -> list[Any]:
        """Every stored event after ``after_seq``, following ``nextCursor`` page by page (at most
        ``max_pages``)."""
        out: list[Any] = []
        cursor = after_seq
        for _ in range(max_pages):
            page = self.events_page(host_run_id, after_seq=cursor, limit=limit)
            out.extend(page["events"])
            if not page["events"] or page["complete"]:
                return out
            cursor = int(page["nextCursor"])
        raise RuntimeError(f"run {host_run_id} has more than {max_pages} pages of {limit} events")

    def stream(
        self,
        host_run_id: str,
        *,
        after_seq: int | None = None,
        timeout: float | None = None,
    ) -> Iterator[SseEvent]:
        """Yield the run's SSE events as they arrive (after ``after_seq``, as
        ``Last-Event-ID`` would), up to and including its terminal event. Raises
        ``TimeoutError`` when the terminal event has not come within ``timeout`` seconds.
        Stop iterating early to leave the stream; the connection is closed either way."""
        limit = timeout or self.timeout
        deadline = time.monotonic() + limit
        path = f"/v1/runs/{quote(host_run_id, safe='')}/stream"
        if after_seq is not None:
            path += f"?afterSeq={after_seq}"
        connection = http.client.HTTPConnection(self.host, self.port, timeout=limit)
        seen: list[str] = []
        try:
            connection.request("GET", path, headers=self._headers({"Accept": "text/event-stream"}))
            response = connection.getresponse()
            if response.status != 200:
                raw = response.read().decode("utf-8", errors="replace")
                try:
                    body: Any = json.loads(raw)
                except ValueError:
                    body = raw
                raise GatewayHTTPError("GET", path, response.status, body)

            def read_line() -> bytes:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError
                if connection.sock is not None:
                    connection.sock.settimeout(remaining)
                return response.readline()

            try:
                for event in _parse_sse(read_line):
                    seen.append(event.event)
                    yield event
                    if event.is_terminal:
                        return
            except TimeoutError:
                raise TimeoutError(f"run {host_run_id}: no terminal event within {limit:g} s; got {seen}") from None
        finally:
            connection.close()

    def stream_to_end(
        self, host_run_id: str, *, after_seq: int | None = None, timeout: float | None = None
    ) -> list[SseEvent]:
        """Every SSE event until the terminal one (see :meth:`stream`)."""
        events = list(self.stream(host_run_id, after_seq=after_seq, timeout=timeout))
        if not events or not events[-1].is_terminal:
            raise AssertionError(f"run {host_run_id}: the stream closed before a terminal event: {events}")
        return events

    def run(self, message: str, *, agent_id: str, timeout: float | None = None, **fields: Any) -> RunResult:
        """Create a run and stream it to its terminal event (see :meth:`create_run`)."""
        receipt = self.create_run(message, agent_id=agent_id, **fields)
        return RunResult(receipt, self.stream_to_end(receipt["hostRunId"], timeout=timeout))


def _parse_sse(read_line: Any) -> Iterator[SseEvent]:
    """SSE frames from a line reader (see :mod:`agent_gateway.testing.sse`), until it returns b""."""

    parser = SseParser()
    while True:
        raw = read_line()
        if not raw:  # the server closed the stream
            return
        event = parser.feed_line(raw)
        if event is not None:
            yield event
