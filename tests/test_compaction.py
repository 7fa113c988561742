"""Compaction of ended runs' text deltas (``[storage] compact_after_terminal``), on SQLite and
PostgreSQL: fewer stored events, and every event invariant still holds — no seq reused, a resume
from ANY seq a client could hold returns exactly what followed it, ``afterSeq`` strictly after."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent_gateway import Event, Run
from agent_gateway.plugins.journal_peewee import PeeweeStorage
from agent_gateway.testing.fake_openai import FakeOpenAI, Reply
from tests._harness import (
    MakeGateway,
    events_page,
    gateway_of,
    read_stream,
    run_body,
    run_to_end,
    storage_fixture,  # noqa: F401  (fixtures)
)

DELTAS = ("message.delta", "thought.delta")


def new_run(storage: PeeweeStorage, status: str = "completed") -> str:
    host_run_id = "run-" + uuid.uuid4().hex[:12]
    storage.insert_run(Run(host_run_id, "req-" + host_run_id, "chat-only", "p", "s-1", "alice", "w", status=status))
    return host_run_id


def stored_rows(storage: PeeweeStorage, host_run_id: str) -> int:
    model = storage.models.event
    return int(model.select().where(model.host_run_id == host_run_id).count())


def tokens(events: list[Event]) -> list[tuple[Any, ...]]:
    """What a client makes of events: each delta's text character by character (tagged with what
    identifies its message), every other event whole. Equal tokens = the same text, in order."""
    out: list[tuple[Any, ...]] = []
    for event in events:
        payload = event.payload
        if event.kind in DELTAS:
            tag = (event.kind, event.source, payload.get("messageId"))
            out.extend((tag, char) for char in str(payload.get("text", "")))
        else:
            out.append((event.seq, event.kind, event.source, repr(payload)))
    return out


def check_read(storage: PeeweeStorage, host_run_id: str, after: int, expected: list[Event], limit: int) -> None:
    """A resume after `after`, whole and page by page, gives exactly what followed `after`."""
    whole = storage.read_events(host_run_id, after)
    assert all(event.seq > after for event in whole)
    assert [e.seq for e in whole] == sorted({e.seq for e in whole})
    wanted = tokens([e for e in expected if e.seq > after])
    assert tokens(whole) == wanted
    paged: list[Event] = []
    cursor = after
    for _ in range(len(expected) + 1):  # bounded: each page moves the cursor on
        page = storage.read_events(host_run_id, cursor, limit)
        if not page:
            break
        assert all(event.seq > cursor for event in page)
        paged.extend(page)
        cursor = page[-1].seq
    assert tokens(paged) == wanted
    if expected and expected[-1].seq > after:
        assert whole[-1] == expected[-1]  # the terminal event, untouched


# Deltas of two messages and both kinds, interleaved with other events; text with any character
# (astral, NUL, a lone surrogate).
TEXT = st.text(alphabet=st.characters(blacklist_categories=()), max_size=6)
ITEM = st.one_of(
    st.tuples(st.sampled_from(DELTAS), st.sampled_from(["m1", "m2", None]), TEXT),
    st.tuples(st.just("tool.started"), st.just(None), st.just("")),
)


def build_events(host_run_id: str, items: list[tuple[str, str | None, str]]) -> list[Event]:
    events = [Event(host_run_id, 1, "run.started", "gateway", {})]
    for kind, message_id, text in items:
        payload: dict[str, Any] = {"text": text} if kind in DELTAS else {"toolCallId": "t"}
        if message_id is not None:
            payload["messageId"] = message_id
        events.append(Event(host_run_id, len(events) + 1, kind, "chat-only", payload))
    events.append(Event(host_run_id, len(events) + 1, "run.completed", "gateway", {}))
    return events


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(items=st.lists(ITEM, max_size=24), max_events=st.integers(2, 6), limit=st.integers(1, 5))
def test_a_resume_from_any_seq_returns_exactly_what_followed_it(
    storage: PeeweeStorage, items: list[tuple[str, str | None, str]], max_events: int, limit: int
) -> None:
    host_run_id = new_run(storage)
    original = build_events(host_run_id, items)
    storage.append_events(original)
    before, after = storage.compact_run(host_run_id, max_events=max_events)
    assert before == len(original) == stored_rows(storage, host_run_id) + (before - after)
    assert after == stored_rows(storage, host_run_id)
    last = original[-1].seq
    assert storage.last_event(host_run_id) == original[-1]  # no seq given out again
    for resume_at in range(last + 1):
        check_read(storage, host_run_id, resume_at, original, limit)
    # Compacting again changes nothing.
    assert storage.compact_run(host_run_id, max_events=max_events) == (after, after)


def test_compaction_folds_a_stretch_into_its_last_seq(storage: PeeweeStorage) -> None:
    host_run_id = new_run(storage)
    texts = ["Hel", "lo", ", ", "wörld", " 😀"]
    items = [("message.delta", "m1", t) for t in texts] + [("thought.delta", "m1", "hm"), ("thought.delta", "m1", "m")]
    original = build_events(host_run_id, items)
    storage.append_events(original)
    assert storage.compact_run(host_run_id) == (len(original), 4)
    stored = storage.read_events(host_run_id)
    assert [(e.seq, e.kind) for e in stored] == [
        (1, "run.started"),
        (6, "message.delta"),
        (8, "thought.delta"),
        (9, "run.completed"),
    ]
    assert stored[1].payload == {"text": "Hello, wörld 😀", "messageId": "m1", "mergedFrom": 2, "mergedCount": 5}
    # A client that holds seq 3 gets the rest of the message, as merged deltas 4..6.
    assert storage.read_events(host_run_id, 3)[0].payload == {
        "text": ", wörld 😀",
        "messageId": "m1",
        "mergedFrom": 4,
        "mergedCount": 3,
    }
    # One that holds seq 5 gets delta 6 exactly as it was first sent.
    assert storage.read_events(host_run_id, 5)[0] == original[5]


def test_a_run_without_its_terminal_event_is_never_compacted(storage: PeeweeStorage) -> None:
    host_run_id = new_run(storage, status="running")
    original = build_events(host_run_id, [("message.delta", None, "a"), ("message.delta", None, "b")])[:-1]
    storage.append_events(original)
    assert storage.compact_run(host_run_id) == (0, 0)
    assert storage.read_events(host_run_id) == original


def test_deltas_written_back_by_spool_recovery_after_compaction_are_not_read_twice(storage: PeeweeStorage) -> None:
    host_run_id = new_run(storage)
    items = [("message.delta", None, t) for t in ["one ", "two ", "three ", "four"]]
    original = build_events(host_run_id, items)
    storage.append_events(original)
    storage.compact_run(host_run_id)
    # A killed gateway's spool still held the last deltas; recovery writes back what is missing.
    storage.append_events(original[2:])
    for resume_at in range(len(original) + 1):
        check_read(storage, host_run_id, resume_at, original, limit=2)
    # Compacting again removes the written-back deltas instead of folding them a second time.
    assert storage.compact_run(host_run_id) == (3 + 2, 3)  # seqs 3 and 4 were written back
    assert stored_rows(storage, host_run_id) == 3
    for resume_at in range(len(original) + 1):
        check_read(storage, host_run_id, resume_at, original, limit=2)


def test_compaction_never_merges_other_events_or_across_them(storage: PeeweeStorage) -> None:
    host_run_id = new_run(storage)
    items = [
        ("message.delta", "m1", "a"),
        ("tool.started", None, ""),
        ("message.delta", "m1", "b"),
        ("message.delta", "m2", "c"),
        ("thought.delta", "m2", "d"),
    ]
    original = build_events(host_run_id, items)
    storage.append_events(original)
    assert storage.compact_run(host_run_id) == (len(original), len(original))
    assert storage.read_events(host_run_id) == original


# -- through the gateway ---------------------------------------------------------------------------


async def test_an_ended_run_is_compacted_and_every_resume_gives_exactly_the_rest(
    make_gateway: MakeGateway, fake_llm: FakeOpenAI, storage_kind: str
) -> None:
    answer = "Compaction keeps every byte of this answer, whatever the resume point. ✓"
    fake_llm.add(Reply(text=answer, reasoning="thinking it over", chunk_size=3))
    client = await make_gateway(overrides={"storage": {"compact_after_terminal": True}}, storage=storage_kind)
    gateway = gateway_of(client)
    _receipt, live = await run_to_end(client, run_body())
    run_id = live[0]["data"]["hostRunId"]
    await gateway.maintenance.settled()
    assert gateway.maintenance.runs_compacted == 1
    stored = await gateway.journal.read(run_id)
    assert len(stored) < len(live) - 20  # the deltas were folded
    assert stored[-1].seq == int(live[-1]["id"])

    def text_after(events: list[dict[str, Any]], kind: str) -> str:
        return "".join(e["data"]["payload"]["text"] for e in events if e["event"] == kind)

    paged = await events_page(client, run_id, limit=2)
    assert "".join(e["payload"]["text"] for e in paged if e["kind"] == "message.delta") == answer
    assert [e["seq"] for e in paged] == [e.cursor for e in stored]
    for index, event in enumerate([{"id": "0"}, *live]):
        seq = event["id"]
        rest = live[index:]
        resumed = await read_stream(client, run_id, after=seq)
        assert [int(e["id"]) for e in resumed] == sorted({int(e["id"]) for e in resumed})
        assert all(int(e["id"]) > int(seq) for e in resumed)
        for kind in DELTAS:
            assert text_after(resumed, kind) == text_after(rest, kind)
        assert [e for e in resumed if e["event"] not in DELTAS] == [e for e in rest if e["event"] not in DELTAS]


async def test_compaction_is_off_by_default(make_gateway: MakeGateway, fake_llm: FakeOpenAI) -> None:
    fake_llm.add(Reply(text="a few small deltas here", chunk_size=2))
    client = await make_gateway()
    gateway = gateway_of(client)
    _receipt, live = await run_to_end(client, run_body())
    await gateway.journal.flush()
    stored = await gateway.journal.read(live[0]["data"]["hostRunId"])
    assert [e.seq for e in stored] == [int(e["id"]) for e in live]
    assert gateway.maintenance.runs_compacted == 0


async def test_a_killed_gateways_spool_written_back_after_compaction_changes_no_resume(
    make_gateway: MakeGateway, fake_llm: FakeOpenAI, storage_kind: str, tmp_path: Path
) -> None:
    answer = "Written back from the spool, told once."
    fake_llm.add(Reply(text=answer, chunk_size=2))
    compact = {"storage": {"compact_after_terminal": True}}
    first = await make_gateway(overrides=compact, storage=storage_kind, data_dir=tmp_path)
    _receipt, live = await run_to_end(first, run_body())
    run_id = live[0]["data"]["hostRunId"]
    await gateway_of(first).maintenance.settled()
    assert gateway_of(first).maintenance.runs_compacted == 1
    # What a killed gateway leaves behind: its spool segment, still holding the run's deltas.
    spool = tmp_path / "spool"
    left_behind = {path.name: path.read_bytes() for path in spool.glob("*.spool")}
    assert any(b"message.delta" in data for data in left_behind.values())
    await first.close()
    for name, data in left_behind.items():
        (spool / name).write_bytes(data)
    second = await make_gateway(overrides=compact, storage=storage_kind, data_dir=tmp_path, schema=first.schema)
    assert not list(spool.glob(f"{next(iter(left_behind))}"))  # recovered, then removed
    for index, event in enumerate([{"id": "0"}, *live]):
        resumed = await read_stream(second, run_id, after=event["id"])
        rest = live[index:]
        for kind in DELTAS:
            got = "".join(e["data"]["payload"]["text"] for e in resumed if e["event"] == kind)
            assert got == "".join(e["data"]["payload"]["text"] for e in rest if e["event"] == kind)
        assert [e for e in resumed if e["event"] not in DELTAS] == [e for e in rest if e["event"] not in DELTAS]
