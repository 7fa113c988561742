"""Built-in plugin: OpenTelemetry traces and metrics of runs (``[otel]``, off by default).

``pip install 'agent-gateway[otel]'`` (opentelemetry-api, -sdk, -exporter-otlp-proto-http), then
``[otel] enabled = true``; the rest is the standard ``OTEL_*`` environment
(``OTEL_EXPORTER_OTLP_ENDPOINT``, ``OTEL_SERVICE_NAME``, ``OTEL_TRACES_SAMPLER``,
``OTEL_SDK_DISABLED``, ...). Spans follow OpenTelemetry's GenAI semantic conventions:
``invoke_agent {agent}`` per run, ``execute_tool {tool}`` per tool call (the gateway's facade and
the agent's own calls it reports), ``chat {model}`` per model call a runtime makes (chat-only).
An inbound W3C ``traceparent`` on run creation is continued; the run's trace id is in its receipt
(``traceId``) and log lines. Metrics: ``gen_ai.client.token.usage`` and
``gen_ai.client.operation.duration``. See docs/observability.md.

Nothing of OpenTelemetry is imported until a run is traced: without the packages the plugin logs
once and stays inert.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from agent_gateway import Config, Run, RunTrace, ToolCall, hookimpl

log = logging.getLogger(__name__)

SECTION = "otel"
DEFAULTS: dict[str, Any] = {
    "enabled": False,
    # Export the GenAI metrics too (OTLP, beside the Prometheus /metrics); OTEL_METRICS_EXPORTER=none also stops them.
    "metrics": True,
}

__all__ = ["DEFAULTS", "SECTION", "use_providers"]

# The process's one telemetry (tracers and instruments are process-wide in OpenTelemetry too).
_lock = threading.Lock()
_telemetry: Any = None
_unavailable = False


def use_providers(tracer_provider: Any, meter_provider: Any = None) -> None:
    """Trace with these OpenTelemetry providers instead of ones built from the ``OTEL_*``
    environment (an embedding application's own, or a test's in-memory exporter). ``None``
    for both goes back to the environment's on the next run."""
    global _telemetry
    with _lock:
        if tracer_provider is None:
            _telemetry = None
            return
        from .tracing import Telemetry

        _telemetry = Telemetry(tracer_provider, meter_provider, owned=False)


def _sdk_disabled() -> bool:
    return os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true"


def _telemetry_for(config: Config) -> Any:
    """The telemetry to trace with, or None (switched off, or the packages are missing)."""
    global _telemetry, _unavailable
    if not config.section(SECTION)["enabled"] or _sdk_disabled():
        return None
    if _telemetry is not None:
        return _telemetry
    if _unavailable:
        return None
    with _lock:
        if _telemetry is None and not _unavailable:
            try:
                from .tracing import Telemetry

                _telemetry = Telemetry.from_environment(metrics=bool(config.section(SECTION)["metrics"]))
            except ImportError as exc:
                _unavailable = True
                log.warning(
                    "[otel] enabled but OpenTelemetry is not installed (%s): runs are not traced; "
                    "pip install 'agent-gateway[otel]'",
                    exc,
                )
    return _telemetry


@hookimpl
def config_sections(register: Callable[..., None]) -> None:
    register(SECTION, dict(DEFAULTS), None, "OpenTelemetry traces and GenAI metrics of runs (OTEL_* environment).")


@hookimpl
def trace_run(run: Run, agent_name: str, headers: Mapping[str, str], config: Config) -> RunTrace | None:
    telemetry = _telemetry_for(config)
    if telemetry is None:
        return None
    trace: RunTrace = telemetry.trace_run(run, agent_name, headers)
    return trace


@hookimpl
def tool_call_completed(call: ToolCall, receipt: dict[str, Any]) -> None:
    telemetry = _telemetry
    if telemetry is not None:
        telemetry.tool_call_completed(call, receipt)


@hookimpl
def gateway_shutdown(context: Any) -> Awaitable[None] | None:
    telemetry = _telemetry
    if telemetry is None or not telemetry.owned:
        return None
    # Export what is batched before the process ends (a blocking call: off the loop).
    return asyncio.to_thread(telemetry.flush)
