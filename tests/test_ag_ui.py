"""The AG-UI plugin (`POST /v1/ag-ui/{agentId}`, `GET /v1/ag-ui/runs/{runId}/stream`).

Checked against the official implementations: every emitted event validates against the `ag_ui`
Python models (PyPI ag-ui-protocol), every sequence passes the official JS client's
`verifyEvents` (npm @ag-ui/client, installed by `contrib/peers/install.sh`, found through
`AGW_AG_UI_CLIENT_DIR`; missing is a failure, not a skip) and a local restatement of the ordering
rules; the JS `HttpAgent` consumes a chat-only run and a fake ACP agent run end to end; a resume
cut at every frame of a recorded run (thoughts, text, tool calls, plan, mode, permission, files)
yields a valid sequence that, joined to what the client had, is the uncut stream.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient
from hypothesis import given, settings
from hypothesis import strategies as st

from agent_gateway.models import Event
from agent_gateway.plugins.ag_ui.mapping import (
    AgUiTranslator,
    OpenItems,
    Resumption,
    group_frames,
    merged_from,
    prelude,
)
from tests._ag_ui import (
    GUARD,
    SCRIPTED,
    WAIT,
    FakeAcpPlugin,
    ScriptedPlugin,
    agui_input,
    check,
    js_verify,
    node,
    parse,
    post_run,
    resume,
)
from tests._harness import MakeGateway

# -- tests ------------------------------------------------------------------------------------------


@pytest.mark.peers
async def test_chat_only_run_streams_valid_ag_ui_events(make_gateway: MakeGateway, tmp_path: Path) -> None:
    client = await make_gateway()
    body = agui_input("hello there")
    response, raw = await post_run(client, "chat-only", body)
    assert response.status == 200, raw[:500]
    assert response.headers["Content-Type"].startswith("text/event-stream")
    host_run_id = response.headers["X-Agent-Gateway-Run-Id"]
    frames = parse(raw)
    events = [e for _id, e in frames]
    check(events)
    assert await js_verify(tmp_path, [events]) == ["ok"]
    kinds = [e["type"] for e in events]
    assert kinds[0] == "RUN_STARTED" and kinds[-1] == "RUN_FINISHED"
    assert events[0]["threadId"] == body["threadId"] and events[0]["runId"] == body["runId"]
    assert events[0]["metadata"]["agentGateway"]["hostRunId"] == host_run_id
    text = "".join(e["delta"] for e in events if e["type"] == "TEXT_MESSAGE_CONTENT")
    assert "hello there" in text  # the fake upstream echoes
    # ids: the padded seq on a group's last frame, `<seq>:<k>` before it; never decreasing
    seqs = [int(frame_id.split(":")[0]) for frame_id, _e in frames]
    assert seqs == sorted(seqs) and all(len(i.split(":")[0]) == 18 for i, _e in frames)
    # the gateway run: threadId is the session, runId the requestId
    receipt = await (await client.get(f"/v1/runs/{host_run_id}")).json()
    assert receipt["sessionId"] == body["threadId"] and receipt["requestId"] == body["runId"]
    assert receipt["workspaceId"] == "local:test"
    # The same RunAgentInput again is the same run (idempotency), streamed again from the start.
    again, raw_again = await post_run(client, "chat-only", body)
    assert again.headers["X-Agent-Gateway-Run-Id"] == host_run_id
    assert parse(raw_again) == frames


@pytest.mark.peers
async def test_scripted_run_maps_every_kind(make_gateway: MakeGateway, tmp_path: Path) -> None:
    client = await make_gateway(extra_plugins=(ScriptedPlugin(),))
    response, raw = await post_run(client, SCRIPTED, agui_input())
    assert response.status == 200, raw[:500]
    events = [e for _id, e in parse(raw)]
    check(events)
    assert await js_verify(tmp_path, [events]) == ["ok"]
    kinds = [e["type"] for e in events]
    for kind in (
        "REASONING_START",
        "REASONING_MESSAGE_CONTENT",
        "REASONING_END",
        "STEP_STARTED",
        "STEP_FINISHED",
        "STATE_SNAPSHOT",
        "TOOL_CALL_START",
        "TOOL_CALL_ARGS",
        "TOOL_CALL_END",
        "TOOL_CALL_RESULT",
    ):
        assert kind in kinds, kind
    customs = [e["name"] for e in events if e["type"] == "CUSTOM"]
    assert customs == [
        "agent_gateway.files_changed",
        "agent_gateway.permission_requested",
        "agent_gateway.permission_resolved",
    ]
    permission = next(e for e in events if e["type"] == "CUSTOM" and e["name"].endswith("requested"))
    assert permission["value"]["respondUrl"].endswith("/permissions/p1")
    state = [e["snapshot"] for e in events if e["type"] == "STATE_SNAPSHOT"][-1]
    assert state["sessionMode"] == "new_session" and state["plan"][0]["status"] == "completed"
    result = next(e for e in events if e["type"] == "TOOL_CALL_RESULT")
    assert result["toolCallId"] == "t1" and result["content"] == "hi"
    # t2 never completed: it is closed (no result) before the terminal, as RUN_FINISHED requires
    assert kinds.count("TOOL_CALL_END") == 2 and kinds[-1] == "RUN_FINISHED"


@pytest.mark.parametrize("outcome", ["failed", "cancelled"])
async def test_terminals_map_to_run_error_or_cancelled(make_gateway: MakeGateway, outcome: str) -> None:
    client = await make_gateway(extra_plugins=(ScriptedPlugin(),))
    body = agui_input()
    body["forwardedProps"]["agentGateway"]["options"] = {"outcome": outcome}
    _response, raw = await post_run(client, SCRIPTED, body)
    events = [e for _id, e in parse(raw)]
    check(events)
    if outcome == "failed":
        assert events[-1]["type"] == "RUN_ERROR" and events[-1]["code"] == "failed"
    else:
        assert events[-1]["type"] == "RUN_FINISHED" and events[-1]["outcome"] == {"type": "cancelled"}


@pytest.mark.peers
async def test_resume_cut_at_every_frame_is_valid_and_complete(make_gateway: MakeGateway, tmp_path: Path) -> None:
    plugin = ScriptedPlugin()
    client = await make_gateway(extra_plugins=(plugin,))
    response, raw = await post_run(client, SCRIPTED, agui_input())
    host_run_id = response.headers["X-Agent-Gateway-Run-Id"]
    frames = parse(raw)
    whole = [e for _id, e in frames]
    resumed_sequences = []
    for index, (cursor, _event) in enumerate(frames):
        got, tail_raw = await resume(client, host_run_id, cursor)
        assert got.status == 200, tail_raw[:300]
        tail = parse(tail_raw)
        assert all(
            frame_id == cursor for frame_id, e in tail if e.get("metadata", {}).get("agentGateway", {}).get("resumed")
        )
        tail_events = [e for _id, e in tail]
        if index == len(frames) - 1:
            assert tail_events == []  # the client saw the end: nothing more
            continue
        check(tail_events)
        resumed_sequences.append(tail_events)
        # What follows the prelude is exactly the rest of the uncut stream.
        rest = whole[index + 1 :]
        assert tail_events[len(tail_events) - len(rest) :] == rest
        assert tail_events[0]["metadata"]["agentGateway"]["resumed"] is True
    assert set(await js_verify(tmp_path, resumed_sequences)) == {"ok"}
    # No cursor: the whole stream again. A bad cursor: 400. Another actor's or unknown run: 404.
    _got, again = await resume(client, host_run_id, None)
    assert [e for _i, e in parse(again)] == whole
    bad, _ = await resume(client, host_run_id, "12x")
    assert bad.status == 400
    missing, _ = await resume(client, "run_nope", "1")
    assert missing.status == 404


@pytest.mark.peers
async def test_resume_by_ag_ui_ids_and_live_tail(make_gateway: MakeGateway, tmp_path: Path) -> None:
    """A client that dropped mid-run resumes with its own threadId/runId and gets the live tail."""
    plugin = ScriptedPlugin()
    client = await make_gateway(extra_plugins=(plugin,))
    body = agui_input()
    body["forwardedProps"]["agentGateway"]["options"] = {"hold": True}
    async with asyncio.timeout(WAIT):
        response = await client.post(f"/v1/ag-ui/{SCRIPTED}", json=body)
        host_run_id = response.headers["X-Agent-Gateway-Run-Id"]
        received = b""
        while b"and after" not in received:  # the last scripted thought: the rest is held
            chunk = await response.content.read(1024)
            assert chunk, "the stream ended early"
            received += chunk
        response.close()  # the connection drops mid-run
    frames = parse(received.rsplit(b"\n\n", 1)[0] + b"\n\n")
    cursor = frames[-1][0]
    async with asyncio.timeout(WAIT):
        tail_response = await client.get(
            f"/v1/ag-ui/runs/{body['runId']}/stream",
            params={"threadId": body["threadId"], "workspaceId": "local:test"},
            headers={"Last-Event-ID": cursor},
        )
        assert tail_response.status == 200
        assert tail_response.headers["X-Agent-Gateway-Run-Id"] == host_run_id
        plugin.runtime.release.set()
        tail = parse(await tail_response.read())
    events = [e for _i, e in tail]
    check(events)
    assert events[-1]["type"] == "RUN_FINISHED"
    # the prelude: the run re-started, the state the client had
    assert [e["type"] for e in events[:2]] == ["RUN_STARTED", "STATE_SNAPSHOT"]
    assert await js_verify(tmp_path, [events]) == ["ok"]


@pytest.mark.peers
async def test_http_agent_consumes_a_chat_only_run(make_gateway: MakeGateway, tmp_path: Path) -> None:
    client = await make_gateway()
    body = agui_input("from the JS client")
    out = await node(tmp_path, "run", str(client.make_url("/v1/ag-ui/chat-only")), stdin={**body, "headers": GUARD})
    result = json.loads(out.splitlines()[-1])
    assert result["error"] is None, result
    assert result["seen"][0] == "RUN_STARTED" and result["seen"][-1] == "RUN_FINISHED"
    assistant = [m for m in result["messages"] if m["role"] == "assistant"]
    assert assistant and "from the JS client" in assistant[-1]["content"]


@pytest.mark.peers
async def test_http_agent_consumes_a_fake_acp_agent_run(make_gateway: MakeGateway, tmp_path: Path) -> None:
    """The fake ACP agent: a thought then the echo (basic); a tool call behind a permission that the
    test answers through the respondUrl the CUSTOM event carries (permission)."""
    client = await make_gateway(extra_plugins=(FakeAcpPlugin(),))
    body = agui_input("think first")
    out = await node(tmp_path, "run", str(client.make_url("/v1/ag-ui/fake-basic")), stdin={**body, "headers": GUARD})
    result = json.loads(out.splitlines()[-1])
    assert result["error"] is None, result
    assert "REASONING_MESSAGE_CONTENT" in result["seen"] and result["seen"][-1] == "RUN_FINISHED"
    assert any("echo: think first" in (m.get("content") or "") for m in result["messages"])

    # permission: the run starts from Python (the same RunAgentInput is the same run for the JS client
    # after it), which answers the permission its CUSTOM event announces, at its respondUrl
    body = agui_input("write it")
    async with asyncio.timeout(WAIT):
        response = await client.post("/v1/ag-ui/fake-permission", json=body)
        respond, buffer = None, b""
        while respond is None:
            chunk = await response.content.read(256)
            assert chunk, "the stream ended before the permission request"
            buffer += chunk
            complete = buffer.rsplit(b"\n\n", 1)[0] + b"\n\n" if b"\n\n" in buffer else b""
            for _id, event in parse(complete):
                if event["type"] == "CUSTOM" and event["name"] == "agent_gateway.permission_requested":
                    respond = event["value"]["respondUrl"]
        answer = await client.post(respond, json={"optionId": "allow_once"})
        assert answer.status == 200, await answer.text()
        response.close()
    url = str(client.make_url("/v1/ag-ui/fake-permission"))
    out = await node(tmp_path, "run", url, stdin={**body, "headers": GUARD})
    result = json.loads(out.splitlines()[-1])
    assert result["error"] is None, result
    seen = result["seen"]
    assert "CUSTOM:agent_gateway.permission_requested" in seen and "TOOL_CALL_RESULT" in seen
    assert seen[-1] == "RUN_FINISHED"
    assert any("permission: allow_once" in (m.get("content") or "") for m in result["messages"])


@pytest.mark.peers
async def test_http_agent_resumes_mid_message_and_ends_with_the_whole_answer(
    make_gateway: MakeGateway, tmp_path: Path
) -> None:
    """An HttpAgent that holds what it got before the cut (its messages) resumes through the resume
    route: the prelude re-opens the message it was inside, so the rest lands in that same message."""
    client = await make_gateway(extra_plugins=(ScriptedPlugin(),))
    body = agui_input()
    response, raw = await post_run(client, SCRIPTED, body)
    host_run_id = response.headers["X-Agent-Gateway-Run-Id"]
    frames = parse(raw)
    cut = next(i for i, (_id, e) in enumerate(frames) if e["type"] == "TEXT_MESSAGE_CONTENT")
    message_id = frames[cut][1]["messageId"]
    had = [*body["messages"], {"id": message_id, "role": "assistant", "content": frames[cut][1]["delta"]}]
    url = str(client.make_url(f"/v1/ag-ui/runs/{host_run_id}/stream"))
    out = await node(
        tmp_path, "resume", url, stdin={**body, "messages": had, "headers": GUARD, "lastEventId": frames[cut][0]}
    )
    result = json.loads(out.splitlines()[-1])
    assert result["error"] is None, result
    assert result["seen"][0] == "RUN_STARTED" and result["seen"][-1] == "RUN_FINISHED"
    same = [m for m in result["messages"] if m["id"] == message_id]
    assert len(same) == 1 and same[0]["content"] == "Let me look.", same
    assert result["state"]["sessionMode"] == "new_session"


async def test_bad_input_is_a_clear_4xx(make_gateway: MakeGateway) -> None:
    client = await make_gateway(tokens={"secret-token": "alice", "bob-token": "bob"})
    auth = {"Authorization": "Bearer secret-token"}
    no_auth = await client.post("/v1/ag-ui/chat-only", json=agui_input())
    assert no_auth.status == 401
    cases: list[tuple[Any, int, str]] = [
        ({"threadId": "t"}, 400, "RunAgentInput"),
        ({**agui_input(), "messages": [{"id": "a", "role": "assistant", "content": "x"}]}, 400, "no user message"),
        ({**agui_input(), "forwardedProps": {"agentGateway": 3}}, 400, "agentGateway"),
        ([1, 2], 400, "RunAgentInput"),
        # the declared input names the bad field (the document's, /openapi.json)
        ({**agui_input(), "messages": [{"id": "a", "role": "robot"}]}, 400, "messages.0 must be a message with a role"),
        ({**agui_input(), "threadId": " "}, 400, "threadId must be a non-empty string"),
        (
            {**agui_input(), "forwardedProps": {"agentGateway": {"multitaskStrategy": "later"}}},
            400,
            "forwardedProps.agentGateway.multitaskStrategy must be one of",
        ),
    ]
    for body, status, words in cases:
        response = await client.post("/v1/ag-ui/chat-only", json=body, headers=auth)
        assert response.status == status, (body, await response.text())
        assert words in (await response.json())["error"]["message"]
    unknown = await client.post("/v1/ag-ui/nobody", json=agui_input(), headers=auth)
    assert unknown.status == 400 and (await unknown.json())["error"]["code"] == "unknown_agent"
    deep = '{"threadId": "t", "runId": "r", "messages": ' + "[" * 5000 + "]" * 5000 + "}"
    response = await client.post("/v1/ag-ui/chat-only", data=deep, headers={**auth, "Content-Type": "application/json"})
    assert response.status == 400
    surrogate = b'{"threadId": "t", "runId": "r", "messages": [{"id": "1", "role": "user", "content": "\\ud800"}]}'
    response = await client.post(
        "/v1/ag-ui/chat-only", data=surrogate, headers={**auth, "Content-Type": "application/json"}
    )
    assert response.status == 400
    # another actor's run is not found, by either id
    client_run, raw = await post_run_with(client, auth)
    host_run_id = client_run.headers["X-Agent-Gateway-Run-Id"]
    assert parse(raw)[-1][1]["type"] == "RUN_FINISHED"
    other = await client.get(f"/v1/ag-ui/runs/{host_run_id}/stream", headers={"Authorization": "Bearer nope"})
    assert other.status == 401
    bob = {"Authorization": "Bearer bob-token"}
    assert (await client.get(f"/v1/ag-ui/runs/{host_run_id}/stream", headers=bob)).status == 404
    huge = {**agui_input("x" * (9 << 20))}
    assert (await client.post("/v1/ag-ui/chat-only", json=huge, headers=auth)).status == 413


async def post_run_with(client: TestClient, headers: dict[str, str]) -> tuple[Any, bytes]:
    async with asyncio.timeout(WAIT):
        response = await client.post("/v1/ag-ui/chat-only", json=agui_input(), headers=headers)
        return response, await response.read()


# -- the translation on random journals ------------------------------------------------------------

TEXT = st.text(alphabet="ab 思", min_size=0, max_size=4)
CALL = st.sampled_from(["c1", "c2"])
PAYLOADS: dict[str, Any] = {
    "message.delta": st.fixed_dictionaries({"text": TEXT}),
    "message.completed": st.one_of(st.just({}), st.fixed_dictionaries({"text": TEXT})),
    "thought.delta": st.fixed_dictionaries({"text": TEXT}),
    "tool.started": st.fixed_dictionaries({"toolCallId": CALL, "title": TEXT, "rawInput": st.just({"a": 1})}),
    "tool.updated": st.fixed_dictionaries({"toolCallId": CALL, "status": st.sampled_from(["in_progress", "failed"])}),
    "tool.completed": st.fixed_dictionaries({"toolCallId": CALL, "status": st.just("completed")}),
    "plan.updated": st.fixed_dictionaries(
        {
            "entries": st.lists(
                st.fixed_dictionaries(
                    {"content": st.sampled_from(["x", "y"]), "status": st.sampled_from(["in_progress", "completed"])}
                ),
                max_size=2,
            )
        }
    ),
    "permission.requested": st.fixed_dictionaries({"requestId": st.just("p1")}),
    "files.changed": st.fixed_dictionaries({"changes": st.just([{"path": "a"}])}),
    "session.info.updated": st.fixed_dictionaries({"sessionMode": st.just("loaded")}),
}
TERMINAL = st.sampled_from(["run.completed", "run.failed", "run.cancelled", "run.interrupted"])


class FakeRun:
    host_run_id = "run_x"
    session_id = "thread"
    request_id = "r1"


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.sampled_from(sorted(PAYLOADS)).flatmap(lambda k: st.tuples(st.just(k), PAYLOADS[k])), max_size=25),
    TERMINAL,
    st.booleans(),
)
def test_any_journal_translates_to_a_valid_sequence_and_every_cut_resumes(
    steps: list[tuple[str, dict[str, Any]]], terminal: str, replayed: bool
) -> None:
    journal = [Event("run_x", 1, "run.created", "gateway", {})]
    for kind, payload in steps:
        source = "adapter_replay" if replayed and kind == "message.delta" else "agent"
        journal.append(Event("run_x", len(journal) + 1, kind, source, payload))
    journal.append(Event("run_x", len(journal) + 1, terminal, "gateway", {"reason": "because"}))
    translator = AgUiTranslator(FakeRun())  # type: ignore[arg-type]
    groups = [(e.seq, translator.translate(e)) for e in journal]
    whole = [json.loads(f.split("data: ", 1)[1]) for seq, g in groups for f in group_frames(seq, g)]
    check(whole)
    # a cut after every frame: the prelude plus the rest is valid on its own
    position = 0
    for seq, group in groups:
        for k in range(1, len(group) + 1):
            position += 1
            fresh = AgUiTranslator(FakeRun())  # type: ignore[arg-type]
            received = OpenItems()
            for event in journal:
                if event.seq > seq:
                    break
                out = fresh.translate(event)
                received.feed(out[:k] if event.seq == seq else out)
            head = [e.model_dump(mode="json", by_alias=True, exclude_none=True) for e in prelude(fresh, received)]
            rest = whole[position:]
            if rest:
                check(head + rest)


@settings(max_examples=200, deadline=None)
@given(st.text(min_size=1, max_size=40).filter(lambda t: not any(0xD800 <= ord(c) <= 0xDFFF for c in t)))
def test_the_content_fast_path_writes_what_the_official_encoder_writes(text: str) -> None:
    """Deltas into an open message or reasoning skip building the model: the bytes must be the same."""
    for kind in ("message.delta", "thought.delta"):
        translator = AgUiTranslator(FakeRun())  # type: ignore[arg-type]
        translator.translate(Event("run_x", 1, kind, "agent", {"text": "open"}))
        event = Event("run_x", 2, kind, "agent", {"text": text})
        fast = translator.content_frame(event)
        assert fast is not None
        assert fast.decode() == "".join(group_frames(2, translator.translate(event)))
    closed = AgUiTranslator(FakeRun())  # type: ignore[arg-type]
    assert closed.content_frame(Event("run_x", 1, "message.delta", "agent", {"text": text})) is None


async def test_without_the_ag_ui_package_the_routes_are_off_and_the_log_says_why(
    make_gateway: MakeGateway, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    for name in ("ag_ui", "ag_ui.core", "ag_ui.encoder"):
        monkeypatch.setitem(sys.modules, name, None)  # `import ag_ui` now fails as if not installed
    for name in ("agent_gateway.plugins.ag_ui.routes", "agent_gateway.plugins.ag_ui.mapping"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    with caplog.at_level("INFO", logger="agent_gateway.plugins.ag_ui"):
        client = await make_gateway()
    assert "pip install 'agent-gateway[ag-ui]'" in caplog.text
    response = await client.post("/v1/ag-ui/chat-only", json=agui_input())
    assert response.status in (404, 405)
    paths = (await (await client.get("/openapi.json")).json())["paths"]
    assert not [path for path in paths if path.startswith("/v1/ag-ui/")]
    assert (await client.post("/v1/runs", json={**agui_input(), "agentId": "x"})).status == 400  # the rest works


def test_serving_the_routes_builds_no_ag_ui_model_until_a_stream_is_encoded() -> None:
    # The SDK's event models cost start-up time; validating an input needs none of them.
    code = (
        "import sys; from agent_gateway.plugins.ag_ui import routes; "
        "routes.parse_input({'threadId': 't', 'runId': 'r', "
        "'messages': [{'id': '1', 'role': 'user', 'content': 'hi'}]}); "
        "print(sorted(m for m in sys.modules if m.startswith('ag_ui')))"
    )
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert loaded.stdout.strip() == "[]", loaded.stdout


def test_a_cut_inside_a_merged_delta_resumes_from_the_unmerged_journal_without_loss() -> None:
    """A client that fell behind got deltas merged by the bus (one event standing for seqs 2..3);
    its resume is rebuilt from the journal, unmerged: every cut gives back exactly the rest."""
    journal = [
        Event("run_x", 1, "run.created", "gateway", {}),
        Event("run_x", 2, "message.delta", "agent", {"text": "a"}),
        Event("run_x", 3, "message.delta", "agent", {"text": "b"}),
        Event("run_x", 4, "message.delta", "agent", {"text": "c"}),
        Event("run_x", 5, "run.completed", "gateway", {}),
    ]
    merged = Event("run_x", 3, "message.delta", "agent", {"text": "ab", "mergedFrom": 2, "mergedCount": 2})
    live = AgUiTranslator(FakeRun())  # type: ignore[arg-type]
    sent: list[tuple[str, dict[str, Any]]] = []
    for event in (journal[0], merged, *journal[3:]):
        frames = group_frames(event.seq, live.translate(event), first_seq=merged_from(event))
        sent.extend(parse("".join(frames).encode()))
    assert [frame_id[-4:] for frame_id, _e in sent] == ["0001", "02:1", "0003", "0004", "05:1", "0005"]
    for index, (cursor, _event) in enumerate(sent[:-1]):
        seq, _, k = cursor.partition(":")
        resumption = Resumption(AgUiTranslator(FakeRun()), int(seq), int(k) if k else None)  # type: ignore[arg-type]
        for event in journal:
            if event.seq <= int(seq):
                resumption.feed(event)
        resumed = [e for _i, e in parse(resumption.head(cursor))]
        for event in journal:
            if event.seq > int(seq):
                frames = group_frames(event.seq, resumption.translator.translate(event))
                resumed.extend(e for _i, e in parse("".join(frames).encode()))
        check(resumed)
        had = [e for _i, e in sent[: index + 1]]
        text = "".join(e.get("delta", "") for e in had + resumed if e["type"] == "TEXT_MESSAGE_CONTENT")
        assert text == "abc", (cursor, had, resumed)
        ids = {e["messageId"] for e in had + resumed if e["type"].startswith("TEXT_MESSAGE")}
        assert ids == {"run_x-msg-2"}


async def test_a_null_multitask_strategy_is_the_default(make_gateway: MakeGateway) -> None:
    # The operation declares the field nullable: null means "not chosen", never a 400 from the core.
    client = await make_gateway()
    body = agui_input(
        "hello", forwardedProps={"agentGateway": {"workspaceId": "local:test", "multitaskStrategy": None}}
    )
    response, raw = await post_run(client, "chat-only", body)
    assert response.status == 200, raw[:500]
    assert [e["type"] for _id, e in parse(raw)][-1] == "RUN_FINISHED"


async def test_a_thread_id_with_a_control_character_is_answered(make_gateway: MakeGateway) -> None:
    # The thread id becomes the session id, which no header may carry: the stream still answers.
    client = await make_gateway()
    messages = [
        {"id": "u0", "role": "user", "content": "earlier"},
        {"id": "a0", "role": "assistant", "content": "ok"},
        {"id": "u1", "role": "user", "content": "now"},
    ]
    body = agui_input("now", threadId="\x1b", messages=messages)
    response, raw = await post_run(client, "chat-only", body)
    assert response.status == 200, raw[:500]
    assert "X-Agent-Gateway-Session" not in response.headers
    events = [e for _id, e in parse(raw)]
    assert events[0]["threadId"] == "\x1b" and events[-1]["type"] == "RUN_FINISHED"
