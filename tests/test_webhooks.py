"""Run webhooks (docs/webhooks.md): a run's receipt is POSTed to its webhook when it ends, signed
per Standard Webhooks (verified here with the spec's own library), retried until a receiver
accepts it, sent after a gateway is SIGKILLed between the run's end and the delivery (owed, or in
flight), once by two instances polling one PostgreSQL outbox, and never sent to a private or
loopback address that ``allowed_hosts`` does not list.

Receivers are aiohttp servers on 127.0.0.1 (so the tests allow that address)."""

from __future__ import annotations

import asyncio
import contextlib
import re
import signal
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from standardwebhooks import Webhook

from agent_gateway.config import Config
from agent_gateway.testing.fake_openai import FakeOpenAI, Reply
from agent_gateway.webhooks import (
    Refused,
    _Allowed,
    decode_secret,
    new_secret,
    resolve_checked,
    retry_delay,
    sign,
)
from tests._cluster import free_port, fresh_database, instances
from tests._harness import GatewayProcess, MakeGateway, run_body, run_to_end, start_gateway_process

WAIT = 20.0
SECRET = new_secret()
DOC = (Path(__file__).resolve().parent.parent / "docs" / "webhooks.md").read_text(encoding="utf-8")


@dataclass
class Received:
    headers: dict[str, str]
    body: bytes
    answered: int


@dataclass
class Receiver:
    """Answers each POST with the next of `answers` (then 200), records every request."""

    answers: list[int] = field(default_factory=list)
    requests: list[Received] = field(default_factory=list)
    hold: asyncio.Event | None = None  # set: the first request waits for it (never answered in time)
    arrived: asyncio.Event = field(default_factory=asyncio.Event)
    accepted: asyncio.Event = field(default_factory=asyncio.Event)
    url: str = ""

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        first = not self.requests
        status = self.answers.pop(0) if self.answers else 200
        self.requests.append(Received(dict(request.headers), body, status))
        self.arrived.set()
        if first and self.hold is not None:
            await self.hold.wait()
        if status == 200:
            self.accepted.set()
        return web.Response(status=status, text="ok" if status == 200 else "try again")


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    state = Receiver()
    app = web.Application()
    app.router.add_post("/hook", state.handle)
    runner = web.AppRunner(app, shutdown_timeout=0.5)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    state.url = f"http://127.0.0.1:{runner.addresses[0][1]}/hook"
    yield state
    if state.hold is not None:
        state.hold.set()
    await runner.cleanup()


def webhooks_config(**extra: Any) -> dict[str, Any]:
    return {
        "secret": SECRET,
        "allowed_hosts": ["127.0.0.1"],
        "backoff_seconds": 0.05,
        "max_backoff_seconds": 0.2,
        "poll_seconds": 0.2,
        "timeout_seconds": 5.0,
        **extra,
    }


async def delivery_when(
    get: Callable[[], Any], done: Callable[[dict[str, Any]], bool], timeout: float = WAIT
) -> dict[str, Any]:
    """GET the run's delivery until `done(delivery)` holds (bounded by `timeout`)."""
    async with asyncio.timeout(timeout):
        while True:
            delivery = await get()
            if delivery is not None and done(delivery):
                return delivery
            await asyncio.sleep(0.05)  # a poll interval: what ends the wait is the condition above


async def client_delivery(client: TestClient, run_id: str) -> dict[str, Any] | None:
    response = await client.get(f"/v1/runs/{run_id}/webhook")
    assert response.status == 200, await response.text()
    body = await response.json()
    assert body["hostRunId"] == run_id
    return body["webhook"]  # type: ignore[no-any-return]


def verify(received: Received) -> dict[str, Any]:
    """The receiver's side, as docs/webhooks.md shows it: the library checks the signature."""
    return Webhook(SECRET).verify(received.body, received.headers)  # type: ignore[no-any-return]


@pytest.mark.parametrize("storage", ["sqlite", "postgres"])
async def test_a_receiver_failing_twice_gets_the_signed_receipt_on_the_third_attempt(
    make_gateway: MakeGateway, receiver: Receiver, storage: str
) -> None:
    receiver.answers = [500, 503]
    client = await make_gateway({"webhooks": webhooks_config()}, storage=storage)
    run_id = (await run_to_end(client, run_body(webhook=receiver.url)))[0]["hostRunId"]
    delivery = await delivery_when(lambda: client_delivery(client, run_id), lambda d: d["state"] != "pending")
    assert delivery["state"] == "delivered", delivery
    assert delivery["attempts"] == 3 and delivery["lastStatus"] == 200 and delivery["lastError"] is None
    assert [r.answered for r in receiver.requests] == [500, 503, 200]
    # One message: every attempt carries the same webhook-id (what receivers deduplicate on).
    assert {r.headers["webhook-id"] for r in receiver.requests} == {delivery["webhookId"]}
    receipt = await (await client.get(f"/v1/runs/{run_id}")).json()
    payload = verify(receiver.requests[-1])
    assert payload == receipt
    assert payload["schema"] == "gateway.run.v1" and payload["status"] == "completed"
    # A tampered body or a wrong secret does not verify.
    forged = Received(receiver.requests[-1].headers, receiver.requests[-1].body.replace(b"completed", b"failed"), 200)
    with pytest.raises(Exception, match=r"(?i)signature"):
        verify(forged)
    with pytest.raises(Exception, match=r"(?i)signature"):
        Webhook(new_secret()).verify(receiver.requests[-1].body, receiver.requests[-1].headers)


async def test_a_receiver_that_never_accepts_ends_failed_once_the_retry_window_is_over(
    make_gateway: MakeGateway, receiver: Receiver
) -> None:
    receiver.answers = [503] * 1000
    client = await make_gateway({"webhooks": webhooks_config(retry_for_seconds=0.5)})
    run_id = (await run_to_end(client, run_body(webhook=receiver.url)))[0]["hostRunId"]
    delivery = await delivery_when(lambda: client_delivery(client, run_id), lambda d: d["state"] != "pending")
    assert delivery["state"] == "failed", delivery
    assert delivery["attempts"] == len(receiver.requests) >= 2  # retried, then given up
    assert delivery["lastStatus"] == 503 and "503" in delivery["lastError"]
    assert delivery["nextAttemptAt"] is None and delivery["deliveredAt"] is None


def test_retries_back_off_exponentially_with_jitter() -> None:
    lowest = [retry_delay(n, 1.0, 30.0, uniform=lambda low, _high: low) for n in range(1, 8)]
    highest = [retry_delay(n, 1.0, 30.0, uniform=lambda _low, high: high) for n in range(1, 8)]
    assert highest == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]  # doubled per attempt, capped
    assert lowest == [h / 2 for h in highest]  # the random factor is between 0.5 and 1
    draws = {retry_delay(3, 1.0, 30.0) for _ in range(50)}
    assert all(2.0 <= d <= 4.0 for d in draws) and len(draws) > 1  # jittered, within its bounds


async def test_defaults_per_actor_and_agent_and_a_run_without_any(
    make_gateway: MakeGateway, receiver: Receiver
) -> None:
    client = await make_gateway(
        {"webhooks": webhooks_config(url_by_agent={"chat-only": receiver.url})}, tokens={"tok-a": "alice"}
    )
    headers = {"Authorization": "Bearer tok-a"}
    run_id = (await run_to_end(client, run_body(), headers=headers))[0]["hostRunId"]
    delivery = await delivery_when(
        lambda: client_delivery_as(client, run_id, headers), lambda d: d["state"] == "delivered"
    )
    assert delivery["url"] == receiver.url
    assert verify(receiver.requests[-1])["hostRunId"] == run_id


async def client_delivery_as(client: TestClient, run_id: str, headers: dict[str, str]) -> dict[str, Any] | None:
    response = await client.get(f"/v1/runs/{run_id}/webhook", headers=headers)
    assert response.status == 200, await response.text()
    return (await response.json())["webhook"]  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    ("url", "kind"),
    [
        ("http://10.0.0.1:9/hook", "private address 10.0.0.1"),
        ("http://169.254.169.254/latest/meta-data", "link-local address 169.254.169.254"),
        ("http://localhost:9/hook", "loopback address"),  # a name resolving to a loopback address
    ],
)
async def test_private_loopback_and_link_local_addresses_are_refused_and_recorded(
    make_gateway: MakeGateway, url: str, kind: str
) -> None:
    client = await make_gateway({"webhooks": webhooks_config(allowed_hosts=[])})
    run_id = (await run_to_end(client, run_body(webhook=url)))[0]["hostRunId"]
    delivery = await delivery_when(lambda: client_delivery(client, run_id), lambda d: d["state"] != "pending")
    assert delivery["state"] == "refused" and delivery["attempts"] == 1
    assert delivery["lastStatus"] is None and kind in delivery["lastError"] and "allowed_hosts" in delivery["lastError"]


async def test_run_create_checks_the_webhook(make_gateway: MakeGateway) -> None:
    without = await make_gateway()
    response = await without.post("/v1/runs", json=run_body(webhook="https://example.com/hook"))
    assert response.status == 400 and (await response.json())["error"]["code"] == "webhooks_disabled"
    client = await make_gateway({"webhooks": webhooks_config()})
    for bad in ("ftp://example.com/x", "not a url", "http://user:pw@example.com/", 42):
        response = await client.post("/v1/runs", json=run_body(webhook=bad))
        assert response.status == 400, bad
        assert "webhook" in (await response.json())["error"]["message"]
    # A run without one has no delivery.
    run_id = (await run_to_end(client, run_body()))[0]["hostRunId"]
    assert await client_delivery(client, run_id) is None


async def test_the_receiver_of_the_docs_verifies_a_real_delivery(
    make_gateway: MakeGateway, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The receiver docs/webhooks.md shows, run as it is written (but for `web.run_app`): it
    verifies a real delivery with the library and refuses a forged one."""
    section = DOC.split("## A receiver that verifies the signature", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    assert "web.run_app(app, port=8080)\n" in code
    monkeypatch.setenv("GATEWAY_WEBHOOK_SECRET", SECRET)
    namespace: dict[str, Any] = {"__name__": "receiver_of_the_docs"}
    exec(compile(code.replace("web.run_app(app, port=8080)\n", ""), "docs/webhooks.md", "exec"), namespace)
    server = TestServer(namespace["app"], host="127.0.0.1")
    await server.start_server()
    try:
        url = str(server.make_url("/hooks/agent-runs"))
        client = await make_gateway({"webhooks": webhooks_config()})
        run_id = (await run_to_end(client, run_body(webhook=url)))[0]["hostRunId"]
        delivery = await delivery_when(lambda: client_delivery(client, run_id), lambda d: d["state"] != "pending")
        assert delivery["state"] == "delivered" and delivery["lastStatus"] == 204, delivery
        assert f"{run_id} completed None" in capsys.readouterr().out
        assert namespace["seen"] == {delivery["webhookId"]}
        # a body that is not what was signed: 401 from the receiver
        async with aiohttp.ClientSession() as http:
            headers = {"webhook-id": "msg_x", "webhook-timestamp": str(int(time.time()))}
            headers["webhook-signature"] = sign([decode_secret(new_secret())], "msg_x", int(time.time()), b"{}")
            async with http.post(url, data=b"{}", headers=headers) as forged:
                assert forged.status == 401
    finally:
        await server.close()


# -- a gateway process killed between the run's end and its delivery -------------------------------


@pytest.fixture
async def gateways(tmp_path: Path) -> AsyncIterator[list[GatewayProcess]]:
    started: list[GatewayProcess] = []
    yield started
    for gateway in started:
        with contextlib.suppress(ProcessLookupError):
            await gateway.stop()


async def test_a_gateway_killed_before_the_delivery_delivers_after_restart_once(
    tmp_path: Path, fake_llm: FakeOpenAI, receiver: Receiver, gateways: list[GatewayProcess]
) -> None:
    fake_llm.default = Reply(text="done")
    env = {
        "AGENT_GATEWAY__CHAT_ONLY__BASE_URL": fake_llm.base_url,
        "AGENT_GATEWAY__CHAT_ONLY__MODEL": "m",
        "AGENT_GATEWAY__WEBHOOKS__SECRET": SECRET,
        "AGENT_GATEWAY__WEBHOOKS__ALLOWED_HOSTS": '["127.0.0.1"]',
        "AGENT_GATEWAY__WEBHOOKS__TIMEOUT_SECONDS": "2.0",
        "AGENT_GATEWAY__WEBHOOKS__POLL_SECONDS": "0.2",
    }
    data_dir = tmp_path / "data"
    # The first attempt is held unanswered: the gateway dies with the delivery claimed, not done.
    receiver.hold = asyncio.Event()
    first = await start_gateway_process(data_dir, tmp_path / "gateway-0.log", env=env)
    gateways.append(first)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=WAIT)) as http:
        response = await http.post(f"{first.url}/v1/runs", json=run_body("go", webhook=receiver.url))
        assert response.status == 201, await response.text()
        run_id = (await response.json())["hostRunId"]
        async with asyncio.timeout(WAIT):
            await receiver.arrived.wait()  # the run ended and its delivery is in flight
        first.kill()
        assert await first.wait() == -signal.SIGKILL
        receiver.hold.set()  # the held answer goes to a dead connection
        second = await start_gateway_process(data_dir, tmp_path / "gateway-1.log", env=env)
        gateways.append(second)

        async def delivery() -> dict[str, Any] | None:
            answer = await http.get(f"{second.url}/v1/runs/{run_id}/webhook")
            assert answer.status == 200, await answer.text()
            return (await answer.json())["webhook"]  # type: ignore[no-any-return]

        done = await delivery_when(delivery, lambda d: d["state"] == "delivered", timeout=WAIT * 2)
        receipt = await (await http.get(f"{second.url}/v1/runs/{run_id}")).json()
        # Delivered once more after the restart, and only once: the held attempt and this one.
        await second.stop()
    assert len(receiver.requests) == 2, [r.answered for r in receiver.requests]
    assert receiver.requests[0].headers["webhook-id"] == receiver.requests[1].headers["webhook-id"] == done["webhookId"]
    payload = verify(receiver.requests[1])
    assert payload == receipt and payload["status"] == "completed"


async def test_a_gateway_killed_while_a_delivery_is_owed_sends_it_once_after_restart(
    tmp_path: Path, fake_llm: FakeOpenAI, gateways: list[GatewayProcess]
) -> None:
    """The run ended, its receiver was not up yet (connection refused, a retry due), and the
    gateway is SIGKILLed: the gateway started again on the same data sends the receipt, once."""
    fake_llm.default = Reply(text="done")
    port = free_port()
    url = f"http://127.0.0.1:{port}/hook"
    env = {
        "AGENT_GATEWAY__CHAT_ONLY__BASE_URL": fake_llm.base_url,
        "AGENT_GATEWAY__CHAT_ONLY__MODEL": "m",
        "AGENT_GATEWAY__WEBHOOKS__SECRET": SECRET,
        "AGENT_GATEWAY__WEBHOOKS__ALLOWED_HOSTS": '["127.0.0.1"]',
        "AGENT_GATEWAY__WEBHOOKS__BACKOFF_SECONDS": "0.2",
        "AGENT_GATEWAY__WEBHOOKS__MAX_BACKOFF_SECONDS": "0.5",
        "AGENT_GATEWAY__WEBHOOKS__POLL_SECONDS": "0.2",
        # a claim a killed attempt leaves lapses this long after it (plus a margin)
        "AGENT_GATEWAY__WEBHOOKS__TIMEOUT_SECONDS": "2.0",
    }
    data_dir = tmp_path / "data"
    first = await start_gateway_process(data_dir, tmp_path / "gateway-0.log", env=env)
    gateways.append(first)
    receiver = Receiver()
    app = web.Application()
    app.router.add_post("/hook", receiver.handle)
    runner = web.AppRunner(app, shutdown_timeout=0.5)
    await runner.setup()
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=WAIT)) as http:

            def delivery_on(gateway: GatewayProcess) -> Callable[[], Any]:
                async def delivery() -> dict[str, Any] | None:
                    answer = await http.get(f"{gateway.url}/v1/runs/{run_id}/webhook")
                    assert answer.status == 200, await answer.text()
                    return (await answer.json())["webhook"]  # type: ignore[no-any-return]

                return delivery

            response = await http.post(f"{first.url}/v1/runs", json=run_body("go", webhook=url))
            assert response.status == 201, await response.text()
            run_id = (await response.json())["hostRunId"]
            owed = await delivery_when(delivery_on(first), lambda d: d["attempts"] >= 1)
            assert owed["state"] == "pending" and owed["lastStatus"] is None and owed["lastError"], owed
            first.kill()
            assert await first.wait() == -signal.SIGKILL
            await web.TCPSite(runner, "127.0.0.1", port).start()  # the receiver is up now
            second = await start_gateway_process(data_dir, tmp_path / "gateway-1.log", env=env)
            gateways.append(second)
            done = await delivery_when(delivery_on(second), lambda d: d["state"] == "delivered", timeout=WAIT * 2)
            receipt = await (await http.get(f"{second.url}/v1/runs/{run_id}")).json()
            await second.stop()
    finally:
        await runner.cleanup()
    assert len(receiver.requests) == 1, [r.answered for r in receiver.requests]
    assert receiver.requests[0].headers["webhook-id"] == done["webhookId"]
    assert done["attempts"] > owed["attempts"] and done["lastStatus"] == 200
    payload = verify(receiver.requests[0])
    assert payload == receipt and payload["status"] == "completed"


# -- a cluster: several instances poll one outbox ---------------------------------------------------


async def test_two_instances_on_one_postgresql_deliver_each_runs_webhook_once(
    tmp_path: Path, fake_llm: FakeOpenAI, receiver: Receiver
) -> None:
    """Both instances poll the one outbox in PostgreSQL as fast as they may; runs created on
    either are each delivered once, whichever instance claims the row, and every delivery is
    visible from both instances."""
    fake_llm.default = Reply(text="done")
    extra = {
        "AGENT_GATEWAY__CHAT_ONLY__BASE_URL": fake_llm.base_url,
        "AGENT_GATEWAY__CHAT_ONLY__MODEL": "m",
        "AGENT_GATEWAY__WEBHOOKS__SECRET": SECRET,
        "AGENT_GATEWAY__WEBHOOKS__ALLOWED_HOSTS": '["127.0.0.1"]',
        "AGENT_GATEWAY__WEBHOOKS__POLL_SECONDS": "0.05",
    }
    runs = 8
    with fresh_database() as database:
        async with (
            instances(tmp_path, database, 2, extra=extra) as gateways,
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=WAIT)) as http,
        ):
            created: list[str] = []
            for index in range(runs):
                body = run_body(f"run {index}", workspaceId="default", webhook=receiver.url)
                async with http.post(f"{gateways[index % 2].url}/v1/runs", json=body) as response:
                    assert response.status == 201, await response.text()
                    created.append((await response.json())["hostRunId"])
            deliveries = []
            for index, run_id in enumerate(created):

                async def delivery(url: str = gateways[(index + 1) % 2].url, run_id: str = run_id) -> Any:
                    async with http.get(f"{url}/v1/runs/{run_id}/webhook") as answer:
                        assert answer.status == 200, await answer.text()
                        return (await answer.json())["webhook"]

                deliveries.append(await delivery_when(delivery, lambda d: d["state"] != "pending", timeout=WAIT * 2))
            receipts = []
            for run_id in created:
                async with http.get(f"{gateways[0].url}/v1/runs/{run_id}") as answer:
                    receipts.append(await answer.json())
    assert [d["state"] for d in deliveries] == ["delivered"] * runs, deliveries
    assert [d["attempts"] for d in deliveries] == [1] * runs
    # One request per run: no row was claimed by both instances.
    assert len(receiver.requests) == runs, [r.headers["webhook-id"] for r in receiver.requests]
    by_id = {r.headers["webhook-id"]: verify(r) for r in receiver.requests}
    assert set(by_id) == {d["webhookId"] for d in deliveries}
    assert sorted(p["hostRunId"] for p in by_id.values()) == sorted(created)
    assert sorted(by_id.values(), key=lambda p: p["hostRunId"]) == sorted(receipts, key=lambda p: p["hostRunId"])


# -- the pieces, without a gateway ------------------------------------------------------------------


def test_a_rotation_signs_with_both_secrets_and_either_verifies() -> None:
    old, new = new_secret(), new_secret()
    body = b'{"hostRunId":"run_1"}'
    timestamp = int(time.time())
    header = sign([decode_secret(new), decode_secret(old)], "msg_run_1", timestamp, body)
    assert header.count("v1,") == 2
    headers = {"webhook-id": "msg_run_1", "webhook-timestamp": str(timestamp), "webhook-signature": header}
    for secret in (old, new):
        assert Webhook(secret).verify(body, headers) == {"hostRunId": "run_1"}
    with pytest.raises(Exception, match=r"(?i)signature"):
        Webhook(new_secret()).verify(body, headers)


@pytest.mark.parametrize(
    ("host", "allowed", "refused"),
    [
        ("10.0.0.1", [], "private address 10.0.0.1"),
        ("::ffff:10.0.0.1", [], "private address ::ffff:a00:1"),  # IPv4-mapped: judged as 10.0.0.1
        ("fe80::1", [], "link-local"),
        ("0.0.0.0", [], "private address 0.0.0.0"),
        ("100.64.0.1", [], "non-public"),  # carrier-grade NAT
        ("10.0.0.1", ["10.0.0.0/8"], None),
        ("127.0.0.1", ["127.0.0.1"], None),
        ("8.8.8.8", [], None),  # public: allowed (nothing is contacted here)
    ],
)
async def test_address_checks(host: str, allowed: list[str], refused: str | None) -> None:
    check = resolve_checked(host, 80, _Allowed(allowed))
    if refused is None:
        [result] = await check
        assert result["host"] == host and result["hostname"] == host
    else:
        with pytest.raises(Refused, match=re.escape(refused)):
            await check


def test_config_refuses_a_malformed_secret_and_urls() -> None:
    config = Config.load(
        None,
        env={},
        overrides={"webhooks": {"secret": "hunter2", "url_by_agent": {"chat-only": "ftp://x"}, "poll_seconds": 0}},
    )
    problems = "\n".join(config.problems())
    assert "secret" in problems and "whsec_" in problems
    assert "chat-only" in problems and "poll_seconds" in problems
