"""Hostile bytes in request bodies and cursors get a clear 4xx, identically on every backend.

Before: a 100,000-deep JSON array was a 500 RecursionError on `/v1/runs`, `/v1/preferences` and
`/v1/mcp`; a lone surrogate in `sessionId` or `message` a 500 UnicodeEncodeError; a NUL in
`sessionId`/`requestId` a 201 on SQLite but a 500 on PostgreSQL; `afterSeq=٣` cursor 3.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests._harness import MakeGateway, run_body, run_to_end

DEEP = b"[" * 100_000 + b"]" * 100_000


async def post_raw(client: Any, path: str, raw: bytes) -> tuple[int, dict[str, Any]]:
    response = await client.post(path, data=raw, headers={"Content-Type": "application/json"})
    assert response.content_type == "application/json", await response.text()
    return response.status, await response.json()


@pytest.mark.parametrize("path", ["/v1/runs", "/v1/preferences"])
async def test_deeply_nested_json_is_a_400(make_gateway: MakeGateway, path: str) -> None:
    client = await make_gateway()
    method = client.post if path == "/v1/runs" else client.put
    response = await method(path, data=DEEP, headers={"Content-Type": "application/json"})
    assert response.status == 400, await response.text()
    assert (await response.json())["error"]["code"] == "json_too_deep"
    # a body nested just past the limit inside a valid run is refused the same way
    nested: Any = "x"
    for _ in range(80):
        nested = [nested]
    status, body = await post_raw(client, "/v1/runs", _dumps(run_body(context={"contextRefs": nested})))
    assert status == 400 and body["error"]["code"] == "json_too_deep"


async def test_deep_json_to_the_mcp_surface_is_a_json_rpc_parse_error(make_gateway: MakeGateway) -> None:
    client = await make_gateway()
    response = await client.post("/v1/mcp", data=DEEP, headers={"Content-Type": "application/json"})
    assert 400 <= response.status < 500, await response.text()
    assert "error" in await response.json()


def _dumps(body: dict[str, Any]) -> bytes:
    import json

    return json.dumps(body).encode()  # ensure_ascii: lone surrogates travel as \\ud800 escapes


@pytest.mark.parametrize(
    ("field", "value", "problem"),
    [
        ("sessionId", "s-\ud800", "lone surrogate"),
        ("message", "hello \udfff", "lone surrogate"),
        ("sessionId", "s-\x00", "NUL"),
        ("requestId", "r-\x00", "NUL"),
        ("message", "a\x00b", "NUL"),
    ],
)
async def test_bad_text_in_a_run_field_is_a_400_naming_it_on_every_backend(
    make_gateway: MakeGateway, storage_kind: str, field: str, value: str, problem: str
) -> None:
    client = await make_gateway(storage=storage_kind)
    status, body = await post_raw(client, "/v1/runs", _dumps(run_body(**{field: value})))
    assert status == 400, body
    assert body["error"]["code"] == "invalid_text" and body["error"]["field"] == field
    assert problem in body["error"]["message"]
    # nothing was stored: the gateway still serves a clean run on the same backend
    _, events = await run_to_end(client, run_body())
    assert events[-1]["event"] == "run.completed"


async def test_bad_text_in_nested_fields_and_keys_is_named(make_gateway: MakeGateway) -> None:
    client = await make_gateway()
    body = run_body(context={"target": {"path": "notes/\x00.md"}})
    status, answer = await post_raw(client, "/v1/runs", _dumps(body))
    assert status == 400 and answer["error"]["field"] == "context.target.path"
    status, answer = await post_raw(client, "/v1/runs", _dumps(run_body(options={"k\ud800": 1})))
    assert status == 400 and answer["error"]["code"] == "invalid_text" and answer["error"]["field"] == "options"


async def test_preferences_refuse_bad_text(make_gateway: MakeGateway) -> None:
    client = await make_gateway()
    response = await client.put(
        "/v1/preferences",
        data=b'{"values": {"ai.common.model": "m\\ud800"}}',
        headers={"Content-Type": "application/json"},
    )
    assert response.status == 400
    assert (await response.json())["error"]["code"] == "invalid_text"


@pytest.mark.parametrize("cursor", ["٣", "３", "1٣", "²"])
async def test_cursors_take_ascii_digits_only(make_gateway: MakeGateway, cursor: str) -> None:
    client = await make_gateway()
    receipt, _ = await run_to_end(client, run_body())
    run_id = receipt["hostRunId"]
    page = await client.get(f"/v1/runs/{run_id}/events", params={"afterSeq": cursor})
    assert page.status == 400, await page.text()
    stream = await client.get(f"/v1/runs/{run_id}/stream", headers={"Last-Event-ID": cursor})
    assert stream.status == 400, await stream.text()
    # the control: the ASCII digit is a cursor
    assert (await client.get(f"/v1/runs/{run_id}/events", params={"afterSeq": "3"})).status == 200


def test_tokens_are_compared_in_constant_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every configured token goes through hmac.compare_digest, not a dict lookup or `==`."""
    import hmac

    from agent_gateway.auth import actor_for_token

    compared: list[bytes] = []
    real = hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        compared.append(a)
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", spy)
    tokens = {"tok-alice": "alice", "tok-bob": "bob", "tok-carol": "carol"}
    assert actor_for_token(tokens, "tok-bob") == "bob"
    assert sorted(compared) == sorted(t.encode() for t in tokens)  # all of them, even after a match
    compared.clear()
    assert actor_for_token(tokens, "tok-b") is None and len(compared) == 3
    assert actor_for_token(tokens, "\ud800") is None  # a surrogate from a header is no crash


async def test_metrics_follow_the_auth_config(make_gateway: MakeGateway) -> None:
    tokens = {"tok-alice-0123456789": "alice"}
    client = await make_gateway(tokens=tokens)
    assert (await client.get("/metrics")).status == 401
    answer = await client.get("/metrics", headers={"Authorization": "Bearer tok-alice-0123456789"})
    assert answer.status == 200 and "journal" in await answer.text()
    assert (await client.get("/v1/health")).status == 200  # health stays public

    public = await make_gateway(tokens=tokens, overrides={"auth": {"public_metrics": True}})
    assert (await public.get("/metrics")).status == 200
