"""Several gateways on one PostgreSQL database (and one Redis): real `agent-gateway serve`
processes, real PostgreSQL, real Redis. Every wait is bounded; nothing sleeps to synchronise."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import aiohttp

from agent_gateway.testing.fake_openai import FakeOpenAI, Reply
from tests._cluster import fresh_database, get_json, instances, post_json, sse


async def test_three_gateways_started_at_once_on_an_empty_database_all_come_up(tmp_path: Path) -> None:
    # Concurrent schema creation used to kill about half the starts (UniqueViolation on pg_type).
    for attempt in range(2):
        with fresh_database() as url:
            async with instances(tmp_path / str(attempt), url, 3, redis_url=None) as gateways:
                async with aiohttp.ClientSession() as http:
                    for gw in gateways:
                        status, health = await get_json(http, f"{gw.url}/v1/health")
                        assert status == 200 and health["status"] == "ok", health


def test_storages_opened_at_the_same_instant_on_an_empty_database_all_open() -> None:
    # The same race without process start-up times to spread it out: every open() released by
    # one barrier, on a fresh database each round.
    from agent_gateway.plugins.journal_peewee import PeeweeStorage

    for _ in range(3):
        with fresh_database() as url:
            storages = [PeeweeStorage(url) for _ in range(6)]
            barrier = threading.Barrier(len(storages), timeout=30)
            errors: list[BaseException] = []

            def open_at_once(storage: PeeweeStorage, barrier: threading.Barrier, errors: list[BaseException]) -> None:
                barrier.wait()
                try:
                    storage.open()
                except BaseException as exc:  # collected: the assertion names it
                    errors.append(exc)

            threads = [threading.Thread(target=open_at_once, args=(s, barrier, errors)) for s in storages]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(60)
            for storage in storages:
                storage.close()
            assert not errors, errors


def run_body(request_id: str, session_id: str = "s-1", message: str = "hello") -> dict[str, Any]:
    return {"requestId": request_id, "agentId": "chat-only", "sessionId": session_id, "message": message}


async def journal_of(http: aiohttp.ClientSession, url: str, host_run_id: str) -> list[dict[str, Any]]:
    """Every stored event of a run, paged."""
    events: list[dict[str, Any]] = []
    cursor = "0"
    for _ in range(100):
        status, page = await get_json(http, f"{url}/v1/runs/{host_run_id}/events?afterSeq={cursor}&limit=1000")
        assert status == 200, page
        events += page["events"]
        cursor = page["nextCursor"]
        if page["complete"] or not page["events"]:
            return events
    raise AssertionError("the journal did not end within 100 pages")


async def test_any_instance_streams_any_run_and_resumes_anywhere(tmp_path: Path, fake_llm: FakeOpenAI) -> None:
    fake_llm.default = Reply("word " * 300, chunk_size=4, delay=0.002)
    extra = {"AGENT_GATEWAY__CHAT_ONLY__BASE_URL": fake_llm.base_url}
    with fresh_database() as url:
        async with instances(tmp_path, url, 3, extra=extra) as gateways, aiohttp.ClientSession() as http:
            status, receipt = await post_json(http, f"{gateways[0].url}/v1/runs", run_body("r-1"))
            assert status == 201, receipt
            run_id = receipt["hostRunId"]
            # A client on every instance, from the start (subscribe, replay, then the live tail).
            streams = await asyncio.gather(*(sse(http, f"{gw.url}/v1/runs/{run_id}/stream") for gw in gateways))
            journal = await journal_of(http, gateways[1].url, run_id)
            assert journal[-1]["kind"] == "run.completed"
            assert len(journal) > 50
            for stream in streams:
                assert [data for _, _, data in stream] == journal
            # Resume on an instance other than the one the stream started on.
            middle = int(journal[len(journal) // 2]["seq"])
            for gw in gateways:
                resumed = await sse(
                    http,
                    f"{gw.url}/v1/runs/{run_id}/stream",
                    headers={"Last-Event-ID": journal[len(journal) // 2]["seq"]},
                )
                assert [data for _, _, data in resumed] == [e for e in journal if int(e["seq"]) > middle]
            for index, gw in enumerate(gateways):
                status, health = await get_json(http, f"{gw.url}/v1/health")
                assert status == 200, health
                assert health["cluster"]["instanceId"] == f"gw{index}"
                assert health["cluster"]["redis"] == "up" and health["cluster"]["lease"] == "held"
            relayed = [(await get_json(http, f"{gw.url}/v1/health"))[1]["cluster"]["relayedIn"] for gw in gateways]
            assert relayed[1] > 0 and relayed[2] > 0  # the other instances got the live tail over Redis


async def test_a_session_has_one_owner_and_a_request_id_one_run_across_instances(
    tmp_path: Path, fake_llm: FakeOpenAI
) -> None:
    fake_llm.default = Reply("slow " * 40, chunk_size=2, delay=0.02)
    extra = {"AGENT_GATEWAY__CHAT_ONLY__BASE_URL": fake_llm.base_url}
    with fresh_database() as url:
        async with instances(tmp_path, url, 3, extra=extra) as gateways, aiohttp.ClientSession() as http:
            # The same requestId at all three at once: one run.
            answers = await asyncio.gather(
                *(post_json(http, f"{gw.url}/v1/runs", run_body("same", session_id="s-9")) for gw in gateways)
            )
            assert sorted(status for status, _ in answers) == [200, 200, 201], answers
            assert len({receipt["hostRunId"] for _, receipt in answers}) == 1
            first = answers[0][1]["hostRunId"]
            # The next run of that session, sent to every instance, runs where the first does.
            owners = []
            for index, gw in enumerate(gateways):
                status, receipt = await post_json(http, f"{gw.url}/v1/runs", run_body(f"next-{index}", "s-9"))
                assert status == 201, receipt
                actives = [(await get_json(http, f"{g.url}/v1/health"))[1]["cluster"]["activeRuns"] for g in gateways]
                owners.append([i for i, runs in enumerate(actives) if receipt["hostRunId"] in runs])
            assert all(len(found) == 1 for found in owners), owners
            assert len({found[0] for found in owners}) == 1, owners
            # Cancel from an instance that does not own the session reaches the owner.
            owner = owners[0][0]
            other = gateways[(owner + 1) % 3]
            async with http.post(
                f"{other.url}/v1/runs/{first}/cancel", headers={"X-Agent-Gateway-Client": "test"}
            ) as response:
                assert response.status in (200, 202), await response.text()
            events = await sse(http, f"{other.url}/v1/runs/{first}/stream")
            assert events[-1][1] == "run.cancelled", events[-3:]
