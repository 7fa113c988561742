"""The session index's incremental fold (issue 31): an ended run's digest is folded as its events
are published, equal to folding its whole journal; a run not seen from its start, or whose fold was
lost, is folded from its journal as before; a long answer's stored digest keeps only what the
session's search text can show."""

from __future__ import annotations

import random
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from agent_gateway.models import Event, Run
from agent_gateway.plugins.journal_peewee import PeeweeStorage
from agent_gateway.plugins.journal_peewee.sessions import MAX_SEARCH_TEXT, SessionIndexMixin
from agent_gateway.routes.sessions.indexer import DIGEST_TEXT_CHARS, RunFold, run_digest
from agent_gateway.transcript import project_transcript, run_transcript
from tests._harness import POSTGRES_URL, WAIT, gateway_of, run_to_end, storage_fixture  # noqa: F401  (fixtures)
from tests._sessions import ALICE, auth, body, gateway, get_json, indexer_of, watch_index_batches


def _run(host_run_id: str = "run_fold", session_id: str = "s-fold", message: Any = "what about kelp?") -> Run:
    return Run(
        host_run_id=host_run_id,
        request_id=host_run_id,
        agent_id="bench",
        provider="tests",
        session_id=session_id,
        actor_id="alice",
        workspace_id="w",
        status="completed",
        created_at=1,
        updated_at=2,
        request={"message": message, "options": {}},
    )


def _journal(run_id: str, rng: random.Random, final: bool) -> list[Event]:
    """Every kind the transcript folds, in a random order between `run.created` and the end."""
    middle: list[tuple[str, str, dict[str, Any]]] = [
        ("session.info.updated", "gateway", {"sessionMode": "loaded", "agentSessionId": "agent-1"}),
        ("session.info.updated", "gateway", {"sessionMode": "native_live"}),
        ("message.delta", "adapter_replay", {"text": "OLD"}),
        ("replay.message", "adapter_replay", {"role": "assistant", "text": "OLD"}),
        ("thought.delta", "bench", {"text": "hmm"}),
        ("thought.delta", "adapter_replay", {"text": "old hmm"}),
        ("tool.started", "bench", {"toolCallId": "c1", "title": "search kelp", "kind": "search"}),
        ("tool.updated", "bench", {"toolCallId": "c1", "locations": [{"path": "sea/kelp.md"}]}),
        ("tool.completed", "bench", {"toolCallId": "c1", "status": "completed", "tool": "search"}),
        (
            "tool.completed",
            "bench",
            {"toolCallId": "c2", "rawOutput": {"refs": [{"citationMarkdown": "[k](u)", "path": "k.md"}]}},
        ),
        ("tool.completed", "bench", {"toolCallId": "c3", "rawOutput": {"citationUrl": "https://x.test/k"}}),
        ("client_tool.requested", "bench", {"toolCallId": "c4", "name": "pick"}),
        ("files.changed", "gateway", {"changes": [{"path": "notes/kelp.txt"}, {"nopath": 1}]}),
        ("plan.updated", "bench", {"entries": [{"content": "x"}]}),
        ("usage.updated", "bench", {"inputTokens": 3}),
        ("message.delta", "bench", {"text": ""}),
        ("message.delta", "bench", {"text": 7}),
        ("agent.update", "bench", {"raw": 1}),
    ]
    middle += [("message.delta", "bench", {"text": f"kelp {i} "}) for i in range(rng.randrange(0, 9000))]
    rng.shuffle(middle)
    if final:  # a final answer, then more deltas after it
        at = rng.randrange(len(middle) + 1)
        middle.insert(at, ("message.completed", "bench", {"text": "the final kelp answer"}))
    kinds = [("run.created", "gateway", {"receipt": {"agentId": "bench"}}), *middle]
    kinds.append(("run.completed", "gateway", {"status": "completed"}))
    return [Event(run_id, seq, kind, source, payload) for seq, (kind, source, payload) in enumerate(kinds, 1)]


def test_the_fold_gives_the_digest_of_the_whole_journal() -> None:
    rng = random.Random(31)
    for case in range(12):
        run = _run(message=None if case == 3 else "what about kelp?")
        events = _journal(run.host_run_id, rng, final=case % 2 == 1)
        fold = RunFold(run.host_run_id)
        at = 0
        while at < len(events):  # in published batches of any size
            size = rng.choice((1, 2, 50, 256, 1024, 5000))
            assert fold.add(events[at : at + size])
            at += size
        assert fold.ended
        expected = run_digest(run, project_transcript(events, run_transcript(run)))
        assert run_digest(run, fold.transcript(run)) == expected


def test_a_long_answer_is_folded_up_to_what_a_digest_carries() -> None:
    """A digest carries the start of a long answer: the fold keeps no more of its deltas, and its
    digest is still the whole journal's (a final answer after the cut replaces what was kept)."""
    for final_at in (None, 30_000):
        run = _run("run_long")
        kinds = [("message.delta", {"text": f"kelp {i} "}) for i in range(40_000)]  # about 350,000 characters
        if final_at is not None:
            kinds.insert(final_at, ("message.completed", {"text": "the final kelp answer"}))
        events = [
            Event(run.host_run_id, 1, "run.created", "gateway", {}),
            *(Event(run.host_run_id, seq, kind, "bench", payload) for seq, (kind, payload) in enumerate(kinds, 2)),
            Event(run.host_run_id, len(kinds) + 2, "run.completed", "gateway", {"status": "completed"}),
        ]
        fold = RunFold(run.host_run_id)
        for at in range(0, len(events), 1000):
            assert fold.add(events[at : at + 1000])
        assert fold.kept < DIGEST_TEXT_CHARS + 20  # the delta that reached the cut is the last kept
        digest = run_digest(run, fold.transcript(run))
        assert digest == run_digest(run, project_transcript(events, run_transcript(run)))
        assert len(digest["answer"]) == DIGEST_TEXT_CHARS
        assert digest["answer"].startswith("the final kelp answer" if final_at else "kelp 0 kelp 1 ")


def test_a_fold_refuses_events_that_do_not_follow_it() -> None:
    events = _journal("run_gap", random.Random(1), final=False)
    fold = RunFold("run_gap")
    assert fold.add(events[:3])
    assert not fold.add(events[4:6])  # seq 4 is missing
    assert not fold.ended


async def test_an_ended_run_is_indexed_from_its_fold_not_its_journal(
    make_gateway: Any, storage_kind: str, monkeypatch: Any
) -> None:
    client, _plugin = await gateway(make_gateway, storage_kind)
    indexer = indexer_of(client)
    await get_json(client, "/v1/sessions")  # the first list indexes ended runs never indexed: none later
    batches = watch_index_batches(monkeypatch, indexer)
    await run_to_end(client, body("s-folded", "tell me about kelp", "f1"), headers=auth(ALICE))
    [session] = (await get_json(client, "/v1/sessions"))["sessions"]
    assert (session["messageCount"], session["toolCount"], session["runCount"]) == (2, 1, 1)
    found = (await get_json(client, "/v1/sessions", q="kelp"))["sessions"]
    assert [s["sessionId"] for s in found] == ["s-folded"]
    assert not (await get_json(client, "/v1/sessions", q="pondering"))["sessions"]  # thoughts never indexed
    sources = [source for batch in batches for run, source in batch if run.is_terminal]
    assert len(sources) == 1 and isinstance(sources[0], RunFold)
    assert indexer.folds == {}  # taken at the run's end


async def test_a_run_whose_fold_was_lost_is_folded_from_its_journal(make_gateway: Any, storage_kind: str) -> None:
    """A fold dropped mid-run (the bound on folds, or a fold that failed) is not used: the
    run's end folds its journal, with the same result."""
    client, _plugin = await gateway(make_gateway, storage_kind)
    indexer = indexer_of(client)
    folded = indexer._fold

    def fold_then_lose(host_run_id: str, events: list[Event]) -> None:
        folded(host_run_id, events)
        indexer.folds.pop(host_run_id, None)

    gateway_of(client).journal.on_publish[:] = [fold_then_lose]
    await run_to_end(client, body("s-lost", "tell me about kelp", "l1"), headers=auth(ALICE))
    [session] = (await get_json(client, "/v1/sessions"))["sessions"]
    assert (session["messageCount"], session["toolCount"]) == (2, 1)
    assert [s["sessionId"] for s in (await get_json(client, "/v1/sessions", q="kelp"))["sessions"]] == ["s-lost"]
    detail = await get_json(client, "/v1/sessions/s-lost")
    assert detail["runs"][0]["transcript"]["answer"]["text"] == "Here is about tell me about kelp"


def test_a_long_answers_digest_keeps_what_the_search_text_can_show(tmp_path: Path) -> None:
    storage = PeeweeStorage(f"sqlite:///{tmp_path / 'fold.db'}")
    storage.open()
    try:
        answers = ["kelp " * (MAX_SEARCH_TEXT // 4), "seaweed answer"]
        for number, answer in enumerate(answers):
            run = _run(f"run_{number}", "s-long")
            storage.insert_run(run)
            storage.touch_session_index(run)
            events = [
                Event(run.host_run_id, 1, "run.created", "gateway", {}),
                Event(run.host_run_id, 2, "message.delta", "bench", {"text": answer}),
                Event(run.host_run_id, 3, "run.completed", "gateway", {"status": "completed"}),
            ]
            storage.put_run_digest(run_digest(run, project_transcript(events, run_transcript(run))))
        [(stored,)] = storage.database.execute_sql(
            f"SELECT answer FROM {storage._rd} WHERE host_run_id = ?", ("run_0",)
        ).fetchall()
        assert stored == answers[0][:MAX_SEARCH_TEXT]
        [(joined,)] = storage.database.execute_sql(f"SELECT answers FROM {storage._si}").fetchall()
        assert joined == "\n".join(answers)[:MAX_SEARCH_TEXT]  # what the whole answers made
        assert storage.search_session_index("alice", "kelp", limit=5)
        assert not storage.search_session_index("alice", "seaweed", limit=5)  # past the cut, as before
    finally:
        storage.close()


async def test_a_fold_that_fails_never_stops_the_run(make_gateway: Any, storage_kind: str, monkeypatch: Any) -> None:
    """The fold runs inside the journal's publish: its failure is logged, the run goes on, and its
    end is folded from its journal."""

    def broken(self: RunFold, events: list[Event]) -> bool:
        raise ValueError("a broken fold")

    monkeypatch.setattr(RunFold, "add", broken)
    client, _plugin = await gateway(make_gateway, storage_kind)
    _receipt, events = await run_to_end(client, body("s-broken", "tell me about kelp", "b1"), headers=auth(ALICE))
    assert events[-1]["event"] == "run.completed"
    [session] = (await get_json(client, "/v1/sessions"))["sessions"]
    assert (session["messageCount"], session["toolCount"]) == (2, 1)
    assert (indexer_of(client)).folds == {}


def _index_row(storage: PeeweeStorage, session_id: str) -> tuple[Any, ...]:
    row = storage.database.execute_sql(
        f"SELECT questions, answers, tools, files, message_count, tool_count, last_mode FROM {storage._si}"
        f" WHERE actor_id = {'?' if storage.is_sqlite else '%s'} AND session_id = {'?' if storage.is_sqlite else '%s'}",
        ("alice", session_id),
    ).fetchone()
    return tuple(row)


def _found(storage: PeeweeStorage, words: list[str]) -> list[list[tuple[str, float]]]:
    return [
        [(hit["session_id"], hit["score"]) for hit in storage.search_session_index("alice", word, limit=20)]
        for word in words
    ]


def test_a_session_text_kept_turn_by_turn_is_the_one_recomputed_from_every_digest(
    storage: PeeweeStorage, monkeypatch: Any
) -> None:
    """A run's end adds its digest to the session's counts and search text (the session's other
    turns unread) when it is the session's newest; a digest that replaces one, or comes in older
    than another, has them recomputed. Either way the row and the search are what a recompute
    from every digest makes, on SQLite and PostgreSQL, with texts past the cut and empty ones."""
    monkeypatch.setattr("agent_gateway.plugins.journal_peewee.sessions.MAX_SEARCH_TEXT", 3_000)
    rng = random.Random(4)
    recomputed: list[str] = []
    recompute = SessionIndexMixin._recompute_session
    monkeypatch.setattr(
        SessionIndexMixin,
        "_recompute_session",
        lambda self, actor_id, session_id: (recomputed.append(session_id), recompute(self, actor_id, session_id)),
    )
    words = ["kelp", "tide", "reef", "brine", "gull"]
    for session in range(3):
        session_id = f"s-turns-{session}"
        runs = []
        for number in range(25):
            run = _run(f"run_{session}_{number:02d}", session_id, f"{rng.choice(words)} question {number}")
            run.created_at = 1_000 + number + (rng.randrange(-3, 1) if session == 2 else 0)  # some out of order
            storage.insert_run(run)
            storage.touch_session_index(run)
            runs.append(run)
        order = runs[:] if session == 0 else rng.sample(runs, len(runs))
        for again in rng.sample(runs[:15], 5):  # indexed again (a replacement), later on
            order.insert(rng.randrange(order.index(again) + 1, len(order) + 1), again)
        expected_appends = 0
        newest: tuple[int, str] | None = None
        seen: set[str] = set()
        for run in order:
            answer = " ".join(rng.choice(words) for _ in range(rng.choice((0, 3, 200))))
            transcript = {
                "question": run.request["message"] if rng.random() > 0.1 else "",
                "answer": {"text": answer, "final": True},
                "tools": [{"tool": rng.choice(words)}] if rng.random() > 0.5 else [],
                "files": [{"path": f"notes/{rng.choice(words)}.md"}] if rng.random() > 0.7 else [],
                "citations": [],
                "sessionMode": rng.choice((None, "", "fresh", "loaded", "native_live")),
                "agentSessionId": None,
            }
            key = (run.created_at, run.host_run_id)
            if run.host_run_id not in seen and (newest is None or newest < key):
                expected_appends += 1
            seen.add(run.host_run_id)
            newest = key if newest is None else max(newest, key)
            # As the indexer writes an ended run: its row (the run's own mode), then its digest.
            run.session_mode, run.updated_at = rng.choice((None, "fresh", "loaded")), 2_000 + len(seen)
            storage.touch_session_index(run)
            storage.put_run_digest(run_digest(run, transcript))
            kept, found = _index_row(storage, session_id), _found(storage, words)
            recompute(storage, "alice", session_id)
            assert (_index_row(storage, session_id), _found(storage, words)) == (kept, found)
        assert recomputed.count(session_id) == len(order) - expected_appends
        if session == 0:
            assert recomputed.count(session_id) == 5  # in order: only the replacements recomputed
        assert len(kept[1]) == 3_000  # the answers reached the cut


def test_two_instances_ending_runs_of_one_session_at_once_keep_both_texts(postgres_admin: Any) -> None:
    """Cluster instances share PostgreSQL. Two digests of one session written at the same moment
    (each instance's indexer, in its own transaction): the second waits for the first and reads
    what it committed, so the session's text keeps both runs (a read of the row before the first
    committed wrote it back without the first run's text)."""
    schema = f"ag_race_{uuid.uuid4().hex[:10]}"
    first, second = PeeweeStorage(POSTGRES_URL, schema=schema), PeeweeStorage(POSTGRES_URL, schema=schema)
    first.open()
    second.open()
    try:
        runs = [_run("run_race_1", "s-race", "kelp question"), _run("run_race_2", "s-race", "tide question")]
        for number, run in enumerate(runs):
            run.created_at = run.updated_at = 1_000 + number
            first.insert_run(run)
            first.touch_session_index(run)
        digests = [
            run_digest(run, {**run_transcript(run), "question": run.request["message"], "answer": {"text": answer}})
            for run, answer in zip(runs, ("brine answer", "gull answer"), strict=True)
        ]
        # The first instance's transaction stops once it has written the session's row.
        written, release = threading.Event(), threading.Event()
        reindex = first._reindex_search

        def reindex_then_hold(*args: Any, **kwargs: Any) -> None:
            reindex(*args, **kwargs)
            written.set()
            release.wait(WAIT)

        first._reindex_search = reindex_then_hold  # type: ignore[method-assign]
        with ThreadPoolExecutor(2) as pool:
            writing_first = pool.submit(first.put_run_digest, digests[0])
            assert written.wait(WAIT)
            writing_second = pool.submit(second.put_run_digest, digests[1])
            # Bounded: until the second transaction waits for a lock the first holds.
            with postgres_admin.cursor() as cur:
                for _ in range(2_000):
                    cur.execute(  # (this test's statements name its schema; other tests' do not)
                        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE %s",
                        (f"%{schema}%",),
                    )
                    if cur.fetchone()[0] or writing_second.done():
                        break
                    time.sleep(0.005)  # polling pace
            release.set()
            writing_first.result(WAIT)
            writing_second.result(WAIT)
        kept = _index_row(second, "s-race")
        assert kept[0] == "kelp question\ntide question" and kept[1] == "brine answer\ngull answer"
        assert [hit["session_id"] for hit in second.search_session_index("alice", "brine", limit=5)] == ["s-race"]
        SessionIndexMixin._recompute_session(second, "alice", "s-race")
        assert _index_row(second, "s-race") == kept
    finally:
        first.close()
        second.close()
        with postgres_admin.cursor() as cur:
            cur.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
