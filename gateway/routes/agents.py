"""/v1/agents: one ``gateway.agent_descriptor.v1`` per registered runtime, merged for the calling
actor (see agent_gateway.descriptors)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field

from agent_gateway.api_models import AgentDescriptor
from agent_gateway.auth import ACTOR_ID, Auth, identity
from agent_gateway.declare import Route, RouteResponse
from agent_gateway.descriptors import DESCRIPTORS_SCHEMA
from agent_gateway.errors import ApiError
from agent_gateway.preferences import Preferences


class AgentDescriptors(BaseModel):
    model_config = ConfigDict(defer_build=True)
    schema_: Literal["gateway.agent_descriptors.v1"] = Field(alias="schema")
    actorId: str
    agents: list[AgentDescriptor]


class AgentPath(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, defer_build=True)
    agentId: str = Field(min_length=1)


LIST_AGENTS: Route[Any, Any] = Route(
    "GET",
    "/v1/agents",
    "Agent descriptors, merged for the calling actor",
    operation_id="listAgents",
    responses={200: RouteResponse("gateway.agent_descriptors.v1", AgentDescriptors)},
    errors=(400, 401, 403, 503),
)
GET_AGENT: Route[Any, Any, AgentPath] = Route(
    "GET",
    "/v1/agents/{agentId}",
    "One agent descriptor (gateway.agent_descriptor.v1) for the calling actor",
    operation_id="getAgent",
    params=AgentPath,
    responses={200: RouteResponse("The descriptor", AgentDescriptor)},
    errors=(400, 401, 403, 404, 503),
)
DECLARED: tuple[Route[Any, Any, Any], ...] = (LIST_AGENTS, GET_AGENT)


def setup(app: web.Application, auth: Auth, runtimes: Mapping[str, Any], preferences: Preferences) -> None:
    async def list_agents(request: web.Request) -> web.Response:
        agents = await preferences.describe_agents(request[ACTOR_ID])
        if auth.authorizing:  # the agents the caller may not read are left out
            actor = identity(request)
            agents = [
                agent
                for agent in agents
                if await auth.allowed(actor, "agents:read", {"type": "agent", "id": agent["agentId"]})
            ]
        return web.json_response({"schema": DESCRIPTORS_SCHEMA, "actorId": request[ACTOR_ID], "agents": agents})

    async def one_agent(request: web.Request) -> web.Response:
        agent_id = GET_AGENT.parse_path(request).agentId
        if agent_id not in runtimes:
            raise ApiError(404, "unknown_agent", f"unknown agentId {agent_id[:100]!r}", knownAgents=sorted(runtimes))
        if auth.authorizing:
            await auth.authorize(request, "agents:read", {"type": "agent", "id": agent_id})
        (descriptor,) = await preferences.describe_agents(request[ACTOR_ID], agent_id)
        return web.json_response(descriptor)

    app.router.add_route(LIST_AGENTS.method, LIST_AGENTS.path, list_agents)
    app.router.add_route(GET_AGENT.method, GET_AGENT.path, one_agent)
