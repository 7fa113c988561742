"""The knowledge routes (the lightrag plugin's ``/v1/knowledge/...``) do what ``/openapi.json``
says, checked by Schemathesis as tests/test_openapi_conformance.py checks the core's.

The gateway (tests/_openapi.GatewayThread with ``knowledge``) points the plugin at a fake LightRAG
server (tests/_fake_lightrag.py: the real server's shapes and refusals, in memory) and has a
workspace ``default`` with two files. Every built-in check runs on every knowledge operation:
examples, coverage and fuzzing cases. A 5xx is a failure here: the fake is healthy, so a
``provider_error`` means the gateway forwarded something the provider refuses. Same settings as
the core's test: fixed seed, derandomized, no example database, a few examples per operation.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import hypothesis
import pytest
import requests
import schemathesis
from schemathesis.specs.openapi.schemas import OpenApiSchema

import agent_gateway
from tests._harness import WAIT
from tests._openapi import (  # noqa: F401  (fixtures)
    EXAMPLES,
    KNOWLEDGE,
    RUNS_TOKEN,
    GatewayThread,
    _node_id_for_schemathesis,
    headers_for,
    load_schema,
)


@pytest.fixture(scope="module")
def knowledge_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayThread]:
    with GatewayThread(str(tmp_path_factory.mktemp("knowledge")), knowledge=True) as gateway:
        yield gateway


@pytest.fixture(scope="module")
def knowledge_schema(knowledge_gateway: GatewayThread) -> OpenApiSchema:
    return load_schema(knowledge_gateway.url).include(path_regex=KNOWLEDGE)


schema = schemathesis.pytest.from_fixture("knowledge_schema")


@schema.parametrize()
@hypothesis.settings(deadline=None, suppress_health_check=list(hypothesis.HealthCheck))
def test_every_knowledge_operation_conforms(case: schemathesis.Case) -> None:
    case.call_and_validate(headers=headers_for(case))


# -- what it found, each pinned ---------------------------------------------------------------------


def _post(gateway: GatewayThread, path: str, body: dict[str, Any]) -> requests.Response:
    return requests.post(
        f"{gateway.url}/v1/knowledge/{path}", json=body, headers={"Authorization": f"Bearer {RUNS_TOKEN}"}, timeout=WAIT
    )


def test_an_integral_top_k_is_an_integer(knowledge_gateway: GatewayThread) -> None:
    """JSON Schema's "integer" takes 7.0; the route did not (the tool schema's check says number)."""
    response = _post(knowledge_gateway, "query", {"query": "what is blue?", "topK": 7.0})
    assert response.status_code == 200, response.text
    assert _post(knowledge_gateway, "query", {"query": "what is blue?", "topK": 7.5}).status_code == 400


@pytest.mark.parametrize("query", ["  ab", "a  ", " \u3000x\u3000 ", "\ufeffab"])
def test_a_query_lightrag_would_refuse_is_refused_first(knowledge_gateway: GatewayThread, query: str) -> None:
    """Three characters, but fewer once stripped: the provider's 422 came back as a 502."""
    response = _post(knowledge_gateway, "query", {"query": query})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["code"] == "invalid_arguments"


@pytest.mark.parametrize(
    "body",
    [{"referenceId": "ref-never-given"}, {"reference": {"referenceId": "ref-never-given"}}, {"sourcePath": "a\x17b"}],
)
def test_a_reference_nothing_has_is_not_found(knowledge_gateway: GatewayThread, body: dict[str, Any]) -> None:
    response = _post(knowledge_gateway, "open_reference", body)
    assert response.status_code == 404, response.text
    assert response.json()["error"]["code"] == "not_found"


@pytest.mark.parametrize("body", [{"referenceId": ""}, {"reference": {}}, {"reference": {"sourcePath": None}}])
def test_a_reference_without_a_usable_key_is_refused_as_the_document_says(
    knowledge_gateway: GatewayThread, body: dict[str, Any]
) -> None:
    response = _post(knowledge_gateway, "open_reference", body)
    assert response.status_code == 400, response.text


@pytest.mark.parametrize("path", ["notes/" + "n" * 256, "notes/" + "é" * 128 + ".md", "a/" * 2100])
def test_a_path_too_long_to_exist_is_not_found(knowledge_gateway: GatewayThread, path: str) -> None:
    response = _post(knowledge_gateway, "documents", {"path": path[:4096]})
    assert response.status_code == 404, response.text
    assert response.json()["error"]["code"] == "not_found"


@pytest.mark.parametrize("query", ["x=1", "=", "workspaceId=default&limit=5"])
def test_a_query_parameter_the_document_does_not_name_is_refused(knowledge_gateway: GatewayThread, query: str) -> None:
    """The GET routes took any query parameter silently (an empty name too); the document says
    `workspaceId` and `allowedRoots` only."""
    for path in ("documents", "documents/track/insert_000001"):
        response = requests.get(
            f"{knowledge_gateway.url}/v1/knowledge/{path}?{query}",
            headers={"Authorization": f"Bearer {RUNS_TOKEN}"},
            timeout=WAIT,
        )
        assert response.status_code == 400, response.text
        assert response.json()["error"]["code"] == "invalid_request"


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("query", {"query": "what is blue?", "mode": None}, "mode"),
        ("query", {"query": "what is blue?", "topK": "7"}, "topK"),
        ("documents", {"path": "notes/widget.md", "allowedRoots": 3}, "allowedRoots"),
    ],
)
def test_a_field_the_document_refuses_is_named(
    knowledge_gateway: GatewayThread, path: str, body: dict[str, Any], field: str
) -> None:
    """Null is not a value of an optional field (the document lists none), nor is "7" a number."""
    response = _post(knowledge_gateway, path, body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert (error["code"], error["field"]) == ("invalid_request", field), error


def test_the_served_operations_are_the_declarations(knowledge_gateway: GatewayThread) -> None:
    """Every knowledge route is in /openapi.json exactly as its declaration builds it, and the
    component schemas it refers to are served with it."""
    from agent_gateway.plugins.lightrag import declared

    document = requests.get(f"{knowledge_gateway.url}/openapi.json", timeout=WAIT).json()
    routes = [value for value in vars(declared).values() if isinstance(value, agent_gateway.Route)]
    assert {(route.method, route.openapi_path) for route in routes} == {
        (method.upper(), path)
        for path, item in document["paths"].items()
        if re.match(KNOWLEDGE, path)
        for method in item
    }
    for route in routes:
        operation, schemas = route.openapi_operation()
        assert document["paths"][route.openapi_path][route.method.lower()] == operation, route.path
        for name, schema in schemas.items():
            assert document["components"]["schemas"][name] == schema, name


@pytest.fixture
def links_gateway(tmp_path: Path) -> Iterator[GatewayThread]:
    """A gateway and fake of the stateful test's own: what the module's other tests added first
    (which depends on how pytest-xdist shares the module out) would change its answers (409 for a
    name taken), and so the sequences Hypothesis draws."""
    with GatewayThread(str(tmp_path), knowledge=True) as gateway:
        yield gateway


def test_document_links_conform(links_gateway: GatewayThread) -> None:
    """Stateful sequences following the document's links: a document added (202) to its indexing
    status. The fake processes a document as it is added, so no answer depends on timing."""
    knowledge_schema = load_schema(links_gateway.url).include(path_regex=KNOWLEDGE)

    fake = links_gateway.lightrag
    assert fake is not None

    class DocumentLinks(knowledge_schema.as_state_machine()):  # type: ignore[misc]
        def setup(self) -> None:
            # Each sequence starts from the same store: Hypothesis replays a sequence to check and
            # shrink it, and a replay must meet the same answers (the core's test gives each one
            # an actor of its own for the same reason).
            fake.forget_documents()

        def get_call_kwargs(self, case: schemathesis.Case) -> dict[str, Any]:
            return {"headers": headers_for(case)}

    DocumentLinks.run(
        settings=hypothesis.settings(
            max_examples=EXAMPLES,
            stateful_step_count=4,
            deadline=None,
            derandomize=True,
            database=None,
            phases=(hypothesis.Phase.explicit, hypothesis.Phase.generate),
            suppress_health_check=list(hypothesis.HealthCheck),
        )
    )
    # The link was followed: an indexing status asked for by a track id the provider gave out.
    tracked = [path for _, path in fake.calls if path.startswith("/documents/track_status/insert_")]
    assert tracked, fake.calls[-20:]


def test_the_documents_path_rules_are_the_routes(knowledge_gateway: GatewayThread) -> None:
    """The served document carries the path patterns the plugin defines, and they say what the
    gateway's path check refuses (so Schemathesis predicts every 400 ``path_refused``)."""
    from agent_gateway.plugins.lightrag import declared as routes

    document = requests.get(f"{knowledge_gateway.url}/openapi.json", timeout=WAIT).json()
    body = document["paths"]["/v1/knowledge/documents"]["post"]["requestBody"]["content"]["application/json"]
    assert body["schema"] == {"$ref": "#/components/schemas/KnowledgeAddDocument"}
    properties = document["components"]["schemas"]["KnowledgeAddDocument"]["properties"]
    assert properties["path"]["pattern"] == routes.PATH_PATTERN
    assert properties["name"]["pattern"] == routes.NAME_PATTERN
    for text in ["a", "notes/a.md", "/abs/x", "./x", "x/./y", ".hidden", "...", "..a/b", "a/~b", "é/ü"]:
        assert re.fullmatch(routes.PATH_PATTERN, text), text
    for text in ["..", "../x", "x/..", "a/../b", "~x", "a\\b", "a\x01b", "a/", ".", "/", "x/."]:
        assert not re.fullmatch(routes.PATH_PATTERN, text), text
    assert not re.fullmatch(routes.NAME_PATTERN, "/abs/x") and re.fullmatch(routes.NAME_PATTERN, "inbox/gnu.md")


CONSTRAINTS = ("minLength", "maxLength", "pattern", "maxItems", "minimum", "maximum", "enum")


def _constraints(schema: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """What a property's schema bounds (its items' too, and its object's properties'), the
    route models' references and nullable branches followed."""
    if "$ref" in schema:
        schema = defs[schema["$ref"].rsplit("/", 1)[1]]
    branches = [b for b in schema.get("anyOf", ()) if b.get("type") != "null" and "required" not in b]
    if len(branches) == 1 and "properties" not in schema:
        return _constraints(branches[0], defs)
    found = {key: schema[key] for key in CONSTRAINTS if key in schema}
    if "items" in schema:
        found["items"] = _constraints(schema["items"], defs)
    if "properties" in schema:
        found["properties"] = {
            name: _constraints(value, defs) for name, value in schema["properties"].items() if name != "title"
        }
    return found


def test_the_knowledge_tools_take_the_limits_of_the_knowledge_routes() -> None:
    """An agent's knowledge_rag tool call and a client's knowledge request are refused by the
    same limits: each tool argument bounds what the route's body field bounds."""
    from agent_gateway.plugins.lightrag.declared import KnowledgeOpenReference, KnowledgeQuery
    from agent_gateway.plugins.lightrag.tools import KnowledgeTools

    tools = {tool.name: tool for tool in KnowledgeTools(service=None).tools()}  # type: ignore[arg-type]
    for name, model in (
        ("knowledge_rag.query", KnowledgeQuery),
        ("knowledge_rag.open_reference", KnowledgeOpenReference),
    ):
        route = model.model_json_schema()
        defs = route.get("$defs", {})
        arguments = tools[name].input_schema["properties"]
        assert set(arguments) <= set(route["properties"]), name
        for argument, schema in arguments.items():
            tool_bounds = _constraints(schema, {})
            route_bounds = _constraints(route["properties"][argument], defs)
            assert tool_bounds == route_bounds, (name, argument)
