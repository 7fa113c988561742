"""Creating a run and deleting its session are atomic per session, on both storage backends: fired
together, either the delete answers 409 (the run is active) or it went first and the run starts
the session anew. Never a ghost: a listed session has runs and its last run answers; no event,
digest, session record or index row outlives its run."""

from __future__ import annotations

import asyncio
from typing import Any

from agent_gateway.routes.sessions import run_digest
from agent_gateway.transcript import project_transcript, run_transcript
from tests._harness import WAIT, gateway_of, run_to_end
from tests._sessions import ALICE, auth, body, gateway, get_json

PAIRS = 50


def orphans(storage: Any) -> dict[str, int]:
    """Rows whose run (or, for a session's rows, every run) is gone."""
    models = storage.models
    runs = storage._qualified(models.run._meta.table_name)
    events = storage._qualified(models.event._meta.table_name)
    records = storage._qualified(models.session._meta.table_name)
    no_run = f"NOT EXISTS (SELECT 1 FROM {runs} r WHERE r.host_run_id = x.host_run_id)"
    no_runs = f"NOT EXISTS (SELECT 1 FROM {runs} r WHERE r.actor_id = x.actor_id AND r.session_id = x.session_id)"
    queries = {
        "events": f"SELECT COUNT(*) FROM {events} x WHERE {no_run}",
        "digests": f"SELECT COUNT(*) FROM {storage._rd} x WHERE {no_run}",
        "index rows": f"SELECT COUNT(*) FROM {storage._si} x WHERE {no_runs}",
        "session records": f"SELECT COUNT(*) FROM {records} x WHERE {no_runs}",
    }
    return {name: storage._sql(sql).fetchone()[0] for name, sql in queries.items()}


async def test_a_run_created_while_its_session_is_deleted_leaves_no_ghost(make_gateway: Any, storage_kind: str) -> None:
    client, plugin = await gateway(make_gateway, storage_kind)
    gw = gateway_of(client)
    sessions = [f"race-{i}" for i in range(PAIRS)]
    first = {}
    for session in sessions:  # each session exists (listed) before the race
        receipt, _ = await run_to_end(client, body(session, f"first of {session}", f"{session}-a"), headers=auth(ALICE))
        first[session] = receipt["hostRunId"]

    # A third of the runs stay active until half the answers are in: they end while the other
    # requests are still handled (the runs that end during a delete are what left ghosts).
    answered = 0

    def held(index: int) -> bool:
        return index % 3 == 0

    def answer(status: int, data: Any) -> tuple[int, Any]:
        nonlocal answered
        answered += 1
        if answered == PAIRS:
            plugin.runtime.release.set()
        return status, data

    async def create(index: int, session: str) -> tuple[int, Any]:
        options = {"hold": True} if held(index) else {}
        response = await client.post(
            "/v1/runs", json=body(session, "racing", f"{session}-b", **options), headers=auth(ALICE)
        )
        return answer(response.status, await response.json())

    async def delete(index: int, session: str) -> tuple[int, Any]:
        if index % 2:  # both forms of delete
            response = await client.post("/v1/sessions:delete", json={"sessionIds": [session]}, headers=auth(ALICE))
        else:
            response = await client.delete(f"/v1/sessions/{session}", headers=auth(ALICE))
        return answer(response.status, await response.json())

    calls = []
    for index, session in enumerate(sessions):
        # Half the pairs send the create first, half the delete.
        pair = [create(index, session), delete(index, session)]
        calls.extend(pair if index % 4 < 2 else pair[::-1])
    answers = await asyncio.wait_for(asyncio.gather(*calls), WAIT * 4)

    by_session: dict[str, dict[str, tuple[int, Any]]] = {}
    for index, session in enumerate(sessions):
        a, b = answers[2 * index], answers[2 * index + 1]
        by_session[session] = dict(
            zip(("create", "delete") if index % 4 < 2 else ("delete", "create"), (a, b), strict=True)
        )
    for pair_answers in by_session.values():
        assert pair_answers["create"][0] == 201, pair_answers["create"]
        assert pair_answers["delete"][0] in (200, 409), pair_answers["delete"]
        if pair_answers["delete"][0] == 409:
            assert pair_answers["delete"][1]["error"]["code"] == "session_active"
    for pair_answers in by_session.values():  # every created run ends, whatever the delete did
        await asyncio.wait_for(gw.runs.wait(pair_answers["create"][1]["hostRunId"]), WAIT)

    listed = {s["sessionId"]: s for s in (await get_json(client, "/v1/sessions", limit=200))["sessions"]}
    refused = gone = anew = 0
    for session, answers_of in by_session.items():
        new_run = answers_of["create"][1]["hostRunId"]
        if answers_of["delete"][0] == 409:  # the run was active: the delete changed nothing
            kept, refused = [first[session], new_run], refused + 1
        elif session in listed:  # the delete went first: the run started the session anew
            kept, anew = [new_run], anew + 1
        else:  # the delete came after the run ended: all of it is gone
            kept, gone = [], gone + 1
        for run_id in (first[session], new_run):
            status = (await client.get(f"/v1/runs/{run_id}", headers=auth(ALICE))).status
            assert status == (200 if run_id in kept else 404), (session, run_id, answers_of["delete"])
        if not kept:
            await get_json(client, f"/v1/sessions/{session}", expect=404)
            continue
        # A listed session has its runs, its last run answers, with its whole journal.
        summary = listed[session]
        assert summary["runCount"] == len(kept) and summary["lastRunId"] == new_run
        detail = await get_json(client, f"/v1/sessions/{session}")
        assert [run["receipt"]["hostRunId"] for run in detail["runs"]] == kept
        events = await get_json(client, f"/v1/runs/{new_run}/events", afterSeq="0", limit="1000")
        assert events["events"][0]["kind"] == "run.created" and events["events"][-1]["kind"] == "run.completed"
    assert refused + anew + gone == PAIRS
    assert orphans(gw.storage) == {"events": 0, "digests": 0, "index rows": 0, "session records": 0}
    found = {s["sessionId"] for s in (await get_json(client, "/v1/sessions", q="racing", limit=200))["sessions"]}
    assert found == set(listed)  # search shows what the list shows

    # Deleting every session now leaves nothing behind, not even in search.
    remaining = sorted(listed)
    for start in range(0, len(remaining), 25):
        batch = remaining[start : start + 25]
        response = await client.post("/v1/sessions:delete", json={"sessionIds": batch}, headers=auth(ALICE))
        assert response.status == 200 and sorted((await response.json())["deleted"]) == batch
    assert (await get_json(client, "/v1/sessions"))["sessions"] == []
    assert (await get_json(client, "/v1/sessions", q="racing"))["sessions"] == []
    assert orphans(gw.storage) == {"events": 0, "digests": 0, "index rows": 0, "session records": 0}


async def test_a_late_index_write_of_a_deleted_sessions_run_brings_nothing_back(
    make_gateway: Any, storage_kind: str
) -> None:
    client, _plugin = await gateway(make_gateway, storage_kind)
    gw = gateway_of(client)
    receipt, _ = await run_to_end(client, body("late", "index me late", "l1"), headers=auth(ALICE))
    run = gw.storage.get_run(receipt["hostRunId"])
    digest = run_digest(run, project_transcript(gw.storage.read_events(run.host_run_id), run_transcript(run)))
    assert (await client.delete("/v1/sessions/late", headers=auth(ALICE))).status == 200

    # The indexer's snapshot of the run (queued before the delete, written after): nothing.
    gw.storage.touch_session_index(run)
    gw.storage.put_run_digest(digest)
    await get_json(client, "/v1/sessions/late", expect=404)
    assert (await get_json(client, "/v1/sessions", q="late"))["sessions"] == []
    assert orphans(gw.storage) == {"events": 0, "digests": 0, "index rows": 0, "session records": 0}
