"""Routes declared once (agent_gateway.Route): the document's operation is the declaration's, the
handler refuses what the declared models refuse with the gateway's usual 400s, the actor's
preference defaults come after validation, and a plugin can declare its routes the same way."""

from __future__ import annotations

from typing import Any

import pytest
from aiohttp import web
from pydantic import BaseModel, ConfigDict

from agent_gateway import ApiError, Identifier, NonBlankText, PluginError, PluginRoutes, Route, RouteResponse, hookimpl
from agent_gateway.declare import ERROR_RESPONSES, declared_paths
from agent_gateway.mcp import http as mcp_http
from agent_gateway.routes import agents, metrics, preferences, receipts, runs, sessions, system, workspaces
from agent_gateway.routes.runs import CREATE_RUN
from tests._descriptors import ALICE, BOB, MakeClient, make_client_fixture, put_prefs  # noqa: F401
from tests._harness import run_body
from tests._sessions import ALICE as ALICE_TOKEN
from tests._sessions import TOKENS, auth


async def test_the_served_create_run_operation_is_the_declarations(make_gateway: Any) -> None:
    client = await make_gateway()
    spec = await (await client.get("/openapi.json")).json()
    operation, schemas = CREATE_RUN.openapi_operation()
    assert spec["paths"]["/v1/runs"] == {"post": operation}
    for name, schema in schemas.items():  # RunRequest, RunContext, Run: from the models
        assert spec["components"]["schemas"][name] == schema, name
    assert set(schemas) >= {"RunRequest", "Run"}
    # the references the declaration makes resolve in the served document
    for status in CREATE_RUN.errors:
        name = operation["responses"][str(status)]["$ref"].rsplit("/", 1)[1]
        assert name in spec["components"]["responses"], status
    assert "AgentId" in spec["components"]["schemas"] and "SseEvent" in spec["components"]["schemas"]


def served_operations_are_the_declarations(spec: dict[str, Any], routes: tuple[Route[Any, Any, Any], ...]) -> None:
    for route in routes:
        operation, schemas = route.openapi_operation()
        assert spec["paths"][route.openapi_path][route.method.lower()] == operation, (route.method, route.path)
        for name, schema in schemas.items():
            assert spec["components"]["schemas"][name] == schema, name
        for status in route.errors:  # the references the declaration makes resolve
            name = operation["responses"][str(status)]["$ref"].rsplit("/", 1)[1]
            assert name in spec["components"]["responses"], status


async def test_the_served_sessions_operations_are_the_declarations(make_gateway: Any) -> None:
    client = await make_gateway()
    spec = await (await client.get("/openapi.json")).json()
    served_operations_are_the_declarations(spec, sessions.DECLARED)
    assert {route.openapi_path for route in sessions.DECLARED} == {
        "/v1/sessions",
        "/v1/sessions:delete",
        "/v1/sessions/{sessionId}",
        "/v1/sessions/{sessionId}/export",
        "/v1/sessions/{sessionId}/agent-session",
    }
    # the path variable is the document's name (no second spelling in the router)
    assert {
        resource.canonical
        for resource in client.app.router.resources()
        if resource.canonical.startswith("/v1/sessions")
    } >= {"/v1/sessions/{sessionId}", "/v1/sessions/{sessionId}/export"}


async def test_the_served_run_operations_are_the_declarations(make_gateway: Any) -> None:
    client = await make_gateway()
    spec = await (await client.get("/openapi.json")).json()
    declared = (*runs.DECLARED, *receipts.DECLARED)
    served_operations_are_the_declarations(spec, declared)
    run_paths = {path for path in spec["paths"] if path.startswith("/v1/runs")}
    # nothing else written by hand
    assert run_paths == {route.openapi_path for route in declared if route.openapi_path.startswith("/v1/runs")}
    assert "/v1/sessions/{sessionId}/active-run" in {route.openapi_path for route in runs.DECLARED}
    # the links of a created run name operations that exist
    operation_ids = {op.get("operationId") for item in spec["paths"].values() for op in item.values()}
    links = spec["paths"]["/v1/runs"]["post"]["responses"]["201"]["links"]
    assert {link["operationId"] for link in links.values()} <= operation_ids
    # query parameters are text, never null; the parsed cursor's default is not in the document
    events = {p["name"]: p for p in spec["paths"]["/v1/runs/{hostRunId}/events"]["get"]["parameters"]}
    assert events["afterSeq"]["schema"] == {"type": "string", "pattern": "^[0-9]{0,18}$"}
    assert events["projection"]["schema"]["$ref"] == "#/components/schemas/Projection"
    assert events["hostRunId"]["in"] == "path" and events["hostRunId"]["required"] is True


async def test_agents_preferences_and_workspaces_are_declared(make_gateway: Any) -> None:
    client = await make_gateway()
    spec = await (await client.get("/openapi.json")).json()
    served_operations_are_the_declarations(spec, (*agents.DECLARED, *preferences.DECLARED, *workspaces.DECLARED))
    for body in ({}, {"values": {}, "more": 1}, [1], {"value": {}}):
        error = await error_of(await client.put("/v1/preferences", json=body))
        assert error == {
            "code": "invalid_request",
            "message": 'send {"values": {"<preference key>": value or null, ...}}',
        }, body
    error = await error_of(await client.put("/v1/preferences", json={"values": []}))
    assert error["code"] != "invalid_request" or "values" in error["message"]  # the registry's own check
    fine = await client.put("/v1/preferences", json={"values": {}})
    assert fine.status == 200, await fine.text()
    unknown = await error_of(await client.get("/v1/agents/nope"), 404)
    assert unknown["code"] == "unknown_agent"


def references(value: Any) -> set[str]:
    if isinstance(value, dict):
        found = {value["$ref"]} if isinstance(value.get("$ref"), str) else set()
        return found.union(*(references(item) for item in value.values()))
    if isinstance(value, list):
        return set().union(*(references(item) for item in value))
    return set()


async def test_the_whole_core_document_is_declared(make_gateway: Any) -> None:
    """Nothing is written by hand: health, the document itself, metrics and MCP are declared routes
    too, and every reference the served document makes (plugins' included) resolves in it."""
    client = await make_gateway({"pi_lab": {"enabled": True}}, tokens=TOKENS)
    spec = await (await client.get("/openapi.json")).json()
    assert spec["openapi"] == "3.1.0" and spec["security"] == [{"bearer": []}]
    served_operations_are_the_declarations(spec, (*system.DECLARED, *metrics.DECLARED, *mcp_http.DECLARED))
    assert set(spec["components"]["responses"]) == set(ERROR_RESPONSES.values())
    for ref in references(spec):
        section, name = ref.removeprefix("#/components/").split("/")
        assert name in spec["components"][section], ref
    # the paths a token is not needed for say so
    assert spec["paths"]["/v1/health"]["get"]["security"] == [] == spec["paths"]["/openapi.json"]["get"]["security"]
    assert spec["paths"]["/v1/mcp"]["post"]["security"] == [{"leaseToken": []}]


async def test_hostile_run_requests_get_the_same_400s(make_gateway: Any) -> None:
    client = await make_gateway()
    created = await client.post("/v1/runs", json=run_body("hostile"))
    run_id = (await created.json())["hostRunId"]
    for query, code, message in (
        ("afterSeq=%205", "invalid_cursor", "afterSeq: a cursor is 0 or up to 18 ASCII digits, got ' 5'"),
        ("limit=0", "invalid_limit", "limit must be 1..5000"),
        ("limit=5_0", "invalid_limit", "limit must be an integer 1..5000"),
        ("limit=9999", "invalid_limit", "limit must be 1..5000"),
        ("limits=5", "invalid_request", "unknown query parameter(s): limits"),
    ):
        error = await error_of(await client.get(f"/v1/runs/{run_id}/events?{query}"))
        assert (error["code"], error["message"]) == (code, message), (query, error)
    error = await error_of(await client.get(f"/v1/runs/{run_id}/stream?limit=5"))
    assert error["message"] == "unknown query parameter(s): limit"
    error = await error_of(await client.get(f"/v1/runs/{run_id}/stream", headers={"Last-Event-ID": "x"}))
    assert error["code"] == "invalid_cursor" and error["message"].startswith("Last-Event-ID")
    error = await error_of(await client.get(f"/v1/runs/{run_id}/events?projection=nope"))
    assert error["code"] == "unknown_projection" and "ui" in error["known"]
    for body in ({}, {"optionId": ""}, {"optionId": 1}, {"optionId": "a", "more": 1}, [1]):
        response = await client.post(f"/v1/runs/{run_id}/permissions/p1", json=body)
        error = await error_of(response)
        assert error == {"code": "invalid_request", "message": 'send {"optionId": "<one of the offered options>"}'}
    page = await client.get(f"/v1/runs/{run_id}/events?afterSeq=&limit=2&projection=ui")
    assert page.status == 200 and len((await page.json())["events"]) == 2
    assert (await error_of(await client.get("/v1/runs/run_0/events?limit=1"), 404))["code"] == "run_not_found"


# The sessions routes' refusals before they were declared: (method, path, query, body) -> the
# code and message they keep.
SESSION_HOSTILE: list[tuple[str, str, dict[str, str], Any, str, str]] = [
    ("GET", "/v1/sessions", {"limit": "0"}, None, "invalid_limit", "limit must be 1..200"),
    ("GET", "/v1/sessions", {"limit": "x"}, None, "invalid_limit", "limit must be an integer"),
    ("GET", "/v1/sessions", {"q": "x" * 501}, None, "invalid_query", "q must be at most 500 characters, without NUL"),
    ("GET", "/v1/sessions", {"q": "a\x00"}, None, "invalid_query", "q must be at most 500 characters, without NUL"),
    (
        "GET",
        "/v1/sessions",
        {"agentId": "a" * 201},
        None,
        "invalid_agent_id",
        "agentId must be at most 200 characters, without NUL",
    ),
    ("GET", "/v1/sessions", {"status": "done"}, None, "invalid_status", "unknown status filter"),
    ("GET", "/v1/sessions", {"cursor": "!!"}, None, "invalid_cursor", "cursor: not a cursor this API returned"),
    ("GET", "/v1/sessions", {"qq": "x"}, None, "invalid_request", "unknown query parameter(s): qq"),
    (
        "GET",
        "/v1/sessions/%20",
        {},
        None,
        "invalid_session_id",
        "a session id must be a string with a visible character",
    ),
    ("GET", "/v1/sessions/" + "s" * 201, {}, None, "invalid_session_id", "a session id must be at most 200 characters"),
    ("GET", "/v1/sessions/s/export", {"format": "pdf"}, None, "invalid_format", "format must be json or markdown"),
    ("PATCH", "/v1/sessions/s", {}, {}, "invalid_request", 'send {"title": "...", "pinned": true|false}'),
    ("PATCH", "/v1/sessions/s", {}, [1], "invalid_request", 'send {"title": "...", "pinned": true|false}'),
    (
        "PATCH",
        "/v1/sessions/s",
        {},
        {"title": 5},
        "invalid_request",
        'title must be a string of at most 200 characters ("": default)',
    ),
    (
        "PATCH",
        "/v1/sessions/s",
        {},
        {"title": "t" * 201},
        "invalid_request",
        'title must be a string of at most 200 characters ("": default)',
    ),
    ("PATCH", "/v1/sessions/s", {}, {"pinned": "yes"}, "invalid_request", "pinned must be true or false"),
    ("PATCH", "/v1/sessions/s", {}, {"title": "t", "tags": []}, "invalid_request", "unknown field(s): tags"),
    (
        "POST",
        "/v1/sessions:delete",
        {},
        {"sessionIds": []},
        "invalid_request",
        'send {"sessionIds": [...]} with 1..100 ids',
    ),
    (
        "POST",
        "/v1/sessions:delete",
        {},
        {"sessionIds": "s"},
        "invalid_request",
        'send {"sessionIds": [...]} with 1..100 ids',
    ),
    (
        "POST",
        "/v1/sessions:delete",
        {},
        {"sessionIds": ["s"] * 101},
        "invalid_request",
        'send {"sessionIds": [...]} with 1..100 ids',
    ),
    (
        "POST",
        "/v1/sessions:delete",
        {},
        {"sessionIds": ["s"], "all": True},
        "invalid_request",
        'send {"sessionIds": [...]} with 1..100 ids',
    ),
    ("POST", "/v1/sessions:delete", {}, [1], "invalid_request", 'send {"sessionIds": [...]} with 1..100 ids'),
    (
        "POST",
        "/v1/sessions:delete",
        {},
        {"sessionIds": ["s", 7]},
        "invalid_session_id",
        "a session id must be a string with a visible character",
    ),
]


async def test_hostile_sessions_requests_get_the_same_400s(make_gateway: Any) -> None:
    client = await make_gateway(tokens=TOKENS)
    for method, path, query, body, code, message in SESSION_HOSTILE:
        response = await client.request(method, path, params=query, json=body, headers=auth(ALICE_TOKEN))
        error = await error_of(response)
        assert (error["code"], error["message"]) == (code, message), (method, path, query, body, error)
    status = await error_of(await client.get("/v1/sessions", params={"status": "x"}, headers=auth(ALICE_TOKEN)))
    assert "completed" in status["known"] and "active" in status["known"]
    # what the models take: empty filters are none, q is trimmed, an unknown session is a 404
    listed = await client.get(
        "/v1/sessions", params={"agentId": "", "status": "", "cursor": "", "q": " "}, headers=auth(ALICE_TOKEN)
    )
    assert listed.status == 200 and (await listed.json())["sessions"] == []
    missing = await client.patch("/v1/sessions/nope", json={"title": None, "pinned": True}, headers=auth(ALICE_TOKEN))
    assert (await error_of(missing, 404))["code"] == "session_not_found"


async def error_of(response: Any, status: int = 400) -> dict[str, Any]:
    assert response.status == status, await response.text()
    return (await response.json())["error"]


# Bodies the gateway refused before its routes were declared, with the same status, code and the
# field the message names (the messages' wording is the declaration's).
HOSTILE: list[tuple[dict[str, Any], str]] = [
    ({"requestId": None}, "requestId"),
    ({"requestId": 12}, "requestId"),
    ({"requestId": ""}, "requestId"),
    ({"requestId": "x" * 201}, "requestId"),
    ({"sessionId": "   "}, "sessionId"),
    ({"sessionId": ["s"]}, "sessionId"),
    ({"workspaceId": None}, "workspaceId"),
    ({"message": None}, "message"),
    ({"message": ""}, "message"),
    ({"message": " \t\n\u0085\ufeff\u001c"}, "message"),
    ({"message": {"text": "hi"}}, "message"),
    ({"context": "notes/"}, "context"),
    ({"context": [1]}, "context"),
    ({"context": {"allowedRoots": "notes/"}}, "context.allowedRoots"),
    ({"context": {"allowedRoots": [1]}}, "context.allowedRoots"),
    ({"options": [1]}, "options"),
    ({"options": "model"}, "options"),
    ({"parentRunId": 5}, "parentRunId"),
    ({"parentRunId": {}}, "parentRunId"),
    ({"multitaskStrategy": None}, "multitaskStrategy"),
    ({"multitaskStrategy": "queue"}, "multitaskStrategy"),
    ({"webhook": "ftp://example.com/hook"}, "webhook"),
    ({"webhook": 7}, "webhook"),
    ({"agentId": None}, "agentId"),  # no default agent for this actor
    ({"agentId": True}, "agentId"),
]


async def test_hostile_run_bodies_get_the_same_400s(make_gateway: Any) -> None:
    client = await make_gateway(overrides={"gateway": {"max_body_bytes": 4096}})
    good = run_body("fine")
    for change, field in HOSTILE:
        error = await error_of(await client.post("/v1/runs", json={**good, **change}))
        assert error["code"] == "invalid_request", change
        assert error["message"].startswith(field), (change, error)
        assert error["field"].startswith(field), (change, error)
    for missing in ("requestId", "agentId", "sessionId", "message"):
        body = {k: v for k, v in good.items() if k != missing}
        error = await error_of(await client.post("/v1/runs", json=body))
        assert error["code"] == "invalid_request" and missing in error["message"], error
    unknown = await error_of(await client.post("/v1/runs", json={**good, "surprise": 1, "z": None, "agentID": "x"}))
    assert unknown == {"code": "invalid_request", "message": "unknown field(s): agentID, surprise, z"}
    for raw in (b"[]", b'"text"', b"7", b"null", b"true"):
        error = await error_of(await client.post("/v1/runs", data=raw, headers={"Content-Type": "application/json"}))
        assert error == {"code": "invalid_request", "message": "the body must be a JSON object"}, raw
    huge = await error_of(await client.post("/v1/runs", json={**good, "message": "x" * 10_000}), 413)
    assert huge["code"] == "body_too_large"
    bad_query = await error_of(await client.post("/v1/runs?stream=yes", json=good))
    assert bad_query["code"] == "invalid_request" and bad_query["message"].startswith("stream"), bad_query
    unknown_query = await error_of(await client.post("/v1/runs?strem=1", json=good))
    assert unknown_query["message"] == "unknown query parameter(s): strem"
    # nulls the document allows are absent values; none of the refusals above created a run
    fine = {**good, "context": None, "options": None, "parentRunId": None, "webhook": None}
    created = await client.post("/v1/runs", json=fine)
    assert created.status == 201, await created.text()
    assert (await created.json())["requestId"] == good["requestId"]


async def test_preference_defaults_come_after_validation(make_client: MakeClient) -> None:
    client = await make_client()
    await put_prefs(client, ALICE, {"ai.common.defaultAgent": "chat-only"})
    body = {"requestId": "d-1", "sessionId": "d", "message": "hi"}
    # absent or null: the actor's default agent
    created = await client.post("/v1/runs", json=body, headers=ALICE)
    assert created.status == 201, await created.text()
    assert (await created.json())["agentId"] == "chat-only"
    created = await client.post("/v1/runs", json={**body, "requestId": "d-2", "agentId": None}, headers=ALICE)
    assert created.status == 201 and (await created.json())["agentId"] == "chat-only"
    # what the body sent is checked as sent: an empty agentId is refused, default or not
    error = await error_of(
        await client.post("/v1/runs", json={**body, "requestId": "d-3", "agentId": ""}, headers=ALICE)
    )
    assert error["code"] == "invalid_request" and error["field"] == "agentId"
    error = await error_of(await client.post("/v1/runs", json={**body, "context": "x"}, headers=ALICE))
    assert error["field"] == "context"
    # an actor without a default must name its agent
    error = await error_of(await client.post("/v1/runs", json=body, headers=BOB))
    assert error["code"] == "invalid_request" and "agentId" in error["message"]


class Note(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    title: Identifier
    text: NonBlankText
    stars: int = 0


class Noted(BaseModel):
    title: str
    stars: int


NOTE = Route(
    "POST",
    "/v1/notes/{noteId}",
    "Keep a note",
    operation_id="keepNote",
    body=Note,
    responses={201: RouteResponse("Kept", Noted)},
    errors=(400, 401),
)


class NotesPlugin:
    @hookimpl
    def register_routes(self, routes: PluginRoutes) -> None:
        async def keep(request: web.Request) -> web.Response:
            note = await NOTE.read_body(request)
            return web.json_response({"title": note.title, "stars": note.stars}, status=201)

        routes.add(NOTE, keep)


async def test_a_plugin_declares_its_route_once(make_gateway: Any) -> None:
    client = await make_gateway(extra_plugins=(NotesPlugin(),))
    spec = await (await client.get("/openapi.json")).json()
    operation, schemas = NOTE.openapi_operation()
    assert spec["paths"]["/v1/notes/{noteId}"] == {"post": operation}
    assert spec["components"]["schemas"]["Note"] == schemas["Note"]
    assert spec["components"]["schemas"]["Noted"] == schemas["Noted"]
    assert spec["components"]["schemas"]["Note"]["required"] == ["title", "text"]
    kept = await client.post("/v1/notes/n1", json={"title": "t", "text": "hello", "stars": 2})
    assert kept.status == 201 and await kept.json() == {"title": "t", "stars": 2}
    for body, field in (({"title": "t", "text": " "}, "text"), ({"title": "t", "text": "x", "stars": "2"}, "stars")):
        error = await error_of(await client.post("/v1/notes/n1", json=body))
        assert error["code"] == "invalid_request" and error["field"] == field, error
    error = await error_of(await client.post("/v1/notes/n1", json={"title": "t", "text": "x", "tags": []}))
    assert error["message"] == "unknown field(s): tags"


def test_a_name_declared_twice_differently_is_refused() -> None:
    class Other(BaseModel):
        title: int

    Other.__name__ = "Note"
    clash = Route("POST", "/v1/notes2", "Another", body=Other)
    paths, schemas = declared_paths([NOTE])
    with pytest.raises(PluginError, match="'Note'"):
        declared_paths([NOTE, clash])
    assert "/v1/notes/{noteId}" in paths and "Note" in schemas


def test_a_route_parses_what_it_declares() -> None:
    with pytest.raises(ApiError) as refused:
        NOTE.parse_body({"title": "t"})
    assert (refused.value.status, refused.value.code, str(refused.value)) == (
        400,
        "invalid_request",
        "text is required",
    )
    assert NOTE.parse_body({"title": "t", "text": "x"}).stars == 0
    with pytest.raises(PluginError, match="no shared error response"):
        Route("GET", "/v1/x", "x", errors=(418,))
