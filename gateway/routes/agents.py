"""/v1/agents: one ``gateway.agent_descriptor.v1`` per registered runtime, merged for the calling
actor (see gateway/descriptors.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from aiohttp import web

from agent_gateway.auth import identity
from agent_gateway.descriptors import DESCRIPTORS_SCHEMA, describe_agents
from agent_gateway.errors import ApiError

if TYPE_CHECKING:
    from agent_gateway.app import Gateway


def setup(app: web.Application, gateway: Gateway) -> None:
    async def list_agents(request: web.Request) -> web.Response:
        agents = await describe_agents(gateway, request["actor"])
        if gateway.auth.authorizing:  # the agents the caller may not read are left out
            actor = identity(request)
            agents = [
                agent
                for agent in agents
                if await gateway.auth.allowed(actor, "agents:read", {"type": "agent", "id": agent["agentId"]})
            ]
        return web.json_response({"schema": DESCRIPTORS_SCHEMA, "actorId": request["actor"], "agents": agents})

    async def one_agent(request: web.Request) -> web.Response:
        agent_id = request.match_info["agent_id"]
        if agent_id not in gateway.runtimes:
            raise ApiError(
                404, "unknown_agent", f"unknown agentId {agent_id[:100]!r}", knownAgents=sorted(gateway.runtimes)
            )
        if gateway.auth.authorizing:
            await gateway.auth.authorize(request, "agents:read", {"type": "agent", "id": agent_id})
        (descriptor,) = await describe_agents(gateway, request["actor"], agent_id)
        return web.json_response(descriptor)

    app.router.add_get("/v1/agents", list_agents)
    app.router.add_get("/v1/agents/{agent_id}", one_agent)
