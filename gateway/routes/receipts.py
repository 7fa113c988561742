"""GET /v1/runs/{hostRunId}/receipts: the tool receipts of one run (the actor's own runs only):
the gateway facade's and those of the calls the agent reported running itself, in the order the
calls ended."""

from __future__ import annotations

import asyncio
from concurrent.futures import Executor
from typing import TYPE_CHECKING, Any, Literal

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field

from agent_gateway.api_models import ToolReceipt
from agent_gateway.auth import ACTOR_ID, Auth, run_resource
from agent_gateway.declare import Route, RouteResponse
from agent_gateway.errors import ApiError
from agent_gateway.routes.runs import RUN_ERRORS, RunPath

if TYPE_CHECKING:
    from agent_gateway.runs import RunManager
    from agent_gateway.storage import Storage

RECEIPTS_SCHEMA = "gateway.tool_receipts.v1"


class ToolReceipts(BaseModel):
    model_config = ConfigDict(defer_build=True)
    schema_: Literal["gateway.tool_receipts.v1"] = Field(alias="schema")
    hostRunId: str
    receipts: list[ToolReceipt]


RUN_RECEIPTS: Route[Any, Any, RunPath] = Route(
    "GET",
    "/v1/runs/{hostRunId}/receipts",
    "The tool receipts of a run (gateway.tool_receipts.v1)",
    operation_id="getRunReceipts",
    description="What touched the run's files: the receipts of the calls made through the gateway's tool facade "
    "(`source` gateway) and of the tool calls the agent reported running itself (`source` agent), in the order the "
    "calls ended (`createdAt`). Every receipt of a run is stored before its terminal event is sent.",
    params=RunPath,
    responses={200: RouteResponse("Receipts", ToolReceipts)},
    errors=RUN_ERRORS,
)
DECLARED = (RUN_RECEIPTS,)


def _created_at(receipt: dict[str, Any]) -> int:
    created = receipt.get("createdAt")
    return created if isinstance(created, int) and not isinstance(created, bool) else 0


def in_call_order(receipts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Stored receipts (insertion order) by ``createdAt``, ties in insertion order: an agent's
    receipt is stored with the journal's next group commit, so it may follow a facade receipt
    made after it."""
    return sorted(receipts, key=_created_at)


def setup(app: web.Application, auth: Auth, runs: RunManager, storage: Storage, executor: Executor) -> None:
    async def list_receipts(request: web.Request) -> web.Response:
        run = await runs.get(RUN_RECEIPTS.parse_path(request).hostRunId, request[ACTOR_ID])
        if run is None:
            raise ApiError(404, "run_not_found", "no such run")
        if auth.authorizing:
            await auth.authorize(request, "runs:read", run_resource(run))
        loop = asyncio.get_running_loop()
        receipts = await loop.run_in_executor(executor, storage.list_receipts, run.host_run_id)
        return web.json_response(
            {"schema": RECEIPTS_SCHEMA, "hostRunId": run.host_run_id, "receipts": in_call_order(receipts)}
        )

    app.router.add_route(RUN_RECEIPTS.method, RUN_RECEIPTS.path, list_receipts)
