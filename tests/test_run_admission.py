"""Run admission: a session's queue is bounded (`[gateway] max_queued_runs_per_session`) and so are
an actor's unfinished runs (`max_active_runs_per_actor`). Beyond either, `POST /v1/runs` answers
429 with `Retry-After` and the JSON error shape; a repeated `requestId` of an existing run is still
answered (200): idempotency first. Once runs end, new ones are accepted again.

A real gateway (aiohttp TestServer, SQLite) whose chat-only runs talk to the fake upstream; a
`Reply(hang=True)` holds a session's running run, so the runs behind it stay queued.
"""

from __future__ import annotations

import asyncio
from typing import Any

from agent_gateway.models import TERMINAL_KINDS
from agent_gateway.testing.fake_openai import Reply
from tests._harness import WAIT, gateway_of, read_stream, run_body, run_to_end

TOKENS = {"tok-alice-0123456789": "alice", "tok-bob-0123456789ab": "bob"}
ALICE = {"Authorization": "Bearer tok-alice-0123456789"}
BOB = {"Authorization": "Bearer tok-bob-0123456789ab"}


async def post_run(client: Any, body: dict[str, Any], headers: dict[str, str] | None = None) -> Any:
    return await client.post("/v1/runs", json=body, headers=headers or {})


async def created(client: Any, body: dict[str, Any], headers: dict[str, str] | None = None) -> dict[str, Any]:
    response = await post_run(client, body, headers)
    assert response.status == 201, await response.text()
    receipt: dict[str, Any] = await response.json()
    return receipt


async def too_many(response: Any, code: str) -> dict[str, Any]:
    """Assert a 429 with a usable Retry-After and the JSON error shape; return the error."""
    assert response.status == 429, await response.text()
    assert response.content_type == "application/json"
    retry_after = response.headers.get("Retry-After", "")
    assert retry_after.isdigit() and int(retry_after) >= 1, response.headers
    error: dict[str, Any] = (await response.json())["error"]
    assert error["code"] == code and error["message"]
    assert error["retryAfterSeconds"] == int(retry_after)
    return error


async def cancel_to_end(client: Any, run_id: str, headers: dict[str, str] | None = None) -> str:
    """Cancel a run and read its stream to the terminal event; return that event's kind."""
    response = await client.post(f"/v1/runs/{run_id}/cancel", json={}, headers=headers or {})
    assert response.status in (200, 202), await response.text()
    events = await read_stream(client, run_id, headers=headers)
    assert events[-1]["event"] in TERMINAL_KINDS
    return str(events[-1]["event"])


async def test_a_full_session_queue_is_429_until_a_run_ends(make_gateway, fake_llm) -> None:
    fake_llm.add(Reply(text="hold the session", hang=True))
    client = await make_gateway(overrides={"gateway": {"max_queued_runs_per_session": 3}})
    session = "s-bounded"
    running = await created(client, run_body("running", sessionId=session))
    await fake_llm.wait_for_requests(1, timeout=WAIT)
    queued = [await created(client, run_body(f"queued {i}", sessionId=session)) for i in range(3)]

    fourth = run_body("one too many", sessionId=session)
    error = await too_many(await post_run(client, fourth), "session_queue_full")
    assert error["limit"] == 3
    assert len(gateway_of(client).runs.active_runs()) == 4  # the refused run was not created
    # Idempotency first: repeating an accepted run's request still answers it.
    repeat = await post_run(client, {**run_body("queued 2", sessionId=session), "requestId": queued[2]["requestId"]})
    assert repeat.status == 200, await repeat.text()
    assert (await repeat.json())["hostRunId"] == queued[2]["hostRunId"]
    # Other sessions are not affected.
    _, events = await run_to_end(client, run_body("elsewhere"))
    assert events[-1]["event"] == "run.completed"

    # A queued run ends: there is room for one more, and then the queue is full again.
    assert await cancel_to_end(client, queued[0]["hostRunId"]) == "run.cancelled"
    again = await created(client, fourth)
    await too_many(await post_run(client, run_body("full again", sessionId=session)), "session_queue_full")
    # The running run ends: the queue drains (the fake upstream echoes) and runs are accepted.
    assert await cancel_to_end(client, running["hostRunId"]) == "run.cancelled"
    for receipt in (queued[1], queued[2], again):
        assert (await read_stream(client, receipt["hostRunId"]))[-1]["event"] == "run.completed"
    _, events = await run_to_end(client, run_body("after", sessionId=session))
    assert events[-1]["event"] == "run.completed"


async def test_the_default_bound_refuses_the_17th_queued_run(make_gateway, fake_llm) -> None:
    """5,000 runs on one session are no longer all accepted: by default 16 may queue."""
    fake_llm.add(Reply(text="hold the session", hang=True))
    client = await make_gateway()
    session = "s-default-bound"
    running = await created(client, run_body("running", sessionId=session))
    await fake_llm.wait_for_requests(1, timeout=WAIT)
    for i in range(16):
        await created(client, run_body(f"queued {i}", sessionId=session))
    await too_many(await post_run(client, run_body("17th", sessionId=session)), "session_queue_full")
    assert await cancel_to_end(client, running["hostRunId"]) == "run.cancelled"
    for run in gateway_of(client).runs.active_runs():
        await cancel_to_end(client, run.host_run_id)


async def test_concurrent_creations_cannot_overfill_a_session(make_gateway, fake_llm) -> None:
    fake_llm.add(Reply(text="hold the session", hang=True))
    client = await make_gateway(overrides={"gateway": {"max_queued_runs_per_session": 3}})
    session = "s-burst"
    async with asyncio.timeout(WAIT):
        responses = await asyncio.gather(
            *(post_run(client, run_body(f"burst {i}", sessionId=session)) for i in range(12))
        )
    statuses = sorted(response.status for response in responses)
    assert statuses == [201] * 4 + [429] * 8, statuses
    for response in responses:
        if response.status == 429:
            await too_many(response, "session_queue_full")
    for run in gateway_of(client).runs.active_runs():
        await cancel_to_end(client, run.host_run_id)


async def test_an_actor_has_at_most_max_active_runs_across_sessions(make_gateway, fake_llm) -> None:
    fake_llm.add(Reply(text="hold one", hang=True), Reply(text="hold two", hang=True))
    client = await make_gateway(tokens=TOKENS, overrides={"gateway": {"max_active_runs_per_actor": 3}})
    first = await created(client, run_body("one", sessionId="s-1"), ALICE)
    second = await created(client, run_body("two", sessionId="s-2"), ALICE)
    await fake_llm.wait_for_requests(2, timeout=WAIT)
    queued = await created(client, run_body("queued behind one", sessionId="s-1"), ALICE)  # queued runs count

    error = await too_many(await post_run(client, run_body("four", sessionId="s-3"), ALICE), "too_many_active_runs")
    assert error["limit"] == 3
    # Idempotency first here too.
    repeat = await post_run(client, {**run_body("two", sessionId="s-2"), "requestId": second["requestId"]}, ALICE)
    assert repeat.status == 200 and (await repeat.json())["hostRunId"] == second["hostRunId"]
    # Another actor has limits of its own.
    _, events = await run_to_end(client, run_body("bob's"), BOB)
    assert events[-1]["event"] == "run.completed"

    # One of alice's runs ends: she may start another, and then she is at the limit again.
    assert await cancel_to_end(client, queued["hostRunId"], ALICE) == "run.cancelled"
    _, events = await run_to_end(client, run_body("now there is room", sessionId="s-3"), ALICE)
    assert events[-1]["event"] == "run.completed"
    held = await created(client, run_body("third again", sessionId="s-4"), ALICE)
    await too_many(await post_run(client, run_body("five", sessionId="s-5"), ALICE), "too_many_active_runs")
    for receipt in (first, second, held):
        await cancel_to_end(client, receipt["hostRunId"], ALICE)
    _, events = await run_to_end(client, run_body("all ended", sessionId="s-5"), ALICE)
    assert events[-1]["event"] == "run.completed"
