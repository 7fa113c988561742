"""The cluster's Redis channel is signed: what someone who can PUBLISH on the cluster's Redis, but
does not hold `[cluster] secret`, can no longer do (create runs, push events into streams, replay
what they captured); a secret rotation; TLS to Redis with a CA file and the documented ACL user;
and that no API error names an internal address. Real `agent-gateway serve` processes on
PostgreSQL and Redis, as in test_cluster.py; every wait is bounded and waits on a counter or an
event, never on a sleep."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import secrets
import shutil
import subprocess
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import redis.asyncio as aioredis

from agent_gateway.plugins.cluster_redis.envelope import SEEN_CAPACITY, Rejected, Verifier, seal
from agent_gateway.testing.fake_openai import FakeOpenAI, Reply
from agent_gateway.testing.sse import sse_events
from tests._cli import clean_env, run_cli
from tests._cluster import (
    REDIS_URL,
    SECRET,
    free_port,
    fresh_database,
    get_json,
    instance_env,
    instances,
    post_json,
    start_redis,
    wait_for_health,
)

pytestmark = [pytest.mark.cluster, pytest.mark.postgres]

KEY = SECRET.encode()
WRONG_KEY = b"not-the-cluster-secret-" + b"x" * 16
ROOT = Path(__file__).resolve().parent.parent


# -- the envelope ----------------------------------------------------------------------------------


def test_a_sealed_message_opens_once_on_its_channel_with_an_accepted_key() -> None:
    verifier = Verifier([KEY], 30.0)
    body = b'{"op": "create"}'
    assert verifier.open(b"p:rpc:gw0", seal(KEY, b"p:rpc:gw0", body)) == body
    # A second secret during a rotation: either one opens.
    rotating = Verifier([b"n" * 32, KEY], 30.0)
    assert rotating.open(b"c", seal(KEY, b"c", b"x")) == b"x"
    assert rotating.open(b"c", seal(b"n" * 32, b"c", b"y")) == b"y"


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (lambda sealed: b'{"op": "create"}', "unsigned"),
        (lambda sealed: b"AGW1 garbage\n{}", "unsigned"),
        (lambda sealed: sealed[:-1] + b"!", "bad_signature"),  # the body altered
        (lambda sealed: sealed.replace(b"AGW1 1", b"AGW1 2", 1), "bad_signature"),  # the timestamp altered
        (lambda sealed: sealed[:20] + (b"0" if sealed[20:21] != b"0" else b"1") + sealed[21:], "bad_signature"),
        (lambda sealed: seal(WRONG_KEY, b"p:rpc:gw0", b'{"op": "create"}'), "bad_signature"),
        (lambda sealed: seal(KEY, b"p:rpc:gw1", b'{"op": "create"}'), "bad_signature"),  # another channel's
    ],
    ids=["plain", "bad-header", "body", "timestamp", "id", "wrong-key", "other-channel"],
)
def test_what_is_not_sealed_with_the_key_for_this_channel_is_refused(
    make: Callable[[bytes], bytes], reason: str
) -> None:
    verifier = Verifier([KEY], 30.0)
    sealed = seal(KEY, b"p:rpc:gw0", b'{"op": "create"}')
    with pytest.raises(Rejected) as refused:
        verifier.open(b"p:rpc:gw0", make(sealed))
    assert refused.value.reason == reason


def test_stale_future_and_replayed_messages_are_refused_and_ids_are_forgotten_with_the_window() -> None:
    now = [1_000_000.0]
    verifier = Verifier([KEY], 30.0, clock=lambda: now[0])
    at = int(now[0] * 1000)
    for ts in (at - 31_000, at + 31_000):
        with pytest.raises(Rejected) as refused:
            verifier.open(b"c", seal(KEY, b"c", b"x", ts_ms=ts))
        assert refused.value.reason == "stale"
    sealed = seal(KEY, b"c", b"x", ts_ms=at - 29_000)
    assert verifier.open(b"c", sealed) == b"x"
    with pytest.raises(Rejected) as refused:
        verifier.open(b"c", sealed)
    assert refused.value.reason == "replayed"
    # Once the message is stale its id is forgotten (the seen-set expires with the window).
    now[0] += 2.0
    verifier.open(b"c", seal(KEY, b"c", b"y", ts_ms=int(now[0] * 1000)))
    assert verifier.remembered == 1
    with pytest.raises(Rejected) as refused:
        verifier.open(b"c", sealed)
    assert refused.value.reason == "stale"


def test_a_full_seen_set_refuses_what_it_forgot_as_stale_instead_of_letting_it_replay() -> None:
    verifier = Verifier([KEY], 30.0, capacity=3, clock=lambda: 1000.0)
    sealed = [seal(KEY, b"c", b"%d" % i, ts_ms=999_000 + i) for i in range(5)]
    for message in sealed:
        verifier.open(b"c", message)
    assert verifier.remembered <= 3
    for message in sealed:
        with pytest.raises(Rejected) as refused:
            verifier.open(b"c", message)
        assert refused.value.reason in ("stale", "replayed")
    assert SEEN_CAPACITY >= 100_000


# -- helpers for the cluster tests -------------------------------------------------------------------


def run_body(request_id: str, session_id: str, message: str = "hello") -> dict[str, Any]:
    return {"requestId": request_id, "agentId": "chat-only", "sessionId": session_id, "message": message}


async def rejected(http: aiohttp.ClientSession, url: str) -> dict[str, int]:
    status, health = await get_json(http, f"{url}/v1/health")
    assert status == 200, health
    return dict(health["cluster"]["messagesRejected"])


async def wait_rejected(http: aiohttp.ClientSession, url: str, **at_least: int) -> dict[str, Any]:
    """Wait until this instance has dropped at least these many messages, by reason."""
    health = await wait_for_health(
        http, url, lambda body: all(body["cluster"]["messagesRejected"][k] >= n for k, n in at_least.items())
    )
    return dict(health["cluster"]["messagesRejected"])


async def metrics_text(http: aiohttp.ClientSession, url: str) -> str:
    async with http.get(f"{url}/metrics") as response:
        assert response.status == 200
        return await response.text()


async def stream_replays(http: aiohttp.ClientSession, url: str) -> int:
    return await metric(http, url, "agent_gateway_stream_replays_total")


async def metric(http: aiohttp.ClientSession, url: str, name: str) -> int:
    [value] = re.findall(rf"^{name} (\d+)$", await metrics_text(http, url), re.M)
    return int(value)


async def wait_for_metric(http: aiohttp.ClientSession, url: str, name: str, at_least: int) -> None:
    async with asyncio.timeout(30):
        while True:
            if await metric(http, url, name) >= at_least:
                return
            await asyncio.sleep(0.05)  # poll pacing: the metric itself is what is waited for


def runs_of(database_url: str, actor_id: str) -> list[str]:
    """The request ids of an actor's runs, straight from PostgreSQL."""
    import psycopg2

    with contextlib.closing(psycopg2.connect(database_url, connect_timeout=5)) as db, db.cursor() as cursor:
        cursor.execute("SELECT request_id FROM ag_runs WHERE actor_id = %s ORDER BY request_id", (actor_id,))
        return [row[0] for row in cursor.fetchall()]


class Capture:
    """The test's own subscription to some of the cluster's channels (what anyone allowed to
    SUBSCRIBE sees): every message, in order."""

    def __init__(self, client: aioredis.Redis, *channels: str) -> None:
        self.pubsub = client.pubsub()
        self.channels = channels
        self.messages: list[tuple[str, bytes]] = []
        self._arrived = asyncio.Condition()
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Capture:
        await self.pubsub.subscribe(*self.channels)
        self._task = asyncio.create_task(self._read())
        return self

    async def _read(self) -> None:
        async for message in self.pubsub.listen():
            if message["type"] == "message":
                async with self._arrived:
                    self.messages.append((message["channel"].decode(), message["data"]))
                    self._arrived.notify_all()

    async def wait_for(self, check: Callable[[str, bytes], bool], timeout: float = 30) -> bytes:
        async with asyncio.timeout(timeout), self._arrived:
            while True:
                for channel, data in self.messages:
                    if check(channel, data):
                        return data
                await self._arrived.wait()

    async def __aexit__(self, *exc_info: object) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self.pubsub.aclose()


class LiveStream:
    """An SSE client reading a run's stream in the background; `wait_for` blocks until an event
    matching a check has arrived."""

    def __init__(self, http: aiohttp.ClientSession, url: str) -> None:
        self.http, self.url = http, url
        self.events: list[dict[str, Any]] = []
        self.ended = False
        self._arrived = asyncio.Condition()
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> LiveStream:
        self._task = asyncio.create_task(self._read())
        return self

    async def _read(self) -> None:
        try:
            async with self.http.get(self.url) as response:
                assert response.status == 200, await response.text()
                async for event in sse_events(response):
                    async with self._arrived:
                        self.events.append(event.data)
                        self._arrived.notify_all()
        finally:
            self.ended = True
            async with self._arrived:
                self._arrived.notify_all()

    async def wait_for(self, check: Callable[[dict[str, Any]], bool], timeout: float = 30) -> dict[str, Any]:
        async with asyncio.timeout(timeout), self._arrived:
            while True:
                for event in self.events:
                    if check(event):
                        return event
                if self.ended:
                    raise AssertionError(f"the stream ended first; it sent {self.events[-3:]}")
                await self._arrived.wait()

    def text(self) -> str:
        return json.dumps(self.events)

    async def __aexit__(self, *exc_info: object) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, aiohttp.ClientError):
                await self._task


@contextlib.asynccontextmanager
async def raw_redis(url: str = REDIS_URL, **options: Any) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.from_url(url, socket_connect_timeout=5, **options)
    try:
        yield client
    finally:
        await client.aclose()


def create_op(request_id: str, session_id: str, actor_id: str = "alice") -> bytes:
    """A forwarded create-run operation, exactly as an instance sends one."""
    body = run_body(request_id, session_id, "do something as alice")
    return json.dumps(
        {"id": secrets.token_hex(8), "from": "attacker", "op": "create", "args": {"actorId": actor_id, "body": body}}
    ).encode()


# -- forwarded operations ----------------------------------------------------------------------------


async def test_a_forged_create_run_on_an_instances_rpc_channel_creates_nothing(
    tmp_path: Path, fake_llm: FakeOpenAI
) -> None:
    fake_llm.default = Reply("ok")
    extra = {"AGENT_GATEWAY__CHAT_ONLY__BASE_URL": fake_llm.base_url}
    prefix = "agtest:" + secrets.token_hex(4) + ":"
    rpc = f"{prefix}rpc:gw0"
    with fresh_database() as url:
        async with (
            instances(tmp_path, url, 2, extra=extra, key_prefix=prefix) as gateways,
            aiohttp.ClientSession() as http,
            raw_redis() as redis,
            Capture(redis, f"{prefix}reply:attacker", rpc) as capture,
        ):
            target = gateways[0].url
            # Both listeners (gw0 and the capture) are subscribed before anything is published.
            async with asyncio.timeout(30):
                while (await redis.pubsub_numsub(rpc))[0][1] < 2:  # noqa: ASYNC110 (Redis tells no one of a subscribe)
                    await asyncio.sleep(0.01)
            # Unsigned; signed with another secret; signed with the secret but for another
            # instance's channel. Each would have created a run as alice before.
            assert await redis.publish(rpc, create_op("forged-unsigned", "s-a")) == 2  # gw0 and the capture
            await redis.publish(rpc, seal(WRONG_KEY, rpc.encode(), create_op("forged-wrong-key", "s-a")))
            await redis.publish(rpc, seal(KEY, f"{prefix}rpc:gw1".encode(), create_op("forged-other-channel", "s-a")))
            # The control: the same operation signed with the cluster's secret is carried out (so
            # what was refused above had the right shape). Its reply, also signed, comes after
            # gw0 handled the three before it.
            await redis.publish(rpc, seal(KEY, rpc.encode(), create_op("signed-control", "s-a")))
            reply = await capture.wait_for(lambda channel, _: channel.endswith("reply:attacker"))
            answer = json.loads(Verifier([KEY], 30.0).open(f"{prefix}reply:attacker".encode(), reply))
            assert answer["ok"]["created"] is True, answer
            assert runs_of(url, "alice") == ["signed-control"]
            assert await rejected(http, target) == {"unsigned": 1, "bad_signature": 2, "stale": 0, "replayed": 0}
            metrics = await metrics_text(http, target)
            assert 'agent_gateway_cluster_messages_rejected_total{instance="gw0",reason="unsigned"} 1' in metrics
            assert 'agent_gateway_cluster_messages_rejected_total{instance="gw0",reason="bad_signature"} 2' in metrics
            # Stale (signed a minute ago, or a minute ahead): dropped.
            minute = 60_000
            for ahead in (-minute, minute):
                ts = int(time.time() * 1000) + ahead
                await redis.publish(rpc, seal(KEY, rpc.encode(), create_op(f"stale{ahead}", "s-a"), ts_ms=ts))
            await wait_rejected(http, target, stale=2)
            # A forwarded run captured off Redis (gw1 forwards to the session's owner gw0),
            # published again: dropped as a replay.
            status, receipt = await post_json(http, f"{target}/v1/runs", run_body("owner", "s-b"))
            assert status == 201, receipt
            status, receipt = await post_json(http, f"{gateways[1].url}/v1/runs", run_body("forwarded", "s-b"))
            assert status == 201, receipt
            captured = await capture.wait_for(lambda channel, data: channel == rpc and b'"forwarded"' in data)
            await redis.publish(rpc, captured)
            counts = await wait_rejected(http, target, replayed=1)
            assert counts == {"unsigned": 1, "bad_signature": 2, "stale": 2, "replayed": 1}
            assert runs_of(url, "alice") == ["signed-control"]
            # The instances' own traffic was never refused.
            assert await rejected(http, gateways[1].url) == dict.fromkeys(counts, 0)


# -- relayed events ----------------------------------------------------------------------------------


def forged_batch(run_id: str, template: dict[str, Any], seq: int, text: str) -> bytes:
    """An event batch as an instance publishes it: one message.delta of the run at `seq`."""
    event = json.loads(json.dumps(template).replace("ZQXJ", text))
    event["seq"] = str(seq).zfill(len(template["seq"]))
    return b"E\x00gw0\x00" + run_id.encode() + b"\x00" + json.dumps([event]).encode()


async def test_a_forged_event_batch_reaches_no_stream(tmp_path: Path, fake_llm: FakeOpenAI) -> None:
    # The run says "ZQXJ" and then waits (its upstream hangs): a stream on the other instance
    # stays open, and the run's seqs stay put while the test publishes.
    fake_llm.default = Reply("ZQXJ and then nothing", chunk_size=4, hang=True)
    extra = {"AGENT_GATEWAY__CHAT_ONLY__BASE_URL": fake_llm.base_url}
    prefix = "agtest:" + secrets.token_hex(4) + ":"
    events = f"{prefix}events"
    with fresh_database() as url:
        async with (
            instances(tmp_path, url, 2, extra=extra, key_prefix=prefix) as gateways,
            aiohttp.ClientSession() as http,
            raw_redis() as redis,
            Capture(redis, events) as capture,
        ):
            owner, other = gateways[0].url, gateways[1].url
            status, receipt = await post_json(http, f"{owner}/v1/runs", run_body("live", "s-live"))
            assert status == 201, receipt
            run_id = receipt["hostRunId"]
            async with LiveStream(http, f"{other}/v1/runs/{run_id}/stream") as stream:
                delta = await stream.wait_for(lambda e: e["kind"] == "message.delta" and "ZQXJ" in json.dumps(e))
                last = int(stream.events[-1]["seq"])
                captured = await capture.wait_for(lambda _, data: b"ZQXJ" in data)
                # A signed batch far ahead: the relay sends the stream back to PostgreSQL (a batch
                # went missing, it thinks) and from then on hands it the batch right after as is.
                # Once the stream has started that replay, the next batch is no longer lost to it.
                replays = await stream_replays(http, other)
                await redis.publish(events, seal(KEY, events.encode(), forged_batch(run_id, delta, last + 1000, "")))
                await wait_for_metric(http, other, "agent_gateway_stream_replays_total", replays + 1)
                # Each of these is the batch the relay now waits for, and the first of them it
                # took would reach the stream.
                after = last + 1001
                await redis.publish(events, forged_batch(run_id, delta, after, "FORGED-UNSIGNED"))
                forged = forged_batch(run_id, delta, after, "FORGED-WRONG-KEY")
                await redis.publish(events, seal(WRONG_KEY, events.encode(), forged))
                await redis.publish(events, captured)  # replayed as captured
                await redis.publish(events, captured.replace(b"ZQXJ", b"XXXX"))  # altered
                signed = seal(KEY, events.encode(), forged_batch(run_id, delta, after, "FORGED-ALTERED"))
                await redis.publish(events, signed.replace(b"FORGED-ALTERED", b"FORGED-ALTERXD"))
                # The control, signed with the secret, after all of them: once the stream shows
                # it, the instance has handled (and dropped) everything published before.
                await redis.publish(events, seal(KEY, events.encode(), forged_batch(run_id, delta, after, "CONTROL")))
                await stream.wait_for(lambda e: "CONTROL" in json.dumps(e) or "FORGED" in json.dumps(e))
                seen = stream.text()
            assert "FORGED" not in seen and "XXXX" not in seen, seen
            counts = await rejected(http, other)
            assert counts == {"unsigned": 1, "bad_signature": 3, "stale": 0, "replayed": 1}, counts
            metrics = await metrics_text(http, other)
            assert 'agent_gateway_cluster_messages_rejected_total{instance="gw1",reason="replayed"} 1' in metrics
            async with http.post(f"{owner}/v1/runs/{run_id}/cancel", headers={"X-Agent-Gateway-Client": "t"}) as r:
                assert r.status in (200, 202), await r.text()


# -- rotation ---------------------------------------------------------------------------------------


async def test_during_a_secret_rotation_instances_on_the_old_and_the_new_secret_work_together(
    tmp_path: Path, fake_llm: FakeOpenAI
) -> None:
    fake_llm.default = Reply("word " * 60, chunk_size=4, delay=0.002)
    old, new = SECRET, "the-new-cluster-secret-" + secrets.token_hex(16)
    extra = {"AGENT_GATEWAY__CHAT_ONLY__BASE_URL": fake_llm.base_url}
    # gw0 has swapped (signs with the new one, still accepts the old); gw1 not yet (signs with
    # the old one, accepts the new one already).
    each = [
        {"AGENT_GATEWAY__CLUSTER__SECRET": new, "AGENT_GATEWAY__CLUSTER__PREVIOUS_SECRETS": json.dumps([old])},
        {"AGENT_GATEWAY__CLUSTER__SECRET": old, "AGENT_GATEWAY__CLUSTER__PREVIOUS_SECRETS": json.dumps([new])},
    ]
    with fresh_database() as url:
        async with instances(tmp_path, url, 2, extra=extra, each=each) as gateways, aiohttp.ClientSession() as http:
            first, second = gateways[0].url, gateways[1].url
            status, receipt = await post_json(http, f"{first}/v1/runs", run_body("first", "s-rot"))
            assert status == 201, receipt
            # Forwarded to the session's owner gw0 (signed old), answered (signed new).
            status, receipt = await post_json(http, f"{second}/v1/runs", run_body("second", "s-rot"))
            assert status == 201, receipt
            # Streamed on gw1 from gw0's relayed events (signed new).
            async with LiveStream(http, f"{second}/v1/runs/{receipt['hostRunId']}/stream") as stream:
                await stream.wait_for(lambda e: e["kind"] == "run.completed", timeout=60)
            _, health = await get_json(http, f"{second}/v1/health")
            assert health["cluster"]["relayedIn"] > 0, health
            for gw in (first, second):
                assert await rejected(http, gw) == {"unsigned": 0, "bad_signature": 0, "stale": 0, "replayed": 0}


# -- configuration -----------------------------------------------------------------------------------


async def test_cluster_mode_refuses_to_start_without_a_long_enough_secret(tmp_path: Path) -> None:
    env = instance_env(tmp_path, "gw0", "postgresql://unused/x", redis_url=REDIS_URL, key_prefix="agtest:x:", extra={})
    del env["AGENT_GATEWAY__CLUSTER__SECRET"]
    code, out, err = await run_cli("serve", "--port", "0", env=env, cwd=tmp_path)
    assert code != 0
    assert "cluster.secret: required in cluster mode" in out + err, (out, err)
    config = tmp_path / "c.toml"
    config.write_text(
        '[cluster]\nredis_url = "redis://127.0.0.1:6379/0"\nsecret = "short"\nprevious_secrets = ["also-short"]\n'
    )
    code, out, _ = await run_cli("config", "check", "--config", str(config), env=clean_env(tmp_path), cwd=tmp_path)
    assert code == 1
    assert "cluster.secret: must be at least 32 bytes" in out and "cluster.previous_secrets" in out, out
    # Shown masked, like the tokens.
    config.write_text(f'[cluster]\nsecret = "{SECRET}"\n')
    code, out, _ = await run_cli("config", "show", "--config", str(config), env=clean_env(tmp_path), cwd=tmp_path)
    assert code == 0 and SECRET not in out and '"secret": "***"' in out, out


# -- errors name no internal address ----------------------------------------------------------------


async def test_owner_unavailable_names_no_internal_address(tmp_path: Path, fake_llm: FakeOpenAI) -> None:
    fake_llm.default = Reply("ok")
    port = free_port()
    redis_proc = await start_redis(port, tmp_path)
    extra = {"AGENT_GATEWAY__CHAT_ONLY__BASE_URL": fake_llm.base_url}
    try:
        with fresh_database() as url:
            async with (
                instances(tmp_path, url, 2, redis_url=f"redis://127.0.0.1:{port}/0", extra=extra) as gateways,
                aiohttp.ClientSession() as http,
            ):
                status, receipt = await post_json(http, f"{gateways[0].url}/v1/runs", run_body("first", "s-own"))
                assert status == 201, receipt
                redis_proc.kill()
                await redis_proc.wait()
                # gw1 must forward the session's next run to gw0, through a Redis that is gone.
                async with http.post(f"{gateways[1].url}/v1/runs", json=run_body("second", "s-own")) as response:
                    text = await response.text()
                    assert response.status == 503, text
                assert json.loads(text)["error"]["code"] == "owner_unavailable", text
                for internal in ("127.0.0.1", str(port), "redis", "Redis", "gw0", "Error", "refused"):
                    assert internal not in text, (internal, text)
    finally:
        if redis_proc.returncode is None:
            redis_proc.kill()
            await redis_proc.wait()


# -- TLS --------------------------------------------------------------------------------------------


def make_certificates(directory: Path) -> dict[str, Path]:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, by the openssl CLI."""
    directory.mkdir()
    paths = {name: directory / name for name in ("ca.key", "ca.crt", "server.key", "server.crt", "client.key")}
    paths["client.crt"] = directory / "client.crt"

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=directory, check=True, capture_output=True, timeout=60)

    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    ca_extensions = ("-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.crt", "-days", "2", "-subj", "/CN=agtest-ca",
            *ca_extensions)  # fmt: skip
    for name, usage in (("server", "serverAuth"), ("client", "clientAuth")):
        (directory / f"{name}.ext").write_text(
            f"subjectAltName=IP:127.0.0.1\nextendedKeyUsage={usage}\nkeyUsage=critical,digitalSignature\n"
            "authorityKeyIdentifier=keyid,issuer\nsubjectKeyIdentifier=hash\n"
        )
        openssl("req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN=agtest-{name}")
        openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
                "-out", f"{name}.crt", "-days", "2", "-extfile", f"{name}.ext")  # fmt: skip
    return paths


def documented_acl_lines() -> list[list[str]]:
    """The ACL SETUSER lines of docs/deployment.md, as commands."""
    guide = (ROOT / "docs" / "deployment.md").read_text(encoding="utf-8")
    lines = re.findall(r"^ACL SETUSER .*$", guide, re.M)
    assert lines, "docs/deployment.md shows no ACL SETUSER line"
    return [line.split() for line in lines]


def refused_command(entry: Any) -> str:
    """The command of one ACL LOG entry (a dict, or a flat key/value list, by client version)."""
    if not isinstance(entry, dict):
        entry = dict(zip(entry[::2], entry[1::2], strict=True))
    value = entry.get("object", entry.get(b"object", b""))
    return value.decode() if isinstance(value, bytes) else str(value)


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
async def test_rediss_with_a_ca_file_and_the_documented_acl_user(tmp_path: Path, fake_llm: FakeOpenAI) -> None:
    fake_llm.default = Reply("word " * 60, chunk_size=4, delay=0.002)
    certs = make_certificates(tmp_path / "tls")
    port = free_port()
    redis_proc = await start_redis(
        port, tmp_path, "--port", "0", "--tls-port", str(port), "--tls-cert-file", str(certs["server.crt"]),
        "--tls-key-file", str(certs["server.key"]), "--tls-ca-cert-file", str(certs["ca.crt"]),
    )  # fmt: skip
    # Redis asks for a client certificate by default (tls-auth-clients yes).
    tls = {"ssl_ca_certs": str(certs["ca.crt"]), "ssl_certfile": str(certs["client.crt"])}
    tls["ssl_keyfile"] = str(certs["client.key"])
    password = secrets.token_hex(16)
    try:
        async with raw_redis(f"rediss://127.0.0.1:{port}/0", **tls) as admin:
            # The gateway's user exactly as the deployment guide creates it; the default user
            # stays on for this admin connection.
            for words in documented_acl_lines():
                if words[2] == "default":
                    continue
                words = [f">{password}" if word.startswith(">") else word for word in words]
                assert await admin.execute_command(*words) in (b"OK", "OK", True)
            extra = {
                "AGENT_GATEWAY__CHAT_ONLY__BASE_URL": fake_llm.base_url,
                "AGENT_GATEWAY__CLUSTER__TLS_CA_FILE": str(certs["ca.crt"]),
                "AGENT_GATEWAY__CLUSTER__TLS_CERT_FILE": str(certs["client.crt"]),
                "AGENT_GATEWAY__CLUSTER__TLS_KEY_FILE": str(certs["client.key"]),
            }
            redis_url = f"rediss://agent-gateway:{password}@127.0.0.1:{port}/0"
            with fresh_database() as url:
                async with (
                    instances(
                        tmp_path, url, 2, redis_url=redis_url, extra=extra, key_prefix="agent-gateway:"
                    ) as gateways,
                    aiohttp.ClientSession() as http,
                ):
                    first, second = gateways[0].url, gateways[1].url
                    for gw in (first, second):
                        await wait_for_health(http, gw, lambda body: body["cluster"]["redis"] == "up")
                    status, receipt = await post_json(http, f"{first}/v1/runs", run_body("first", "s-tls"))
                    assert status == 201, receipt
                    # Forwarded over TLS to the session's owner, and streamed back.
                    status, receipt = await post_json(http, f"{second}/v1/runs", run_body("second", "s-tls"))
                    assert status == 201, receipt
                    async with LiveStream(http, f"{second}/v1/runs/{receipt['hostRunId']}/stream") as stream:
                        await stream.wait_for(lambda e: e["kind"] == "run.completed", timeout=60)
                    _, health = await get_json(http, f"{second}/v1/health")
                    assert health["cluster"]["relayedIn"] > 0, health
            # The user's rights were enough: Redis refused the gateway nothing (but the client's
            # optional CLIENT SETINFO, on a Redis that knows it).
            refused = [refused_command(entry) for entry in await admin.acl_log()]
            assert [command for command in refused if command != "client|setinfo"] == [], refused
    finally:
        if redis_proc.returncode is None:
            redis_proc.kill()
            await redis_proc.wait()
