"""The OpenTelemetry side of the ``otel`` plugin (imported only when a run is traced).

Spans and attributes follow the GenAI semantic conventions: ``invoke_agent {agent}`` per run,
``chat {model}`` per model call, ``execute_tool {tool}`` per tool call. Spans are made per run,
model call and tool call only: nothing here runs per streamed delta.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Mapping
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from agent_gateway import ModelCallTrace, Run, RunTrace, ToolCall, __version__

log = logging.getLogger(__name__)

INSTRUMENTATION = "agent_gateway"
DEFAULT_SERVICE_NAME = "agent-gateway"
# The conventions' advisory bucket boundaries for the two GenAI client metrics.
TOKEN_BUCKETS = [4**i for i in range(14)]  # 1 … 67,108,864
DURATION_BUCKETS = [0.01 * 2**i for i in range(14)]  # 0.01 … 81.92 s
# An agent that reports calls and never finishes them must not grow a run's memory without bound.
OPEN_AGENT_TOOLS_MAX = 1000
# Run statuses that are failures of the operation (a cancel is the client's choice).
ERROR_STATUSES = frozenset({"failed", "interrupted"})

_propagator = TraceContextTextMapPropagator()


def _traceparent(context: trace.SpanContext) -> str:
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"


def _tokens(usage: Mapping[str, Any] | None) -> tuple[int | None, int | None]:
    if not usage:
        return None, None
    found = (usage.get("inputTokens"), usage.get("outputTokens"))
    return tuple(v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None for v in found)  # type: ignore[return-value]


class Telemetry:
    """The process's tracer and GenAI instruments, and the runs it follows (by hostRunId)."""

    def __init__(self, tracer_provider: Any, meter_provider: Any = None, *, owned: bool) -> None:
        self.tracer_provider = tracer_provider
        self.meter_provider = meter_provider
        self.owned = owned  # built here from the environment: flushed at gateway shutdown
        self.tracer = tracer_provider.get_tracer(INSTRUMENTATION, __version__)
        self.token_usage: Any = None
        self.duration: Any = None
        if meter_provider is not None:
            meter = meter_provider.get_meter(INSTRUMENTATION, __version__)
            self.token_usage = meter.create_histogram(
                "gen_ai.client.token.usage",
                unit="{token}",
                description="Number of input and output tokens used.",
                explicit_bucket_boundaries_advisory=TOKEN_BUCKETS,
            )
            self.duration = meter.create_histogram(
                "gen_ai.client.operation.duration",
                unit="s",
                description="GenAI operation duration.",
                explicit_bucket_boundaries_advisory=DURATION_BUCKETS,
            )
        self.runs: dict[str, OtelRunTrace] = {}
        self._runs_lock = threading.Lock()  # tool calls end on the loop; a flush runs in a thread

    @classmethod
    def from_environment(cls, *, metrics: bool) -> Telemetry:
        """Providers from the ``OTEL_*`` environment: the process's global ones when the host set
        them (``opentelemetry-instrument``, an embedding application), else an SDK tracer provider
        exporting OTLP/HTTP (``OTEL_TRACES_EXPORTER``: ``otlp``, ``console`` or ``none``)."""
        from opentelemetry import metrics as otel_metrics
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

        current = trace.get_tracer_provider()
        if not isinstance(current, trace.ProxyTracerProvider):
            meter_provider = otel_metrics.get_meter_provider() if metrics else None
            return cls(current, meter_provider, owned=False)
        attributes = {} if os.environ.get("OTEL_SERVICE_NAME") else {"service.name": DEFAULT_SERVICE_NAME}
        resource = Resource.create(attributes).merge(Resource({"service.version": __version__}))
        tracer_provider = TracerProvider(resource=resource)
        exporter_name = os.environ.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower()
        if exporter_name == "console":
            tracer_provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter()))
        elif exporter_name != "none":
            protocol = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or os.environ.get(
                "OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"
            )
            if protocol != "http/protobuf":
                log.warning("OTEL_EXPORTER_OTLP_PROTOCOL=%s is not supported: exporting http/protobuf", protocol)
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            tracer_provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        meter_provider = None
        if metrics and os.environ.get("OTEL_METRICS_EXPORTER", "otlp").strip().lower() != "none":
            from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
            from opentelemetry.sdk.metrics import MeterProvider
            from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

            reader = PeriodicExportingMetricReader(OTLPMetricExporter())
            meter_provider = MeterProvider(resource=resource, metric_readers=[reader])
        return cls(tracer_provider, meter_provider, owned=True)

    def flush(self) -> None:
        for provider in (self.tracer_provider, self.meter_provider):
            flush = getattr(provider, "force_flush", None)
            if flush is not None:
                try:
                    flush()
                except Exception:
                    log.exception("could not flush OpenTelemetry data")

    # -- runs -----------------------------------------------------------------------------------------
    def trace_run(self, run: Run, agent_name: str, headers: Mapping[str, str]) -> OtelRunTrace:
        parent = _propagator.extract(headers) if headers.get("traceparent") else None
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.provider.name": run.provider,
            "gen_ai.agent.id": run.agent_id,
            "gen_ai.agent.name": agent_name,
            "gen_ai.conversation.id": run.session_id,
            "agent_gateway.run.id": run.host_run_id,
            "agent_gateway.workspace.id": run.workspace_id,
        }
        model = (run.request.get("options") or {}).get("model")
        if isinstance(model, str) and model:
            attributes["gen_ai.request.model"] = model
        span = self.tracer.start_span(
            f"invoke_agent {run.agent_id}", context=parent, kind=SpanKind.INTERNAL, attributes=attributes
        )
        traced = OtelRunTrace(self, run, span)
        with self._runs_lock:
            self.runs[run.host_run_id] = traced
        return traced

    def forget(self, host_run_id: str) -> None:
        with self._runs_lock:
            self.runs.pop(host_run_id, None)

    def tool_call_completed(self, call: ToolCall, receipt: Mapping[str, Any]) -> None:
        """A call of the gateway's tool facade ended: its span, under its run's."""
        traced = self.runs.get(call.scope.run.host_run_id)
        if traced is None:
            return
        status = str(receipt.get("status") or "")
        error = receipt.get("errorCode") if (not receipt.get("allowed") or status == "failed") else None
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": call.name,
            "gen_ai.tool.call.id": call.id,
            "gen_ai.tool.type": "function",
            "gen_ai.conversation.id": traced.run.session_id,
            "agent_gateway.tool.source": "gateway",
            "agent_gateway.receipt.id": str(receipt.get("receiptId") or ""),
        }
        if error:
            attributes["error.type"] = str(error)
        span = self.tracer.start_span(
            f"execute_tool {call.name}",
            context=traced.context,
            kind=SpanKind.INTERNAL,
            attributes=attributes,
            start_time=call.started_ns,
        )
        if error:
            span.set_status(Status(StatusCode.ERROR, str(receipt.get("reason") or error)[:200]))
        span.end()

    def record(self, operation: str, provider: str, model: str | None, seconds: float, **more: Any) -> None:
        """The GenAI client metrics of one operation (its duration, its tokens)."""
        if self.duration is None:
            return
        attributes: dict[str, Any] = {"gen_ai.operation.name": operation, "gen_ai.provider.name": provider}
        if model:
            attributes["gen_ai.request.model"] = model
        if more.get("error"):
            attributes["error.type"] = more["error"]
        self.duration.record(seconds, attributes)
        for token_type, count in (("input", more.get("input_tokens")), ("output", more.get("output_tokens"))):
            if count is not None and "error.type" not in attributes:
                self.token_usage.record(count, {**attributes, "gen_ai.token.type": token_type})


class OtelRunTrace(RunTrace):
    """One run's ``invoke_agent`` span and its children."""

    def __init__(self, telemetry: Telemetry, run: Run, span: Any) -> None:
        self.telemetry = telemetry
        self.run = run
        self.span = span
        self.started = time.monotonic()
        span_context = span.get_span_context()
        self.context = trace.set_span_in_context(span)
        self.trace_id = f"{span_context.trace_id:032x}" if span_context.is_valid else None
        self.traceparent = _traceparent(span_context) if span_context.is_valid else None
        self.agent_tools: dict[str, Any] = {}
        self.model_tokens = False  # a model call recorded the tokens (not again for the run)

    def model_call(self, operation: str, model: str, provider: str) -> ModelCallTrace:
        span = self.telemetry.tracer.start_span(
            f"{operation} {model}",
            context=self.context,
            kind=SpanKind.CLIENT,
            attributes={
                "gen_ai.operation.name": operation,
                "gen_ai.provider.name": provider,
                "gen_ai.request.model": model,
                "gen_ai.conversation.id": self.run.session_id,
            },
        )
        headers: dict[str, str] = {}
        _propagator.inject(headers, context=trace.set_span_in_context(span))
        return OtelModelCall(self, span, operation, model, provider, headers)

    def agent_tool_event(self, kind: str, payload: Mapping[str, Any]) -> None:
        call_id = payload.get("toolCallId")
        if not isinstance(call_id, str) or not call_id:
            return
        span = self.agent_tools.get(call_id)
        if span is None:
            if len(self.agent_tools) >= OPEN_AGENT_TOOLS_MAX:
                return
            name = str(payload.get("tool") or payload.get("kind") or "tool")[:100]
            attributes: dict[str, Any] = {
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.name": name,
                "gen_ai.tool.call.id": call_id[:200],
                "gen_ai.conversation.id": self.run.session_id,
                "agent_gateway.tool.source": "agent",
            }
            title = payload.get("title")
            if isinstance(title, str) and title:
                attributes["gen_ai.tool.description"] = title[:500]
            span = self.agent_tools[call_id] = self.telemetry.tracer.start_span(
                f"execute_tool {name}", context=self.context, kind=SpanKind.INTERNAL, attributes=attributes
            )
        status = payload.get("status")
        if kind == "tool.completed" or status in ("completed", "failed"):
            if status == "failed":
                span.set_attribute("error.type", "tool_failed")
                span.set_status(Status(StatusCode.ERROR))
            span.end()
            del self.agent_tools[call_id]

    def end(self, run: Run, usage: Mapping[str, Any] | None) -> None:
        self.telemetry.forget(run.host_run_id)
        for span in self.agent_tools.values():  # calls the agent never finished
            span.set_attribute("error.type", "unfinished")
            span.end()
        self.agent_tools.clear()
        span = self.span
        input_tokens, output_tokens = _tokens(usage)
        if input_tokens is not None:
            span.set_attribute("gen_ai.usage.input_tokens", input_tokens)
        if output_tokens is not None:
            span.set_attribute("gen_ai.usage.output_tokens", output_tokens)
        span.set_attribute("agent_gateway.run.status", run.status)
        if run.provider_run_id:
            span.set_attribute("agent_gateway.agent_session.id", run.provider_run_id)
        error = run.status if run.status in ERROR_STATUSES else None
        if error:
            span.set_attribute("error.type", error)
            span.set_status(Status(StatusCode.ERROR, (run.error or error)[:200]))
        span.end()
        tokens = {} if self.model_tokens else {"input_tokens": input_tokens, "output_tokens": output_tokens}
        self.telemetry.record(
            "invoke_agent", run.provider, None, time.monotonic() - self.started, error=error, **tokens
        )


class OtelModelCall(ModelCallTrace):
    def __init__(
        self, run: OtelRunTrace, span: Any, operation: str, model: str, provider: str, headers: dict[str, str]
    ) -> None:
        self.run = run
        self.span = span
        self.operation = operation
        self.model = model
        self.provider = provider
        self.headers = headers
        self.started = time.monotonic()

    def end(
        self,
        *,
        usage: Mapping[str, Any] | None = None,
        error: str | None = None,
        response_model: str | None = None,
    ) -> None:
        span = self.span
        input_tokens, output_tokens = _tokens(usage)
        if input_tokens is not None:
            span.set_attribute("gen_ai.usage.input_tokens", input_tokens)
        if output_tokens is not None:
            span.set_attribute("gen_ai.usage.output_tokens", output_tokens)
        if response_model:
            span.set_attribute("gen_ai.response.model", response_model)
        if error:
            span.set_attribute("error.type", error)
            span.set_status(Status(StatusCode.ERROR))
        span.end()
        if input_tokens is not None or output_tokens is not None:
            self.run.model_tokens = True
        self.run.telemetry.record(
            self.operation,
            self.provider,
            self.model,
            time.monotonic() - self.started,
            error=error,
            input_tokens=input_tokens,
            output_tokens=output_tokens,
        )
