"""The ``otel`` plugin: runs traced with OpenTelemetry's GenAI conventions.

In process, spans go to the SDK's in-memory exporter (``use_providers``); the last test runs a
real gateway process exporting OTLP/HTTP to a receiver the test serves on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from agent_gateway import AcpAgentSpec, AcpRuntime, RuntimePolicy, ToolError, Turn, TurnOutcome, hookimpl
from agent_gateway.plugins import otel
from agent_gateway.testing.fake_openai import FakeOpenAI, Reply
from tests._harness import (
    FAKE_ACP_AGENT,
    ROOT,
    WAIT,
    MakeGateway,
    gateway_of,
    run_body,
    run_to_end,
    sse_events,
    start_gateway_process,
)

INBOUND_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
INBOUND = {"traceparent": f"00-{INBOUND_TRACE}-00f067aa0ba902b7-01"}
USAGE = {"prompt_tokens": 31, "completion_tokens": 12, "total_tokens": 43}
ON = {"otel": {"enabled": True}}


class Recorded:
    def __init__(self) -> None:
        self.spans = InMemorySpanExporter()
        self.metrics = InMemoryMetricReader()

    def finished(self) -> list[ReadableSpan]:
        return list(self.spans.get_finished_spans())

    def named(self, prefix: str) -> list[ReadableSpan]:
        return [span for span in self.finished() if span.name.startswith(prefix)]

    def metric_points(self, name: str) -> list[Any]:
        data = self.metrics.get_metrics_data()
        points: list[Any] = []
        for resource in data.resource_metrics if data else ():
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    if metric.name == name:
                        points.extend(metric.data.data_points)
        return points


@pytest.fixture
def recorded() -> Iterator[Recorded]:
    record = Recorded()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(record.spans))
    otel.use_providers(tracer_provider, MeterProvider(metric_readers=[record.metrics]))
    try:
        yield record
    finally:
        otel.use_providers(None)


class ToolUsingRuntime:
    """An in-process agent that calls a gateway tool and reports one tool of its own."""

    agent_id = "tooly"
    display_name = "Tool user (tests)"
    provider = "tests"

    def __init__(self) -> None:
        self.policy = RuntimePolicy(context_carrier="none")

    def describe(self) -> dict[str, Any]:
        return {"capabilities": []}

    async def run_turn(self, turn: Turn) -> TurnOutcome:
        tools = turn.tools
        assert tools is not None
        # This agent has not the capability: the facade refuses the call, receipted (and traced).
        with contextlib.suppress(ToolError):
            await tools.call("workspace.describe_roots", {}, tools.scope_for(turn.run), caller="tests")
        await turn.emit("tool.started", {"toolCallId": "native-1", "title": "Read notes.md", "kind": "read"})
        await turn.emit("tool.completed", {"toolCallId": "native-1", "status": "completed"})
        await turn.emit("message.completed", {"text": "done"})
        return TurnOutcome("completed")

    async def close(self) -> None:
        pass


class FakeAcpPlugin:
    @hookimpl
    def register_runtimes(self, register: Any, config: Any) -> None:
        env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
        command = [sys.executable, FAKE_ACP_AGENT, "--behaviour", "basic"]
        register(AcpRuntime(AcpAgentSpec("fake-acp", "Fake ACP", "fake-acp", command, env=env)))


class ToolPlugin:
    @hookimpl
    def register_runtimes(self, register: Any, config: Any) -> None:
        register(ToolUsingRuntime())


def attributes(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


async def test_a_chat_only_run_is_an_invoke_agent_span_with_its_chat_call(
    make_gateway: MakeGateway, fake_llm: FakeOpenAI, recorded: Recorded
) -> None:
    client = await make_gateway(ON)
    fake_llm.add(Reply(text="traced answer", usage=USAGE))
    body = run_body("hello", sessionId="s-traced")
    receipt, events = await run_to_end(client, body)
    await gateway_of(client).runs.wait(receipt["hostRunId"])
    assert events[-1]["event"] == "run.completed"

    [run_span] = recorded.named("invoke_agent")
    [chat_span] = recorded.named("chat")
    assert run_span.name == "invoke_agent chat-only"
    run_attributes = attributes(run_span)
    assert run_attributes["gen_ai.operation.name"] == "invoke_agent"
    assert run_attributes["gen_ai.agent.id"] == "chat-only"
    assert run_attributes["gen_ai.agent.name"] == "Chat only"
    assert run_attributes["gen_ai.conversation.id"] == "s-traced"
    assert run_attributes["gen_ai.usage.input_tokens"] == 31
    assert run_attributes["gen_ai.usage.output_tokens"] == 12
    assert run_attributes["agent_gateway.run.status"] == "completed"
    assert "error.type" not in run_attributes
    assert run_span.parent is None  # no inbound traceparent: a trace of its own

    assert chat_span.name == "chat m"
    assert chat_span.kind == SpanKind.CLIENT
    assert chat_span.parent is not None and chat_span.parent.span_id == run_span.context.span_id
    chat_attributes = attributes(chat_span)
    assert chat_attributes["gen_ai.operation.name"] == "chat"
    assert chat_attributes["gen_ai.request.model"] == "m"
    assert (chat_attributes["gen_ai.usage.input_tokens"], chat_attributes["gen_ai.usage.output_tokens"]) == (31, 12)

    # The receipt (at creation and read back later) names the trace; the upstream got its context.
    trace_id = f"{run_span.context.trace_id:032x}"
    assert receipt["traceId"] == trace_id
    read = await client.get(f"/v1/runs/{receipt['hostRunId']}")
    assert (await read.json())["traceId"] == trace_id
    [headers] = fake_llm.request_headers
    flags = int(chat_span.context.trace_flags)
    assert headers["traceparent"] == f"00-{trace_id}-{chat_span.context.span_id:016x}-{flags:02x}"

    # The GenAI metrics: one chat call's tokens (not counted again for the run) and durations.
    tokens = recorded.metric_points("gen_ai.client.token.usage")
    assert sorted((p.attributes["gen_ai.token.type"], p.sum) for p in tokens) == [("input", 31), ("output", 12)]
    assert all(p.attributes["gen_ai.operation.name"] == "chat" for p in tokens)
    durations = recorded.metric_points("gen_ai.client.operation.duration")
    assert sorted(p.attributes["gen_ai.operation.name"] for p in durations) == ["chat", "invoke_agent"]


async def test_an_inbound_traceparent_is_continued(
    make_gateway: MakeGateway, fake_llm: FakeOpenAI, recorded: Recorded
) -> None:
    client = await make_gateway(ON)
    receipt, _ = await run_to_end(client, run_body("hello"), headers=INBOUND)
    await gateway_of(client).runs.wait(receipt["hostRunId"])
    [run_span] = recorded.named("invoke_agent")
    assert f"{run_span.context.trace_id:032x}" == INBOUND_TRACE
    assert run_span.parent is not None and f"{run_span.parent.span_id:016x}" == "00f067aa0ba902b7"
    assert receipt["traceId"] == INBOUND_TRACE
    assert fake_llm.request_headers[-1]["traceparent"].split("-")[1] == INBOUND_TRACE


async def test_a_failed_run_carries_its_error_type(
    make_gateway: MakeGateway, fake_llm: FakeOpenAI, recorded: Recorded
) -> None:
    client = await make_gateway(ON)
    fake_llm.add(Reply(status=500, error_message="upstream exploded"))
    receipt, events = await run_to_end(client, run_body("fail"))
    await gateway_of(client).runs.wait(receipt["hostRunId"])
    assert events[-1]["event"] == "run.failed"
    [run_span] = recorded.named("invoke_agent")
    [chat_span] = recorded.named("chat")
    assert attributes(run_span)["error.type"] == "failed"
    assert run_span.status.status_code == StatusCode.ERROR
    assert attributes(chat_span)["error.type"] == "UpstreamError"


async def test_tool_calls_are_execute_tool_spans(make_gateway: MakeGateway, recorded: Recorded) -> None:
    client = await make_gateway(ON, extra_plugins=(ToolPlugin(),))
    receipt, events = await run_to_end(client, run_body("use a tool", agentId="tooly"))
    await gateway_of(client).runs.wait(receipt["hostRunId"])
    assert events[-1]["event"] == "run.completed"
    [run_span] = recorded.named("invoke_agent")
    tools = {attributes(span)["agent_gateway.tool.source"]: span for span in recorded.named("execute_tool")}
    assert set(tools) == {"gateway", "agent"}
    facade, native = tools["gateway"], tools["agent"]
    assert facade.name == "execute_tool workspace.describe_roots"
    assert attributes(facade)["gen_ai.tool.name"] == "workspace.describe_roots"
    assert attributes(facade)["gen_ai.tool.call.id"].startswith("tc_")
    assert attributes(facade)["error.type"] == "capability_disabled"
    assert facade.status.status_code == StatusCode.ERROR
    assert attributes(native)["gen_ai.tool.call.id"] == "native-1"
    assert attributes(native)["gen_ai.tool.name"] == "read"
    assert attributes(native)["gen_ai.tool.description"] == "Read notes.md"
    for span in (facade, native):
        assert attributes(span)["gen_ai.operation.name"] == "execute_tool"
        assert span.parent is not None and span.parent.span_id == run_span.context.span_id


async def test_an_acp_agent_gets_the_trace_context_in_meta(make_gateway: MakeGateway, recorded: Recorded) -> None:
    client = await make_gateway(ON, extra_plugins=(FakeAcpPlugin(),))
    receipt, events = await run_to_end(client, run_body("traceparent?", agentId="fake-acp"), headers=INBOUND)
    await gateway_of(client).runs.wait(receipt["hostRunId"])
    [run_span] = recorded.named("invoke_agent")
    [completed] = [e for e in events if e["event"] == "message.completed"]
    sent = completed["data"]["payload"]["text"].removeprefix("traceparent: ")
    assert sent.split("-")[:3] == ["00", INBOUND_TRACE, f"{run_span.context.span_id:016x}"]


async def test_switched_off_nothing_is_traced(
    make_gateway: MakeGateway, fake_llm: FakeOpenAI, recorded: Recorded
) -> None:
    client = await make_gateway()
    receipt, _ = await run_to_end(client, run_body("hello"), headers=INBOUND)
    await gateway_of(client).runs.wait(receipt["hostRunId"])
    assert recorded.finished() == []
    assert receipt["traceId"] is None
    assert "traceparent" not in fake_llm.request_headers[-1]


async def test_without_the_packages_the_plugin_is_inert(
    make_gateway: MakeGateway, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    otel.use_providers(None)
    monkeypatch.setattr(otel, "_unavailable", False)
    monkeypatch.delitem(sys.modules, "agent_gateway.plugins.otel.tracing", raising=False)
    monkeypatch.setitem(sys.modules, "opentelemetry", None)  # `import opentelemetry` now fails
    client = await make_gateway(ON)
    for _ in range(2):
        receipt, events = await run_to_end(client, run_body("hello"))
        assert events[-1]["event"] == "run.completed"
        assert receipt["traceId"] is None
    ours = [r for r in caplog.records if r.name.startswith("agent_gateway.plugins.otel")]
    warnings = [r for r in ours if "not installed" in r.getMessage()]
    assert len(warnings) == 1


def test_importing_the_plugin_imports_no_opentelemetry() -> None:
    code = (
        "import sys, agent_gateway.plugins.otel\n"
        "loaded = [m for m in sys.modules if m.startswith('opentelemetry')]\n"
        "assert not loaded, loaded\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, timeout=WAIT)


# -- a real process exporting OTLP/HTTP ----------------------------------------------------------------


class Receiver:
    def __init__(self) -> None:
        self.exports: list[tuple[str, bytes]] = []
        self.arrived = asyncio.Event()

    async def traces(self, request: web.Request) -> web.Response:
        self.exports.append((request.content_type, await request.read()))
        self.arrived.set()
        return web.Response(body=b"", content_type="application/x-protobuf")


@pytest.fixture
async def receiver() -> AsyncIterator[tuple[Receiver, str]]:
    receiving = Receiver()
    app = web.Application()
    app.router.add_post("/v1/traces", receiving.traces)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield receiving, f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


async def test_a_gateway_exports_otlp_http_and_logs_the_trace_id(
    tmp_path: Path, fake_llm: FakeOpenAI, receiver: tuple[Receiver, str]
) -> None:
    receiving, endpoint = receiver
    log_path = tmp_path / "gateway.log"
    gateway = await start_gateway_process(
        tmp_path / "data",
        log_path,
        env={
            "AGENT_GATEWAY__CHAT_ONLY__BASE_URL": fake_llm.base_url,
            "AGENT_GATEWAY__CHAT_ONLY__MODEL": "m",
            "AGENT_GATEWAY__OTEL__ENABLED": "true",
            "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
            "OTEL_SERVICE_NAME": "gateway-under-test",
            "OTEL_METRICS_EXPORTER": "none",
        },
        args=["--log-format", "json"],
    )
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=WAIT)) as http:
            response = await http.post(f"{gateway.url}/v1/runs", json=run_body("hello"), headers=INBOUND)
            assert response.status == 201, await response.text()
            receipt = await response.json()
            async with http.get(f"{gateway.url}/v1/runs/{receipt['hostRunId']}/stream") as stream:
                events = [event async for event in sse_events(stream)]
            assert events[-1]["event"] == "run.completed"
    finally:
        await gateway.stop()  # the plugin flushes its batch at shutdown
    assert gateway.proc.returncode == 0
    await asyncio.wait_for(receiving.arrived.wait(), WAIT)
    spans = []
    for content_type, body in receiving.exports:
        assert content_type == "application/x-protobuf"
        assert body
        export = ExportTraceServiceRequest.FromString(body)
        for resource_spans in export.resource_spans:
            service = {a.key: a.value.string_value for a in resource_spans.resource.attributes}["service.name"]
            assert service == "gateway-under-test"
            spans += [span for scope in resource_spans.scope_spans for span in scope.spans]
    names = {span.name: span.trace_id.hex() for span in spans}
    assert names == {"invoke_agent chat-only": INBOUND_TRACE, "chat m": INBOUND_TRACE}
    # The run's log lines name its trace.
    records = [json.loads(line) for line in log_path.read_text().splitlines() if line.strip()]
    ended = [r for r in records if r.get("hostRunId") == receipt["hostRunId"] and "completed" in r["message"]]
    assert ended and all(r["traceId"] == INBOUND_TRACE for r in ended)
