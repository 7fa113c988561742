"""What a tracing plugin (the ``trace_run`` hook) is told of a run, and the do-nothing default.

The core never imports a tracing library. A plugin returns a :class:`RunTrace` for each new run;
the core calls it at the few points a trace needs (a model call a runtime makes, an agent's own
tool event, the run's end), never per streamed delta. Without such a plugin every run gets
:data:`NO_TRACE`, whose methods do nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agent_gateway.models import Run


class ModelCallTrace:
    """One call a runtime makes to a model, as a tracing plugin follows it.

    ``headers`` are sent with the call (the W3C ``traceparent``); ``end(...)`` is called once
    when the call is over: ``usage`` in the journal's ``usage.updated`` names (``inputTokens``,
    ``outputTokens``, ...), ``error`` a short error type when it failed."""

    headers: Mapping[str, str] = {}

    def end(
        self,
        *,
        usage: Mapping[str, Any] | None = None,
        error: str | None = None,
        response_model: str | None = None,
    ) -> None:
        return None


NO_MODEL_CALL = ModelCallTrace()


class RunTrace:
    """A tracing plugin's handle on one run (returned by the ``trace_run`` hook).

    ``trace_id`` (32 hex digits) goes into the run's receipt (``traceId``) and its log lines;
    ``traceparent`` is passed on to the agent where its protocol allows (ACP ``_meta``).
    The core calls the methods from the event loop; they must be cheap and must not raise."""

    trace_id: str | None = None
    traceparent: str | None = None

    def model_call(self, operation: str, model: str, provider: str) -> ModelCallTrace:
        """A runtime is about to call a model (``operation`` ``chat``): what to send and end."""
        return NO_MODEL_CALL

    def agent_tool_event(self, kind: str, payload: Mapping[str, Any]) -> None:
        """A ``tool.*`` event the agent reported of its own tool (not the gateway's facade)."""
        return None

    def end(self, run: Run, usage: Mapping[str, Any] | None) -> None:
        """The run ended (``run.status`` is terminal, ``run.error`` its reason); ``usage`` is the
        last ``usage.updated`` payload of the run that counted tokens, or None."""
        return None


NO_TRACE = RunTrace()
