"""Telemetry family: following a run in a tracing system (the built-in ``otel`` plugin)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from agent_gateway.hookspecs.markers import hookspec

if TYPE_CHECKING:
    from agent_gateway.config import Config
    from agent_gateway.models import Run
    from agent_gateway.telemetry import RunTrace


@hookspec(firstresult=True)
def trace_run(run: Run, agent_name: str, headers: Mapping[str, str], config: Config) -> RunTrace | None:
    """Begin following a new run (an :class:`agent_gateway.Run`, not yet started) in a tracing
    system: return an :class:`agent_gateway.RunTrace`, or None (not tracing). ``agent_name`` is
    its agent's display name.
    ``headers`` are the HTTP headers of the request that created it (a W3C ``traceparent`` among
    them to continue), case-insensitive; empty when the run was not created over HTTP.
    The trace's ``trace_id`` is written to the run's receipt (``traceId``) and log lines; the core
    then calls the trace at a model call (``model_call``), an agent's own tool event
    (``agent_tool_event``) and the run's end (``end``), never per streamed delta. Tool calls of the
    gateway's facade are seen with ``tool_call_completed``.
    First non-None result wins. Called once per new run (not for a repeated ``requestId``), on
    the event loop, before the run's first event: keep it cheap.
    """
