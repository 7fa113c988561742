"""The example runtime's own tests, on the fixtures agent-gateway installs for plugin authors
(``agent_gateway.testing``): a real gateway with this plugin loaded, driven over HTTP."""

from __future__ import annotations

from importlib import metadata

import agent_gateway_example
import pytest

from agent_gateway.testing import GatewayClient, GatewayHTTPError


@pytest.fixture
def agw_plugins() -> list[object]:
    # Loaded by its entry point once installed; naming it here also covers a source checkout.
    return [agent_gateway_example]


def test_a_run_streams_the_message_upper_cased(agw_client: GatewayClient) -> None:
    result = agw_client.run("hello plugin", agent_id="example-upper")

    assert result.kinds[0] == "run.created" and result.status == "completed"
    assert [e.payload["text"] for e in result.events if e.event == "message.delta"] == ["HELL", "O PL", "UGIN"]
    assert result.payloads("message.completed") == [{"text": "HELLO PLUGIN"}]
    assert {e.source for e in result.events if e.event.startswith("message.")} == {"example-upper"}
    # What the stream delivered is what the journal stored.
    stored = agw_client.events(result.host_run_id)
    assert [e["kind"] for e in stored] == result.kinds
    assert agw_client.get_run(result.host_run_id)["status"] == "completed"


@pytest.mark.agw_config(example_upper={"prefix": "> ", "chunk_size": 100})
def test_the_configuration_section_shapes_the_reply(agw_client: GatewayClient) -> None:
    result = agw_client.run("configured", agent_id="example-upper")
    assert result.text == "> CONFIGURED"
    assert result.payloads("message.delta") == [{"text": "> CONFIGURED"}]


@pytest.mark.agw_config(example_upper={"delay": 60.0})
def test_cancel_stops_the_reply_at_once(agw_client: GatewayClient) -> None:
    receipt = agw_client.create_run("a reply too slow to wait for", agent_id="example-upper")
    kinds = []
    for event in agw_client.stream(receipt["hostRunId"], timeout=30):
        kinds.append(event.event)
        if event.event == "message.delta":  # the first chunk is out; the runtime now waits
            assert agw_client.cancel(receipt["hostRunId"])["hostRunId"] == receipt["hostRunId"]

    assert kinds.count("message.delta") == 1
    assert kinds[-1] == "run.cancelled" and "message.completed" not in kinds
    assert agw_client.get_run(receipt["hostRunId"])["status"] == "cancelled"


def test_the_descriptor(agw_client: GatewayClient) -> None:
    descriptor = agw_client.agent("example-upper")

    assert descriptor["displayName"] == "Example: upper-case echo"
    assert descriptor["provider"] == "example"
    assert descriptor["capabilities"] == ["chat"]
    assert descriptor["availability"] == {"available": True}
    assert descriptor["policy"]["contextCarrier"] == "transcript_rebuild"
    assert descriptor["toolAccess"] is False and descriptor["tools"] == []
    [prefix] = [f for f in descriptor["fields"] if f["key"] == "ai.agent.example-upper.prefix"]
    assert (prefix["kind"], prefix["default"], prefix["label"]) == ("string", "", "Prefix")


@pytest.mark.agw_config(example_upper={"enabled": False})
def test_disabled_it_registers_no_agent(agw_client: GatewayClient) -> None:
    assert "example-upper" not in {a["agentId"] for a in agw_client.agents()}
    with pytest.raises(GatewayHTTPError) as refused:
        agw_client.create_run("hello", agent_id="example-upper")
    assert refused.value.status == 400


def test_the_distribution_declares_its_entry_point() -> None:
    """Installed (pip install .), the gateway finds the plugin by this entry point alone."""
    [entry_point] = [ep for ep in metadata.entry_points(group="agent_gateway") if ep.name == "example_upper"]
    assert entry_point.load() is agent_gateway_example
    assert entry_point.dist is not None and entry_point.dist.name == "agent-gateway-example-runtime"
