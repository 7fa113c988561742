"""Several gateways on one PostgreSQL database (and one Redis): real `agent-gateway serve`
processes, real PostgreSQL, real Redis. Every wait is bounded; nothing sleeps to synchronise."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
import signal
import threading
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from agent_gateway import Coordinator, Event, hookimpl
from agent_gateway.testing.fake_openai import FakeOpenAI, Reply
from tests._cli import clean_env, run_cli, serve
from tests._cluster import (
    REDIS_URL,
    SECRET,
    Partition,
    assert_run_invariants,
    follow,
    free_port,
    fresh_database,
    get_json,
    instance_env,
    instances,
    post_json,
    sse,
    start_redis,
    wait_for_health,
)
from tests._harness import POSTGRES_URL, gateway_of, run_to_end
from tests._harness import run_body as conftest_run_body

pytestmark = [pytest.mark.cluster, pytest.mark.postgres]


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
            async with http.get(f"{gateways[1].url}/metrics") as response:
                metrics = await response.text()
            assert 'agent_gateway_cluster_ready{instance="gw1"} 1' in metrics
            assert f'agent_gateway_cluster_relayed_in{{instance="gw1"}} {relayed[1]}' in metrics


async def test_a_session_has_one_owner_and_a_request_id_one_run_across_instances(
    tmp_path: Path, fake_llm: FakeOpenAI
) -> None:
    # Every run's reply hangs (until the run is cancelled or the gateway stops): the session's runs
    # stay queued behind its first however slow the machine is, so the cancel below always finds
    # the last one queued (a reply of a few seconds could end first on a loaded machine).
    fake_llm.default = Reply("slow", chunk_size=2, hang=True)
    extra = {"AGENT_GATEWAY__CHAT_ONLY__BASE_URL": fake_llm.base_url}
    with fresh_database() as url:
        async with instances(tmp_path, url, 3, extra=extra) as gateways, aiohttp.ClientSession() as http:
            # The same requestId at all three at once: one run.
            answers = await asyncio.gather(
                *(post_json(http, f"{gw.url}/v1/runs", run_body("same", session_id="s-9")) for gw in gateways)
            )
            assert sorted(status for status, _ in answers) == [200, 200, 201], answers
            assert len({receipt["hostRunId"] for _, receipt in answers}) == 1
            # The next run of that session, sent to every instance, runs where the first does.
            owners = []
            for index, gw in enumerate(gateways):
                status, receipt = await post_json(http, f"{gw.url}/v1/runs", run_body(f"next-{index}", "s-9"))
                assert status == 201, receipt
                actives = [(await get_json(http, f"{g.url}/v1/health"))[1]["cluster"]["activeRuns"] for g in gateways]
                owners.append([i for i, runs in enumerate(actives) if receipt["hostRunId"] in runs])
            assert all(len(found) == 1 for found in owners), owners
            assert len({found[0] for found in owners}) == 1, owners
            # Every instance knows the session's active run, wherever it runs.
            for gw in gateways:
                status, active = await get_json(http, f"{gw.url}/v1/sessions/s-9/active-run")
                assert status == 200 and active["run"] is not None, active
            # `agent-gateway cluster status` lists the three and where the session's runs are.
            env = clean_env(
                tmp_path, AGENT_GATEWAY__STORAGE__URL=url, AGENT_GATEWAY__CLUSTER__REDIS_URL="redis://127.0.0.1:6379/0"
            )
            code, out, err = await run_cli("cluster", "status", "--json", env=env, cwd=tmp_path)
            assert code == 0, err
            listed = json.loads(out)["instances"]
            assert [i["instanceId"] for i in listed] == ["gw0", "gw1", "gw2"] and all(i["alive"] for i in listed)
            assert listed[owners[0][0]]["sessions"] == 1 and listed[owners[0][0]]["runs"], listed
            code, out, err = await run_cli("cluster", "status", env=env, cwd=tmp_path)
            assert code == 0 and "gw0" in out and "alive" in out, (out, err)
            # Cancel from an instance that does not own the session reaches the owner (the last
            # run is still queued behind the others).
            last = receipt["hostRunId"]
            owner = owners[0][0]
            other = gateways[(owner + 1) % 3]
            async with http.post(
                f"{other.url}/v1/runs/{last}/cancel", headers={"X-Agent-Gateway-Client": "test"}
            ) as response:
                assert response.status in (200, 202), await response.text()
            events = await sse(http, f"{other.url}/v1/runs/{last}/stream")
            assert events[-1][1] == "run.cancelled", events[-3:]


async def test_a_non_streaming_answer_from_another_instance_waits_for_the_owners_run(
    tmp_path: Path, fake_llm: FakeOpenAI
) -> None:
    # A protocol route that waits for a run (a non-streaming chat completion) on an instance that
    # does not own the session: the run executes on the owner, the answer still holds all of it.
    answer = "slow " * 40
    fake_llm.default = Reply(answer, chunk_size=2, delay=0.01)
    extra = {"AGENT_GATEWAY__CHAT_ONLY__BASE_URL": fake_llm.base_url}
    with fresh_database() as url:
        async with instances(tmp_path, url, 2, extra=extra) as gateways, aiohttp.ClientSession() as http:
            status, receipt = await post_json(http, f"{gateways[0].url}/v1/runs", run_body("first", "s-wait"))
            assert status == 201, receipt
            body = {"model": "chat-only", "messages": [{"role": "user", "content": "hello"}]}
            async with http.post(
                f"{gateways[1].url}/v1/chat/completions", json=body, headers={"X-Agent-Gateway-Session": "s-wait"}
            ) as response:
                completion = await response.json()
                assert response.status == 200, completion
            assert completion["choices"][0]["message"]["content"] == answer
            assert completion["choices"][0]["finish_reason"] == "stop"
            actives = [(await get_json(http, f"{g.url}/v1/health"))[1]["cluster"] for g in gateways]
            assert actives[1]["activeRuns"] == [], actives  # it ran on the owner, not here


async def test_a_refusal_relayed_from_the_owner_keeps_its_retry_after(tmp_path: Path, fake_llm: FakeOpenAI) -> None:
    fake_llm.default = Reply("slow " * 200, chunk_size=2, delay=0.02)
    extra = {
        "AGENT_GATEWAY__CHAT_ONLY__BASE_URL": fake_llm.base_url,
        "AGENT_GATEWAY__GATEWAY__MAX_QUEUED_RUNS_PER_SESSION": "0",
    }
    with fresh_database() as url:
        async with instances(tmp_path, url, 2, extra=extra) as gateways, aiohttp.ClientSession() as http:
            status, receipt = await post_json(http, f"{gateways[0].url}/v1/runs", run_body("first", "s-full"))
            assert status == 201, receipt
            # The session's owner is instance 0; instance 1 forwards and relays the owner's 429.
            async with http.post(f"{gateways[1].url}/v1/runs", json=run_body("second", "s-full")) as response:
                refusal = await response.json()
                assert response.status == 429, refusal
                assert refusal["error"]["code"] == "session_queue_full", refusal
                assert response.headers["Retry-After"] == str(refusal["error"]["retryAfterSeconds"])


FAST_LEASE = {"AGENT_GATEWAY__CLUSTER__LEASE_SECONDS": "2.0", "AGENT_GATEWAY__CLUSTER__HEARTBEAT_SECONDS": "0.5"}


async def test_sigkill_of_one_of_three_during_30_runs(tmp_path: Path, fake_llm: FakeOpenAI) -> None:
    # Long enough that every run is still going when the instance dies.
    fake_llm.default = Reply("tok " * 300, chunk_size=4, delay=0.02)
    extra = {"AGENT_GATEWAY__CHAT_ONLY__BASE_URL": fake_llm.base_url, **FAST_LEASE}
    with fresh_database() as url:
        async with instances(tmp_path, url, 3, extra=extra) as gateways, aiohttp.ClientSession() as http:
            urls = [gw.url for gw in gateways]
            created = await asyncio.gather(
                *(post_json(http, f"{urls[i % 3]}/v1/runs", run_body(f"r-{i}", f"s-{i}")) for i in range(30))
            )
            run_ids = [receipt["hostRunId"] for status, receipt in created if status == 201]
            assert len(run_ids) == 30, created
            # Clients on all three instances (each starts one instance further along).
            clients = [
                asyncio.create_task(follow(http, urls[i % 3 :] + urls[: i % 3], run_id))
                for i, run_id in enumerate(run_ids)
            ]
            victim = await wait_for_health(http, urls[0], lambda body: len(body["cluster"]["activeRuns"]) >= 5)
            gateways[0].proc.kill()
            await gateways[0].proc.wait()
            results = await asyncio.gather(*clients)
            survivors = urls[1:]
            interrupted = 0
            for run_id, (seen, _) in zip(run_ids, results, strict=True):
                journal = await journal_of(http, survivors[0], run_id)
                assert_run_invariants(journal, seen)
                if run_id in victim["cluster"]["activeRuns"]:
                    assert journal[-1]["kind"] == "run.interrupted", journal[-1]
                    assert journal[-1]["payload"]["takenOverBy"] in ("gw1", "gw2")
                    interrupted += 1
                status, receipt = await get_json(http, f"{survivors[1]}/v1/runs/{run_id}")
                assert receipt["status"] == journal[-1]["kind"].removeprefix("run."), receipt
            assert interrupted >= 5
            # The dead instance's sessions take new runs on a survivor.
            status, receipt = await post_json(http, f"{survivors[0]}/v1/runs", run_body("after", "s-0", "again"))
            assert status == 201, receipt
            seen, _ = await follow(http, survivors, receipt["hostRunId"])
            assert seen[-1]["kind"] == "run.completed"


async def test_an_instance_stopped_past_its_lease_writes_nothing_after_it_resumes(
    tmp_path: Path, fake_llm: FakeOpenAI
) -> None:
    fake_llm.default = Reply("tok " * 400, chunk_size=4, delay=0.02)
    extra = {"AGENT_GATEWAY__CHAT_ONLY__BASE_URL": fake_llm.base_url, **FAST_LEASE}
    with fresh_database() as url:
        async with instances(tmp_path, url, 2, extra=extra) as gateways, aiohttp.ClientSession() as http:
            owner, other = gateways
            status, receipt = await post_json(http, f"{owner.url}/v1/runs", run_body("paused"))
            assert status == 201, receipt
            run_id = receipt["hostRunId"]
            client = asyncio.create_task(follow(http, [other.url], run_id))
            await wait_for_health(http, other.url, lambda body: body["cluster"]["relayedIn"] >= 10)
            owner.proc.send_signal(signal.SIGSTOP)
            try:
                seen, _ = await client  # ends when the other instance takes the run over
            finally:
                owner.proc.send_signal(signal.SIGCONT)
            journal = await journal_of(http, other.url, run_id)
            assert_run_invariants(journal, seen)
            assert journal[-1]["kind"] == "run.interrupted"
            # Resumed, the paused instance finds its lease gone, drops what it still had to write,
            # and joins again under a new lease.
            health = await wait_for_health(
                http, owner.url, lambda body: body["cluster"]["rejoins"] >= 1 and body["cluster"]["lease"] == "held"
            )
            assert health["cluster"]["fencedEvents"] > 0, health
            assert await journal_of(http, other.url, run_id) == journal
            status, receipt = await get_json(http, f"{owner.url}/v1/runs/{run_id}")
            assert receipt["status"] == "interrupted", receipt


# -- the hook, and configuration ---------------------------------------------------------------------


async def test_cluster_coordinator_hook_a_plugin_coordinator_sees_every_committed_event(make_gateway: Any) -> None:
    class Recording(Coordinator):
        instance_id = "rec-1"
        durable_delivery = True

        def __init__(self) -> None:
            self.committed_events: list[Event] = []
            self.started = self.stopped = False

        async def start(self, gateway: Any) -> None:
            self.started = True

        async def stop(self) -> None:
            self.stopped = True

        def committed(self, events: list[Event]) -> None:
            self.committed_events += events

        def health(self) -> dict[str, Any]:
            return {"instanceId": self.instance_id, "ready": True}

    coordinator = Recording()

    class Plugin:
        @hookimpl
        def cluster_coordinator(self, config: Any) -> Coordinator:
            return coordinator

    client = await make_gateway(extra_plugins=(Plugin(),))
    receipt, events = await run_to_end(client, conftest_run_body("hi"))
    assert coordinator.started
    # Delivered only once committed: every event a client saw was handed over as committed.
    committed = [(e.seq, e.kind) for e in coordinator.committed_events if e.host_run_id == receipt["hostRunId"]]
    assert committed == [(int(e["id"]), e["event"]) for e in events]
    health = await (await client.get("/v1/health")).json()
    assert health["cluster"] == {"instanceId": "rec-1", "ready": True}


async def test_a_run_read_just_before_its_owner_stored_its_end_is_not_rewritten(make_gateway: Any) -> None:
    """Another instance may read a run's row while its owner is storing the end: the row still says
    running, and by the time it asks, the owner has given the run up (in the same commit). It takes
    the stored end; it does not write one of its own (a receipt that differed from the webhook's)."""

    class NoOtherOwner(Coordinator):
        clustered = True

        async def owner_elsewhere(self, run: Any) -> str | None:
            return None

    class Plugin:
        @hookimpl
        def cluster_coordinator(self, config: Any) -> Coordinator:
            return NoOtherOwner()

    client = await make_gateway(extra_plugins=(Plugin(),))
    receipt, _ = await run_to_end(client, conftest_run_body("hi"))
    runs = gateway_of(client).runs
    run_id = receipt["hostRunId"]
    await runs.wait(run_id)
    stored = await runs._db(runs.storage.get_run, run_id)
    stale = dataclasses.replace(stored, status="running", updated_at=stored.updated_at - 40)
    writes: list[Any] = []
    update_run = runs.storage.update_run
    runs.storage.update_run = lambda *args, **kwargs: writes.append(args) or update_run(*args, **kwargs)
    await runs._repair(stale)
    assert (stale.status, stale.updated_at) == ("completed", stored.updated_at) and writes == []
    answer = await (await client.get(f"/v1/runs/{run_id}")).json()
    assert answer == stored.to_receipt() and answer["status"] == "completed"


def test_without_a_cluster_section_the_gateway_is_one_instance(tmp_path: Path) -> None:
    from agent_gateway.app import GATEWAY_KEY, create_app
    from agent_gateway.config import Config

    config = Config.load(None, overrides={"gateway": {"data_dir": str(tmp_path)}})
    gateway = create_app(config)[GATEWAY_KEY]
    assert type(gateway.coordinator) is Coordinator
    assert gateway.journal.spool_dir is not None and not gateway.journal.durable_delivery


async def test_config_check_says_cluster_mode_needs_postgresql_and_a_redis_url(tmp_path: Path) -> None:
    from tests._cli import clean_env, run_cli

    config = tmp_path / "c.toml"
    config.write_text(f'[cluster]\nredis_url = "redis://127.0.0.1:6379/0"\nsecret = "{SECRET}"\n')
    code, out, _ = await run_cli("config", "check", "--config", str(config), env=clean_env(tmp_path), cwd=tmp_path)
    assert code == 1 and "cluster mode ([cluster] redis_url) needs PostgreSQL storage" in out, out
    config.write_text('[cluster]\nredis_url = "http://x"\nlease_seconds = 1.0\nheartbeat_seconds = 1.0\n')
    code, out, _ = await run_cli("config", "check", "--config", str(config), env=clean_env(tmp_path), cwd=tmp_path)
    assert code == 1 and "cluster.redis_url: must be a redis://" in out and "cluster.lease_seconds" in out, out
    config.write_text(
        f'[storage]\nurl = "{POSTGRES_URL}"\n[cluster]\nredis_url = "redis://127.0.0.1:6379/0"\nsecret = "{SECRET}"\n'
    )
    code, out, _ = await run_cli("config", "check", "--config", str(config), env=clean_env(tmp_path), cwd=tmp_path)
    assert code == 0, out


async def test_a_redis_restart_mid_stream_loses_nothing(tmp_path: Path, fake_llm: FakeOpenAI) -> None:
    fake_llm.default = Reply("tok " * 400, chunk_size=4, delay=0.02)
    port = free_port()
    redis_proc = await start_redis(port, tmp_path)
    extra = {"AGENT_GATEWAY__CHAT_ONLY__BASE_URL": fake_llm.base_url, **FAST_LEASE}
    try:
        with fresh_database() as url:
            async with (
                instances(tmp_path, url, 2, redis_url=f"redis://127.0.0.1:{port}/0", extra=extra) as gateways,
                aiohttp.ClientSession() as http,
            ):
                owner, other = gateways
                status, receipt = await post_json(http, f"{owner.url}/v1/runs", run_body("through-restart"))
                assert status == 201, receipt
                run_id = receipt["hostRunId"]
                client = asyncio.create_task(follow(http, [other.url], run_id))
                await wait_for_health(http, other.url, lambda body: body["cluster"]["relayedIn"] >= 10)
                redis_proc.kill()
                await redis_proc.wait()
                await wait_for_health(http, other.url, lambda body: body["cluster"]["redis"] == "down")
                redis_proc = await start_redis(port, tmp_path)
                for gw in gateways:
                    await wait_for_health(http, gw.url, lambda body: body["cluster"]["redis"] == "up")
                seen, resumes = await client
                journal = await journal_of(http, other.url, run_id)
                assert_run_invariants(journal, seen)
                assert journal[-1]["kind"] == "run.completed" and resumes == 0
    finally:
        if redis_proc.returncode is None:
            redis_proc.kill()
            await redis_proc.wait()


async def test_postgresql_connections_killed_mid_stream_lose_nothing(tmp_path: Path, fake_llm: FakeOpenAI) -> None:
    import psycopg2

    fake_llm.default = Reply("tok " * 300, chunk_size=4, delay=0.02)
    extra = {"AGENT_GATEWAY__CHAT_ONLY__BASE_URL": fake_llm.base_url}
    with fresh_database() as url:
        async with instances(tmp_path, url, 2, extra=extra) as gateways, aiohttp.ClientSession() as http:
            owner, other = gateways
            status, receipt = await post_json(http, f"{owner.url}/v1/runs", run_body("through-kills"))
            assert status == 201, receipt
            run_id = receipt["hostRunId"]
            client = asyncio.create_task(follow(http, [other.url], run_id))
            admin = psycopg2.connect(POSTGRES_URL, connect_timeout=5)
            admin.autocommit = True
            try:
                for threshold in (10, 60, 120):
                    await wait_for_health(http, other.url, lambda body, t=threshold: body["cluster"]["relayedIn"] >= t)
                    with admin.cursor() as cursor:
                        cursor.execute(
                            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                            "WHERE datname = %s AND pid <> pg_backend_pid()",
                            (url.rsplit("/", 1)[1],),
                        )
                        (killed,) = cursor.fetchone()
                    assert killed > 0
            finally:
                admin.close()
            seen, resumes = await client
            journal = await journal_of(http, other.url, run_id)
            assert_run_invariants(journal, seen)
            assert journal[-1]["kind"] == "run.completed" and resumes == 0
            for gw in gateways:
                status, health = await get_json(http, f"{gw.url}/v1/health")
                assert status == 200 and health["cluster"]["lease"] == "held", health


DEPLOYMENT_GUIDE = Path(__file__).resolve().parent.parent / "docs" / "deployment.md"


async def test_the_deployment_guide_configuration_passes_config_check(tmp_path: Path) -> None:
    from tests._cli import clean_env, run_cli

    guide = DEPLOYMENT_GUIDE.read_text(encoding="utf-8")
    # The first TOML block is the cluster's configuration (the TLS one names a deployment's files).
    block = re.findall(r"```toml\n(.*?)```", guide, re.S)[0]
    config = tmp_path / "gateway.toml"
    config.write_text(block.replace("postgresql://gateway@127.0.0.1:5432/gateway", POSTGRES_URL))
    env = clean_env(tmp_path, AGENT_GATEWAY__CLUSTER__INSTANCE_ID="gw1", AGENT_GATEWAY__GATEWAY__PORT="8701")
    code, out, _ = await run_cli("config", "check", "--config", str(config), env=env, cwd=tmp_path)
    assert code == 0, out
    # What the guide says each instance sets is what the tests set.
    for variable in ("AGENT_GATEWAY__CLUSTER__INSTANCE_ID", "AGENT_GATEWAY__GATEWAY__DATA_DIR"):
        assert variable in guide


async def test_an_instance_cut_off_from_postgresql_and_redis_stops_writing(
    tmp_path: Path, fake_llm: FakeOpenAI
) -> None:
    # The partitioned instance reaches PostgreSQL and Redis only through proxies the test cuts:
    # its connections hang (no reset), as across a real partition.
    fake_llm.default = Reply("tok " * 500, chunk_size=4, delay=0.02)
    postgres, redis = Partition(5432), Partition(6379)
    await postgres.start()
    await redis.start()
    extra = {"AGENT_GATEWAY__CHAT_ONLY__BASE_URL": fake_llm.base_url, **FAST_LEASE}
    try:
        with fresh_database() as url:
            name = url.rsplit("/", 1)[1]
            proxied = instance_env(
                tmp_path, "gw0", f"postgresql://postgres@127.0.0.1:{postgres.port}/{name}",
                redis_url=f"redis://127.0.0.1:{redis.port}/0", key_prefix="agtest:part:" + name + ":", extra=extra,
            )  # fmt: skip
            direct = instance_env(
                tmp_path, "gw1", url, redis_url=REDIS_URL, key_prefix="agtest:part:" + name + ":", extra=extra
            )
            async with (
                serve("--port", "0", env=proxied, cwd=tmp_path) as cut_off,
                serve("--port", "0", env=direct, cwd=tmp_path) as other,
                aiohttp.ClientSession() as http,
            ):
                status, receipt = await post_json(http, f"{cut_off.url}/v1/runs", run_body("partitioned"))
                assert status == 201, receipt
                run_id = receipt["hostRunId"]
                client = asyncio.create_task(follow(http, [other.url], run_id))
                await wait_for_health(http, other.url, lambda body: body["cluster"]["relayedIn"] >= 10)
                postgres.cut = redis.cut = True
                seen, _ = await client  # the other instance takes the run over
                # Cut off for longer than its lease, the instance stops its runs on its own.
                await wait_for_health(http, cut_off.url, lambda body: body["cluster"]["lease"] == "lost")
                postgres.heal()
                redis.heal()
                await wait_for_health(
                    http,
                    cut_off.url,
                    lambda body: body["cluster"]["rejoins"] >= 1 and body["cluster"]["lease"] == "held",
                )
                journal = await journal_of(http, other.url, run_id)
                assert_run_invariants(journal, seen)
                assert journal[-1]["kind"] == "run.interrupted" and journal[-1]["payload"]["takenOverBy"] == "gw1"
    finally:
        await postgres.stop()
        await redis.stop()
