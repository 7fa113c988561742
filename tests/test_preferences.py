"""GET/PUT /v1/preferences: scopes, validation against the descriptor fields, storage through the
storage hook, isolation between actors."""

from __future__ import annotations

from tests._descriptors import (
    ALICE,
    BOB,
    MakeClient,
    ToolAgent,
    ToolAgentPlugin,
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
