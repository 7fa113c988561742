"""``/openapi.json`` describes what the gateway really does, checked by Schemathesis.

A real gateway (chat-only on the fake OpenAI upstream, tokens configured) listens on 127.0.0.1 in
a thread of its own; Schemathesis (pinned in the test extras) loads the served document and runs
every built-in check on every operation: examples, coverage and fuzzing cases
(``test_every_operation_conforms``), then stateful sequences that follow the document's links from
a created run to its receipt, events, stream and cancel (``test_run_links_conform``). Any server
error, undocumented status, content type or header, body off its schema, schema-valid request
refused or schema-violating request accepted fails the test. Runs are deterministic (fixed seed,
derandomized) and bounded (a few examples per operation).

The preference writes go through a second actor: stored preferences fill a run's missing
``agentId``, and the runs' actor must not get one mid-run (its requests would change meaning).
The knowledge routes (the lightrag plugin's) are checked the same way on a gateway of their own,
in tests/test_knowledge_openapi.py.
"""

from __future__ import annotations

import re
from typing import Any

import hypothesis
import pytest
import requests
import schemathesis
from schemathesis.specs.openapi.schemas import OpenApiSchema

from agent_gateway.routes.console import CONSOLE_ROUTES
from tests._harness import WAIT, run_body, run_to_end
from tests._openapi import (  # noqa: F401  (fixtures)
    EXAMPLES,
    KNOWLEDGE,
    RUNS_TOKEN,
    SCENARIO_TOKENS,
    GatewayThread,
    _node_id_for_schemathesis,
    api_schema_fixture,
    gateway_url_fixture,
    headers_for,
)

schema = schemathesis.pytest.from_fixture("api_schema").exclude(path_regex=KNOWLEDGE)


@schema.parametrize()
@hypothesis.settings(deadline=None, suppress_health_check=list(hypothesis.HealthCheck))
def test_every_operation_conforms(case: schemathesis.Case) -> None:
    case.call_and_validate(headers=headers_for(case))


TERMINAL_STATUSES = ("completed", "failed", "cancelled", "interrupted")


def settle(gateway_url: str, response: Any, token: str) -> bool:
    """Wait (bounded) until the run a response names has ended (its stream closed).

    Which rules the state machine can draw next depends on the statuses answered so far (each
    link's bundle fills with the responses of its status): a run still streaming answers its
    cancel with 202, a finished one with 200. Left
    to timing, the same choices would meet different answers, which Hypothesis reports as
    ``FlakyStrategyDefinition``; settled, every step meets the state the choices before it made."""
    content_type = " ".join(response.headers.get("content-type", []))  # (lowercase keys, lists of values)
    if not 200 <= response.status_code < 300 or "json" not in content_type:
        return False
    body = response.json()
    run_id = body.get("hostRunId") if isinstance(body, dict) else None
    if not isinstance(run_id, str):
        return False
    # the stream closes after the run's terminal event
    stream = requests.get(
        f"{gateway_url}/v1/runs/{run_id}/stream", headers={"Authorization": f"Bearer {token}"}, timeout=WAIT
    )
    if stream.status_code != 200:
        return False
    assert any(f"event: run.{status}" in stream.text for status in TERMINAL_STATUSES), stream.text[-500:]
    return True


def test_run_links_conform(api_schema: OpenApiSchema, gateway_url: str) -> None:
    scenarios = iter(SCENARIO_TOKENS)
    settled: list[str] = []

    # The run links' own operations only: protocol plugins' routes (chat completions, AG-UI) wait
    # for whole runs, and their timing must not change which link rules the machine can draw.
    run_operations = api_schema.include(path_regex=r"^/v1/(runs|sessions/\{sessionId\}/active-run)")

    class RunLinks(run_operations.as_state_machine()):  # type: ignore[misc]
        def setup(self) -> None:
            self.tokens = next(scenarios)

        def get_call_kwargs(self, case: schemathesis.Case) -> dict[str, Any]:
            return {"headers": headers_for(case, self.tokens)}

        def after_call(self, response: Any, case: schemathesis.Case) -> None:
            super().after_call(response, case)
            if settle(gateway_url, response, self.tokens[0]):
                settled.append(case.operation.label)

    RunLinks.run(
        settings=hypothesis.settings(
            max_examples=EXAMPLES,
            stateful_step_count=6,
            deadline=None,
            derandomize=True,
            database=None,
            # no shrinking: every scenario is a fresh one (see SCENARIO_TOKENS), and a failure is
            # reported as found
            phases=(hypothesis.Phase.explicit, hypothesis.Phase.generate),
            suppress_health_check=list(hypothesis.HealthCheck),
        )
    )
    # The waiting above is what keeps the sequences deterministic: it must have happened (a
    # Schemathesis release that reshapes its responses once made it a silent no-op).
    assert "POST /v1/runs" in settled and "POST /v1/runs/{hostRunId}/cancel" in settled, settled


def test_a_real_run_stream_matches_its_event_schema(api_schema: OpenApiSchema, gateway_url: str) -> None:
    """The SSE events of a finished run, as sent, validate against the declared event schema (and
    the receipt and event page against theirs), whatever the random phases happened to reach."""
    headers = {"Authorization": f"Bearer {RUNS_TOKEN}"}
    body = {"requestId": "conf-1", "agentId": "chat-only", "sessionId": "conf", "message": "hello"}
    created = requests.post(f"{gateway_url}/v1/runs", json=body, headers=headers, timeout=WAIT)
    assert created.status_code == 201, created.text
    run_id = created.json()["hostRunId"]
    stream = api_schema["/v1/runs/{hostRunId}/stream"]["GET"].Case(path_parameters={"hostRunId": run_id})
    response = stream.call_and_validate(headers=headers)
    events = [line.removeprefix("event: ") for line in response.text.splitlines() if line.startswith("event: ")]
    assert events[0] == "run.created" and events[-1] == "run.completed", events
    for path in ("/v1/runs/{hostRunId}", "/v1/runs/{hostRunId}/events", "/v1/runs/{hostRunId}/receipts"):
        api_schema[path]["GET"].Case(path_parameters={"hostRunId": run_id}).call_and_validate(headers=headers)


# -- plain checks, on the usual test gateway ---------------------------------------------------------


def _shape(path: str) -> str:
    return re.sub(r"\{[^}]+\}", "{}", path)


async def test_every_served_route_is_documented_with_its_methods(make_gateway: Any) -> None:
    """Core and built-in plugin routes (pi-lab's and the knowledge routes included) each have a
    path item in /openapi.json with exactly the methods served; nothing documented is unserved."""
    client = await make_gateway({"pi_lab": {"enabled": True}, "lightrag": {"enabled": True}})
    spec = await (await client.get("/openapi.json")).json()
    served = {
        (_shape(resource.canonical), route.method)
        for resource in client.app.router.resources()
        for route in resource
        # the console's page and files are not API routes (no JSON, outside /v1/)
        if route.method not in ("HEAD", "OPTIONS") and resource.canonical not in CONSOLE_ROUTES
    }
    documented = {
        (_shape(path), method.upper())
        for path, item in spec["paths"].items()
        for method in item
        if method in ("get", "post", "put", "patch", "delete")
    }
    assert {path for path, _ in served} >= {"/v1/knowledge/query", "/v1/pi-lab/runs/{}/steer"}
    assert served == documented


async def test_the_served_document_names_this_gateways_agents_projections_and_preferences(make_gateway: Any) -> None:
    client = await make_gateway()
    spec = await (await client.get("/openapi.json")).json()
    schemas = spec["components"]["schemas"]
    agents = (await (await client.get("/v1/health")).json())["agents"]
    assert schemas["AgentId"]["enum"] == sorted(agents)
    assert {"ui", "openai"} <= set(schemas["Projection"]["enum"])
    values = schemas["PreferenceValues"]
    assert values["additionalProperties"] is False
    assert values["properties"]["ai.common.defaultAgent"]["enum"] == [*agents, None]
    # every 4xx of a JSON route is the JSON error shape
    for path, item in spec["paths"].items():
        for method, operation in item.items():
            if method not in ("get", "post", "put", "patch", "delete"):  # path-level parameters
                continue
            for status, response in operation["responses"].items():
                if status.startswith("4") and path != "/v1/mcp":
                    assert response == {"$ref": response.get("$ref")} or "application/json" in response["content"], (
                        method,
                        path,
                        status,
                    )


@pytest.mark.parametrize(
    ("query", "code"),
    [
        ("afterSeq=%205", "invalid_cursor"),  # " 5"
        ("afterSeq=%2B5", "invalid_cursor"),  # "+5"
        ("afterSeq=%D9%A3", "invalid_cursor"),  # Arabic-Indic 3
        ("limit=5_0", "invalid_limit"),
        ("limit=%2B5", "invalid_limit"),
        ("limit=%205", "invalid_limit"),
        ("limit=0", "invalid_limit"),
    ],
)
async def test_event_page_parameters_are_exactly_what_the_document_allows(
    make_gateway: Any, query: str, code: str
) -> None:
    """Python's int() takes " 5", "+5" and "5_0"; the document says ASCII digits, and so does the server."""
    client = await make_gateway()
    receipt, _ = await run_to_end(client, run_body())
    response = await client.get(f"/v1/runs/{receipt['hostRunId']}/events?{query}")
    assert response.status == 400
    assert (await response.json())["error"]["code"] == code
    ok = await client.get(f"/v1/runs/{receipt['hostRunId']}/events?afterSeq=&limit=5")
    assert ok.status == 200


@pytest.mark.parametrize(
    "fields",
    [
        {"requestId": ""},
        {"requestId": "   "},
        {"requestId": "\x1d"},  # white space to Python, not to ECMA-262: blank by the document's rule too
        {"sessionId": "\ufeff"},  # white space to ECMA-262, not to Python
        {"sessionId": ""},
        {"workspaceId": ""},
        {"message": " \n"},
        {"requestId": "x" * 201},
        {"context": {"allowedRoots": "notes"}},
        {"parentRunId": 5},
        {"surprise": True},
    ],
)
async def test_run_bodies_the_document_forbids_are_refused(make_gateway: Any, fields: dict[str, Any]) -> None:
    client = await make_gateway()
    response = await client.post("/v1/runs", json=run_body(**fields))
    assert response.status == 400, await response.text()
    assert (await response.json())["error"]["code"] == "invalid_request"


@pytest.mark.parametrize("body", [{}, {"optionId": ""}, {"optionId": 3}, {"optionId": "allow", "extra": 1}, []])
async def test_permission_answers_the_document_forbids_are_refused(make_gateway: Any, body: Any) -> None:
    client = await make_gateway()
    receipt, _ = await run_to_end(client, run_body())
    response = await client.post(f"/v1/runs/{receipt['hostRunId']}/permissions/perm_x", json=body)
    assert response.status == 400
    assert (await response.json())["error"]["code"] == "invalid_request"


@pytest.mark.parametrize("body", [{}, {"message": " "}, {"message": "go", "extra": 1}, {"message": 5}])
async def test_pi_lab_messages_the_document_forbids_are_refused(make_gateway: Any, body: Any) -> None:
    client = await make_gateway({"pi_lab": {"enabled": True}})
    receipt, _ = await run_to_end(client, run_body())  # a run of the caller: the body is checked next
    response = await client.post(f"/v1/pi-lab/runs/{receipt['hostRunId']}/steer", json=body)
    assert response.status == 400
    assert (await response.json())["error"]["code"] == "invalid_request"


async def test_integer_preferences_take_integral_numbers_within_64_bits(make_gateway: Any) -> None:
    """JSON (and JSON Schema's "integer") does not tell 40.0 from 40; beyond 64 bits is refused."""
    client = await make_gateway()
    key = "ai.common.knowledge_rag.topK"
    stored = await client.put("/v1/preferences", json={"values": {key: 40.0}})
    assert stored.status == 200, await stored.text()
    assert (await stored.json())["values"][key] == 40
    for value in (2**63, 40.5):
        refused = await client.put("/v1/preferences", json={"values": {key: value}})
        assert refused.status == 400
        assert (await refused.json())["error"]["code"] == "invalid_preference"


async def test_mcp_get_is_a_405_with_allow(make_gateway: Any) -> None:
    client = await make_gateway()
    response = await client.get("/v1/mcp")
    assert response.status == 405
    assert set(response.headers["Allow"].replace(" ", "").split(",")) == {"POST", "DELETE"}
    assert (await response.json())["error"]["code"] == "method_not_allowed"
