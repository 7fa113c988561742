"""/v1/agents: one descriptor per registered runtime."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from aiohttp import web

if TYPE_CHECKING:
    from gateway.app import Gateway


def descriptor(runtime: Any) -> dict[str, Any]:
    described = dict(runtime.describe())
    return {
        "schema": "gateway.agent_descriptor.v1",
        "agentId": runtime.agent_id,
        "displayName": runtime.display_name,
        "provider": runtime.provider,
        "policy": runtime.policy.to_wire(),
        "capabilities": described.pop("capabilities", []),
        "availability": described.pop("availability", {"available": True}),
        **described,
    }


def setup(app: web.Application, gateway: Gateway) -> None:
    async def list_agents(request: web.Request) -> web.Response:
        agents = [descriptor(r) for _, r in sorted(gateway.runtimes.items())]
        return web.json_response({"schema": "gateway.agent_descriptors.v1", "agents": agents})

    app.router.add_get("/v1/agents", list_agents)
