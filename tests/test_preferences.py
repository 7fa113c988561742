"""GET/PUT /v1/preferences: scopes, validation against the descriptor fields, storage through the
storage hook, isolation between actors."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from agent_gateway.descriptors import DescriptorRegistry, FieldError, FieldSpec
from agent_gateway.hookspecs import hookimpl
from tests._descriptors import (
    ALICE,
    BOB,
    MakeClient,
    ToolAgent,
    ToolAgentPlugin,
    agents_of,
    make_client_fixture,  # noqa: F401  (the fixture `make_client`)
    put_prefs,
)


async def test_two_actors_see_only_their_own(make_client: MakeClient) -> None:
    client = await make_client(extra=(ToolAgentPlugin(ToolAgent()),))
    await put_prefs(client, ALICE, {"ai.common.defaultAgent": "tool-agent", "ai.agent.tool-agent.model": "alice-m"})
    await put_prefs(client, BOB, {"ai.common.defaultAgent": "chat-only"})
    alice = await (await client.get("/v1/preferences", headers=ALICE)).json()
    bob = await (await client.get("/v1/preferences", headers=BOB)).json()
    assert alice["schema"] == "gateway.preferences.v1" and alice["actorId"] == "alice"
    assert alice["values"] == {"ai.common.defaultAgent": "tool-agent", "ai.agent.tool-agent.model": "alice-m"}
    assert bob["values"] == {"ai.common.defaultAgent": "chat-only"}
    # descriptors merge each actor's own values
    from tests._descriptors import agents_of

    alice_model = next(
        f for f in (await agents_of(client, ALICE))["tool-agent"]["fields"] if f["key"] == "ai.agent.tool-agent.model"
    )
    bob_model = next(
        f for f in (await agents_of(client, BOB))["tool-agent"]["fields"] if f["key"] == "ai.agent.tool-agent.model"
    )
    assert alice_model["value"] == "alice-m" and alice_model["isSet"] is True
    assert bob_model["value"] == "m" and bob_model["isSet"] is False
    # unauthenticated: refused
    assert (await client.get("/v1/preferences")).status == 401


async def test_validation_errors_are_clear_400s(make_client: MakeClient) -> None:
    client = await make_client(extra=(ToolAgentPlugin(ToolAgent()),))
    cases = [
        ({"ai.common.nope": 1}, "unknown_preference"),
        ({"ai.agent.ghost.model": "x"}, "unknown_preference"),
        ({"theme": "dark"}, "unknown_preference"),
        ({"ai.common.capabilities.knowledge_rag.enabled": "no"}, "invalid_preference"),
        ({"ai.common.defaultAgent": "ghost"}, "invalid_preference"),
        ({"ai.common.defaultContextRefs": "current_page"}, "invalid_preference"),
        ({"ai.common.knowledge_rag.topK": 2.5}, "invalid_preference"),
        ({"ai.common.knowledge_rag.mode": "telepathy"}, "invalid_preference"),
    ]
    for values, code in cases:
        body = await put_prefs(client, ALICE, values, status=400)
        assert body["error"]["code"] == code, (values, body)
        assert next(iter(values))[:40] in body["error"]["message"]
    for bad in ({}, {"values": []}, {"values": {}, "extra": 1}):
        response = await client.put("/v1/preferences", json=bad, headers=ALICE)
        assert response.status == 400, bad
    # nothing was stored by the refused updates
    assert (await (await client.get("/v1/preferences", headers=ALICE)).json())["values"] == {}


async def test_merge_and_remove_with_null(make_client: MakeClient) -> None:
    client = await make_client(extra=(ToolAgentPlugin(ToolAgent()),))
    await put_prefs(client, ALICE, {"ai.common.knowledge_rag.topK": 5, "ai.agent.tool-agent.model": "x"})
    body = await put_prefs(
        client, ALICE, {"ai.common.knowledge_rag.topK": None, "ai.common.knowledge_rag.mode": "naive"}
    )
    assert body["values"] == {"ai.agent.tool-agent.model": "x", "ai.common.knowledge_rag.mode": "naive"}
    from agent_gateway.app import GATEWAY_KEY

    stored = client.app[GATEWAY_KEY].storage.get_preferences("alice")
    assert stored == {"ai.agent.tool-agent.model": "x", "ai.common.knowledge_rag.mode": "naive"}


async def test_local_actor_without_tokens(make_client: MakeClient) -> None:
    client = await make_client(tokens=None, extra=(ToolAgentPlugin(ToolAgent()),))
    body = await put_prefs(client, {}, {"ai.agent.tool-agent.debugTrace": True})  # the local actor is admin
    assert body["actorId"] == "local" and body["values"] == {"ai.agent.tool-agent.debugTrace": True}


async def test_runs_read_preferences_from_memory_and_see_every_update(make_client: MakeClient) -> None:
    """A run's defaults come from the actor's preferences without a storage read per run (one
    worker trip less before its first event), and an update is seen by the next run at once."""
    from agent_gateway.app import GATEWAY_KEY

    client = await make_client(extra=(ToolAgentPlugin(ToolAgent()),))
    gateway = client.app[GATEWAY_KEY]
    storage_reads: list[str] = []
    read = gateway.storage.get_preferences

    def counting_read(actor_id: str) -> dict[str, object]:
        storage_reads.append(actor_id)
        return read(actor_id)

    gateway.storage.get_preferences = counting_read  # type: ignore[method-assign]
    body = {"message": "hi", "requestId": "r", "sessionId": "s"}
    assert (await gateway.preferences.apply_run_defaults("alice", body)).get("agentId") is None
    assert (await gateway.preferences.apply_run_defaults("alice", body)).get("agentId") is None
    assert storage_reads == ["alice"]  # read once, then from memory

    await put_prefs(client, ALICE, {"ai.common.defaultAgent": "tool-agent", "ai.agent.tool-agent.model": "big"})
    filled = await gateway.preferences.apply_run_defaults("alice", body)
    assert filled["agentId"] == "tool-agent" and filled["options"] == {"model": "big"}
    await put_prefs(client, ALICE, {"ai.common.defaultAgent": "chat-only", "ai.agent.tool-agent.model": None})
    assert (await gateway.preferences.apply_run_defaults("alice", body))["agentId"] == "chat-only"
    assert (await gateway.preferences.apply_run_defaults("alice", {**body, "agentId": "tool-agent"})).get(
        "options"
    ) is None
    assert storage_reads == ["alice"]  # the updates went to memory as they went to storage
    assert (await gateway.preferences.apply_run_defaults("bob", body)).get("agentId") is None
    assert storage_reads == ["alice", "bob"]  # each actor read once

    # The values handed out are copies: a caller changing them changes nothing stored.

    (await gateway.preferences.load_values("alice"))["ai.common.defaultAgent"] = "tool-agent"
    assert (await gateway.preferences.apply_run_defaults("alice", body))["agentId"] == "chat-only"


# -- settings fields with a declared JSON Schema ------------------------------------------------------


class SchemaFields:
    """Declares fields whose values must also fit a JSON Schema, with keywords the gateway used to
    ignore: $ref/$defs, allOf, not, const, if/then, uniqueItems, format."""

    @hookimpl
    def register_setting_fields(self, register: Callable[[dict[str, Any]], None], config: Any) -> None:
        fields: dict[str, tuple[str, dict[str, Any]]] = {
            "ref": ("string", {"$defs": {"slug": {"pattern": "^[a-z-]+$"}}, "$ref": "#/$defs/slug"}),
            "allOf": ("integer", {"allOf": [{"minimum": 1}, {"maximum": 10}]}),
            "not": ("string", {"not": {"const": "root"}}),
            "const": ("boolean", {"const": True}),
            "ifThen": ("string", {"if": {"pattern": "^https:"}, "then": {"maxLength": 20}}),
            "unique": ("string_list", {"uniqueItems": True}),
            "email": ("string", {"format": "email"}),
        }
        for name, (kind, schema) in fields.items():
            register({"key": f"ai.common.test.{name}", "label": name, "kind": kind, "schema": schema})


SCHEMA_CASES = [
    ("ref", "my-space", "My Space", "ai.common.test.ref does not match ^[a-z-]+$"),
    ("allOf", 10, 11, "ai.common.test.allOf must be at most 10"),
    ("not", "home", "root", 'ai.common.test.not must not match {"const": "root"}'),
    ("const", True, False, "ai.common.test.const must be True"),
    ("ifThen", "https://a.example", "https://" + "a" * 20, "ai.common.test.ifThen is longer than 20 characters"),
    ("unique", ["a", "b"], ["a", "a"], "ai.common.test.unique must not hold the same item twice"),
    ("email", "a@example.org", "nobody", "ai.common.test.email is not a valid email"),
]


async def test_declared_schemas_are_enforced(make_client: MakeClient) -> None:
    client = await make_client(extra=(SchemaFields(),))
    for name, good, bad, message in SCHEMA_CASES:
        key = f"ai.common.test.{name}"
        body = await put_prefs(client, ALICE, {key: bad}, status=400)
        assert body["error"]["code"] == "invalid_preference", body
        assert body["error"]["message"] == message
        assert body["error"]["key"] == key
        assert (await put_prefs(client, ALICE, {key: good}))["values"][key] == good
    # the kind still comes first, in its own words
    body = await put_prefs(client, ALICE, {"ai.common.test.allOf": "3"}, status=400)
    assert body["error"]["message"] == "ai.common.test.allOf must be an integer (64-bit)"
    # the descriptor shows the declared schema, the served OpenAPI document enforces it too
    fields = {f["key"]: f for f in (await agents_of(client, ALICE))["chat-only"]["fields"]}
    assert fields["ai.common.test.allOf"]["schema"] == {"allOf": [{"minimum": 1}, {"maximum": 10}]}
    served = await (await client.get("/openapi.json", headers=ALICE)).json()
    allof = served["components"]["schemas"]["PreferenceValues"]["properties"]["ai.common.test.allOf"]
    assert allof["anyOf"][0] == {"type": "null"} and allof["anyOf"][1]["allOf"][1]["allOf"][1] == {"maximum": 10}
    ref = served["components"]["schemas"]["PreferenceValues"]["properties"]["ai.common.test.ref"]["anyOf"][1]
    validator = Draft202012Validator(ref)  # the served schema keeps its $ref working: its own $id
    assert validator.is_valid("my-space") and not validator.is_valid("My Space")


def test_an_invalid_field_schema_is_refused_at_declaration(caplog: pytest.LogCaptureFixture) -> None:
    """Refused when the descriptors are built, naming the field (and the agent for its own
    fields), rather than ignored on every write."""
    bad_plugin_field = {"key": "ai.common.test.n", "kind": "integer", "schema": {"minimum": "one"}}
    with pytest.raises(ValueError, match=r"settings field 'ai.common.test.n': schema is not a valid JSON Schema"):
        DescriptorRegistry({}, {}, [bad_plugin_field])
    typo = {"key": "ai.common.test.n", "kind": "integer", "schema": {"maximun": 3}}
    with pytest.raises(ValueError, match=r"at /: Unevaluated properties are not allowed \('maximun' was unexpected\)"):
        DescriptorRegistry({}, {}, [typo])

    class Agent:
        def describe(self) -> dict[str, Any]:
            return {"fields": [{"key": "depth", "kind": "integer", "schema": {"type": "integer", "enum": 3}}]}

    with caplog.at_level(logging.WARNING, logger="agent_gateway.descriptors"):
        registry = DescriptorRegistry({"deep": Agent()}, {}, [])
    assert registry.field("ai.agent.deep.depth") is None  # a runtime's bad field is left out, said once
    assert "agent deep declares a bad field: settings field 'ai.agent.deep.depth' of agent 'deep'" in caplog.text


def test_field_values_are_checked_by_one_cached_validator() -> None:
    spec = FieldSpec.from_declaration({"key": "ai.common.x", "kind": "string_list", "options": ["a", "b"]})
    assert spec.value_schema == {"type": "array", "items": {"type": "string", "enum": ["a", "b"]}, "maxItems": 100}
    assert spec.check(["a"]) == ["a"]
    with pytest.raises(FieldError, match=r"ai.common.x: 'c' is not one of 'a', 'b'"):
        spec.check(["a", "c"])
    with pytest.raises(FieldError, match=r"must be a list of strings \(at most 100\)"):
        spec.check(["a"] * 101)
    again = FieldSpec.from_declaration({"key": "ai.common.y", "kind": "string_list", "options": ["a", "b"]})
    assert again._kind_validator is spec._kind_validator  # the same schema: checked and built once
