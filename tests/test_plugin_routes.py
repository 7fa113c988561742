"""Plugin routes go through one narrow door, ``agent_gateway.PluginRoutes``: a route is declared
with its OpenAPI operation (so ``/openapi.json`` lists it), handlers reach the caller's runs,
preferences and tools only through the facade, and the routes a plugin may declare are checked.

And the URL agents are told to call back on (MCP) never comes from a request's ``Host`` header:
it is ``[gateway] public_url``, else the address the gateway listens on.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from agent_gateway import PluginError, PluginRoutes, Tool, ToolCall, ToolError, hookimpl
from agent_gateway.app import create_app
from agent_gateway.config import Config
from agent_gateway.mcp import MCP_PATH
from agent_gateway.plugin_host import PluginHost
from agent_gateway.runtime import RuntimePolicy
from tests._harness import gateway_of, run_body, run_to_end

ALICE = {"Authorization": "Bearer alice-token-0123456789"}
BOB = {"Authorization": "Bearer bob-token-0123456789ab"}
TOKENS = {"alice-token-0123456789": "alice", "bob-token-0123456789ab": "bob"}
ECHO_SCHEMA = {"type": "object", "properties": {"text": {"type": "string"}}, "additionalProperties": False}


async def echo(call: ToolCall) -> dict[str, Any]:
    return {"echoed": call.arguments["text"], "actor": call.scope.actor_id}


class EchoArea:
    """A plugin with a tool and a route that calls it for the caller's run."""

    def __init__(self) -> None:
        self.closed = 0

    @hookimpl
    def register_tools(self, register: Callable[[Tool], None]) -> None:
        register(Tool("demo.echo", "Echo a text.", ECHO_SCHEMA, (), echo))

    @hookimpl
    def register_routes(self, routes: PluginRoutes) -> None:
        async def call(request: web.Request) -> web.Response:
            run = await routes.run(request.match_info["hostRunId"], routes.actor(request))
            if run is None:
                return web.json_response({"error": {"code": "run_not_found", "message": "no such run"}}, status=404)
            try:
                result = await routes.call_tool("demo.echo", await request.json(), run)
            except ToolError as exc:
                return web.json_response({"error": exc.to_wire()}, status=400)
            return web.json_response(result)

        async def preferences(request: web.Request) -> web.Response:
            values = await routes.preferences(routes.actor(request))
            size = await routes.in_thread(len, values)
            return web.json_response({"values": values, "count": size})

        def close() -> None:
            self.closed += 1

        routes.add(
            "POST",
            "/v1/demo/runs/{hostRunId}/echo",
            call,
            openapi={"summary": "Echo through a tool", "responses": {"200": {"description": "the result"}}},
        )
        routes.add("GET", "/v1/demo/preferences", preferences)  # no description: a placeholder
        routes.on_shutdown(close)


def config_for(tmp_path: Path, fake_llm_url: str, **sections: dict[str, Any]) -> Config:
    # a section given is merged into the defaults: a `gateway` section must keep the test's data dir
    # (without it the gateway opened the user's own ~/.local/share/agent-gateway database)
    overrides: dict[str, dict[str, Any]] = {
        "gateway": {"data_dir": str(tmp_path / "data")},
        "chat_only": {"base_url": fake_llm_url, "model": "m"},
    }
    for name, section in sections.items():
        overrides[name] = {**overrides.get(name, {}), **section}
    return Config.load(None, env={}, overrides=overrides)


@pytest.fixture
async def served(tmp_path: Path, fake_llm: Any) -> AsyncIterator[Callable[..., Any]]:
    clients: list[TestClient] = []

    async def start(*plugins: object, **sections: dict[str, Any]) -> TestClient:
        app = create_app(config_for(tmp_path, fake_llm.base_url, **sections), PluginHost.load(env={}, extra=plugins))
        client = TestClient(TestServer(app))
        await client.start_server()
        clients.append(client)
        return client

    yield start
    for client in clients:
        await client.close()


async def test_a_plugin_route_calls_a_tool_in_the_callers_run_only(served: Any) -> None:
    client = await served(EchoArea(), auth={"tokens": TOKENS})
    receipt, _ = await run_to_end(client, run_body("hi"), headers=ALICE)
    path = f"/v1/demo/runs/{receipt['hostRunId']}/echo"

    response = await client.post(path, json={"text": "ping"}, headers=ALICE)
    assert response.status == 200, await response.text()
    result = await response.json()
    assert (result["echoed"], result["actor"]) == ("ping", "alice") and result["receiptId"]
    # Receipted like an agent's call, on the caller's run, marked as a route's.
    receipts = (await (await client.get(f"/v1/runs/{receipt['hostRunId']}/receipts", headers=ALICE)).json())["receipts"]
    assert [(r["tool"], r["caller"], r["receiptId"]) for r in receipts] == [("demo.echo", "route", result["receiptId"])]
    # The same checks as any call: a bad argument is refused with its code.
    refused = await client.post(path, json={"text": 5}, headers=ALICE)
    assert refused.status == 400 and (await refused.json())["error"]["code"] == "invalid_arguments"
    # Another actor cannot reach alice's run through the plugin.
    assert (await client.post(path, json={"text": "x"}, headers=BOB)).status == 404
    assert (await client.post(path, json={"text": "x"})).status == 401


async def test_a_plugin_route_reads_only_the_callers_preferences(served: Any) -> None:
    client = await served(EchoArea(), auth={"tokens": TOKENS})
    put = await client.put("/v1/preferences", json={"values": {"ai.common.knowledge_rag.mode": "local"}}, headers=ALICE)
    assert put.status == 200, await put.text()
    alice = await (await client.get("/v1/demo/preferences", headers=ALICE)).json()
    assert alice == {"values": {"ai.common.knowledge_rag.mode": "local"}, "count": 1}
    assert await (await client.get("/v1/demo/preferences", headers=BOB)).json() == {"values": {}, "count": 0}


async def test_openapi_lists_plugin_routes_with_what_they_declared(served: Any) -> None:
    client = await served(EchoArea())
    paths = (await (await client.get("/openapi.json")).json())["paths"]
    assert paths["/v1/demo/runs/{hostRunId}/echo"]["post"]["summary"] == "Echo through a tool"
    assert "without an OpenAPI description" in paths["/v1/demo/preferences"]["get"]["summary"]
    # The built-in plugins declare theirs the same way.
    assert paths["/v1/knowledge/documents/track/{trackId}"]["get"]["responses"]
    assert set(paths["/v1/knowledge/documents"]) == {"get", "post", "delete"}
    assert paths["/v1/pi-lab/runs/{hostRunId}/steer"]["post"]


async def test_shutdown_callbacks_run_once_when_the_gateway_stops(served: Any) -> None:
    area = EchoArea()
    client = await served(area)
    assert area.closed == 0
    await client.close()
    assert area.closed == 1


class Claims:
    def __init__(self, method: str, path: str) -> None:
        self.method, self.path = method, path
        self.kept: PluginRoutes | None = None

    @hookimpl
    def register_routes(self, routes: PluginRoutes) -> None:
        async def handler(request: web.Request) -> web.Response:
            return web.json_response({})

        self.kept = routes
        routes.add(self.method, self.path, handler)


@pytest.mark.parametrize(
    ("method", "path", "problem"),
    [
        ("GET", "/v1/agents", "route GET /v1/agents is already served"),
        ("GET", "/v1/runs/{other}", "route GET /v1/runs/{other} is already served"),
        ("POST", "/v1/knowledge/query", "route POST /v1/knowledge/query is already served"),
        ("GET", "/metrics", "plugin routes live under /v1/"),
        ("TRACE", "/v1/x", "method must be one of"),
    ],
)
def test_a_route_the_gateway_already_serves_or_outside_v1_is_refused(
    tmp_path: Path, method: str, path: str, problem: str
) -> None:
    config = config_for(tmp_path, "http://127.0.0.1:9/v1")
    with pytest.raises(PluginError, match=problem.replace("{", r"\{").replace("}", r"\}")):
        create_app(config, PluginHost.load(env={}, extra=(Claims(method, path),)))


def test_routes_cannot_be_added_after_start_up(tmp_path: Path) -> None:
    plugin = Claims("GET", "/v1/claims/one")
    create_app(config_for(tmp_path, "http://127.0.0.1:9/v1"), PluginHost.load(env={}, extra=(plugin,)))
    assert plugin.kept is not None
    with pytest.raises(PluginError, match="only be added while register_routes runs"):
        plugin.kept.add("GET", "/v1/claims/two", lambda request: None)  # type: ignore[arg-type,return-value]


# -- the URL agents call back on ---------------------------------------------------------------------


class StandInTurn:
    """What the MCP provider reads of a turn: its run, and no ACP binding (a session lease)."""

    def __init__(self, run: Any) -> None:
        self.run = run
        self.binding = None


class HostEcho:
    """A route that shows which Host the server saw (so the test knows the header arrived)."""

    @hookimpl
    def register_routes(self, routes: PluginRoutes) -> None:
        async def host(request: web.Request) -> web.Response:
            return web.json_response({"host": request.host})

        routes.add("GET", "/v1/host-echo", host)


async def mcp_urls(client: TestClient, host_run_id: str) -> list[str]:
    gateway = gateway_of(client)
    run = await gateway.runs.get(host_run_id, "local")
    provide = gateway.turn_services.mcp_servers_for
    assert provide is not None
    [http] = provide(StandInTurn(run), RuntimePolicy(mcp_http=True))
    [stdio] = provide(StandInTurn(run), RuntimePolicy())
    return [http["url"], stdio["args"][stdio["args"].index("--url") + 1]]


async def test_a_host_header_never_becomes_the_agents_callback_url(served: Any) -> None:
    # allowed_hosts lets the foreign Host reach the routes at all (loopback-only otherwise)
    client = await served(HostEcho(), gateway={"allowed_hosts": ["evil.example"]})
    evil = {"Host": "evil.example"}
    assert await (await client.get("/v1/host-echo", headers=evil)).json() == {"host": "evil.example"}
    receipt, _ = await run_to_end(client, run_body("hi"), headers=evil)
    listening = f"http://127.0.0.1:{client.port}"
    assert await mcp_urls(client, receipt["hostRunId"]) == [listening + MCP_PATH, listening]


async def test_public_url_is_what_agents_are_given(served: Any) -> None:
    client = await served(gateway={"public_url": "https://gw.example.org/agents/", "allowed_hosts": ["evil.example"]})
    receipt, _ = await run_to_end(client, run_body("hi"), headers={"Host": "evil.example"})
    public = "https://gw.example.org/agents"
    assert await mcp_urls(client, receipt["hostRunId"]) == [public + MCP_PATH, public]


def test_public_url_must_be_an_http_url(tmp_path: Path) -> None:
    config = config_for(tmp_path, "http://127.0.0.1:9/v1", gateway={"public_url": "gw.example.org"})
    assert any("gateway.public_url: must be an http:// or https:// URL" in p for p in config.problems())


# -- declared routes: names checked at start-up, the document built when first read -------------------


def _declaring(path: str, body: type[Any]) -> Any:
    from agent_gateway import Route, RouteResponse

    class Declares:
        @hookimpl
        def register_routes(self, routes: PluginRoutes) -> None:
            async def handler(request: web.Request) -> web.Response:
                return web.json_response({})

            routes.add(Route("POST", path, "Take a note", body=body, responses={200: RouteResponse("ok")}), handler)

    return Declares()


def _note_model(field: str) -> type[Any]:
    from pydantic import BaseModel, create_model

    model: type[BaseModel] = create_model("Note", **{field: (str, ...)})  # type: ignore[call-overload]
    return model


def test_two_plugins_declaring_different_models_under_one_name_are_refused_at_start_up(tmp_path: Path) -> None:
    plugins = (_declaring("/v1/notes/a", _note_model("text")), _declaring("/v1/notes/b", _note_model("title")))
    with pytest.raises(PluginError, match="the component schema 'Note' is already declared by another model"):
        create_app(config_for(tmp_path, "http://127.0.0.1:9/v1"), PluginHost.load(env={}, extra=plugins))


async def test_a_declared_route_is_in_the_document_built_on_first_read(tmp_path: Path) -> None:
    model = _note_model("text")
    schema_built: list[str] = []
    real = model.model_json_schema

    def counting(*args: Any, **kwargs: Any) -> Any:
        schema_built.append(model.__name__)
        return real(*args, **kwargs)

    model.model_json_schema = counting  # type: ignore[method-assign]
    plugins = (_declaring("/v1/notes/a", model), _declaring("/v1/notes/b", model))  # one model, two routes: fine
    app = create_app(config_for(tmp_path, "http://127.0.0.1:9/v1"), PluginHost.load(env={}, extra=plugins))
    assert schema_built == []  # start-up built no JSON Schema
    async with TestClient(TestServer(app)) as client:
        spec = await (await client.get("/openapi.json")).json()
    note = {"$ref": "#/components/schemas/Note"}
    for path in ("/v1/notes/a", "/v1/notes/b"):
        assert spec["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"] == note
    assert spec["components"]["schemas"]["Note"]["required"] == ["text"]
    assert schema_built
