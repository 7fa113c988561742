"""Authentication and authorization as hooks (``authenticate``, ``authentication_enabled``,
``authorize``), and the built-in JWT plugin (``[auth_jwt]``): tokens signed by keys made here,
a JWKS served on 127.0.0.1, and what a client sees for every refusal."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import importlib.util
import json
import sqlite3
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import closing
from pathlib import Path
from typing import Any

import jwt
import openai
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from agent_gateway import Actor, PluginRoutes, bearer_token, hookimpl
from agent_gateway.config import Config, section_specs_from_hook
from agent_gateway.mcp import MCP_PATH
from agent_gateway.mcp.wiring import run_lease
from agent_gateway.plugin_host import PluginError, PluginHost
from agent_gateway.testing.fake_openai import FakeOpenAI, Reply
from agent_gateway.tools import ToolError
from tests._auth import AUDIENCE, ISSUER, claims, public_pem, rsa_key, sign
from tests._harness import WAIT, MakeGateway, gateway_of, run_body, run_to_end

ALICE_TOKEN = "tok-static-alice-0123456789"


# -- plugins the tests register ------------------------------------------------------------------


class ApiKeys:
    """An authenticator of its own: ``X-Api-Key``-style bearers from a table; ``async-`` keys
    are answered through an awaitable, as a plugin with I/O would."""

    def __init__(self, keys: dict[str, Actor], enabled: bool | None = None) -> None:
        self.keys = keys
        self.enabled = enabled
        self.asked = 0

    @hookimpl
    def authenticate(self, request: web.Request) -> Actor | Awaitable[Actor | None] | None:
        self.asked += 1
        token = bearer_token(request)
        if token is None or not token.startswith(("key-", "async-")):
            return None
        if token.startswith("async-"):

            async def later() -> Actor | None:
                await asyncio.sleep(0)
                return self.keys.get(token)

            return later()
        return self.keys.get(token)


class ApiKeysWithSwitch(ApiKeys):
    @hookimpl
    def authentication_enabled(self, config: Config) -> bool:
        return bool(self.enabled)


class Policy:
    """An authorize implementation: records every question, denies what ``deny`` says."""

    def __init__(self, deny: Callable[[Actor, str, dict[str, Any]], bool] = lambda *_: False) -> None:
        self.deny = deny
        self.asked: list[tuple[str, str, dict[str, Any]]] = []

    @hookimpl
    def authorize(self, actor: Actor, action: str, resource: dict[str, Any]) -> bool | None:
        self.asked.append((actor.id, action, resource))
        return False if self.deny(actor, action, resource) else None


class AsyncAllow:
    @hookimpl
    def authorize(self, actor: Actor, action: str, resource: dict[str, Any]) -> Awaitable[bool]:
        async def answer() -> bool:
            return True

        return answer()


def recording(calls: list[str]) -> Callable[..., None]:
    """A pluggy hook-call monitor noting each hook's name."""
    return lambda name, _impls, _kwargs: calls.append(name)


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def created(client: TestClient, token: str, **fields: Any) -> dict[str, Any]:
    response = await client.post("/v1/runs", json=run_body(**fields), headers=bearer(token))
    assert response.status == 201, await response.text()
    receipt: dict[str, Any] = await response.json()
    return receipt


# -- authenticate ----------------------------------------------------------------------------------


async def test_authenticate_a_plugins_actor_wins_and_static_tokens_are_tried_last(make_gateway: MakeGateway) -> None:
    keys = ApiKeys({"key-bob": Actor("bob"), "async-carol": Actor("carol"), "key-shadow": Actor("shadow")})
    client = await make_gateway(tokens={ALICE_TOKEN: "alice"}, extra_plugins=(keys,))
    # the plugin's keys, answered directly and through an awaitable
    assert (await created(client, "key-bob"))["actorId"] == "bob"
    assert (await created(client, "async-carol"))["actorId"] == "carol"
    # a bearer the plugin leaves alone reaches the built-in static tokens
    assert (await created(client, ALICE_TOKEN))["actorId"] == "alice"
    # nobody vouches: 401, with or without a bearer, in the gateway's JSON shape
    for headers in ({}, bearer("key-unknown"), bearer("tok-nobody-0123456789")):
        response = await client.get("/v1/agents", headers=headers)
        assert response.status == 401
        assert (await response.json())["error"]["code"] == "unauthorized"
    # public paths ask nobody
    asked = keys.asked
    assert (await client.get("/v1/health")).status == 200
    assert keys.asked == asked


async def test_authentication_enabled_decides_whether_callers_must_authenticate(make_gateway: MakeGateway) -> None:
    # A plugin that says it is off, and no [auth] tokens: the one local actor, as before hooks.
    off = await make_gateway(extra_plugins=(ApiKeysWithSwitch({"key-bob": Actor("bob")}, enabled=False),))
    assert (await created(off, "anything"))["actorId"] == "local"
    assert not gateway_of(off).auth.required
    # The same plugin switched on: authentication is required without any static token.
    on = await make_gateway(extra_plugins=(ApiKeysWithSwitch({"key-bob": Actor("bob")}, enabled=True),))
    assert gateway_of(on).auth.required
    assert (await on.get("/v1/agents")).status == 401
    assert (await created(on, "key-bob"))["actorId"] == "bob"
    # /openapi.json says a token is needed now
    spec = await (await on.get("/openapi.json")).json()
    assert spec.get("security") != []
    # A plugin implementing authenticate without saying: always in use.
    plain = await make_gateway(extra_plugins=(ApiKeys({"key-bob": Actor("bob")}),))
    assert (await plain.get("/v1/agents")).status == 401


# -- authorize -------------------------------------------------------------------------------------


async def test_authorize_any_false_denies_with_403_and_none_abstains(make_gateway: MakeGateway) -> None:
    policy = Policy(lambda actor, action, resource: action == "runs:create" and resource["agentId"] == "chat-only")
    abstains = Policy()
    client = await make_gateway(tokens={ALICE_TOKEN: "alice"}, extra_plugins=(policy, abstains, AsyncAllow()))
    response = await client.post("/v1/runs", json=run_body(), headers=bearer(ALICE_TOKEN))
    assert response.status == 403
    error = (await response.json())["error"]
    assert error["code"] == "forbidden" and error["action"] == "runs:create"
    asked = [q for q in abstains.asked if q[1] == "runs:create"]
    assert asked and asked[0][0] == "alice"
    resource = asked[0][2]
    assert resource == {
        "type": "run",
        "agentId": "chat-only",
        "sessionId": resource["sessionId"],
        "workspaceId": "local:test",
    }
    # nothing was stored for the refused run
    sessions = await (await client.get("/v1/sessions", headers=bearer(ALICE_TOKEN))).json()
    assert sessions["sessions"] == []
    # everything else is allowed: all answers were None or True
    assert (await client.get("/v1/agents", headers=bearer(ALICE_TOKEN))).status == 200


async def test_authorize_is_asked_for_every_resource_the_gateway_serves(make_gateway: MakeGateway) -> None:
    """A policy that allows everything sees each route's action and resource; then a policy that
    denies one action at a time turns exactly that route into a 403."""
    policy = Policy()
    client = await make_gateway(tokens={ALICE_TOKEN: "alice"}, extra_plugins=(policy,))
    auth = bearer(ALICE_TOKEN)
    receipt, _events = await run_to_end(client, run_body(), headers=auth)
    run_id, session_id = receipt["hostRunId"], receipt["sessionId"]
    await gateway_of(client).runs.wait(run_id)
    requests: list[tuple[str, str, dict[str, Any] | None, str, dict[str, Any]]] = [
        ("GET", f"/v1/runs/{run_id}", None, "runs:read", {"type": "run", "id": run_id}),
        ("GET", f"/v1/runs/{run_id}/events", None, "runs:read", {"id": run_id}),
        ("GET", f"/v1/runs/{run_id}/receipts", None, "runs:read", {"id": run_id}),
        ("GET", f"/v1/runs/{run_id}/stream", None, "runs:read", {"id": run_id}),
        ("POST", f"/v1/runs/{run_id}/cancel", None, "runs:cancel", {"id": run_id, "sessionId": session_id}),
        ("POST", f"/v1/runs/{run_id}/permissions/p1", {"optionId": "x"}, "runs:permission", {"id": run_id}),
        ("GET", f"/v1/sessions/{session_id}/active-run", None, "sessions:read", {"id": session_id}),
        ("GET", "/v1/sessions", None, "sessions:read", {"type": "session"}),
        ("GET", f"/v1/sessions/{session_id}", None, "sessions:read", {"id": session_id}),
        ("GET", f"/v1/sessions/{session_id}/export", None, "sessions:read", {"id": session_id}),
        ("PATCH", f"/v1/sessions/{session_id}", {"pinned": True}, "sessions:write", {"id": session_id}),
        ("GET", "/v1/agents", None, "agents:read", {"type": "agent", "id": "chat-only"}),
        ("GET", "/v1/agents/chat-only", None, "agents:read", {"id": "chat-only"}),
        ("GET", "/v1/preferences", None, "preferences:read", {"type": "preferences", "id": "alice"}),
        ("PUT", "/v1/preferences", {"values": {}}, "preferences:write", {"id": "alice"}),
        ("GET", "/metrics", None, "metrics:read", {"type": "metrics"}),
        ("GET", "/v1/models", None, "routes:call", {"type": "route", "method": "GET", "path": "/v1/models"}),
        (
            "GET",
            f"/v1/ag-ui/runs/{run_id}/stream",
            None,
            "routes:call",
            {"path": "/v1/ag-ui/runs/{runId}/stream", "params": {"runId": run_id}},
        ),
        ("DELETE", f"/v1/sessions/{session_id}", None, "sessions:delete", {"id": session_id}),
        ("POST", "/v1/sessions:delete", {"sessionIds": ["s-gone"]}, "sessions:delete", {"id": "s-gone"}),
    ]
    for method, path, body, action, expected in requests:
        policy.asked.clear()
        async with asyncio.timeout(WAIT):
            response = await client.request(method, path, json=body, headers=auth)
            await response.read()
        matching = [r for a, act, r in policy.asked if act == action and a == "alice"]
        assert matching, f"{method} {path}: authorize was not asked {action} (asked {policy.asked})"
        assert any(expected.items() <= r.items() for r in matching), (method, path, matching)

    # Each action, denied alone, is a 403 forbidden on its route.
    denied: set[str] = set()
    strict = await make_gateway(
        tokens={ALICE_TOKEN: "alice"}, extra_plugins=(Policy(lambda _a, action, _r: action in denied),)
    )
    receipt = await created(strict, ALICE_TOKEN)
    await gateway_of(strict).runs.wait(receipt["hostRunId"])
    checks = [
        ("runs:read", "GET", f"/v1/runs/{receipt['hostRunId']}"),
        ("runs:cancel", "POST", f"/v1/runs/{receipt['hostRunId']}/cancel"),
        ("sessions:read", "GET", "/v1/sessions"),
        ("preferences:read", "GET", "/v1/preferences"),
        ("agents:read", "GET", "/v1/agents/chat-only"),
        ("routes:call", "GET", "/v1/models"),
    ]
    for action, method, path in checks:
        denied.clear()
        denied.add(action)
        response = await strict.request(method, path, headers=auth)
        assert response.status == 403, (action, path, await response.text())
    # A denied agent is left out of the list rather than failing it.
    denied.clear()
    denied.add("agents:read")
    listing = await (await strict.get("/v1/agents", headers=auth)).json()
    assert listing["agents"] == []


async def test_authorize_denials_take_the_protocol_error_shape(make_gateway: MakeGateway) -> None:
    policy = Policy(lambda _a, action, resource: action == "runs:create")
    client = await make_gateway(tokens={ALICE_TOKEN: "alice"}, extra_plugins=(policy,))
    sdk = openai.AsyncOpenAI(base_url=str(client.make_url("/v1")), api_key=ALICE_TOKEN, max_retries=0, timeout=WAIT)
    try:
        with pytest.raises(openai.PermissionDeniedError) as caught:
            await sdk.chat.completions.create(model="chat-only", messages=[{"role": "user", "content": "hi"}])
    finally:
        await sdk.close()
    assert caught.value.status_code == 403
    assert caught.value.code == "forbidden"
    assert caught.value.body["type"] == "permission_error"  # type: ignore[index]
    # AG-UI answers with the gateway's JSON error before its stream opens
    response = await client.post("/v1/ag-ui/chat-only", json=agui_input(), headers=bearer(ALICE_TOKEN))
    assert response.status == 403
    assert (await response.json())["error"]["code"] == "forbidden"


async def test_without_an_authorize_plugin_nothing_is_asked(make_gateway: MakeGateway) -> None:
    """The cheap path: no authorize implementation, no authorize call (and, with no
    authentication configured, no authenticate call either)."""
    for tokens in ({ALICE_TOKEN: "alice"}, None):
        client = await make_gateway(tokens=tokens)
        gateway = gateway_of(client)
        assert not gateway.auth.authorizing
        called: list[str] = []
        gateway.plugins.pm.add_hookcall_monitoring(recording(called), lambda *_: None)
        receipt, _events = await run_to_end(client, run_body(), headers=bearer(ALICE_TOKEN))
        assert (await client.get(f"/v1/runs/{receipt['hostRunId']}", headers=bearer(ALICE_TOKEN))).status == 200
        assert (await client.get("/v1/models", headers=bearer(ALICE_TOKEN))).status == 200
        assert "authorize" not in called
        assert ("authenticate" in called) == (tokens is not None)


async def test_a_workspaces_claim_restricts_workspaces_like_owners(make_gateway: MakeGateway, tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    keys = ApiKeys({"key-bob": Actor("bob", {"workspaces": ["ws-a"]}), "key-eve": Actor("eve")})
    client = await make_gateway(
        overrides={"workspaces": {"roots": {"ws-a": str(tmp_path / "a"), "ws-b": str(tmp_path / "b")}}},
        extra_plugins=(keys,),
    )
    assert (await created(client, "key-bob", workspaceId="ws-a"))["workspaceId"] == "ws-a"
    response = await client.post("/v1/runs", json=run_body(workspaceId="ws-b"), headers=bearer("key-bob"))
    assert response.status == 404
    assert (await response.json())["error"]["code"] == "workspace_not_found"
    response = await client.get("/v1/workspaces/ws-b/events", headers=bearer("key-bob"))
    assert response.status == 404
    # an actor without the claim is not restricted by it
    assert (await created(client, "key-eve", workspaceId="ws-b"))["workspaceId"] == "ws-b"


# -- the JWT plugin ----------------------------------------------------------------------------------


def public_jwk(key: rsa.RSAPrivateKey, kid: str) -> dict[str, Any]:
    jwk: dict[str, Any] = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(key.public_key()))
    return {**jwk, "kid": kid, "use": "sig", "alg": "RS256"}


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def hand_made(header: dict[str, Any], payload: dict[str, Any], secret: bytes | None) -> str:
    """A token PyJWT refuses to make: `alg: none`, or HS256 keyed with a PEM public key."""
    signing_input = f"{b64(json.dumps(header).encode())}.{b64(json.dumps(payload).encode())}"
    signature = b"" if secret is None else hmac.new(secret, signing_input.encode(), hashlib.sha256).digest()
    return f"{signing_input}.{b64(signature)}"


class Jwks:
    """A JWKS endpoint on 127.0.0.1 whose key set the test changes, counting fetches."""

    def __init__(self) -> None:
        self.keys: list[dict[str, Any]] = []
        self.fetches = 0
        self.server: TestServer | None = None

    async def serve(self, request: web.Request) -> web.Response:
        self.fetches += 1
        return web.json_response({"keys": self.keys})

    @property
    def url(self) -> str:
        assert self.server is not None
        return str(self.server.make_url("/jwks.json"))


@pytest.fixture
async def jwks() -> AsyncIterator[Jwks]:
    served = Jwks()
    app = web.Application()
    app.router.add_get("/jwks.json", served.serve)
    served.server = TestServer(app, host="127.0.0.1")
    await served.server.start_server()
    try:
        yield served
    finally:
        await served.server.close()


def jwt_section(**values: Any) -> dict[str, Any]:
    return {"auth_jwt": {"enabled": True, "issuer": ISSUER, "audience": AUDIENCE, **values}}


async def test_jwt_actor_creates_runs_and_sees_only_its_own_sessions(make_gateway: MakeGateway, jwks: Jwks) -> None:
    key = rsa_key()
    jwks.keys = [public_jwk(key, "k1")]
    client = await make_gateway(overrides=jwt_section(jwks_url=jwks.url))
    assert gateway_of(client).auth.required  # no static token, yet authentication is on
    alice = sign(key, "k1", **claims("alice", roles=["writer"]))
    bob = sign(key, "k1", **claims("bob"))
    receipt, events = await run_to_end(client, run_body("hi"), headers=bearer(alice))
    assert receipt["actorId"] == "alice" and events[-1]["event"] == "run.completed"
    mine = await (await client.get("/v1/sessions", headers=bearer(alice))).json()
    assert [s["sessionId"] for s in mine["sessions"]] == [receipt["sessionId"]]
    theirs = await (await client.get("/v1/sessions", headers=bearer(bob))).json()
    assert theirs["sessions"] == []
    assert (await client.get(f"/v1/runs/{receipt['hostRunId']}", headers=bearer(bob))).status == 404
    assert jwks.fetches == 1  # cached after the first token
    # the console's 401 (which makes it ask for a token) and its calls with a JWT bearer
    assert (await client.get("/v1/agents")).status == 401
    assert (await client.get("/v1/agents", headers=bearer(alice))).status == 200


async def test_jwt_claims_name_the_actor_its_roles_and_its_workspaces(
    make_gateway: MakeGateway, jwks: Jwks, tmp_path: Path
) -> None:
    key = rsa_key()
    jwks.keys = [public_jwk(key, "k1")]
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    roles: list[tuple[str, ...]] = []

    def note_roles(actor: Actor, _action: str, _resource: dict[str, Any]) -> bool:
        roles.append(actor.roles)
        return False  # deny nothing

    policy = Policy(note_roles)
    client = await make_gateway(
        overrides={
            **jwt_section(
                jwks_url=jwks.url,
                actor_claim="email",
                roles_claim="realm_access.roles",
                workspaces_claim="spaces",
            ),
            "workspaces": {"roots": {"ws-a": str(tmp_path / "a"), "ws-b": str(tmp_path / "b")}},
        },
        extra_plugins=(policy,),
    )
    ada = sign(
        key,
        "k1",
        **claims("user-1", email="ada@example.test", realm_access={"roles": ["writer", "viewer"]}, spaces="ws-a"),
    )
    receipt = await created(client, ada, workspaceId="ws-a")
    assert receipt["actorId"] == "ada@example.test"
    [(actor_id, _, _)] = [q for q in policy.asked if q[1] == "runs:create"]
    assert actor_id == "ada@example.test"
    response = await client.post("/v1/runs", json=run_body(workspaceId="ws-b"), headers=bearer(ada))
    assert response.status == 404 and (await response.json())["error"]["code"] == "workspace_not_found"
    assert (await client.get("/v1/agents/chat-only", headers=bearer(ada))).status == 200
    assert roles == [("writer", "viewer")] * len(roles) and roles
    # configured but absent from a token: no workspace at all, rather than every one
    bare = sign(key, "k1", **claims("user-2", email="bob@example.test"))
    response = await client.post("/v1/runs", json=run_body(workspaceId="ws-a"), headers=bearer(bare))
    assert response.status == 404
    # a token without the actor claim is refused, naming it
    response = await client.get("/v1/agents", headers=bearer(sign(key, "k1", **claims("user-3"))))
    assert response.status == 401 and "'email'" in (await response.json())["error"]["message"]


async def test_jwt_refusals_say_why(make_gateway: MakeGateway, jwks: Jwks) -> None:
    key, stranger = rsa_key(), rsa_key()
    jwks.keys = [public_jwk(key, "k1")]
    client = await make_gateway(
        overrides=jwt_section(jwks_url=jwks.url, leeway_seconds=0.0, jwks_min_refetch_seconds=3600.0),
        tokens={ALICE_TOKEN: "alice"},
    )
    pem = public_pem(key)
    good = claims("alice")
    cases = {
        "expired": (sign(key, "k1", **{**good, "exp": int(time.time()) - 60}), "expired"),
        "wrong audience": (sign(key, "k1", **{**good, "aud": "another-app"}), "audience"),
        "wrong issuer": (sign(key, "k1", **{**good, "iss": "https://evil.test/"}), "issuer"),
        "alg none": (hand_made({"alg": "none", "typ": "JWT", "kid": "k1"}, good, None), "'none' is not accepted"),
        "HMAC keyed with the RSA public key": (
            hand_made({"alg": "HS256", "typ": "JWT", "kid": "k1"}, good, pem),
            "'HS256' is not accepted",
        ),
        "signed by another key": (sign(stranger, "k1", **good), "Signature verification failed"),
        "no exp": (sign(key, "k1", **{k: v for k, v in good.items() if k != "exp"}), "exp"),
        "no sub": (sign(key, "k1", **{k: v for k, v in good.items() if k != "sub"}), "'sub' claim"),
        "unknown kid": (sign(stranger, "k-unknown", **good), "no key with this kid"),
    }
    for name, (token, reason) in cases.items():
        response = await client.get("/v1/agents", headers=bearer(token))
        assert response.status == 401, name
        error = (await response.json())["error"]
        assert error["code"] == "unauthorized" and reason.lower() in error["message"].lower(), (name, error)
    # the good token, and the static tokens beside it
    assert (await client.get("/v1/agents", headers=bearer(sign(key, "k1", **good)))).status == 200
    assert (await client.get("/v1/agents", headers=bearer(ALICE_TOKEN))).status == 200
    # made-up kids did not make the gateway fetch the JWKS again (bounded re-fetch)
    assert jwks.fetches == 1


async def test_jwt_a_rotated_kid_is_accepted_after_the_jwks_is_fetched_again(
    make_gateway: MakeGateway, jwks: Jwks
) -> None:
    old, new = rsa_key(), rsa_key()
    jwks.keys = [public_jwk(old, "2024")]
    client = await make_gateway(overrides=jwt_section(jwks_url=jwks.url, jwks_min_refetch_seconds=0.0))
    assert (await client.get("/v1/agents", headers=bearer(sign(old, "2024", **claims("alice"))))).status == 200
    assert jwks.fetches == 1
    # the provider rotates: the new key appears in the JWKS, the old one goes
    jwks.keys = [public_jwk(new, "2025")]
    fresh = sign(new, "2025", **claims("alice"))
    # concurrent first uses of the new kid share one fetch
    responses = await asyncio.gather(*(client.get("/v1/agents", headers=bearer(fresh)) for _ in range(5)))
    assert [r.status for r in responses] == [200] * 5
    assert jwks.fetches == 2
    # the old key is gone from the set: its tokens are refused once the set no longer has it
    response = await client.get("/v1/agents", headers=bearer(sign(old, "2024", **claims("alice"))))
    assert response.status == 401


async def test_jwt_from_a_key_file_and_an_hmac_secret(make_gateway: MakeGateway, tmp_path: Path) -> None:
    key = rsa_key()
    (tmp_path / "public.pem").write_bytes(public_pem(key))
    client = await make_gateway(overrides=jwt_section(key_file=str(tmp_path / "public.pem"), algorithms=["RS256"]))
    good = claims("alice")
    assert (await client.get("/v1/agents", headers=bearer(sign(key, None, **good)))).status == 200
    confused = hand_made({"alg": "HS256", "typ": "JWT"}, good, public_pem(key))
    assert (await client.get("/v1/agents", headers=bearer(confused))).status == 401
    # an HMAC secret file with HS256
    secret = uuid.uuid4().hex + uuid.uuid4().hex
    (tmp_path / "secret").write_text(secret + "\n")
    hs = await make_gateway(overrides=jwt_section(key_file=str(tmp_path / "secret"), algorithms=["HS256"]))
    token = jwt.encode(good, secret, algorithm="HS256")
    assert (await hs.get("/v1/agents", headers=bearer(token))).status == 200
    assert (await hs.get("/v1/agents", headers=bearer(jwt.encode(good, secret + "x", algorithm="HS256")))).status == 401


def test_jwt_configuration_problems_are_reported(tmp_path: Path) -> None:
    plugins = PluginHost.load(env={})
    specs = section_specs_from_hook(plugins.config_sections())
    config = Config.load(
        None,
        specs,
        env={},
        overrides={"auth_jwt": {"enabled": True, "algorithms": ["RS256", "HS256", "none"]}},
    )
    problems = "\n".join(config.problems())
    for expected in ("auth_jwt.issuer", "auth_jwt.audience", "auth_jwt.jwks_url", "'none'", "must not be mixed"):
        assert expected in problems, problems
    # An unreadable key stops start-up with its reason (authentication_enabled builds the verifier).
    (tmp_path / "private.pem").write_bytes(
        rsa_key().private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    config = Config.load(None, specs, env={}, overrides=jwt_section(key_file=str(tmp_path / "private.pem")))
    with pytest.raises(PluginError, match="private key"):
        plugins.authentication_required(config)
    # Off by default: no authentication, the local actor.
    assert not plugins.authentication_required(Config.load(None, specs, env={}))


async def test_jwt_bearer_works_with_the_openai_sdk_and_ag_ui(make_gateway: MakeGateway, jwks: Jwks) -> None:
    key = rsa_key()
    jwks.keys = [public_jwk(key, "k1")]
    client = await make_gateway(overrides=jwt_section(jwks_url=jwks.url))
    token = sign(key, "k1", **claims("alice"))
    sdk = openai.AsyncOpenAI(base_url=str(client.make_url("/v1")), api_key=token, max_retries=0, timeout=WAIT)
    try:
        completion = await sdk.chat.completions.create(
            model="chat-only", messages=[{"role": "user", "content": "hello there"}]
        )
        assert completion.choices[0].message.content
        with pytest.raises(openai.AuthenticationError):
            await openai.AsyncOpenAI(
                base_url=str(client.make_url("/v1")), api_key="not-a-token", max_retries=0, timeout=WAIT
            ).models.list()
    finally:
        await sdk.close()
    sessions = await (await client.get("/v1/sessions", headers=bearer(token))).json()
    assert len(sessions["sessions"]) == 1  # the SDK's run is alice's
    async with asyncio.timeout(WAIT):
        response = await client.post("/v1/ag-ui/chat-only", json=agui_input(), headers=bearer(token))
        raw = await response.read()
    assert response.status == 200, raw[:300]
    assert b"RUN_FINISHED" in raw
    assert (await client.post("/v1/ag-ui/chat-only", json=agui_input())).status == 401


def agui_input(text: str = "hello") -> dict[str, Any]:
    return {
        "threadId": "thread-" + uuid.uuid4().hex[:8],
        "runId": "run-" + uuid.uuid4().hex[:8],
        "messages": [{"id": "u1", "role": "user", "content": text}],
        "tools": [],
        "context": [],
        "state": {},
        "forwardedProps": {"agentGateway": {"workspaceId": "local:test"}},
    }


# -- the worked example of docs/auth.md ---------------------------------------------------------------

EXAMPLE = Path(__file__).resolve().parent.parent / "contrib" / "example-auth-plugin" / "api_keys.py"


async def test_the_api_key_example_from_the_docs(make_gateway: MakeGateway, tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("api_keys_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    database = tmp_path / "app.db"
    with closing(sqlite3.connect(database)) as db:
        db.execute(
            "CREATE TABLE api_keys (key_hash TEXT PRIMARY KEY, user_id TEXT NOT NULL,"
            " roles TEXT NOT NULL DEFAULT '', revoked INTEGER NOT NULL DEFAULT 0)"
        )
        for key, user, revoked in (("ak_ada_0123456789", "ada", 0), ("ak_zed_0123456789", "zed", 1)):
            digest = hashlib.sha256(key.encode()).hexdigest()
            db.execute("INSERT INTO api_keys VALUES (?, ?, 'writer', ?)", (digest, user, revoked))
        db.commit()
    roles: list[tuple[str, tuple[str, ...]]] = []

    class SeesRoles:
        @hookimpl
        def authorize(self, actor: Actor, action: str) -> None:
            roles.append((actor.id, actor.roles))

    # no [auth] tokens: configuring the plugin is what turns authentication on
    client = await make_gateway(
        overrides={"api_keys": {"database": str(database)}}, extra_plugins=(example, SeesRoles())
    )
    assert gateway_of(client).auth.required
    receipt, _events = await run_to_end(client, run_body(), headers=bearer("ak_ada_0123456789"))
    assert receipt["actorId"] == "ada"
    assert ("ada", ("writer",)) in roles
    for token in ("ak_zed_0123456789", "ak_nobody", "not-a-key"):  # revoked, unknown, not ours
        assert (await client.get("/v1/agents", headers=bearer(token))).status == 401
    # beside the static tokens, which still answer for bearers that are not API keys
    both = await make_gateway(
        overrides={"api_keys": {"database": str(database)}}, tokens={ALICE_TOKEN: "alice"}, extra_plugins=(example,)
    )
    assert (await created(both, ALICE_TOKEN))["actorId"] == "alice"
    assert (await created(both, "ak_ada_0123456789"))["actorId"] == "ada"


# -- every resource kind, denied one at a time -----------------------------------------------------------


async def test_a_denying_authorize_refuses_every_kind_of_resource(
    make_gateway: MakeGateway, fake_llm: FakeOpenAI, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """One row per kind the gateway serves (runs, sessions, workspaces, agents, tools,
    preferences, metrics, a plugin route, the OpenAI-compatible and AG-UI endpoints): with the
    one action of the row denied, that request is refused, and the same request is served once
    the policy allows it again."""

    class Hello:
        @hookimpl
        def register_routes(self, routes: PluginRoutes) -> None:
            async def hello(request: web.Request) -> web.Response:
                return web.json_response({"actor": routes.actor(request)})

            routes.add("GET", "/v1/hello", hello, openapi={"summary": "Say hello", "responses": {}})

    denied: set[str] = set()
    policy = Policy(lambda _actor, action, _resource: action in denied)
    client = await make_gateway(
        overrides={"workspaces": {"roots": {"ws": str(tmp_path)}}},
        tokens={ALICE_TOKEN: "alice"},
        extra_plugins=(policy, Hello()),
    )
    gateway = gateway_of(client)
    # chat-only stands in for an agent that calls tools (a tool-less agent's runs have every tool
    # capability off); set before the first run, which reads the agents' descriptions once
    chat = gateway.runtimes["chat-only"]
    described = chat.describe
    monkeypatch.setattr(chat, "describe", lambda: {**described(), "toolAccess": True})
    auth = bearer(ALICE_TOKEN)
    receipt = await created(client, ALICE_TOKEN, workspaceId="ws")
    run_id, session_id = receipt["hostRunId"], receipt["sessionId"]
    await gateway.runs.wait(run_id)
    workspace = receipt["workspaceId"]

    def sdk() -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(
            base_url=str(client.make_url("/v1")), api_key=ALICE_TOKEN, max_retries=0, timeout=WAIT
        )

    async def http(method: str, path: str, body: Any = None) -> int:
        async with asyncio.timeout(WAIT):
            response = await client.request(method, path, json=body, headers=auth)
            if response.status == 403:
                assert (await response.json())["error"]["code"] == "forbidden"
            response.close()  # a stream that was allowed is not read to its end
        return response.status

    async def openai_chat() -> int:
        async with sdk() as api:
            try:
                await api.chat.completions.create(model="chat-only", messages=[{"role": "user", "content": "hi"}])
            except openai.PermissionDeniedError as denial:
                return denial.status_code
        return 200

    async def openai_responses() -> int:
        async with sdk() as api:
            try:
                await api.responses.create(model="chat-only", input="hi")
            except openai.PermissionDeniedError as denial:
                return denial.status_code
        return 200

    async def openai_models() -> int:
        async with sdk() as api:
            try:
                await api.models.list()
            except openai.PermissionDeniedError as denial:
                return denial.status_code
        return 200

    rows: list[tuple[str, str, Callable[[], Awaitable[int]]]] = [
        ("runs", "runs:create", lambda: http("POST", "/v1/runs", run_body())),
        ("runs", "runs:read", lambda: http("GET", f"/v1/runs/{run_id}")),
        ("runs", "runs:read", lambda: http("GET", f"/v1/runs/{run_id}/events")),
        ("runs", "runs:read", lambda: http("GET", f"/v1/runs/{run_id}/stream")),
        ("runs", "runs:read", lambda: http("GET", f"/v1/runs/{run_id}/receipts")),
        ("runs", "runs:read", lambda: http("GET", f"/v1/runs/{run_id}/webhook")),
        ("runs", "runs:cancel", lambda: http("POST", f"/v1/runs/{run_id}/cancel")),
        ("runs", "runs:permission", lambda: http("POST", f"/v1/runs/{run_id}/permissions/p1", {"optionId": "x"})),
        ("sessions", "sessions:read", lambda: http("GET", "/v1/sessions")),
        ("sessions", "sessions:read", lambda: http("GET", f"/v1/sessions/{session_id}")),
        ("sessions", "sessions:read", lambda: http("GET", f"/v1/sessions/{session_id}/export")),
        ("sessions", "sessions:read", lambda: http("GET", f"/v1/sessions/{session_id}/active-run")),
        ("sessions", "sessions:write", lambda: http("PATCH", f"/v1/sessions/{session_id}", {"pinned": True})),
        ("sessions", "sessions:delete", lambda: http("DELETE", f"/v1/sessions/{session_id}/agent-session")),
        ("workspaces", "workspaces:read", lambda: http("GET", f"/v1/workspaces/{workspace}/events")),
        ("agents", "agents:read", lambda: http("GET", "/v1/agents/chat-only")),
        ("preferences", "preferences:read", lambda: http("GET", "/v1/preferences")),
        ("preferences", "preferences:write", lambda: http("PUT", "/v1/preferences", {"values": {}})),
        ("metrics", "metrics:read", lambda: http("GET", "/metrics")),
        ("plugin routes", "routes:call", lambda: http("GET", "/v1/hello")),
        ("OpenAI-compatible", "routes:call", openai_models),
        ("OpenAI-compatible", "routes:call", openai_chat),
        ("OpenAI-compatible", "runs:create", openai_chat),
        ("OpenAI-compatible", "runs:create", openai_responses),
        ("AG-UI", "routes:call", lambda: http("POST", "/v1/ag-ui/chat-only", agui_input())),
        ("AG-UI", "runs:create", lambda: http("POST", "/v1/ag-ui/chat-only", agui_input())),
        ("AG-UI", "routes:call", lambda: http("GET", f"/v1/ag-ui/runs/{run_id}/stream")),
    ]
    for kind, action, request in rows:
        denied.clear()
        denied.add(action)
        assert await request() == 403, (kind, action)
        denied.clear()
        assert await request() != 403, (kind, action)
    # The sessions' delete last: allowed, it deletes.
    denied.add("sessions:delete")
    assert await http("DELETE", f"/v1/sessions/{session_id}") == 403
    assert await http("POST", "/v1/sessions:delete", {"sessionIds": [session_id]}) == 403
    denied.clear()
    assert await http("DELETE", f"/v1/sessions/{session_id}") in (200, 204)

    # Tools: an agent's call over MCP (with its run's lease) is asked tools:call for the run's
    # actor; denied, the call fails with `forbidden` and its receipt says so.
    fake_llm.add(Reply(hang=True))
    seen = len(fake_llm.requests)
    holding = await created(client, ALICE_TOKEN, message="hold on", workspaceId="ws")
    await fake_llm.wait_for_requests(seen + 1, timeout=WAIT)  # the run is in its model call
    run = next(r for r in gateway.runs.active_runs() if r.host_run_id == holding["hostRunId"])
    lease = {"Authorization": f"Bearer {run_lease(gateway.mcp, run)}"}

    async def tool_call() -> dict[str, Any]:
        message = {"jsonrpc": "2.0", "id": 1, "method": "tools/call"}
        message["params"] = {"name": "workspace.describe_roots", "arguments": {}}
        async with asyncio.timeout(WAIT):
            response = await client.post(MCP_PATH, json=message, headers=lease)
            assert response.status == 200, await response.text()
            result: dict[str, Any] = (await response.json())["result"]
        return result

    policy.asked.clear()
    denied.add("tools:call")
    result = await tool_call()
    assert result["isError"] is True and result["content"][0]["text"].startswith("forbidden"), result
    [(actor_id, _action, resource)] = [q for q in policy.asked if q[1] == "tools:call"]
    assert actor_id == "alice"
    assert resource == {
        "type": "tool",
        "id": "workspace.describe_roots",
        "caller": "mcp",
        "runId": run.host_run_id,
        "agentId": "chat-only",
        "sessionId": run.session_id,
        "workspaceId": run.workspace_id,
    }
    denied.clear()
    allowed = await tool_call()
    assert allowed["isError"] is False, allowed
    assert (await client.post(f"/v1/runs/{run.host_run_id}/cancel", headers=auth)).status in (200, 202)
    await gateway.runs.wait(run.host_run_id)
    receipts = await (await client.get(f"/v1/runs/{run.host_run_id}/receipts", headers=auth)).json()
    codes = [r.get("errorCode") for r in receipts["receipts"]]
    assert codes == ["forbidden", None], receipts


async def test_tool_calls_are_asked_with_the_claims_the_actor_created_its_run_with(
    make_gateway: MakeGateway, fake_llm: FakeOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    keys = ApiKeys(
        {
            "key-ada": Actor("ada", {"roles": ["no-tools"]}),
            "key-bob": Actor("bob", {"roles": ["writer"]}),
            "key-eve": Actor("eve", {"roles": ["breaks-the-policy"]}),
        }
    )

    def deny(actor: Actor, action: str, _resource: dict[str, Any]) -> bool:
        if action == "tools:call" and "breaks-the-policy" in actor.roles:
            raise RuntimeError("the policy service is down")
        return action == "tools:call" and "no-tools" in actor.roles

    policy = Policy(deny)
    client = await make_gateway(extra_plugins=(keys, policy))
    gateway = gateway_of(client)
    chat = gateway.runtimes["chat-only"]
    described = chat.describe
    monkeypatch.setattr(chat, "describe", lambda: {**described(), "toolAccess": True})
    answers: dict[str, str] = {}
    for key in ("key-ada", "key-bob", "key-eve"):
        fake_llm.add(Reply(hang=True))
        seen = len(fake_llm.requests)
        receipt = await created(client, key, message="hold on")
        await fake_llm.wait_for_requests(seen + 1, timeout=WAIT)
        run = next(r for r in gateway.runs.active_runs() if r.host_run_id == receipt["hostRunId"])
        try:
            await gateway.tools.call("workspace.describe_roots", {}, gateway.tools.scope_for(run))
            answers[run.actor_id] = "ok"
        except ToolError as error:
            answers[run.actor_id] = error.code
        assert (await client.post(f"/v1/runs/{run.host_run_id}/cancel", headers=bearer(key))).status in (200, 202)
        await gateway.runs.wait(run.host_run_id)
    assert answers["ada"] == "forbidden"
    assert answers["bob"] == "ok"
    assert answers["eve"] == "forbidden"  # a policy that raises fails closed
