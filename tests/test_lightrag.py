"""The knowledge facade against the real LightRAG server (``lightrag-hku`` 1.5.7, installed by
``contrib/peers/install.sh lightrag``), driven by the contrib fake LLM and embeddings.

Index two documents from a workspace root through the gateway, query through the tools and the
HTTP routes, get references mapped to the workspace paths with citation fields, filter them with
sourcePaths, open references precisely or degraded; a turn whose agent calls
``knowledge_rag.query`` carries the citations in the run's events; stopping the server mid-query
gives a clear tool error and the run goes on. No response contains the provider's URL, ``file://``
or its storage folder.

The server binary is ``$LIGHTRAG_SERVER_BIN`` or ``~/.cache/agent-gateway/peers/bin/lightrag-server``;
tiktoken's file is in ``$TIKTOKEN_CACHE_DIR`` or ``~/.cache/agent-gateway/peers/tiktoken``. Missing:
the tests FAIL (run ``contrib/peers/install.sh lightrag``).
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestClient, TestServer

import agent_gateway.testing.fake_openai.server as fake_server
from agent_gateway.app import GATEWAY_KEY
from agent_gateway.config import Config
from agent_gateway.models import Run
from agent_gateway.plugins.lightrag import service_of
from agent_gateway.plugins.lightrag.mapping import encode_source
from agent_gateway.plugins.lightrag.service import Where, wait_processed
from agent_gateway.testing.fake_openai import FakeOpenAI
from agent_gateway.tools import RunScope, ToolError
from tests._descriptors import ToolAgent, ToolAgentPlugin, build_app, plugin_host
from tests._harness import run_to_end
from tests._lightrag import (
    API_KEY,
    EMBEDDING_DIM,
    OTHER_WIDGET,
    WAIT,
    WIDGET,
    WORKSPACE,
    ZEBRA,
    LightRAG,
    LlmScript,
    Seen,
    bag_of_words,
    index,
    start_lightrag,
    where,
)

pytestmark = pytest.mark.peers

# -- the fake LLM's answers to LightRAG's prompts ----------------------------------------------------


# -- the LightRAG server ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def llm() -> Iterator[tuple[FakeOpenAI, LlmScript]]:
    original = fake_server._embedding
    fake_server._embedding = bag_of_words  # type: ignore[assignment]
    script = LlmScript()
    fake = FakeOpenAI(default=script, embedding_dim=EMBEDDING_DIM)
    fake.start_in_thread()
    try:
        yield fake, script
    finally:
        fake.stop_thread()
        fake_server._embedding = original  # type: ignore[assignment]


@pytest.fixture(scope="module")
def rag(llm: tuple[FakeOpenAI, LlmScript], tmp_path_factory: pytest.TempPathFactory) -> Iterator[LightRAG]:
    server = start_lightrag(tmp_path_factory.mktemp("lightrag"), llm[0].base_url)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    ws = tmp_path_factory.mktemp("ws")
    for rel, text in (("notes/widget.md", WIDGET), ("research/zebra.md", ZEBRA), ("other/widget.md", OTHER_WIDGET)):
        (ws / rel).parent.mkdir(parents=True, exist_ok=True)
        (ws / rel).write_text(text)
    return ws


async def gateway_client(rag: LightRAG, workspace: Path, data: Path) -> TestClient:
    config = Config.load(
        None,
        env={},
        overrides={
            "gateway": {"data_dir": str(data)},
            "chat_only": {"base_url": "http://127.0.0.1:9/v1", "model": "m"},
            "workspaces": {"roots": {WORKSPACE: str(workspace)}},
            "lightrag": {"url": rag.url, "api_key": API_KEY, "mode": "mix", "timeout_seconds": 60.0},
        },
    )
    agent = ToolAgent("kb-agent", arguments={"query": "Compare the Acme Widget and the striped zebra"})
    client = TestClient(TestServer(build_app(config, plugin_host(ToolAgentPlugin(agent)))))
    await client.start_server()
    return client


@pytest.fixture
async def client(rag: LightRAG, workspace: Path, tmp_path: Path) -> AsyncIterator[TestClient]:
    made = await gateway_client(rag, workspace, tmp_path / "gw")
    try:
        yield made
    finally:
        await made.close()


def scope_of(client: TestClient, actor: str = "local", roots: list[str] | None = None) -> RunScope:
    gateway = client.app[GATEWAY_KEY]
    run = Run(
        host_run_id="run_" + os.urandom(6).hex(),
        request_id="r",
        agent_id="kb-agent",
        provider="test",
        session_id="s",
        actor_id=actor,
        workspace_id=WORKSPACE,
        request={"message": "x", "context": {"allowedRoots": roots if roots is not None else [""]}},
    )
    return gateway.tools.scope_for(run)


# -- tests ------------------------------------------------------------------------------------------------


async def test_index_query_filter_open(client: TestClient, rag: LightRAG, workspace: Path) -> None:
    seen = Seen(rag)
    gateway = client.app[GATEWAY_KEY]
    status = seen.add(await (await client.get("/v1/knowledge/status")).json())
    assert status["configured"] is True and status["available"] is True, status
    assert status["providerVersion"] == "1.5.7"

    await index(client, seen, ["notes/widget.md", "research/zebra.md"])
    listed = seen.add(await (await client.get("/v1/knowledge/documents", params={"workspaceId": WORKSPACE})).json())
    assert {d["sourcePath"] for d in listed["documents"]} >= {"notes/widget.md", "research/zebra.md"}

    # the tool, through the facade (validation, receipt)
    scope = scope_of(client)
    result = seen.add(
        await gateway.tools.call(
            "knowledge_rag.query", {"query": "Compare the Acme Widget and the striped zebra"}, scope, caller="test"
        )
    )
    assert result["schema"] == "gateway.knowledge_rag.query_result.v1"
    assert result["sourceScopeMode"] == "post_filter_mapped_references"
    assert "after retrieval" in result["sourceScope"]["description"]
    assert result["answer"].startswith("The Acme Widget is blue")
    refs = {r["sourcePath"]: r for r in result["references"]}
    assert set(refs) == {"notes/widget.md", "research/zebra.md"}, result["references"]
    widget = refs["notes/widget.md"]
    assert widget["schema"] == "gateway.knowledge_rag.reference.v1"
    assert widget["citationUrl"].startswith("agent-gateway://workspace/local%3Atest/notes/widget.md")
    assert widget["citationMarkdown"].startswith("[notes/widget.md")
    assert widget["citationUrl"] in widget["citationMarkdown"]
    # the chunk is the whole (short) file, found as it is: a precise line locator
    assert widget["locatorDegraded"] is False, widget
    assert widget["locator"] == {"kind": "lines", "startLine": 1, "endLine": 4}
    assert widget["citationUrl"].endswith("#L1-L4")
    # the answer's reference list names workspace paths, not the provider's file names
    assert "notes/widget.md" in result["answer"] and "%2F" not in result["answer"]
    assert result["citations"] == [r["citationMarkdown"] for r in result["references"]]
    receipts = gateway.storage.list_receipts(scope.run.host_run_id)
    assert [r["tool"] for r in receipts] == ["knowledge_rag.query"] and receipts[0]["allowed"] is True

    # sourcePaths: a post-filter of the mapped references, described as such
    filtered = seen.add(
        await gateway.tools.call(
            "knowledge_rag.query",
            {"query": "Compare the Acme Widget and the striped zebra", "sourcePaths": ["notes/"]},
            scope,
            caller="test",
        )
    )
    assert [r["sourcePath"] for r in filtered["references"]] == ["notes/widget.md"]
    assert filtered["sourceScope"]["sourcePaths"] == ["notes/"]
    assert filtered["sourceScope"]["retrievedReferences"] == 2 and filtered["sourceScope"]["returnedReferences"] == 1

    # over HTTP for hosts, same shape
    response = await client.post(
        "/v1/knowledge/query",
        json={"workspaceId": WORKSPACE, "query": "Where does the zebra live?", "sourcePaths": ["research/zebra.md"]},
    )
    body = seen.add(await response.json())
    assert response.status == 200, body
    assert [r["sourcePath"] for r in body["references"]] == ["research/zebra.md"]

    # open_reference: from a reference (precise), from a provider hint, degraded when not locatable
    opened = seen.add(
        await gateway.tools.call("knowledge_rag.open_reference", {"reference": widget}, scope, caller="test")
    )
    assert opened["locatorDegraded"] is False and opened["locator"]["startLine"] == 1
    hint = seen.add(
        await gateway.tools.call(
            "knowledge_rag.open_reference",
            {"filePath": widget["filePath"], "excerpt": "The widget weighs two kilograms."},
            scope,
            caller="test",
        )
    )
    assert hint["sourcePath"] == "notes/widget.md"
    assert hint["locator"] == {"kind": "lines", "startLine": 4, "endLine": 4}
    assert hint["citationMarkdown"].startswith("[notes/widget.md · line 4]")
    degraded = seen.add(
        await gateway.tools.call(
            "knowledge_rag.open_reference", {"sourcePath": "research/zebra.md", "excerpt": "not in the file at all"},
            scope, caller="test",
        )
    )  # fmt: skip
    assert degraded["locatorDegraded"] is True and degraded["locator"] == {"kind": "document"}
    assert degraded["degradedReason"] and "#L" not in degraded["citationUrl"]
    assert "line" not in degraded["citationMarkdown"]
    # a run whose allowed roots exclude the file: no reading it, the citation degrades
    narrow = seen.add(
        await gateway.tools.call(
            "knowledge_rag.open_reference", {"reference": widget}, scope_of(client, roots=["research"]), caller="test"
        )
    )
    assert narrow["locatorDegraded"] is True
    # an unmapped provider name (not added through the gateway): cited by name, no link, degraded
    foreign = seen.add(
        await gateway.tools.call("knowledge_rag.open_reference", {"filePath": "/srv/rag/inputs/x.pdf"}, scope,
                                 caller="test")
    )  # fmt: skip
    assert foreign["sourcePath"] is None and foreign["citationUrl"] is None and foreign["locatorDegraded"] is True
    assert "/srv/rag" not in json.dumps(foreign)
    http_open = await client.post("/v1/knowledge/open_reference", json={"workspaceId": WORKSPACE, "reference": widget})
    assert (seen.add(await http_open.json()))["locatorDegraded"] is False

    # same basename in another folder: accepted (LightRAG keeps basenames; the gateway encodes paths)
    await index(client, seen, ["other/widget.md"])
    again = await client.post("/v1/knowledge/documents", json={"workspaceId": WORKSPACE, "path": "notes/widget.md"})
    assert again.status == 409 and (seen.add(await again.json()))["error"]["code"] == "already_exists"
    outside = await client.post("/v1/knowledge/documents", json={"workspaceId": WORKSPACE, "path": "../etc/passwd"})
    assert outside.status == 400 and (seen.add(await outside.json()))["error"]["code"] == "path_refused"
    text_doc = await client.post(
        "/v1/knowledge/documents",
        json={"workspaceId": WORKSPACE, "text": "Gnus are large antelopes.", "name": "inbox/gnu.md"},
    )
    added = seen.add(await text_doc.json())
    assert text_doc.status == 202 and added["sourcePath"] == "inbox/gnu.md"
    # deleting while the provider's pipeline works is refused by it ("busy"): let it finish first
    service = service_of(gateway)
    assert service is not None
    await wait_processed(service, where(client), added["trackId"], timeout=WAIT)

    # delete through the gateway
    deleted = await client.delete(
        "/v1/knowledge/documents", json={"workspaceId": WORKSPACE, "sourcePaths": ["other/widget.md"]}
    )
    body = seen.add(await deleted.json())
    assert deleted.status == 202, body
    assert body["deleted"][0]["sourcePath"] == "other/widget.md"
    missing = await client.delete(
        "/v1/knowledge/documents", json={"workspaceId": WORKSPACE, "sourcePaths": ["nope.md"]}
    )
    assert missing.status == 404 and (seen.add(await missing.json()))["error"]["code"] == "not_found"
    seen.check()


async def test_turn_calls_knowledge_query_and_events_carry_citations(
    client: TestClient, rag: LightRAG, workspace: Path
) -> None:
    """The agent calls knowledge_rag.query as an MCP call would (through the facade, with the
    run's scope); the run's events carry the citations."""
    seen = Seen(rag)
    await index(client, seen, ["notes/widget.md", "research/zebra.md"])
    body = {
        "requestId": "r-kb",
        "agentId": "kb-agent",
        "sessionId": "s-kb",
        "workspaceId": WORKSPACE,
        "message": "knowledge_rag.query",
        "context": {"allowedRoots": [""]},
    }
    receipt, events = await run_to_end(client, body, timeout=WAIT)
    seen.add([e["data"] for e in events])
    assert events[-1]["event"] == "run.completed"
    facade_done = [
        e["data"]["payload"] for e in events if e["event"] == "tool.completed" and e["data"]["source"] == "tool"
    ]
    assert facade_done and facade_done[0]["status"] == "completed" and facade_done[0]["receiptId"]
    agent_done = [
        e["data"]["payload"] for e in events if e["event"] == "tool.completed" and e["data"]["source"] == "agent"
    ]
    citations = agent_done[0]["result"]["citations"]
    assert any(c.startswith("[notes/widget.md") for c in citations), citations
    final = next(e["data"]["payload"]["text"] for e in events if e["event"] == "message.completed")
    assert "[notes/widget.md" in final and "agent-gateway://workspace/" in final
    receipts = await (await client.get(f"/v1/runs/{receipt['hostRunId']}/receipts")).json()
    # The gateway's receipt of the call, and the agent's own report of it (source agent).
    gateway_receipts = [r for r in receipts["receipts"] if r.get("source") == "gateway"]
    assert [r["tool"] for r in gateway_receipts] == ["knowledge_rag.query"]
    assert {r.get("source") for r in receipts["receipts"]} <= {"gateway", "agent"}
    seen.check()


async def test_server_stopped_mid_query_is_a_clear_tool_error_and_the_run_goes_on(
    llm: tuple[FakeOpenAI, LlmScript], workspace: Path, tmp_path: Path
) -> None:
    fake, script = llm
    server = start_lightrag(tmp_path / "rag2", fake.base_url)
    made = await gateway_client(server, workspace, tmp_path / "gw2")
    seen = Seen(server)
    try:
        await index(made, seen, ["notes/widget.md"])
        script.answer_arrived.clear()
        script.hang_answers = True
        body = {
            "requestId": "r-stop",
            "agentId": "kb-agent",
            "sessionId": "s-stop",
            "workspaceId": WORKSPACE,
            "message": "knowledge_rag.query",
            "context": {"allowedRoots": [""]},
        }
        run = asyncio.create_task(run_to_end(made, body, timeout=WAIT))
        arrived = await asyncio.get_running_loop().run_in_executor(None, script.answer_arrived.wait, WAIT)
        assert arrived, "LightRAG never asked the fake LLM for the answer"
        server.stop()  # mid-query: the gateway's request is in flight
        async with asyncio.timeout(WAIT):
            _, events = await run
        seen.add([e["data"] for e in events])
        assert events[-1]["event"] == "run.completed"
        failed = [
            e["data"]["payload"] for e in events if e["event"] == "tool.completed" and e["data"]["source"] == "tool"
        ]
        assert failed[0]["status"] == "failed"
        assert failed[0]["error"]["code"] == "provider_unavailable", failed
        assert "after one retry" in failed[0]["error"]["message"]
        final = next(e["data"]["payload"]["text"] for e in events if e["event"] == "message.completed")
        assert final.startswith("the tool failed: provider_unavailable")

        # the tool itself, with the server gone: a clear error at once, no hang
        async with asyncio.timeout(WAIT):
            with pytest.raises(ToolError) as info:
                await made.app[GATEWAY_KEY].tools.call(
                    "knowledge_rag.query", {"query": "what is the widget"}, scope_of(made), caller="test"
                )
        assert info.value.code == "provider_unavailable"
        seen.add(info.value.message)
        status = seen.add(await (await made.get("/v1/knowledge/status")).json())
        assert status["available"] is False and status["reason"]
        http = await made.post("/v1/knowledge/query", json={"workspaceId": WORKSPACE, "query": "what is the widget"})
        assert http.status == 503 and (seen.add(await http.json()))["error"]["code"] == "provider_unavailable"
        seen.check()
    finally:
        script.hang_answers = False
        await made.close()
        server.stop()


# -- workspaces: isolated at the provider, and answers that name no other workspace's file ----------------

WS_A, WS_B = "local:a", "local:b"
QUERY = "Compare the Acme Widget and the striped zebra"


def two_workspaces(base: Path) -> dict[str, Path]:
    """Workspace A holds the widget note, B the zebra note (distinct documents)."""
    roots = {WS_A: base / "ws-a", WS_B: base / "ws-b"}
    (roots[WS_A] / "notes").mkdir(parents=True)
    (roots[WS_A] / "notes" / "widget.md").write_text(WIDGET)
    (roots[WS_B] / "research").mkdir(parents=True)
    (roots[WS_B] / "research" / "zebra.md").write_text(ZEBRA)
    return roots


async def knowledge_gateway(roots: dict[str, Path], data: Path, lightrag: dict[str, Any]) -> TestClient:
    config = Config.load(
        None,
        env={},
        overrides={
            "gateway": {"data_dir": str(data)},
            "chat_only": {"base_url": "http://127.0.0.1:9/v1", "model": "m"},
            "workspaces": {"roots": {ws: str(path) for ws, path in roots.items()}},
            "lightrag": {"api_key": API_KEY, "mode": "mix", "timeout_seconds": 60.0, **lightrag},
        },
    )
    client = TestClient(TestServer(build_app(config, plugin_host())))
    await client.start_server()
    return client


def where_in(client: TestClient, workspace_id: str) -> Where:
    gateway = client.app[GATEWAY_KEY]

    async def in_thread(fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(gateway.executor, fn, *args)

    return Where(workspace_id, gateway.config.workspace_roots[workspace_id], [""], in_thread)


async def add_to(client: TestClient, seen: Seen, workspace_id: str, path: str) -> None:
    """Add a workspace file through the gateway's HTTP route and wait until it is indexed."""
    response = await client.post("/v1/knowledge/documents", json={"workspaceId": workspace_id, "path": path})
    body = seen.add(await response.json())
    assert response.status == 202, body
    service = service_of(client.app[GATEWAY_KEY])
    assert service is not None
    tracked = await wait_processed(service, where_in(client, workspace_id), body["trackId"], timeout=WAIT)
    assert [d["status"] for d in tracked["documents"]] == ["processed"], tracked


async def query_from(client: TestClient, seen: Seen, workspace_id: str) -> dict[str, Any]:
    """knowledge_rag.query through the tool facade, for a run of ``workspace_id``."""
    run = Run(
        host_run_id="run_" + os.urandom(6).hex(),
        request_id="r",
        agent_id="kb-agent",
        provider="test",
        session_id="s",
        actor_id="local",
        workspace_id=workspace_id,
        request={"message": "x", "context": {"allowedRoots": [""]}},
    )
    gateway = client.app[GATEWAY_KEY]
    return seen.add(await gateway.tools.call("knowledge_rag.query", {"query": QUERY}, gateway.tools.scope_for(run)))


async def provider_answer(server: LightRAG) -> str:
    """What the provider itself answers the query (its model's text, reference list included)."""
    async with aiohttp.ClientSession() as http:
        async with http.post(
            server.url + "/query",
            json={"query": QUERY, "mode": "mix", "include_references": True, "stream": False},
            headers={"X-API-Key": API_KEY},
        ) as response:
            assert response.status == 200, await response.text()
            return str((await response.json())["response"])


async def provider_documents(server: LightRAG) -> list[str]:
    """The file names of every document the provider holds."""
    async with aiohttp.ClientSession() as http:
        async with http.post(
            server.url + "/documents/paginated", json={"page": 1, "page_size": 100}, headers={"X-API-Key": API_KEY}
        ) as response:
            assert response.status == 200, await response.text()
            return [str(d["file_path"]) for d in (await response.json())["documents"]]


def names_of_a(text: str) -> list[str]:
    """Every way ``text`` could name workspace A's document."""
    return [n for n in ("widget.md", "local%3Aa", "local:a", encode_source(WS_A, "notes/widget.md")) if n in text]


async def test_each_workspace_has_its_own_server_and_its_answers_name_only_its_files(
    llm: tuple[FakeOpenAI, LlmScript], tmp_path: Path
) -> None:
    """``workspace_urls``: A and B on their own LightRAG servers. B's documents and queries go only
    to B's server; its query returns only B's references, and when the provider's answer lists A's
    file too (the model scripted to cite it), the answer text B gets names none of A's files."""
    fake, script = llm
    server_a = start_lightrag(tmp_path / "rag-a", fake.base_url)
    server_b = start_lightrag(tmp_path / "rag-b", fake.base_url)
    roots = two_workspaces(tmp_path)
    client = await knowledge_gateway(
        roots, tmp_path / "gw", {"url": "", "workspace_urls": {WS_A: server_a.url, WS_B: server_b.url}}
    )
    seen_a, seen_b = Seen(server_a), Seen(server_b)
    try:
        await add_to(client, seen_a, WS_A, "notes/widget.md")
        await add_to(client, seen_b, WS_B, "research/zebra.md")
        # Isolation at the provider: each server holds its own workspace's document only.
        assert await provider_documents(server_a) == [encode_source(WS_A, "notes/widget.md")]
        assert await provider_documents(server_b) == [encode_source(WS_B, "research/zebra.md")]

        script.extra_references = [encode_source(WS_A, "notes/widget.md"), "widget.md"]
        from_b = await query_from(client, seen_b, WS_B)
        raw = await provider_answer(server_b)
        assert encode_source(WS_A, "notes/widget.md") in raw and "- [3] widget.md" in raw, raw  # as scripted
        assert [r["sourcePath"] for r in from_b["references"]] == ["research/zebra.md"], from_b["references"]
        assert from_b["sourceScope"]["workspaceIsolation"] == "provider"
        assert from_b["sourceScope"]["otherWorkspaceReferencesDropped"] == 0
        assert "- [1] research/zebra.md" in from_b["answer"], from_b["answer"]
        assert names_of_a(from_b["answer"]) == [], from_b["answer"]
        over_http = await client.post("/v1/knowledge/query", json={"workspaceId": WS_B, "query": QUERY})
        body = seen_b.add(await over_http.json())
        assert over_http.status == 200, body
        assert [r["sourcePath"] for r in body["references"]] == ["research/zebra.md"]
        assert names_of_a(json.dumps(body)) == [], body

        gateway = client.app[GATEWAY_KEY]
        b_run = Run("run_st", "r", "kb-agent", "test", "s", "local", WS_B, request={"context": {"allowedRoots": [""]}})
        status = seen_b.add(await gateway.tools.call("knowledge_rag.status", {}, gateway.tools.scope_for(b_run)))
        assert (status["available"], status["providerVersion"]) == (True, "1.5.7"), status  # B's own server

        # ... and the other way round: A sees its widget note, never B's zebra note.
        script.extra_references = [encode_source(WS_B, "research/zebra.md")]
        from_a = await query_from(client, seen_a, WS_A)
        assert [r["sourcePath"] for r in from_a["references"]] == ["notes/widget.md"], from_a["references"]
        assert "zebra.md" not in from_a["answer"] and "local%3Ab" not in from_a["answer"], from_a["answer"]
        listed = await client.get("/v1/knowledge/documents", params={"workspaceId": WS_B})
        assert [d["sourcePath"] for d in seen_b.add(await listed.json())["documents"]] == ["research/zebra.md"]
        seen_a.check()
        seen_b.check()
    finally:
        script.extra_references = []
        await client.close()
        server_a.stop()
        server_b.stop()


async def test_on_a_shared_server_answers_name_no_other_workspace_file(
    llm: tuple[FakeOpenAI, LlmScript], tmp_path: Path
) -> None:
    """Both workspaces on one server (``url``): B's query retrieves A's note too; its reference is
    dropped and the answer's reference list — which names both, as LightRAG gave them to the
    model — is rewritten to B's file only."""
    fake, _ = llm
    server = start_lightrag(tmp_path / "rag", fake.base_url)
    client = await knowledge_gateway(two_workspaces(tmp_path), tmp_path / "gw", {"url": server.url})
    seen = Seen(server)
    try:
        await add_to(client, seen, WS_A, "notes/widget.md")
        await add_to(client, seen, WS_B, "research/zebra.md")
        raw = await provider_answer(server)
        assert encode_source(WS_A, "notes/widget.md") in raw and encode_source(WS_B, "research/zebra.md") in raw
        from_b = await query_from(client, seen, WS_B)
        assert [r["sourcePath"] for r in from_b["references"]] == ["research/zebra.md"], from_b["references"]
        assert from_b["sourceScope"]["otherWorkspaceReferencesDropped"] == 1
        assert from_b["sourceScope"]["workspaceIsolation"] == "shared"
        assert "research/zebra.md" in from_b["answer"] and "### References" in from_b["answer"], from_b["answer"]
        assert names_of_a(from_b["answer"]) == [], from_b["answer"]
        seen.check()
    finally:
        await client.close()
        server.stop()


def test_workspace_urls_are_checked(tmp_path: Path) -> None:
    from tests._config import load, write

    path = write(
        tmp_path,
        '[lightrag]\nworkspace_urls = { "local:a" = "ftp://rag", "local:b" = "http://127.0.0.1:9622" }\n'
        'citation_url = "http://127.0.0.1:9622/{path}"\n',
    )
    problems = load(path).problems()
    assert f'{path}: lightrag.workspace_urls."local:a": must be a URL starting with http:// or https://' in problems
    assert f"{path}: lightrag.citation_url: must not point at a provider (its URL is never given to clients)" in (
        problems
    )
