"""The OpenAI-compatible routes' real answers validate against their own OpenAPI operations.

Schemathesis (tests/test_openapi_conformance.py) fuzzes these routes, but a random ``model`` is
never an agent, so its cases end at the 404. Here real requests on chat-only reach every 2xx form
(JSON and SSE, chat and responses, resume, cancel) and each is validated against the served
document by Schemathesis, on the same gateway thread the conformance test uses.
"""

from __future__ import annotations

from typing import Any

import requests
from schemathesis.specs.openapi.schemas import OpenApiSchema

from tests._harness import WAIT

# The conformance test's fixtures: its gateway thread, its served schema, its Schemathesis fix-up.
from tests._openapi import RUNS_TOKEN, _node_id_for_schemathesis, api_schema_fixture, gateway_url_fixture  # noqa: F401  (fixtures)

HEADERS = {"Authorization": f"Bearer {RUNS_TOKEN}"}


def validate(api_schema: OpenApiSchema, method: str, path: str, **case: Any) -> Any:
    operation = api_schema[path][method].Case(**case)
    return operation.call_and_validate(headers=HEADERS)


def test_every_openai_answer_matches_its_operation(api_schema: OpenApiSchema, gateway_url: str) -> None:
    models = validate(api_schema, "GET", "/v1/models")
    assert "chat-only" in [m["id"] for m in models.json()["data"]]
    validate(api_schema, "GET", "/v1/models/{model}", path_parameters={"model": "chat-only"})
    chat = {"model": "chat-only", "messages": [{"role": "user", "content": "hello"}]}
    assert validate(api_schema, "POST", "/v1/chat/completions", body=chat).json()["object"] == "chat.completion"
    streamed = validate(api_schema, "POST", "/v1/chat/completions", body={**chat, "stream": True})
    assert streamed.text.rstrip().endswith("data: [DONE]")
    response = validate(api_schema, "POST", "/v1/responses", body={"model": "chat-only", "input": "hi"}).json()
    assert response["status"] == "completed"
    events = validate(api_schema, "POST", "/v1/responses", body={"model": "chat-only", "input": "hi", "stream": True})
    assert "event: response.completed" in events.text
    ids = {"response_id": response["id"]}
    validate(api_schema, "GET", "/v1/responses/{response_id}", path_parameters=ids)
    resumed = validate(
        api_schema,
        "GET",
        "/v1/responses/{response_id}",
        path_parameters=ids,
        query={"stream": "true", "starting_after": 2},
    )
    assert '"sequence_number":3' in resumed.text and '"sequence_number":2,' not in resumed.text
    assert validate(api_schema, "POST", "/v1/responses/{response_id}/cancel", path_parameters=ids).json()["status"] == (
        "completed"
    )
    unknown = requests.post(
        f"{gateway_url}/v1/chat/completions", json={**chat, "model": "nope"}, headers=HEADERS, timeout=WAIT
    )
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "model_not_found"
