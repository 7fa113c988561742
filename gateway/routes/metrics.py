"""GET /metrics: Prometheus text exposition of the gateway's own counters and gauges."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aiohttp import web

from agent_gateway.auth import ACTOR_ID, Auth
from agent_gateway.bus import Bus
from agent_gateway.cluster import Coordinator
from agent_gateway.declare import Route, RouteResponse
from agent_gateway.journal import Journal
from agent_gateway.models import ACTIVE_STATUSES, TERMINAL_STATUSES
from agent_gateway.server.loop_monitor import INTERVAL, LoopLagMonitor
from agent_gateway.sse import StreamStats

if TYPE_CHECKING:
    from agent_gateway.runs import RunManager


@dataclass(frozen=True)
class MetricSources:
    """What ``/metrics`` reads its numbers from."""

    runs: RunManager
    runtimes: Mapping[str, Any]
    journal: Journal
    bus: Bus
    stream_stats: StreamStats
    loop_monitor: LoopLagMonitor
    coordinator: Coordinator
    # The sandbox network's counters (egress connections denied, ...).
    sandbox_counters: Mapping[str, int]


# (the served document drops its token requirement with `[auth] public_metrics` or no tokens)
METRICS: Route[Any, Any] = Route(
    "GET",
    "/metrics",
    "Prometheus text metrics; needs a token unless `[auth] public_metrics = true`",
    operation_id="metrics",
    responses={
        200: RouteResponse(
            "Prometheus text exposition (version 0.0.4)", content={"text/plain": {"schema": {"type": "string"}}}
        )
    },
    errors=(400, 401, 403, 503),
)
DECLARED: tuple[Route[Any, Any, Any], ...] = (METRICS,)


def render(sources: MetricSources) -> str:
    lines: list[str] = []

    def metric(name: str, kind: str, help_text: str, samples: list[tuple[str, float]]) -> None:
        lines.append(f"# HELP {name} {help_text}")
        lines.append(f"# TYPE {name} {kind}")
        for labels, value in samples:
            # Exact integers (`:g` would print 1234567 as 1.23457e+06 and hide increments).
            text = str(int(value)) if float(value).is_integer() else repr(float(value))
            lines.append(f"{name}{labels} {text}")

    active = sources.runs.active_runs()
    metric(
        "agent_gateway_runs_active",
        "gauge",
        "Runs not yet ended, by status.",
        [(f'{{status="{s}"}}', sum(1 for r in active if r.status == s)) for s in sorted(ACTIVE_STATUSES)],
    )
    metric(
        "agent_gateway_runs_finished_total",
        "counter",
        "Runs ended by this process, by terminal status.",
        [(f'{{status="{s}"}}', sources.runs.finished.get(s, 0)) for s in sorted(TERMINAL_STATUSES)],
    )
    metric("agent_gateway_runs_created_total", "counter", "Runs created by this process.", [("", sources.runs.created)])
    egress = sources.sandbox_counters
    metric(
        "agent_gateway_sandbox_egress_total",
        "counter",
        "Connections confined agents asked the gateway to open, by outcome (denied: not on the agent's allow list).",
        [(f'{{outcome="{o}"}}', egress.get(o, 0)) for o in ("allowed", "denied")],
    )
    journal, stats = sources.journal, sources.stream_stats
    metric(
        "agent_gateway_events_appended_total", "counter", "Events appended to the journal.", [("", journal.appended)]
    )
    metric("agent_gateway_events_delivered_total", "counter", "Events written to SSE clients.", [("", stats.delivered)])
    metric(
        "agent_gateway_journal_pending_events",
        "gauge",
        "Events appended but not yet committed to storage.",
        [("", journal.pending)],
    )
    metric("agent_gateway_journal_commits_total", "counter", "Group commits to storage.", [("", journal.batches)])
    metric(
        "agent_gateway_journal_commit_errors_total",
        "counter",
        "Failed commits (retried).",
        [("", journal.commit_errors)],
    )
    metric(
        "agent_gateway_stream_buffered_events",
        "gauge",
        "Events waiting in SSE client buffers.",
        [("", sources.bus.buffered())],
    )
    metric("agent_gateway_streams_open", "gauge", "Open SSE streams.", [("", stats.open_streams)])
    metric(
        "agent_gateway_stream_merges_total",
        "counter",
        "Deltas merged for clients that fell behind.",
        [("", stats.merges + sources.bus.live_merges())],
    )
    metric(
        "agent_gateway_stream_replays_total",
        "counter",
        "Clients moved back to replay from the journal.",
        [("", stats.replays)],
    )
    bindings = [
        (f'{{agent="{agent_id}"}}', float(runtime.live_bindings()))
        for agent_id, runtime in sorted(sources.runtimes.items())
        if hasattr(runtime, "live_bindings")
    ]
    metric("agent_gateway_live_bindings", "gauge", "Live agent sessions kept between turns.", bindings)
    cluster = sources.coordinator.health()
    if cluster is not None:  # one instance of several: its figures, labelled with its id
        label = f'{{instance="{cluster.get("instanceId", "")}"}}'
        metric("agent_gateway_cluster_ready", "gauge", "1 while this instance holds its lease.", [
            (label, 1.0 if cluster.get("ready", True) else 0.0)
        ])  # fmt: skip
        for key, value in sorted(cluster.items()):
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                name = "agent_gateway_cluster_" + "".join(f"_{c.lower()}" if c.isupper() else c for c in key)
                metric(name, "gauge", f"The cluster coordinator's {key} (/v1/health cluster.{key}).", [(label, value)])
    for name, kind, help_text, samples in sources.coordinator.metrics():
        metric(name, kind, help_text, [(_labels(labels), value) for labels, value in samples])
    monitor = sources.loop_monitor
    name = "agent_gateway_loop_lag_seconds"
    lines.append(f"# HELP {name} How late the event loop ran a timer due every {INTERVAL:g} s (it was held).")
    lines.append(f"# TYPE {name} histogram")
    lines += [f'{name}_bucket{{le="{le}"}} {count}' for le, count in monitor.cumulative()]
    lines.append(f"{name}_sum {monitor.sum!r}")
    lines.append(f"{name}_count {monitor.count}")
    return "\n".join(lines) + "\n"


def _labels(labels: dict[str, str]) -> str:
    if not labels:
        return ""
    escaped = {k: str(v).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") for k, v in labels.items()}
    return "{" + ",".join(f'{k}="{v}"' for k, v in escaped.items()) + "}"


def setup(app: web.Application, auth: Auth, sources: MetricSources) -> None:
    async def metrics(request: web.Request) -> web.Response:
        if auth.authorizing and ACTOR_ID in request:  # a public /metrics has no caller to ask about
            await auth.authorize(request, "metrics:read", {"type": "metrics"})
        return web.Response(
            text=render(sources),
            content_type="text/plain",
            charset="utf-8",
            headers={"X-Content-Type-Options": "nosniff"},
        )

    app.router.add_get(METRICS.path, metrics)
