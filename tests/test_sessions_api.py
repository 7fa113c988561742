"""/v1/sessions on both storage backends: list, keyset pages, full-text search with snippets,
detail (the transcript projection), export, rename/pin, delete (409 while a run is active), bulk
delete, the agent-session delete offered only when the runtime declares it, and actor scoping."""

from __future__ import annotations

import asyncio
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from agent_gateway.acp.runtime import AcpAgentSpec, AcpRuntime
from agent_gateway.hookspecs import hookimpl
from agent_gateway.routes.sessions import indexer as sessions_indexer
from tests._harness import FAKE_ACP_AGENT, WAIT, gateway_of, run_to_end
from tests._sessions import (
    ALICE,
    BOB,
    TOKENS,
    TranscriptPlugin,
    auth,
    body,
    gateway,
    get_json,
    indexer_of,
    watch_index_batches,
)


async def test_list_detail_search_export(make_gateway: Any, storage_kind: str) -> None:
    client, _plugin = await gateway(make_gateway, storage_kind)
    await run_to_end(client, body("s-apple", "How do apples grow?", "r1"), headers=auth(ALICE))
    await run_to_end(client, body("s-apple", "And pears?", "r2"), headers=auth(ALICE))
    await run_to_end(client, body("s-bread", "Bake bread at home", "r3"), headers=auth(ALICE))

    listing = await get_json(client, "/v1/sessions")
    assert [s["sessionId"] for s in listing["sessions"]] == ["s-bread", "s-apple"]
    apple = listing["sessions"][1]
    assert apple["title"] == "How do apples grow?"
    assert (apple["runCount"], apple["messageCount"], apple["toolCount"]) == (2, 4, 2)
    assert apple["sessionMode"] == "native_live" and apple["lastStatus"] == "completed"
    assert apple["activeRun"] is None and apple["agentId"] == "transcript"

    detail = await get_json(client, "/v1/sessions/s-apple")
    first, second = (run["transcript"] for run in detail["runs"])
    assert first["question"] == "How do apples grow?"
    assert first["answer"] == {"text": "Here is about How do apples grow?", "final": True}
    assert "secret" not in first["answer"]["text"] and first["thoughts"]["text"] == "secret pondering"
    assert "OLD REPLAYED" not in first["answer"]["text"] and first["replayed"]["messages"] == 1
    assert first["tools"][0]["toolCallId"] == "c1" and first["tools"][0]["receiptId"] == "rcpt_1"
    assert first["citations"][0]["path"] == "docs/guide.md"
    assert first["plan"] == {"entries": [{"content": "answer", "status": "completed"}]}
    assert first["files"][0]["path"] == "notes/summary.txt"
    assert (first["sessionMode"], second["sessionMode"]) == ("new_session", "native_live")
    assert first["status"] == "completed" and first["terminal"]["status"] == "completed"
    binding = detail["binding"]
    assert binding["agentSessionId"] == "agent-s-apple"
    last_mode = {h["hostRunId"]: h["sessionMode"] for h in binding["modeHistory"]}
    assert list(last_mode.values()) == ["new_session", "native_live"]
    assert binding["agentSessionDelete"] is False

    # Full-text search: a word of an answer, a cited file, a tool name; ranked, with marked snippets.
    found = await get_json(client, "/v1/sessions", q="pears")
    assert [s["sessionId"] for s in found["sessions"]] == ["s-apple"]
    assert "<mark>" in found["sessions"][0]["snippet"].lower()
    assert "pears" in found["sessions"][0]["snippet"].lower()
    assert [s["sessionId"] for s in (await get_json(client, "/v1/sessions", q="bread"))["sessions"]] == ["s-bread"]
    assert len((await get_json(client, "/v1/sessions", q="guide"))["sessions"]) == 2
    assert (await get_json(client, "/v1/sessions", q="nothingmatchesthis"))["sessions"] == []

    exported = await get_json(client, "/v1/sessions/s-apple/export", format="json")
    assert exported["schema"] == "gateway.session_export.v1" and len(exported["runs"]) == 2
    assert exported["runs"][0]["events"][0]["kind"] == "run.created"
    response = await client.get("/v1/sessions/s-apple/export", params={"format": "markdown"}, headers=auth(ALICE))
    markdown = await response.text()
    assert response.status == 200 and response.content_type == "text/markdown"
    assert "How do apples grow?" in markdown and "Here is about And pears?" in markdown
    assert "<details><summary>Thoughts</summary>" in markdown and "OLD REPLAYED" not in markdown

    # Another actor sees none of it.
    assert (await get_json(client, "/v1/sessions", token=BOB))["sessions"] == []
    await get_json(client, "/v1/sessions/s-apple", token=BOB, expect=404)
    await get_json(client, "/v1/sessions", token=BOB, q="apples")
    assert (await get_json(client, "/v1/sessions", token=BOB, q="apples"))["sessions"] == []


async def test_pages_rename_pin_and_filters(make_gateway: Any, storage_kind: str) -> None:
    client, _plugin = await gateway(make_gateway, storage_kind)
    for index in range(5):
        await run_to_end(client, body(f"s{index}", f"question number {index}", f"r{index}"), headers=auth(ALICE))
    seen: list[str] = []
    cursor = None
    for _page in range(5):
        params = {"limit": "2", **({"cursor": cursor} if cursor else {})}
        page = await get_json(client, "/v1/sessions", **params)
        seen += [s["sessionId"] for s in page["sessions"]]
        cursor = page["nextCursor"]
        if cursor is None:
            break
    assert seen == ["s4", "s3", "s2", "s1", "s0"]

    response = await client.patch(
        "/v1/sessions/s1", json={"title": "Renamed zebra", "pinned": True}, headers=auth(ALICE)
    )
    assert response.status == 200, await response.text()
    assert (await response.json())["session"]["title"] == "Renamed zebra"
    listing = await get_json(client, "/v1/sessions")
    assert listing["sessions"][0]["sessionId"] == "s1" and listing["sessions"][0]["pinned"] is True
    assert [s["sessionId"] for s in (await get_json(client, "/v1/sessions", q="zebra"))["sessions"]] == ["s1"]
    response = await client.patch("/v1/sessions/s1", json={"title": ""}, headers=auth(ALICE))
    assert (await response.json())["session"]["title"] == "question number 1"

    assert len((await get_json(client, "/v1/sessions", agentId="transcript"))["sessions"]) == 5
    assert (await get_json(client, "/v1/sessions", agentId="deletable"))["sessions"] == []
    assert len((await get_json(client, "/v1/sessions", status="completed"))["sessions"]) == 5
    assert (await get_json(client, "/v1/sessions", status="active"))["sessions"] == []

    bad_inputs: list[dict[str, str]] = [
        {"limit": "0"},
        {"limit": "x"},
        {"limit": "201"},
        {"cursor": "garbage!"},
        {"status": "bogus"},
        {"agentId": "x" * 300},
        {"q": "a\x00b"},
        {"q": "q" * 600},
    ]
    for params in bad_inputs:
        error = await get_json(client, "/v1/sessions", expect=400, **params)
        assert error["error"]["code"].startswith("invalid_")
    search_cursor = (await get_json(client, "/v1/sessions", q="question", limit="1"))["nextCursor"]
    # a search cursor for a list: well-formed, but there is no such page
    error = await get_json(client, "/v1/sessions", expect=404, cursor=search_cursor)
    assert error["error"]["code"] == "cursor_not_found"
    response = await client.patch("/v1/sessions/s1", json={"pinned": "yes"}, headers=auth(ALICE))
    assert response.status == 400
    response = await client.patch("/v1/sessions/nope", json={"pinned": True}, headers=auth(ALICE))
    assert response.status == 404
    await get_json(client, "/v1/sessions/" + "x" * 300, expect=400)
    await get_json(client, "/v1/sessions/%20%09", expect=400)  # no visible character: not an id
    await get_json(client, "/v1/sessions/a%01b", expect=404)  # an id as runs accept them; no such session
    await get_json(client, "/v1/sessions/a%00b/export", expect=400)


async def test_delete_refuses_active_then_removes_history(make_gateway: Any, storage_kind: str) -> None:
    client, plugin = await gateway(make_gateway, storage_kind)
    await run_to_end(client, body("keep", "keep me", "k1"), headers=auth(ALICE))
    await run_to_end(client, body("gone", "delete me", "g1"), headers=auth(ALICE))
    receipt, _ = await run_to_end(client, body("gone2", "delete me too", "g2"), headers=auth(ALICE))

    # A session with an active run: listed with it, and not deletable.
    response = await client.post("/v1/runs", json=body("busy", "wait here", "b1", hold=True), headers=auth(ALICE))
    busy = await response.json()
    await asyncio.wait_for(plugin.runtime.holding.wait(), WAIT)
    listing = await get_json(client, "/v1/sessions", status="active")
    assert [s["sessionId"] for s in listing["sessions"]] == ["busy"]
    assert listing["sessions"][0]["activeRun"]["hostRunId"] == busy["hostRunId"]
    response = await client.delete("/v1/sessions/busy", headers=auth(ALICE))
    assert response.status == 409 and (await response.json())["error"]["code"] == "session_active"
    response = await client.post("/v1/sessions:delete", json={"sessionIds": ["gone", "busy"]}, headers=auth(ALICE))
    assert response.status == 409
    assert (await get_json(client, "/v1/sessions/gone"))["session"]["sessionId"] == "gone"  # all or nothing
    plugin.runtime.release.set()
    await gateway_of(client).runs.wait(busy["hostRunId"])

    response = await client.delete("/v1/sessions/gone", headers=auth(BOB))
    assert response.status == 404  # not Bob's
    response = await client.delete("/v1/sessions/gone", headers=auth(ALICE))
    assert response.status == 200 and (await response.json())["deleted"] == ["gone"]
    await get_json(client, "/v1/sessions/gone", expect=404)
    response = await client.post(
        "/v1/sessions:delete", json={"sessionIds": ["gone2", "busy", "never"]}, headers=auth(ALICE)
    )
    result = await response.json()
    assert response.status == 200 and result["deleted"] == ["gone2", "busy"] and result["notFound"] == ["never"]
    # The runs, their events and the search rows went with the sessions; the other stays.
    assert (await client.get(f"/v1/runs/{receipt['hostRunId']}", headers=auth(ALICE))).status == 404
    assert [s["sessionId"] for s in (await get_json(client, "/v1/sessions"))["sessions"]] == ["keep"]
    assert [s["sessionId"] for s in (await get_json(client, "/v1/sessions", q="delete"))["sessions"]] == []
    storage = gateway_of(client).storage
    assert storage.read_events(receipt["hostRunId"]) == []
    for bad in ({"sessionIds": []}, {"sessionIds": "x"}, {"ids": ["keep"]}, [1]):
        assert (await client.post("/v1/sessions:delete", json=bad, headers=auth(ALICE))).status == 400


async def test_agent_session_delete_only_when_declared(make_gateway: Any, storage_kind: str) -> None:
    client, plugin = await gateway(make_gateway, storage_kind)
    await run_to_end(client, body("plain", "hello", "p1"), headers=auth(ALICE))
    await run_to_end(client, body("owned", "hello", "o1", agent="deletable"), headers=auth(ALICE))

    response = await client.delete("/v1/sessions/plain/agent-session", headers=auth(ALICE))
    assert response.status == 409 and (await response.json())["error"]["code"] == "not_supported"
    detail = await get_json(client, "/v1/sessions/owned")
    assert detail["binding"]["agentSessionDelete"] is True
    response = await client.delete("/v1/sessions/owned/agent-session", headers=auth(ALICE))
    assert response.status == 200, await response.text()
    assert plugin.deletable.deleted[0][0] == "agent-owned"
    # The gateway's history stays; the next run starts a new agent session.
    _receipt, events = await run_to_end(client, body("owned", "again", "o2", agent="deletable"), headers=auth(ALICE))
    modes = [e["data"]["payload"]["sessionMode"] for e in events if e["event"] == "session.info.updated"]
    assert modes[-1] == "new_session"  # the runtime starts a new agent session
    assert (await get_json(client, "/v1/sessions/owned"))["session"]["runCount"] == 2


async def test_transcript_projection_on_events_and_stream(make_gateway: Any) -> None:
    client, _plugin = await gateway(make_gateway, "sqlite")
    receipt, _ = await run_to_end(client, body("p", "project me", "x1"), headers=auth(ALICE))
    run_id = receipt["hostRunId"]
    page = await get_json(client, f"/v1/runs/{run_id}/events", projection="transcript")
    patches = page["events"]
    assert all(p["schema"] == "gateway.transcript_patch.v1" for p in patches)
    ops = [op["op"] for p in patches for op in p["ops"]]
    assert "answer.final" in ops and "tool.upsert" in ops and ops[-1] == "run.end"
    from agent_gateway.transcript import apply_op, empty_transcript

    state = empty_transcript()
    for patch in patches:
        for op in patch["ops"]:
            apply_op(state, op)
    assert state["answer"]["text"] == "Here is about project me"
    response = await client.get(f"/v1/runs/{run_id}/stream", params={"projection": "transcript"}, headers=auth(ALICE))
    text = await response.text()
    assert response.status == 200 and "gateway.transcript_patch.v1" in text and "answer.final" in text


@pytest.mark.parametrize("path", ["/v1/sessions", "/v1/sessions/x", "/v1/sessions/x/export"])
async def test_sessions_need_a_token(make_gateway: Any, path: str) -> None:
    client, _plugin = await gateway(make_gateway, "sqlite")
    assert (await client.get(path)).status == 401


async def test_acp_agent_session_delete_when_the_agent_declares_it(make_gateway: Any, tmp_path: Path) -> None:
    """A real ACP agent process: `sessionCapabilities.delete` declared → offered and sent as
    `session/delete`; not declared → 409, and the agent's store is untouched."""
    state = tmp_path / "agent-state"

    def agent(agent_id: str, *flags: str) -> AcpRuntime:
        command = [sys.executable, FAKE_ACP_AGENT, "--behaviour", "replay", *flags]
        env = {"FAKE_ACP_STATE_DIR": str(state)}
        spec = AcpAgentSpec(agent_id, agent_id, "tests", command, env=env, session_timeout=WAIT, writable=[state])
        return AcpRuntime(spec)

    class AcpAgents:
        @hookimpl
        def register_runtimes(self, register: Any, config: Any) -> None:
            register(agent("acp-del", "--session-delete"))
            register(agent("acp-plain"))

    client = await make_gateway(extra_plugins=(AcpAgents(),), tokens=TOKENS)
    await run_to_end(client, body("with-del", "hello", "d1", agent="acp-del"), headers=auth(ALICE))
    await run_to_end(client, body("no-del", "hello", "n1", agent="acp-plain"), headers=auth(ALICE))

    plain = (await get_json(client, "/v1/sessions/no-del"))["binding"]
    assert plain["agentSessionDelete"] is False and plain["agentSessionId"]
    response = await client.delete("/v1/sessions/no-del/agent-session", headers=auth(ALICE))
    assert response.status == 409 and (await response.json())["error"]["code"] == "not_supported"
    assert (state / f"{plain['agentSessionId']}.json").exists()

    binding = (await get_json(client, "/v1/sessions/with-del"))["binding"]
    assert binding["agentSessionDelete"] is True
    stored = state / f"{binding['agentSessionId']}.json"
    assert stored.exists()
    response = await client.delete("/v1/sessions/with-del/agent-session", headers=auth(BOB))
    assert response.status == 404
    response = await client.delete("/v1/sessions/with-del/agent-session", headers=auth(ALICE))
    assert response.status == 200, await response.text()
    assert (await response.json())["agentSessionId"] == binding["agentSessionId"]
    assert not stored.exists()  # the agent deleted it from its own store
    # The gateway's history stays: the next turn starts a new agent session, given the gateway's
    # transcript (cold resume), not a load of the deleted one.
    _receipt, events = await run_to_end(client, body("with-del", "again", "d2", agent="acp-del"), headers=auth(ALICE))
    modes = [e["data"]["payload"]["sessionMode"] for e in events if e["event"] == "session.info.updated"]
    assert modes[-1] == "cold_resumed"
    detail = await get_json(client, "/v1/sessions/with-del")
    assert len(detail["runs"]) == 2 and detail["binding"]["agentSessionId"] != binding["agentSessionId"]


async def test_a_run_ended_by_shutdown_is_indexed_by_the_next_process(
    make_gateway: Any, storage_kind: str, tmp_path: Path
) -> None:
    plugin = TranscriptPlugin()
    first = await make_gateway(storage=storage_kind, tokens=TOKENS, extra_plugins=(plugin,), data_dir=tmp_path)
    response = await first.post(
        "/v1/runs", json=body("cut", "unfinished zeppelin", "c1", hold=True), headers=auth(ALICE)
    )
    run_id = (await response.json())["hostRunId"]
    await asyncio.wait_for(plugin.runtime.holding.wait(), WAIT)
    assert (await get_json(first, "/v1/sessions", status="active"))["sessions"][0]["sessionId"] == "cut"
    await first.close()  # the gateway stops with the run in flight

    second = await make_gateway(
        storage=storage_kind, tokens=TOKENS, extra_plugins=(TranscriptPlugin(),), data_dir=tmp_path, schema=first.schema
    )
    [session] = (await get_json(second, "/v1/sessions"))["sessions"]
    assert session["activeRun"] is None and session["lastStatus"] in ("cancelled", "interrupted")
    found = (await get_json(second, "/v1/sessions", q="zeppelin"))["sessions"]
    assert [s["sessionId"] for s in found] == ["cut"]
    [run] = (await get_json(second, "/v1/sessions/cut"))["runs"]
    assert run["receipt"]["hostRunId"] == run_id
    assert run["transcript"]["terminal"]["status"] == session["lastStatus"]
    assert run["transcript"]["answer"]["text"] == ""  # nothing was answered; the plan and tool are there
    assert run["transcript"]["plan"]["entries"][0]["content"] == "waiting"


async def test_a_short_runs_changes_are_indexed_in_one_worker_call(
    make_gateway: Any, storage_kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The indexer gathers a run's changes that come close together (running, its session mode,
    its end) into one worker call, not one each."""
    monkeypatch.setattr(sessions_indexer, "INDEX_GATHER_SECONDS", 0.5)  # the whole run below falls within it
    client, _plugin = await gateway(make_gateway, storage_kind)
    batches = watch_index_batches(monkeypatch, indexer_of(client))
    await get_json(client, "/v1/sessions")  # the first list indexes ended runs never indexed: none later
    receipt, _events = await run_to_end(client, body("s-gathered", "gather these", "g1"), headers=auth(ALICE))
    [session] = (await get_json(client, "/v1/sessions"))["sessions"]  # (waits for the indexer)
    assert session["lastStatus"] == "completed" and session["runCount"] == 1
    detail = await get_json(client, "/v1/sessions/s-gathered")
    assert detail["runs"][0]["transcript"]["answer"]["text"] == "Here is about gather these"
    [call] = [batch for batch in batches if any(run.host_run_id == receipt["hostRunId"] for run, _source in batch)]
    statuses = [run.status for run, _source in call]
    assert statuses[0] == "running" and statuses[-1] == "completed" and len(statuses) >= 3


async def test_the_first_sessions_request_does_not_index_a_run_whose_index_is_queued_again(
    make_gateway: Any, storage_kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process's first sessions request also indexes ended runs that never were (its backfill).
    A run that has just ended, its digest still queued, has none stored yet: the backfill waits
    for the queue first, so the run is not indexed a second time, from its whole journal read
    back from storage (a long run's 100,000 rows on a worker)."""
    monkeypatch.setattr(sessions_indexer, "INDEX_GATHER_SECONDS", 0.5)  # the digest waits while the list comes
    client, _plugin = await gateway(make_gateway, storage_kind)
    indexer = indexer_of(client)
    batches = watch_index_batches(monkeypatch, indexer)
    await run_to_end(client, body("s-once", "index me once", "x1"), headers=auth(ALICE))
    assert indexer.backfilled is False  # this is the process's first sessions request
    [session] = (await get_json(client, "/v1/sessions"))["sessions"]
    assert session["sessionId"] == "s-once" and session["lastStatus"] == "completed"
    ended = [source for batch in batches for run, source in batch if run.is_terminal]
    assert [type(source).__name__ for source in ended] == ["RunFold"]  # once, from its fold


async def test_a_sessions_first_run_names_it_when_the_next_one_is_seen_before_its_end(
    make_gateway: Any, storage_kind: str
) -> None:
    """One gathered batch: the first run running, the next one running (it started as soon as the
    first one left the session), then the first one's end. The session's index row is created from
    its first run, and takes that run's question as its title."""
    client, _plugin = await gateway(make_gateway, storage_kind)
    gw = gateway_of(client)
    indexer = indexer_of(client)
    first, _ = await run_to_end(client, body("s-source", "The first question", "o1"), headers=auth(ALICE))
    second, _ = await run_to_end(client, body("s-source", "The second question", "o2"), headers=auth(ALICE))
    await get_json(client, "/v1/sessions")  # (both indexed under s-source)
    runs = [await gw.runs.get(receipt["hostRunId"], "alice") for receipt in (first, second)]
    one, two = (replace(run, session_id="s-order") for run in runs if run is not None)
    batch = [(replace(one, status="running"), None), (replace(two, status="running"), None), (one, None)]
    await asyncio.get_running_loop().run_in_executor(None, indexer._index_batch, batch)
    [session] = [s for s in (await get_json(client, "/v1/sessions"))["sessions"] if s["sessionId"] == "s-order"]
    assert session["title"] == "The first question"
