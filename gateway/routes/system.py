"""/v1/health and /openapi.json (the document: agent_gateway.api_document)."""

from __future__ import annotations

import asyncio
import copy
import json
import logging
import time
from collections.abc import Mapping
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field

from agent_gateway.api_document import core_document
from agent_gateway.api_models import DOCUMENTED
from agent_gateway.cluster import Coordinator
from agent_gateway.declare import Route, RouteResponse, merge_components
from agent_gateway.descriptors import Descriptors, FieldSpec
from agent_gateway.journal import Journal
from agent_gateway.mcp import http as mcp_http
from agent_gateway.routes import agents, metrics, preferences, receipts, runs, sessions, workspaces

if TYPE_CHECKING:
    from agent_gateway.runs import RunManager
    from agent_gateway.storage import Storage


@dataclass(frozen=True)
class SystemSources:
    """What ``/v1/health`` and ``/openapi.json`` read."""

    runtimes: Mapping[str, Any]
    projections: Mapping[str, Any]
    # Whether callers need a token ([auth]); whether /metrics is public anyway.
    auth_required: bool
    public_metrics: bool
    descriptors: Descriptors
    storage: Storage
    journal: Journal
    executor: Executor
    runs: RunManager
    coordinator: Coordinator


# How long readiness waits for the storage ping before reporting storage as down.
HEALTH_PING_TIMEOUT_S = 3.0

log = logging.getLogger("agent_gateway.health")
# A journal commit (or a successful ping) this recent answers a readiness probe without a ping of
# its own.
COMMIT_VOUCHES_S = 1.0


def preference_schema(spec: FieldSpec) -> dict[str, Any]:
    """The JSON schema of one preference value, as ``FieldSpec.check`` accepts it (null removes it)."""
    schema = spec.value_schema
    if "type" in schema:  # a kind alone: null added to its type (and options)
        nullable = {**schema, "type": [schema["type"], "null"]}
        if "enum" in schema:
            nullable["enum"] = [*schema["enum"], None]
    else:
        nullable = {"anyOf": [{"type": "null"}, schema]}
    return {**nullable, "description": spec.label}


class HealthQuery(BaseModel):
    # (a probe's other parameters are ignored, as they always were: load balancers add their own)
    model_config = ConfigDict(extra="ignore", strict=True, defer_build=True)
    probe: Literal["ready", "live"] = Field(
        "ready",
        description="`ready` (default): 200 when storage answers, 503 `degraded` when it does not; `live`: 200 "
        "while the process serves HTTP",
    )


class Health(BaseModel):
    """Readiness: `status` ok or degraded, storage up or down, the agents, active runs, pending journal writes
    (and `cluster` when one instance of several); liveness: `status` and `probe`."""

    model_config = DOCUMENTED
    status: str


class OpenApiDocument(BaseModel):
    """An OpenAPI 3.1 document."""

    model_config = DOCUMENTED
    openapi: str
    paths: dict[str, Any]


HEALTH: Route[Any, HealthQuery] = Route(
    "GET",
    "/v1/health",
    "Readiness (storage reachable); `?probe=live` answers liveness only. No auth.",
    operation_id="health",
    query=HealthQuery,
    responses={
        200: RouteResponse("Ready (or live)", Health),
        503: RouteResponse(
            "Not ready: storage is unreachable",
            # (any JSON object: the connection limit's JSON error is a 503 too)
            content={"application/json": {"schema": {"type": "object"}}},
            headers={"Retry-After": {"required": False, "schema": {"type": "string"}}},
        ),
    },
    errors=(400, 403),
    openapi={"security": []},
)
OPENAPI: Route[Any, Any] = Route(
    "GET",
    "/openapi.json",
    "This document; no auth",
    operation_id="openapi",
    responses={200: RouteResponse("OpenAPI 3.1", OpenApiDocument)},
    errors=(400, 403, 503),
    openapi={"security": []},
)
DECLARED: tuple[Route[Any, Any, Any], ...] = (HEALTH, OPENAPI)


def core_spec() -> dict[str, Any]:
    """The core's document before any plugin, from the declarations (agent_gateway.api_document)."""
    return core_document(
        (
            *DECLARED,
            *metrics.DECLARED,
            *mcp_http.DECLARED,
            *runs.DECLARED,
            *receipts.DECLARED,
            *sessions.DECLARED,
            *agents.DECLARED,
            *preferences.DECLARED,
            *workspaces.DECLARED,
        )
    )


async def served_spec(
    sources: SystemSources,
    spec: Mapping[str, Any],
    plugin_paths: Mapping[str, Mapping[str, Any]],
    plugin_schemas: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The document as served: the core's, the plugins' paths and schemas, and what only this
    gateway knows filled in: its agent ids, projections and preference keys in the named schemas,
    and no token requirement where its auth config has none."""
    served = copy.deepcopy(dict(spec))
    served["paths"] = {**served["paths"], **copy.deepcopy(dict(plugin_paths))}
    schemas = served["components"]["schemas"]
    merge_components(schemas, copy.deepcopy(dict(plugin_schemas or {})), "a plugin's declared routes")
    if sources.runtimes:
        schemas["AgentId"] = {**schemas["AgentId"], "enum": sorted(sources.runtimes)}
    schemas["Projection"] = {**schemas["Projection"], "enum": sorted({"ui", *sources.projections})}
    if not sources.auth_required:  # the one local actor: no route asks for a token
        served["security"] = []
    if sources.public_metrics or not sources.auth_required:
        served["paths"]["/metrics"]["get"]["security"] = []
    registry = await sources.descriptors.registry()
    values = schemas["PreferenceValues"]
    values["properties"] = {field.key: preference_schema(field) for field in registry.fields()}
    values["additionalProperties"] = False
    return served


def setup(
    app: web.Application,
    sources: SystemSources,
    plugin_paths: Mapping[str, Mapping[str, Any]],
    plugin_schemas: Mapping[str, Any] | None = None,
) -> None:
    """``plugin_paths``, ``plugin_schemas``: the OpenAPI path items and component schemas plugins
    declare with their routes (live, read-only views: plugins add routes after the core's)."""
    served: dict[str, bytes] = {}

    # One storage ping at a time: concurrent probes share it, so a hung database holds one worker.
    ping_in_flight: asyncio.Future[None] | None = None
    # When the last successful ping started, and the journal's failed commits then: it vouches for
    # storage as a commit does, until a commit fails after it.
    pinged_at = 0.0
    pinged_errors = -1

    async def storage_up() -> bool:
        nonlocal ping_in_flight, pinged_at, pinged_errors
        ping = getattr(sources.storage, "ping", None)
        if ping is None:  # a storage plugin without ping: nothing to ask
            return True
        now = time.monotonic()
        if now - sources.journal.last_commit_at < COMMIT_VOUCHES_S:
            # The journal just committed: storage answered. A ping would queue behind its
            # commits and make the probe as slow as the busiest run.
            return True
        errors = sources.journal.commit_errors
        if now - pinged_at < COMMIT_VOUCHES_S and errors == pinged_errors:
            # A ping just answered: probes every few ms (a burst of clients arriving while no run
            # commits) are answered on the loop, not each after a worker trip.
            return True
        if ping_in_flight is None or ping_in_flight.done():
            ping_in_flight = asyncio.get_running_loop().run_in_executor(sources.executor, ping)
            ping_in_flight.add_done_callback(lambda done: done.cancelled() or done.exception())
        try:
            async with asyncio.timeout(HEALTH_PING_TIMEOUT_S):
                await asyncio.shield(ping_in_flight)
        except Exception as exc:  # StorageUnavailable, a timeout, or the driver's own error
            log.warning("health: storage is down: %s", str(exc).strip() or type(exc).__name__)
            return False
        pinged_at, pinged_errors = now, errors
        return True

    async def health(request: web.Request) -> web.Response:
        """Readiness (the default, or `?probe=ready`): 200 when storage answers, else 503
        `degraded`. Liveness (`?probe=live`): 200 while the process serves HTTP."""
        if request.rel_url.raw_query_string and HEALTH.parse_query(request).probe == "live":
            return web.json_response({"status": "ok", "probe": "live"})
        up = await storage_up()
        body: dict[str, Any] = {
            "status": "ok" if up else "degraded",
            "storage": "up" if up else "down",
            "agents": sorted(sources.runtimes),
            "activeRuns": len(sources.runs.active_runs()),
            "journalPending": sources.journal.pending,
        }
        cluster = sources.coordinator.health()
        if cluster is not None:  # one instance of several: its id, lease, relay and sessions
            body["cluster"] = cluster
            if not cluster.get("ready", True):
                up, body["status"] = False, "degraded"
        return web.json_response(body, status=200 if up else 503)

    async def openapi(request: web.Request) -> web.Response:
        if "body" not in served:  # built once: routes and registries are fixed once the app runs
            # (on first request, not at start-up: the declared models build their schemas here)
            spec = core_spec()
            served["body"] = json.dumps(await served_spec(sources, spec, plugin_paths, plugin_schemas)).encode()
        return web.Response(body=served["body"], content_type="application/json")

    app.router.add_get(HEALTH.path, health)
    app.router.add_get(OPENAPI.path, openapi)
