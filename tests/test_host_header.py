"""A malformed ``Host`` header (``localhost:evil``) is a 400 in the JSON error shape on every route
(it was a 500 on the routes that create runs, which parsed it); well-formed ones are served."""

from __future__ import annotations

from typing import Any

import pytest

from tests._harness import run_body

TOKEN = "tok-host-0123456789ab"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
CHAT = {"model": "chat-only", "messages": [{"role": "user", "content": "hi"}]}
AG_UI = {
    "threadId": "t-host",
    "runId": "r-host",
    "messages": [{"id": "m1", "role": "user", "content": "hi"}],
    "tools": [],
    "context": [],
    "state": {},
    "forwardedProps": {},
}
ROUTES: list[tuple[str, str, Any]] = [
    ("POST", "/v1/runs", None),  # a fresh run body each time
    ("POST", "/v1/chat/completions", CHAT),
    ("POST", "/v1/ag-ui/chat-only", AG_UI),
    ("GET", "/v1/health", None),
    ("GET", "/v1/agents", None),
    ("GET", "/v1/sessions", None),
    ("GET", "/v1/runs/run_nope", None),
]


@pytest.mark.parametrize("host", ["localhost:evil", "127.0.0.1:99999", "[::1", "a b", "localhost:80:80"])
async def test_a_malformed_host_is_a_400_everywhere(make_gateway: Any, host: str) -> None:
    client = await make_gateway(tokens={TOKEN: "alice"})
    for method, path, json in ROUTES:
        body = run_body() if path == "/v1/runs" else json
        response = await client.request(method, path, json=body, headers={**AUTH, "Host": host})
        assert response.status == 400, (path, await response.text())
        assert response.content_type == "application/json"
        error = (await response.json())["error"]
        assert error["code"] == "invalid_host" and "Host" in error["message"], (path, error)


@pytest.mark.parametrize("host", ["localhost", "localhost:8080", "127.0.0.1:1", "[::1]:8080", "gw.example"])
async def test_a_well_formed_host_is_served(make_gateway: Any, host: str) -> None:
    client = await make_gateway(tokens={TOKEN: "alice"})
    response = await client.post("/v1/runs", json=run_body(), headers={**AUTH, "Host": host})
    assert response.status == 201, await response.text()
    response = await client.post("/v1/chat/completions", json=CHAT, headers={**AUTH, "Host": host})
    assert response.status == 200, await response.text()
