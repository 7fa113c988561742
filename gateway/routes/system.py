"""/v1/health and /openapi.json."""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiohttp import web

from agent_gateway.descriptors import FieldSpec, registry_for

if TYPE_CHECKING:
    from agent_gateway.app import Gateway

OPENAPI_PATH = Path(__file__).resolve().parent.parent / "openapi.json"
# The JSON range of an integer preference (values beyond 64 bits are not JSON the gateway parses).
INT64 = {"minimum": -(2**63) + 1, "maximum": 2**63 - 1}


def preference_schema(spec: FieldSpec) -> dict[str, Any]:
    """The JSON schema of one preference value, as ``FieldSpec.check`` accepts it (null removes it)."""
    options = list(spec.options) if spec.options is not None else None
    if spec.kind == "string_list":
        item: dict[str, Any] = {"type": "string"} if options is None else {"enum": options}
        return {"type": ["array", "null"], "items": item, "maxItems": 100, "description": spec.label}
    if options is not None:
        return {"enum": [*options, None], "description": spec.label}
    schema: dict[str, Any] = {
        "boolean": {"type": ["boolean", "null"]},
        "integer": {"type": ["integer", "null"], **INT64},
    }.get(spec.kind, {"type": ["string", "null"]})
    if spec.kind == "string":
        schema = {**schema, "maxLength": 10_000}
    return {**schema, "description": spec.label}


async def served_spec(
    gateway: Gateway, spec: Mapping[str, Any], plugin_paths: Mapping[str, Mapping[str, Any]]
) -> dict[str, Any]:
    """The document as served: the static file, the plugins' paths, and what only this gateway
    knows filled in: its agent ids, projections and preference keys in the named schemas, and no
    token requirement where its auth config has none."""
    served = copy.deepcopy(dict(spec))
    served["paths"] = {**served["paths"], **copy.deepcopy(dict(plugin_paths))}
    schemas = served["components"]["schemas"]
    if gateway.runtimes:
        schemas["AgentId"] = {**schemas["AgentId"], "enum": sorted(gateway.runtimes)}
    schemas["Projection"] = {**schemas["Projection"], "enum": sorted({"ui", *gateway.projections})}
    if not gateway.tokens:  # the one local actor: no route asks for a token
        served["security"] = []
    if gateway.public_metrics or not gateway.tokens:
        served["paths"]["/metrics"]["get"]["security"] = []
    registry = await registry_for(gateway)
    values = schemas["PreferenceValues"]
    values["properties"] = {field.key: preference_schema(field) for field in registry.fields()}
    values["additionalProperties"] = False
    return served


def setup(app: web.Application, gateway: Gateway, plugin_paths: Mapping[str, Mapping[str, Any]]) -> None:
    """``plugin_paths``: the OpenAPI path items plugins declare with their routes (a live,
    read-only view: plugins add routes after the core's)."""
    spec = json.loads(OPENAPI_PATH.read_text(encoding="utf-8"))
    served: dict[str, bytes] = {}

    async def health(request: web.Request) -> web.Response:
        return web.json_response(
            {
                "status": "ok",
                "agents": sorted(gateway.runtimes),
                "activeRuns": len(gateway.runs.active_runs()),
                "journalPending": gateway.journal.pending,
            }
        )

    async def openapi(request: web.Request) -> web.Response:
        if "body" not in served:  # built once: routes and registries are fixed once the app runs
            served["body"] = json.dumps(await served_spec(gateway, spec, plugin_paths)).encode()
        return web.Response(body=served["body"], content_type="application/json")

    app.router.add_get("/v1/health", health)
    app.router.add_get("/openapi.json", openapi)
