"""Agent descriptors (gateway.agent_descriptor.v1): merged from the runtimes' static registry,
the tool manifest, plugin-declared fields, capability states, the negotiated policy and the
calling actor's preferences; secrets masked, admin fields filtered on the server, a disabled
capability absent and its tools disabled, and the run-time check real (the tool refuses)."""

from __future__ import annotations

import logging

import pytest

from agent_gateway.app import GATEWAY_KEY
from agent_gateway.models import Run
from tests._descriptors import (
    ALICE,
    BOB,
    MakeClient,
    ToolAgent,
    ToolAgentPlugin,
    agents_of,
    make_client_fixture,  # noqa: F401  (fixtures)
    put_prefs,
)

SECRET_VALUE = "sk-very-secret-value-4242"


# -- harness (also used by test_preferences.py and test_lightrag.py) ------------------------------------


# -- tests ------------------------------------------------------------------------------------------------


async def test_descriptor_has_every_part(make_client: MakeClient) -> None:
    client = await make_client(extra=(ToolAgentPlugin(ToolAgent()),))
    agents = await agents_of(client, ALICE)
    assert {"chat-only", "tool-agent"} <= set(agents)
    agent = agents["tool-agent"]
    assert agent["schema"] == "gateway.agent_descriptor.v1"
    assert agent["displayName"] == "Tool agent" and agent["provider"] == "test"
    assert "knowledge_rag" in agent["capabilities"] and "workspace.read" in agent["capabilities"]
    assert agent["capabilityStates"]["knowledge_rag"] == {"enabled": True, "source": "default"}
    assert agent["settingScopes"] == ["ai.common", "ai.agent.tool-agent"]
    assert agent["defaultContextRefs"] == ["current_page"]
    assert agent["policy"]["mcpHttp"] is True and agent["policy"]["contextCarrier"] == "transcript_rebuild"
    assert agent["availability"]["available"] is True
    tools = {t["name"]: t for t in agent["tools"]}
    for name in ("knowledge_rag.status", "knowledge_rag.query", "knowledge_rag.open_reference"):
        assert tools[name] == {"name": name, "capabilityIds": ["knowledge_rag"], "enabled": True}
    assert tools["workspace.read_file"]["enabled"] is True
    fields = {f["key"]: f for f in agent["fields"]}
    for key in (
        "ai.common.defaultAgent",
        "ai.common.defaultContextRefs",
        "ai.common.capabilities.knowledge_rag.enabled",
        "ai.agent.tool-agent.capabilities.knowledge_rag.enabled",
        "ai.agent.tool-agent.model",
        "ai.common.knowledge_rag.mode",  # declared by the lightrag plugin, not by the core
        "ai.common.knowledge_rag.topK",
    ):
        assert key in fields, key
        assert {"key", "label", "kind", "default", "optionsSource", "auth", "secret"} <= set(fields[key])
    assert fields["ai.common.defaultAgent"]["kind"] == "select"
    assert fields["ai.common.defaultAgent"]["optionsSource"] == "agents"
    assert fields["ai.common.knowledge_rag.mode"]["options"] == ["naive", "local", "global", "hybrid", "mix"]
    assert fields["ai.agent.tool-agent.model"] == {
        **fields["ai.agent.tool-agent.model"],
        "kind": "string",
        "auth": "user",
    }
    # a chat-only agent reaches no tools: it lists none and has no tool capabilities
    chat = agents["chat-only"]
    assert chat["tools"] == [] and chat["toolAccess"] is False
    assert "knowledge_rag" not in chat["capabilities"]
    # one agent
    response = await client.get("/v1/agents/tool-agent", headers=ALICE)
    assert (await response.json())["agentId"] == "tool-agent"
    missing = await client.get("/v1/agents/nope", headers=ALICE)
    assert missing.status == 404


async def test_secret_never_in_clear_in_any_response_or_log(
    make_client: MakeClient, caplog: pytest.LogCaptureFixture
) -> None:
    # Every gateway logger at DEBUG; third-party loggers at INFO (peewee logs SQL parameters at
    # DEBUG, preference values included: keep the `peewee` logger above DEBUG in production).
    caplog.set_level(logging.INFO)
    caplog.set_level(logging.DEBUG, logger="gateway")
    client = await make_client(extra=(ToolAgentPlugin(ToolAgent()),))
    put = await put_prefs(
        client, ALICE, {"ai.agent.tool-agent.apiKey": SECRET_VALUE, "ai.agent.tool-agent.model": "big"}
    )
    texts = [str(put)]
    assert put["secrets"] == {"ai.agent.tool-agent.apiKey": {"isSet": True}}
    assert put["values"] == {"ai.agent.tool-agent.model": "big"}
    for path in ("/v1/preferences", "/v1/agents", "/v1/agents/tool-agent"):
        response = await client.get(path, headers=ALICE)
        texts.append(await response.text())
    field = next(
        f for f in (await agents_of(client, ALICE))["tool-agent"]["fields"] if f["key"] == "ai.agent.tool-agent.apiKey"
    )
    assert field["secret"] is True and field["isSet"] is True and "value" not in field and field["default"] is None
    # a bad update naming the secret does not echo it either
    bad = await client.put("/v1/preferences", json={"values": {"ai.agent.tool-agent.apiKey": 5}}, headers=ALICE)
    texts.append(await bad.text())
    assert bad.status == 400
    texts.append(caplog.text)
    assert all(SECRET_VALUE not in text for text in texts)
    # it is stored (server-side use) for the actor only
    gateway = client.app[GATEWAY_KEY]
    assert gateway.storage.get_preferences("alice")["ai.agent.tool-agent.apiKey"] == SECRET_VALUE


async def test_admin_fields_filtered_on_the_server(make_client: MakeClient) -> None:
    client = await make_client(admins=["alice"], extra=(ToolAgentPlugin(ToolAgent()),))
    alice = {f["key"] for f in (await agents_of(client, ALICE))["tool-agent"]["fields"]}
    bob = {f["key"] for f in (await agents_of(client, BOB))["tool-agent"]["fields"]}
    assert "ai.agent.tool-agent.debugTrace" in alice
    assert "ai.agent.tool-agent.debugTrace" not in bob
    await put_prefs(client, ALICE, {"ai.agent.tool-agent.debugTrace": True})
    refused = await put_prefs(client, BOB, {"ai.agent.tool-agent.debugTrace": True}, status=403)
    assert refused["error"]["code"] == "admin_only"


async def test_disabling_knowledge_changes_descriptor_and_tool_refuses_at_run_time(make_client: MakeClient) -> None:
    from tests._harness import run_to_end

    client = await make_client(extra=(ToolAgentPlugin(ToolAgent(arguments={"query": "what is the widget"})),))
    before = (await agents_of(client, ALICE))["tool-agent"]
    assert "knowledge_rag" in before["capabilities"]
    await put_prefs(client, ALICE, {"ai.common.capabilities.knowledge_rag.enabled": False})
    after = (await agents_of(client, ALICE))["tool-agent"]
    assert "knowledge_rag" not in after["capabilities"]
    assert after["capabilityStates"]["knowledge_rag"] == {
        "enabled": False,
        "source": "ai.common.capabilities.knowledge_rag.enabled",
    }
    tools = {t["name"]: t for t in after["tools"]}
    assert tools["knowledge_rag.query"]["enabled"] is False
    assert tools["knowledge_rag.query"]["disabledBy"] == ["ai.common.capabilities.knowledge_rag.enabled"]
    assert tools["workspace.read_file"]["enabled"] is True
    mode_field = next(f for f in after["fields"] if f["key"] == "ai.common.knowledge_rag.mode")
    assert mode_field["disabled"] is True
    # bob is untouched
    assert "knowledge_rag" in (await agents_of(client, BOB))["tool-agent"]["capabilities"]

    # run time: whatever the client cached, the server resolves the scope when the run starts
    body = {
        "requestId": "r1",
        "agentId": "tool-agent",
        "sessionId": "s1",
        "workspaceId": "local:test",
        "message": "knowledge_rag.query",
    }
    _, events = await run_to_end(client, body, headers=ALICE)
    failed = [e["data"]["payload"] for e in events if e["event"] == "tool.completed"]
    assert any(p.get("error", {}).get("code") == "capability_disabled" for p in failed), failed
    assert events[-1]["event"] == "run.completed"  # the run goes on

    # an agent-scope switch wins over the common one
    await put_prefs(client, ALICE, {"ai.agent.tool-agent.capabilities.knowledge_rag.enabled": True})
    gateway = client.app[GATEWAY_KEY]
    assert "knowledge_rag" not in await gateway.preferences.disabled_capabilities("alice", "tool-agent")
    assert "knowledge_rag" in await gateway.preferences.disabled_capabilities("alice", "chat-only")  # no tool access


async def test_run_defaults_from_preferences(make_client: MakeClient) -> None:
    client = await make_client(extra=(ToolAgentPlugin(ToolAgent()),))
    gateway = client.app[GATEWAY_KEY]
    await put_prefs(
        client,
        ALICE,
        {
            "ai.common.defaultAgent": "tool-agent",
            "ai.common.defaultContextRefs": ["current_page", "selection"],
            "ai.agent.tool-agent.model": "big",
        },
    )
    body = await gateway.preferences.apply_run_defaults("alice", {"message": "hi", "requestId": "r", "sessionId": "s"})
    assert body["agentId"] == "tool-agent"
    assert body["context"]["refs"] == ["current_page", "selection"]
    assert body["options"] == {"model": "big"}
    kept = await gateway.preferences.apply_run_defaults("alice", {"agentId": "chat-only", "options": {"model": "x"}})
    assert kept["agentId"] == "chat-only" and kept["options"] == {"model": "x"}
    assert (await gateway.preferences.apply_run_defaults("bob", {"message": "hi"})).get("agentId") is None
    descriptor = (await agents_of(client, ALICE))["tool-agent"]
    assert descriptor["isDefault"] is True and descriptor["defaultContextRefs"] == ["current_page", "selection"]


async def test_scope_for_a_run_without_preferences_has_nothing_disabled(make_client: MakeClient) -> None:
    client = await make_client(extra=(ToolAgentPlugin(ToolAgent()),))
    gateway = client.app[GATEWAY_KEY]
    assert await gateway.preferences.disabled_capabilities("carol", "tool-agent") == frozenset()
    run = Run(
        host_run_id="run_x",
        request_id="r",
        agent_id="tool-agent",
        provider="test",
        session_id="s",
        actor_id="carol",
        workspace_id="local:test",
    )
    scope = gateway.tools.scope_for(run, disabled_capabilities=frozenset({"knowledge_rag"}))
    names = {t["name"] for t in gateway.tools.list_tools(scope)}
    assert "knowledge_rag.query" not in names and "workspace.read_file" in names
