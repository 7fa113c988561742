"""Byte limits on the journal: `[gateway] max_run_journal_bytes` stops a run whose events pass it
(it ends `failed`, reason `journal_limit: ...`, its terminal event last and alone), and
`max_actor_journal_bytes_per_day` makes `POST /v1/runs` answer 429 with Retry-After for an actor
whose runs journalled that much today, while another actor's runs go on.

A real gateway (aiohttp TestServer, SQLite) whose chat-only runs stream from the fake upstream.
"""

from __future__ import annotations

from typing import Any

from agent_gateway.models import TERMINAL_KINDS
from agent_gateway.testing.fake_openai import Reply
from tests._harness import WAIT, events_page, gateway_of, run_body, run_to_end

TOKENS = {"tok-alice-0123456789": "alice", "tok-bob-0123456789ab": "bob"}
ALICE = {"Authorization": "Bearer tok-alice-0123456789"}
BOB = {"Authorization": "Bearer tok-bob-0123456789ab"}
RUN_LIMIT = 16 * 1024
# Far more than the limit: 20,000 deltas of about 150 bytes each.
FLOOD = Reply(text="x" * 40_000, chunk_size=2)


async def test_a_run_past_its_byte_limit_ends_failed_with_the_reason(make_gateway, fake_llm) -> None:
    fake_llm.add(FLOOD)
    client = await make_gateway(overrides={"gateway": {"max_run_journal_bytes": RUN_LIMIT}})
    receipt, streamed = await run_to_end(client, run_body("flood me"), timeout=WAIT)
    terminal = streamed[-1]["data"]
    assert terminal["kind"] == "run.failed"
    assert terminal["payload"]["code"] == "journal_limit"
    assert terminal["payload"]["limitBytes"] == RUN_LIMIT
    reason = terminal["payload"]["reason"]
    assert reason.startswith("journal_limit:") and "max_run_journal_bytes" in reason and str(RUN_LIMIT) in reason

    run = await client.get(f"/v1/runs/{receipt['hostRunId']}")
    assert (await run.json())["status"] == "failed"
    stored = await events_page(client, receipt["hostRunId"])
    assert [e["seq"] for e in stored] == sorted({e["seq"] for e in stored})
    assert sum(e["kind"] in TERMINAL_KINDS for e in stored) == 1 and stored[-1]["kind"] == "run.failed"
    # The run was cut short: nowhere near its 20,000 deltas were journalled.
    deltas = sum(e["kind"] == "message.delta" for e in stored)
    assert deltas < 2_000, deltas

    # The next run of the session is not affected.
    fake_llm.add(Reply(text="short answer"))
    _, events = await run_to_end(client, run_body("again", sessionId=receipt["sessionId"]))
    assert events[-1]["event"] == "run.completed"


async def test_an_actor_past_its_daily_budget_gets_429_and_another_actor_does_not(make_gateway, fake_llm) -> None:
    client = await make_gateway(tokens=TOKENS, overrides={"gateway": {"max_actor_journal_bytes_per_day": 4096}})
    fake_llm.default = Reply(text="y" * 6000, chunk_size=50)
    alices = run_body("alice's")
    first, events = await run_to_end(client, alices, ALICE)
    assert events[-1]["event"] == "run.completed"  # admitted with budget left; runs to its end
    assert gateway_of(client).runs.journal_bytes_today("alice") >= 4096

    response = await client.post("/v1/runs", json=run_body("alice again"), headers=ALICE)
    assert response.status == 429, await response.text()
    assert response.content_type == "application/json"
    retry_after = response.headers.get("Retry-After", "")
    assert retry_after.isdigit() and 1 <= int(retry_after) <= 86_400, response.headers
    error: dict[str, Any] = (await response.json())["error"]
    assert error["code"] == "journal_budget_exhausted"
    assert "max_actor_journal_bytes_per_day" in error["message"]
    assert error["limit"] == 4096 and error["retryAfterSeconds"] == int(retry_after)

    # Idempotency first: alice's accepted run is still answered.
    repeat = await client.post("/v1/runs", json=alices, headers=ALICE)
    assert repeat.status == 200, await repeat.text()
    assert (await repeat.json())["hostRunId"] == first["hostRunId"]
    _, bob_events = await run_to_end(client, run_body("bob's"), BOB)
    assert bob_events[-1]["event"] == "run.completed"
