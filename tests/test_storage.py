"""The peewee journal (agent_gateway.plugins.journal_peewee) against the Storage contract, on SQLite and on a real
PostgreSQL. PostgreSQL is not optional: CI starts it, and an unreachable server fails these tests.

Each PostgreSQL test runs in a fresh schema (``ag_test_<random>``) that is dropped afterwards, so
nothing else in the database is touched. ``AG_TEST_POSTGRES_URL`` overrides the server URL.
"""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pluggy
import psycopg2
import pytest

import agent_gateway.plugins.journal_peewee as journal_plugin
from agent_gateway import hookspecs
from agent_gateway.models import Event, Run
from agent_gateway.plugins.journal_peewee import PeeweeStorage
from agent_gateway.storage import RequestConflict, Storage, StorageUnavailable

POSTGRES_URL = os.environ.get("AG_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")
BACKENDS = ("sqlite", "postgresql")


# -- fixtures -----------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def pg_admin() -> Iterator[Any]:
    """An autocommit psycopg2 connection to the test server, used to create and drop schemas."""
    try:
        conn = psycopg2.connect(POSTGRES_URL, connect_timeout=5)
    except psycopg2.OperationalError as exc:
        pytest.fail(
            f"PostgreSQL is required for tests/test_storage.py and is unreachable at {POSTGRES_URL} "
            f"(set AG_TEST_POSTGRES_URL to point elsewhere): {exc}",
            pytrace=False,
        )
    conn.autocommit = True
    yield conn
    conn.close()


@pytest.fixture
def pg_schema(request: pytest.FixtureRequest) -> Iterator[str]:
    """A schema name unique to this test, dropped (with everything in it) afterwards."""
    admin = request.getfixturevalue("pg_admin")
    name = f"ag_test_{uuid.uuid4().hex[:12]}"
    yield name
    with admin.cursor() as cur:
        cur.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')


StorageFactory = Callable[..., PeeweeStorage]


@pytest.fixture(params=BACKENDS)
def make_storage(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StorageFactory]:
    """Build opened storages on the parametrized backend; all are closed at teardown.

    On SQLite every storage uses the same file unless ``name`` differs; on PostgreSQL the same
    per-test schema."""
    backend: str = request.param
    schema = request.getfixturevalue("pg_schema") if backend == "postgresql" else None
    opened: list[PeeweeStorage] = []

    def factory(name: str = "gateway", table_prefix: str = "ag_") -> PeeweeStorage:
        if backend == "sqlite":
            storage = PeeweeStorage(f"sqlite:///{tmp_path / (name + '.db')}", table_prefix=table_prefix)
        else:
            storage = PeeweeStorage(POSTGRES_URL, table_prefix=table_prefix, schema=schema)
        storage.open()
        opened.append(storage)
        return storage

    yield factory
    for storage in opened:
        storage.close()


@pytest.fixture
def storage(make_storage: StorageFactory) -> PeeweeStorage:
    return make_storage()


def make_run(n: int = 1, **overrides: Any) -> Run:
    values: dict[str, Any] = {
        "host_run_id": f"run-{n}",
        "request_id": f"req-{n}",
        "agent_id": "chat-only",
        "provider": "chat_only",
        "session_id": "s-1",
        "actor_id": "alice",
        "workspace_id": "local:notes",
        "created_at": 1_000 + n,
        "updated_at": 1_000 + n,
        "request_hash": f"hash-{n}",
        "request": {
            "message": "可以",
            "context": {"target": {"path": "notes/today.md", "selection": {"from": 1, "to": 5}}},
            "options": {"model": "m"},
        },
    }
    values.update(overrides)
    return Run(**values)


def make_events(run_id: str, seqs: range | list[int], tag: str = "a") -> list[Event]:
    return [
        Event(
            run_id,
            seq,
            "message.delta",
            "gateway",
            {"text": f"{tag}{seq}", "n": seq},
            5_000 + seq,
        )
        for seq in seqs
    ]


# -- runs ---------------------------------------------------------------------------------------


def test_satisfies_protocol(storage: PeeweeStorage) -> None:
    as_protocol: Storage = storage
    for name in Storage.__dict__:
        if not name.startswith("_"):
            assert callable(getattr(as_protocol, name)), name


def test_run_round_trip(storage: PeeweeStorage) -> None:
    run = make_run(1, parent_run_id="run-0", provider_run_id=None)
    storage.insert_run(run)
    assert storage.get_run("run-1") == run
    assert storage.get_run("missing") is None
    assert storage.find_run_by_request("alice", "s-1", "local:notes", "req-1") == run
    assert storage.find_run_by_request("bob", "s-1", "local:notes", "req-1") is None

    new_request = {"message": "继续", "nested": {"list": [1, 2, {"x": None}]}}
    storage.update_run(
        "run-1",
        status="running",
        session_mode="cold_resumed",
        provider_run_id="prov-9",
        request=new_request,
        updated_at=2_000,
        error="boom",
    )
    got = storage.get_run("run-1")
    assert got is not None
    assert got.status == "running"
    assert got.session_mode == "cold_resumed"
    assert got.provider_run_id == "prov-9"
    assert got.request == new_request
    assert got.updated_at == 2_000
    assert got.error == "boom"
    assert got.created_at == run.created_at
    assert got.parent_run_id == "run-0"

    storage.update_run("run-1", error=None)
    got = storage.get_run("run-1")
    assert got is not None and got.error is None
    storage.update_run("run-1")  # nothing to change
    storage.update_run("missing", status="failed")  # unknown run: no-op
    assert storage.get_run("missing") is None


def test_the_nowait_look_up_answers_like_the_worker_one_or_refuses_at_once(
    storage: PeeweeStorage, tmp_path: Path
) -> None:
    """`find_run_by_request_nowait` (for `POST /v1/runs` on the event loop): on SQLite the same
    answer as `find_run_by_request`, including a row committed after its first read, on a
    connection that never waits for a lock; refused on PostgreSQL (the network)."""
    run = make_run(1, parent_run_id="run-0")
    if storage.path is None:
        with pytest.raises(NotImplementedError):
            storage.find_run_by_request_nowait("alice", "s-1", "local:notes", "req-1")
        return
    assert storage.find_run_by_request_nowait("alice", "s-1", "local:notes", "req-1") is None
    storage.insert_run(run)  # on another connection, after the first read
    assert storage.find_run_by_request_nowait("alice", "s-1", "local:notes", "req-1") == run
    assert storage.find_run_by_request_nowait("bob", "s-1", "local:notes", "req-1") is None
    # Its connection never waits for a lock: a busy database is refused at once (SQLITE_BUSY).
    assert storage._nowait_conn is not None
    assert storage._nowait_conn.execute("PRAGMA busy_timeout").fetchone() == (0,)


def test_update_run_rejects_unknown_fields(storage: PeeweeStorage) -> None:
    storage.insert_run(make_run(1))
    with pytest.raises(ValueError, match="nope"):
        storage.update_run("run-1", nope=1)
    with pytest.raises(ValueError, match="sessionMode"):  # snake_case names only
        storage.update_run("run-1", status="running", sessionMode="loaded")
    got = storage.get_run("run-1")
    assert got is not None and got.status == "pending"


def test_duplicate_request_key_raises_conflict_with_existing_run(
    storage: PeeweeStorage,
) -> None:
    first = make_run(1, request_id="req-x")
    storage.insert_run(first)
    retry = make_run(2, request_id="req-x", request={"message": "other body"})
    with pytest.raises(RequestConflict) as caught:
        storage.insert_run(retry)
    assert caught.value.existing == first
    assert storage.get_run("run-2") is None

    # The key is per (actor, session, workspace): the same requestId elsewhere is a new run.
    storage.insert_run(make_run(3, request_id="req-x", session_id="s-2"))
    storage.insert_run(make_run(4, request_id="req-x", actor_id="bob"))
    storage.insert_run(make_run(5, request_id="req-x", workspace_id="local:other"))
    assert {r.host_run_id for r in storage.list_runs()} == {
        "run-1",
        "run-3",
        "run-4",
        "run-5",
    }


def test_list_runs_filters_and_order(storage: PeeweeStorage) -> None:
    runs = [
        make_run(1, created_at=30, status="completed"),
        make_run(2, created_at=10, status="running"),
        make_run(3, created_at=20, status="queued", session_id="s-2"),
        # run-4 ties with run-3 on created_at: host_run_id breaks the tie.
        make_run(4, created_at=20, status="running", actor_id="bob"),
        make_run(5, created_at=40, status="interrupted", actor_id="bob", session_id="s-2"),
    ]
    for run in runs:
        storage.insert_run(run)

    def ids(found: list[Run]) -> list[str]:
        return [r.host_run_id for r in found]

    assert ids(storage.list_runs()) == ["run-2", "run-3", "run-4", "run-1", "run-5"]
    assert ids(storage.list_runs(actor_id="alice")) == ["run-2", "run-3", "run-1"]
    assert ids(storage.list_runs(session_id="s-2")) == ["run-3", "run-5"]
    assert ids(storage.list_runs(actor_id="bob", session_id="s-2")) == ["run-5"]
    assert ids(storage.list_runs(statuses=["running", "queued"])) == [
        "run-2",
        "run-3",
        "run-4",
    ]
    assert ids(storage.list_runs(statuses=iter({"running"}), actor_id="bob")) == ["run-4"]
    assert ids(storage.list_runs(statuses=[])) == []
    assert ids(storage.list_runs(limit=2)) == ["run-2", "run-3"]
    assert ids(storage.list_runs(actor_id="carol")) == []
    assert storage.list_runs(session_id="s-2")[1] == runs[4]


# -- events -------------------------------------------------------------------------------------


def test_append_and_read_events(storage: PeeweeStorage) -> None:
    storage.append_events(make_events("run-1", range(1, 11)))
    storage.append_events(make_events("run-2", range(1, 4), tag="b"))
    storage.append_events([])

    events = storage.read_events("run-1")
    assert [e.seq for e in events] == list(range(1, 11))
    assert events == make_events("run-1", range(1, 11))
    assert [e.seq for e in storage.read_events("run-1", after_seq=3)] == list(range(4, 11))
    assert [e.seq for e in storage.read_events("run-1", after_seq=3, limit=2)] == [4, 5]
    assert [e.seq for e in storage.read_events("run-1", limit=1)] == [1]
    assert storage.read_events("run-1", after_seq=10) == []
    assert storage.read_events("run-1", after_seq=10**17) == []
    assert [e.payload["text"] for e in storage.read_events("run-2")] == [
        "b1",
        "b2",
        "b3",
    ]
    assert storage.read_events("unknown") == []


def test_payload_json_round_trip(storage: PeeweeStorage) -> None:
    payload = {
        "text": "可以\u2028line",
        "nested": {"a": [1, 2.5, None, True]},
        "empty": {},
    }
    storage.append_events([Event("run-1", 1, "agent.update", "reasonix", payload, 7)])
    (event,) = storage.read_events("run-1")
    assert event == Event("run-1", 1, "agent.update", "reasonix", payload, 7)


def test_duplicate_seq_is_skipped_and_original_kept(storage: PeeweeStorage) -> None:
    storage.append_events(make_events("run-1", range(1, 4), tag="orig"))
    # A replayed batch: seq 2 and 3 again (different payload), plus new seq 4, and a duplicate
    # within the batch itself.
    storage.append_events(make_events("run-1", [2, 3, 4], tag="replay") + make_events("run-1", [4], tag="dup"))
    events = storage.read_events("run-1")
    assert [e.seq for e in events] == [1, 2, 3, 4]
    assert [e.payload["text"] for e in events] == ["orig1", "orig2", "orig3", "replay4"]


def test_large_batch_in_one_call(storage: PeeweeStorage) -> None:
    batch = make_events("run-big", range(1, 5_001))
    storage.append_events(batch)
    events = storage.read_events("run-big")
    assert len(events) == 5_000
    assert [e.seq for e in events] == list(range(1, 5_001))
    assert events[-1] == batch[-1]
    last = storage.last_event("run-big")
    assert last is not None and last.seq == 5_000
    assert len(storage.read_events("run-big", after_seq=4_990)) == 10


def test_last_event(storage: PeeweeStorage) -> None:
    assert storage.last_event("run-1") is None
    storage.append_events(make_events("run-1", [3, 1, 2]))
    storage.append_events(make_events("run-2", [7]))
    last = storage.last_event("run-1")
    assert last == make_events("run-1", [3])[0]
    terminal = Event("run-1", 4, "run.completed", "gateway", {"status": "completed"}, 9)
    storage.append_events([terminal])
    assert storage.last_event("run-1") == terminal


def test_concurrent_appends_from_two_threads(storage: PeeweeStorage) -> None:
    batches, per_batch = 20, 100
    barrier = threading.Barrier(2)
    errors: list[BaseException] = []

    def writer(run_id: str) -> None:
        try:
            barrier.wait()
            for b in range(batches):
                start = b * per_batch + 1
                storage.append_events(make_events(run_id, range(start, start + per_batch)))
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(f"run-{i}",)) for i in (1, 2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    for run_id in ("run-1", "run-2"):
        assert [e.seq for e in storage.read_events(run_id)] == list(range(1, batches * per_batch + 1))


def test_concurrent_inserts_of_one_request_key(storage: PeeweeStorage) -> None:
    """Racing retries of one request: exactly one run is stored; the others see it."""
    workers = 4
    barrier = threading.Barrier(workers)
    winners: list[str] = []
    conflicts: list[str] = []
    errors: list[BaseException] = []

    def insert(n: int) -> None:
        try:
            barrier.wait()
            storage.insert_run(make_run(n, request_id="same"))
            winners.append(f"run-{n}")
        except RequestConflict as conflict:
            conflicts.append(conflict.existing.host_run_id)
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=insert, args=(n,)) for n in range(1, workers + 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert len(winners) == 1
    assert conflicts == winners * (workers - 1)


def test_short_lived_threads_do_not_pile_up_connections(storage: PeeweeStorage) -> None:
    storage.insert_run(make_run(1))
    database: Any = storage.database
    for _ in range(20):
        thread = threading.Thread(target=storage.get_run, args=("run-1",))
        thread.start()
        thread.join()
    # this thread's connection plus at most the last ended thread's (closed on the next connect)
    assert database.open_connection_count() <= 2
    storage.close()
    assert database.open_connection_count() == 0


# -- sessions, preferences, receipts ----------------------------------------------------------


def test_sessions_round_trip_and_isolation(storage: PeeweeStorage) -> None:
    assert storage.get_session("alice", "s-1") is None
    record = {
        "summary": "写作",
        "bindings": [{"runtime": "reasonix", "agentSessionId": "a1"}],
    }
    storage.put_session("alice", "s-1", record)
    assert storage.get_session("alice", "s-1") == record
    assert storage.get_session("bob", "s-1") is None

    storage.put_session("bob", "s-1", {"owner": "bob"})
    replaced = {"summary": "new"}
    storage.put_session("alice", "s-1", replaced)
    assert storage.get_session("alice", "s-1") == replaced
    assert storage.get_session("bob", "s-1") == {"owner": "bob"}
    assert storage.get_session("alice", "s-2") is None


def test_preferences_round_trip_and_isolation(storage: PeeweeStorage) -> None:
    assert storage.get_preferences("alice") == {}
    storage.put_preferences("alice", {"ai.common.model": "m", "ai.agent.reasonix.profile": "p"})
    storage.put_preferences("bob", {"ai.common.model": "other"})
    assert storage.get_preferences("alice") == {
        "ai.common.model": "m",
        "ai.agent.reasonix.profile": "p",
    }
    # put replaces, it does not merge
    storage.put_preferences("alice", {"ai.common.theme": "dark"})
    assert storage.get_preferences("alice") == {"ai.common.theme": "dark"}
    assert storage.get_preferences("bob") == {"ai.common.model": "other"}
    storage.put_preferences("alice", {})
    assert storage.get_preferences("alice") == {}


def test_receipts_round_trip(storage: PeeweeStorage) -> None:
    first = {
        "hostRunId": "run-1",
        "actorId": "alice",
        "createdAt": 10,
        "tool": "read_file",
        "path": "notes/a.md",
        "allowed": True,
    }
    second = {
        "hostRunId": "run-1",
        "actorId": "alice",
        "createdAt": 5,
        "tool": "patch_file",
        "path": "notes/a.md",
        "allowed": False,
        "reason": "outside allowed roots",
    }
    other = {
        "hostRunId": "run-2",
        "actorId": "bob",
        "createdAt": "2025-01-01T00:00:00Z",
        "tool": "x",
    }
    storage.insert_receipt(first)
    storage.insert_receipt(second)
    storage.insert_receipt(other)
    assert storage.list_receipts("run-1") == [first, second]  # insertion order
    assert storage.list_receipts("run-2") == [other]
    assert storage.list_receipts("run-3") == []
    with pytest.raises(ValueError, match="hostRunId"):
        storage.insert_receipt({"actorId": "alice", "createdAt": 1})


# -- lifecycle, coexistence, the hook ---------------------------------------------------------


def test_reopen_keeps_data(make_storage: StorageFactory) -> None:
    storage = make_storage()
    storage.open()  # idempotent
    storage.insert_run(make_run(1))
    storage.append_events(make_events("run-1", range(1, 4)))
    storage.close()

    again = make_storage()
    assert again.get_run("run-1") == make_run(1)
    assert [e.seq for e in again.read_events("run-1")] == [1, 2, 3]


def test_storages_with_different_tables_coexist(make_storage: StorageFactory) -> None:
    left = make_storage(name="left", table_prefix="left_")
    right = make_storage(name="right", table_prefix="right_")
    left.insert_run(make_run(1))
    # the same key in other tables: no conflict
    right.insert_run(make_run(1, status="running"))
    left.append_events(make_events("run-1", [1, 2]))
    right.append_events(make_events("run-1", [1], tag="r"))
    assert [e.payload["text"] for e in left.read_events("run-1")] == ["a1", "a2"]
    assert [e.payload["text"] for e in right.read_events("run-1")] == ["r1"]
    left_run, right_run = left.get_run("run-1"), right.get_run("run-1")
    assert left_run is not None and left_run.status == "pending"
    assert right_run is not None and right_run.status == "running"


def test_sqlite_and_postgresql_in_one_process(tmp_path: Path, pg_schema: str) -> None:
    lite = PeeweeStorage(f"sqlite:///{tmp_path / 'sub' / 'g.db'}")
    pg = PeeweeStorage(POSTGRES_URL, schema=pg_schema)
    with lite, pg:
        lite.insert_run(make_run(1))
        pg.insert_run(make_run(2))
        assert lite.get_run("run-2") is None and pg.get_run("run-1") is None
        assert lite.get_run("run-1") == make_run(1)
        assert pg.get_run("run-2") == make_run(2)
        mode = lite.database.execute_sql("PRAGMA journal_mode").fetchone()
        assert mode is not None and mode[0] == "wal"
        sync = lite.database.execute_sql("PRAGMA synchronous").fetchone()
        assert sync is not None and sync[0] == 1  # NORMAL


def test_rejects_bad_arguments(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="sqlite"):
        PeeweeStorage("redis://localhost/0")
    with pytest.raises(ValueError, match="table_prefix"):
        PeeweeStorage(f"sqlite:///{tmp_path / 'g.db'}", table_prefix='x"; DROP')
    with pytest.raises(ValueError, match="schema"):
        PeeweeStorage(f"sqlite:///{tmp_path / 'g.db'}", schema="s")


def test_repr_hides_the_password() -> None:
    text = repr(PeeweeStorage("postgresql://gw:s3cret@db.example:5432/gateway"))
    assert "s3cret" not in text
    assert "gw:***@db.example:5432/gateway" in text


def test_storage_backend_hook(tmp_path: Path) -> None:
    pm = pluggy.PluginManager(hookspecs.PROJECT_NAME)
    pm.add_hookspecs(hookspecs.storage)
    pm.register(journal_plugin)
    pm.check_pending()

    url = f"sqlite:///{tmp_path / 'g.db'}"
    found = pm.hook.storage_backend(url=url, config=None)
    assert isinstance(found, PeeweeStorage) and found.url == url
    for other in ("postgresql://u@h:5432/db", "postgres://u@h/db"):
        assert isinstance(pm.hook.storage_backend(url=other, config=None), PeeweeStorage)
    assert pm.hook.storage_backend(url="redis://localhost/0", config=None) is None

    sentinel = object()

    class ThirdParty:
        @hookspecs.hookimpl
        def storage_backend(self, url: str, config: Any) -> Any:
            return sentinel if url.startswith("sqlite:") else None

    pm.register(ThirdParty())
    # the built-in is trylast, so a later third-party plugin wins
    assert pm.hook.storage_backend(url=url, config=None) is sentinel
    assert isinstance(pm.hook.storage_backend(url="postgresql://u@h/db", config=None), PeeweeStorage)


# -- a database that goes away (connections dropped, server unreachable) ----------------------------


def test_retried_writes_are_idempotent(storage: PeeweeStorage) -> None:
    """What a write retried after its commit went through does: nothing more."""
    run = make_run(1)
    storage.insert_run(run)
    storage.insert_run(run)  # the run found stored by itself: success, not a conflict
    assert storage.list_runs() == [run]
    with pytest.raises(RequestConflict):
        storage.insert_run(make_run(2, request_id=run.request_id))
    receipt = {"hostRunId": "run-1", "actorId": "alice", "createdAt": 7, "receiptId": "rcpt_1"}
    storage.insert_receipt(receipt)
    storage.insert_receipt(receipt)
    storage.insert_receipt({**receipt, "receiptId": "rcpt_2"})
    assert storage.list_receipts("run-1") == [receipt, {**receipt, "receiptId": "rcpt_2"}]
    events = make_events("run-1", range(1, 6))
    storage.append_events(events)
    storage.append_events(events)
    assert [e.seq for e in storage.read_events("run-1")] == [1, 2, 3, 4, 5]


def _terminate(admin: Any, application_name: str) -> int:
    with admin.cursor() as cur:
        cur.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = %s",
            (application_name,),
        )
        return int(cur.fetchone()[0])


def test_postgresql_reopens_connections_the_server_dropped(pg_admin: Any, pg_schema: str) -> None:
    name = f"ag_test_{uuid.uuid4().hex[:8]}"
    storage = PeeweeStorage(f"{POSTGRES_URL}?application_name={name}", schema=pg_schema)
    storage.open()
    try:
        storage.insert_run(make_run(1))
        storage.append_events(make_events("run-1", range(1, 4)))
        calls: list[Callable[[], Any]] = [
            storage.ping,
            lambda: storage.get_run("run-1"),
            lambda: storage.read_events("run-1"),
            lambda: storage.append_events(make_events("run-1", range(3, 7))),
            lambda: storage.insert_run(make_run(2)),
            lambda: storage.update_run("run-1", status="completed"),
            lambda: storage.put_session("alice", "s-1", {"turns": []}),
            lambda: storage.put_preferences("alice", {"ai.common.defaultAgent": "chat-only"}),
            lambda: storage.insert_receipt({"hostRunId": "run-1", "actorId": "alice", "createdAt": 1}),
            lambda: storage.list_runs(statuses=["completed"]),
        ]
        for number, call in enumerate(calls, start=1):
            assert _terminate(pg_admin, name) == 1  # this thread's one connection
            call()  # answered on a fresh connection
            assert storage.connections_lost == number
        assert storage.get_run("run-1").status == "completed"  # type: ignore[union-attr]
        assert [e.seq for e in storage.read_events("run-1")] == [1, 2, 3, 4, 5, 6]
        assert len(storage.list_receipts("run-1")) == 1
        assert storage.get_session("alice", "s-1") == {"turns": []}
    finally:
        storage.close()


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_postgresql_unreachable_raises_storage_unavailable() -> None:
    storage = PeeweeStorage(f"postgresql://postgres@127.0.0.1:{_free_port()}/test")
    for call in (storage.ping, lambda: storage.get_run("run-1"), lambda: storage.append_events(make_events("r", [1]))):
        with pytest.raises(StorageUnavailable):
            call()
    with pytest.raises(ValueError, match="not updatable"):  # a caller's mistake stays one
        storage.update_run("run-1", colour="red")
    assert storage.connections_lost == 0  # none was ever open
    storage.close()


def test_sqlite_file_that_cannot_be_opened_raises_storage_unavailable(tmp_path: Path) -> None:
    path = tmp_path / "gateway.db"
    storage = PeeweeStorage(f"sqlite:///{path}")
    storage.open()
    storage.insert_run(make_run(1))

    def in_new_thread(call: Callable[[], Any]) -> Any:
        """Run `call` on a thread of its own: its own (new) connection, like a storage worker's."""
        outcome: list[Any] = []

        def target() -> None:
            try:
                outcome.append(call())
            except Exception as exc:
                outcome.append(exc)

        thread = threading.Thread(target=target)
        thread.start()
        thread.join(10)
        assert not thread.is_alive()
        return outcome[0]

    aside = tmp_path / "aside"
    aside.mkdir()
    try:
        for file in tmp_path.glob("gateway.db*"):
            file.rename(aside / file.name)
        path.mkdir()  # a directory where the database file was: it cannot be opened
        assert isinstance(in_new_thread(storage.ping), StorageUnavailable)
        assert isinstance(in_new_thread(lambda: storage.get_run("run-1")), StorageUnavailable)
    finally:
        path.rmdir()
        for file in aside.iterdir():
            file.rename(tmp_path / file.name)
    assert in_new_thread(lambda: storage.get_run("run-1")) == make_run(1)
    storage.close()


def test_the_webhook_outbox_row_comes_with_its_run_and_one_instance_claims_it(make_storage: StorageFactory) -> None:
    """docs/webhooks.md: the delivery is written with the run (one transaction), is due once the
    run's stored status is terminal, and two instances on one database never both take it."""
    first, second = make_storage(), make_storage()
    run = make_run(1)
    run.request = {**run.request, "webhook": "https://example.com/hook"}
    first.insert_run(run)
    first.insert_run(make_run(2))  # no webhook: no row
    assert first.get_webhook("run-2") is None
    row = second.get_webhook("run-1")
    assert row is not None and row["state"] == "pending" and row["url"] == "https://example.com/hook"
    now = 10_000
    assert first.due_webhooks(now) == []  # the run has not ended
    first.update_run("run-1", status="completed")
    [due] = second.due_webhooks(now)
    assert due["id"] == row["id"] == "msg_run-1"
    assert [first.claim_webhook(due["id"], now, now + 5_000), second.claim_webhook(due["id"], now, now + 5_000)] == [
        True,
        False,
    ]
    assert second.due_webhooks(now + 1_000) == []  # leased
    assert [r["id"] for r in second.due_webhooks(now + 5_000)] == ["msg_run-1"]  # the lease lapsed
    first.update_webhook("msg_run-1", state="delivered", attempts=1, lease_until=0, last_status=200)
    assert second.due_webhooks(now + 10_000) == []
    assert second.get_webhook("run-1")["state"] == "delivered"  # type: ignore[index]


def test_conversation_heads_are_claimed_once_released_and_replaced(make_storage: StorageFactory) -> None:
    """docs/sessions.md, conversation affinity: one claim per head at a time (a retry with the same
    claimer claims it again), a released head is claimable again, a session keeps one head, and
    its heads go with it."""
    first, second = make_storage(), make_storage()
    run = make_run(1)  # alice's session "s"
    first.insert_run(run)
    actor, session = run.actor_id, run.session_id
    first.put_conversation(actor, "chat-only", "d1", session)
    assert first.claim_conversation("someone-else", "chat-only", "d1", "claim-x", 1) is None  # per actor
    assert first.claim_conversation(actor, "other-agent", "d1", "claim-x", 1) is None  # per agent
    assert first.claim_conversation(actor, "chat-only", "d1", "claim-a", 1) == session
    assert second.claim_conversation(actor, "chat-only", "d1", "claim-b", 2) is None  # taken
    assert second.claim_conversation(actor, "chat-only", "d1", "claim-a", 3) == session  # the same request
    second.release_conversation(actor, "chat-only", "d1")
    assert second.claim_conversation(actor, "chat-only", "d1", "key-1", 4) == session
    # The session moves on: its new head replaces the old, except a head claimed under a key.
    first.put_conversation(actor, "chat-only", "d2", session)
    assert first.claim_conversation(actor, "chat-only", "d1", "key-1", 5) == session  # the keyed retry
    assert first.claim_conversation(actor, "chat-only", "d1", "claim-c", 5) is None
    first.put_conversation(actor, "chat-only", "d3", session)
    assert first.claim_conversation(actor, "chat-only", "d2", "claim-d", 6) is None  # no longer the head
    # No head for a session without runs (deleted meanwhile); a delete takes the session's heads.
    first.put_conversation(actor, "chat-only", "d9", "no-such-session")
    assert first.claim_conversation(actor, "chat-only", "d9", "claim-e", 7) is None
    assert first.delete_session_history(actor, session)
    assert first.claim_conversation(actor, "chat-only", "d3", "claim-f", 8) is None
    assert first.claim_conversation(actor, "chat-only", "d1", "key-1", 8) is None
