"""/v1/agents: one ``gateway.agent_descriptor.v1`` per registered runtime, merged for the calling
actor (see agent_gateway.descriptors)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from aiohttp import web

from agent_gateway.auth import ACTOR_ID, Auth, identity
from agent_gateway.descriptors import DESCRIPTORS_SCHEMA
from agent_gateway.errors import ApiError
from agent_gateway.preferences import Preferences


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
        agent_id = request.match_info["agent_id"]
        if agent_id not in runtimes:
            raise ApiError(404, "unknown_agent", f"unknown agentId {agent_id[:100]!r}", knownAgents=sorted(runtimes))
        if auth.authorizing:
            await auth.authorize(request, "agents:read", {"type": "agent", "id": agent_id})
        (descriptor,) = await preferences.describe_agents(request[ACTOR_ID], agent_id)
        return web.json_response(descriptor)

    app.router.add_get("/v1/agents", list_agents)
    app.router.add_get("/v1/agents/{agent_id}", one_agent)
