"""A browser page cannot be turned against a gateway on loopback.

Before: with no tokens, `Host: evil.example` (a page after DNS rebinding) was served 200,
`POST /v1/runs` with `Origin: http://evil.example` was 201, and a plain form post to
`POST /v1/runs/{id}/cancel` cancelled a known run.
"""

from __future__ import annotations

import pytest

from agent_gateway.testing.fake_openai import FakeOpenAI, Reply
from tests._harness import WAIT, MakeGateway, read_stream, run_body

EVIL = "http://evil.example"
TOKENS = {"tok-alice-0123456789": "alice"}
ALICE = {"Authorization": "Bearer tok-alice-0123456789"}


async def error_code(response: object) -> tuple[int, str]:
    assert response.content_type == "application/json", await response.text()  # type: ignore[attr-defined]
    body = await response.json()  # type: ignore[attr-defined]
    return response.status, body["error"]["code"]  # type: ignore[attr-defined]


@pytest.mark.parametrize("host", ["evil.example", "evil.example:8787", "10.0.0.5", "127.0.0.1.evil.example"])
async def test_without_tokens_only_loopback_host_names_are_served(make_gateway: MakeGateway, host: str) -> None:
    client = await make_gateway()
    for method, path in (("GET", "/v1/agents"), ("GET", "/v1/health"), ("POST", "/v1/runs")):
        response = await client.request(method, path, json=run_body(), headers={"Host": host})
        assert await error_code(response) == (403, "host_not_allowed")
    for host_ok in ("127.0.0.1", "localhost:8787", "[::1]:8787", "LOCALHOST"):
        assert (await client.get("/v1/agents", headers={"Host": host_ok})).status == 200, host_ok


async def test_allowed_hosts_extends_the_list(make_gateway: MakeGateway) -> None:
    client = await make_gateway(overrides={"gateway": {"allowed_hosts": ["notes.internal"]}})
    assert (await client.get("/v1/agents", headers={"Host": "notes.internal:8787"})).status == 200
    assert (await client.get("/v1/agents", headers={"Host": "evil.example"})).status == 403


async def test_with_tokens_any_host_is_served(make_gateway: MakeGateway) -> None:
    client = await make_gateway(tokens=TOKENS)
    assert (await client.get("/v1/agents", headers={"Host": "gateway.example", **ALICE})).status == 200


@pytest.mark.parametrize("tokens", [None, TOKENS])
async def test_a_foreign_origin_cannot_change_state(make_gateway: MakeGateway, tokens: dict[str, str] | None) -> None:
    client = await make_gateway(tokens=tokens)
    auth = ALICE if tokens else {}
    response = await client.post("/v1/runs", json=run_body(), headers={"Origin": EVIL, **auth})
    assert await error_code(response) == (403, "origin_not_allowed")
    response = await client.put("/v1/preferences", json={"values": {}}, headers={"Origin": "null", **auth})
    assert await error_code(response) == (403, "origin_not_allowed")
    # reads from a foreign origin get no CORS header, so the page cannot read the answer
    read = await client.get("/v1/agents", headers={"Origin": EVIL, **auth})
    assert read.status == 200 and "Access-Control-Allow-Origin" not in read.headers
    # the gateway's own origin (its console) and a request without Origin (curl, SDKs) pass
    own = f"http://{client.host}:{client.port}"
    assert (await client.post("/v1/runs", json=run_body(), headers={"Origin": own, **auth})).status == 201
    assert (await client.post("/v1/runs", json=run_body(), headers=auth)).status == 201


async def test_a_form_post_cannot_cancel_a_run(make_gateway: MakeGateway, fake_llm: FakeOpenAI) -> None:
    client = await make_gateway()
    fake_llm.add(Reply(text="a long answer that never ends", chunk_size=4, hang=True))
    created = await client.post("/v1/runs", json=run_body("hang"))
    run_id = (await created.json())["hostRunId"]
    await fake_llm.wait_for_requests(1, timeout=WAIT)
    cancel = f"/v1/runs/{run_id}/cancel"
    # what a cross-site <form method=post> sends (no Origin: older browsers, or a privacy setting)
    form = await client.post(cancel, data=b"", headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert await error_code(form) in ((403, "client_signal_required"), (415, "unsupported_media_type"))
    bare = await client.post(cancel)  # a body-less no-cors fetch
    assert await error_code(bare) == (403, "client_signal_required")
    assert (await (await client.get(f"/v1/runs/{run_id}")).json())["status"] == "running"
    # a client that says it is one may cancel without a body
    assert (await client.post(cancel, headers={"X-Agent-Gateway-Client": "test"})).status == 202
    events = await read_stream(client, run_id)
    assert events[-1]["event"] == "run.cancelled"


async def test_cors_is_off_by_default_and_per_origin_when_configured(make_gateway: MakeGateway) -> None:
    preflight_headers = {"Origin": "https://notes.example", "Access-Control-Request-Method": "POST"}
    client = await make_gateway()
    response = await client.options("/v1/runs", headers=preflight_headers)
    assert await error_code(response) == (403, "origin_not_allowed")

    client = await make_gateway(overrides={"gateway": {"cors_origins": ["https://notes.example"]}})
    response = await client.options("/v1/runs", headers=preflight_headers)
    assert response.status == 204
    assert response.headers["Access-Control-Allow-Origin"] == "https://notes.example"
    assert "Content-Type" in response.headers["Access-Control-Allow-Headers"]
    created = await client.post("/v1/runs", json=run_body(), headers={"Origin": "https://notes.example"})
    assert created.status == 201 and created.headers["Access-Control-Allow-Origin"] == "https://notes.example"
    # the stream (prepared inside its handler) carries the header too
    run_id = (await created.json())["hostRunId"]
    stream = await client.get(f"/v1/runs/{run_id}/stream", headers={"Origin": "https://notes.example"})
    assert stream.headers["Access-Control-Allow-Origin"] == "https://notes.example"
    stream.close()
    other = await client.post("/v1/runs", json=run_body(), headers={"Origin": "https://other.example"})
    assert await error_code(other) == (403, "origin_not_allowed")


def test_config_check_refuses_bad_origins_and_hosts() -> None:
    from agent_gateway.config import Config

    config = Config.load(
        None, env={}, overrides={"gateway": {"cors_origins": ["notes.example"], "allowed_hosts": ["http://x"]}}
    )
    problems = "\n".join(config.problems())
    assert "gateway.cors_origins: 'notes.example' is not an origin" in problems
    assert "gateway.allowed_hosts: must be a list of host names" in problems


async def test_the_mcp_surface_answers_its_own_401_to_a_bare_call(make_gateway: MakeGateway) -> None:
    """/v1/mcp always needs a run's lease token, so the body-less rule does not stand in front
    of it: a bare DELETE gets the MCP surface's own 401, as its OpenAPI entry says."""
    client = await make_gateway()
    response = await client.delete("/v1/mcp")
    assert response.status == 401, await response.text()
    assert "WWW-Authenticate" in response.headers
