"""Upgrades keep data: databases written by previous releases open with today's journal, every run,
event, session, receipt and preference intact and the schema at the version this code knows; a
database a newer release migrated is refused, untouched.

The old databases are tests/fixtures/journal_upgrade/: each written by that release's own storage
code (generate.py runs it from this repository's history): a SQLite file and a ``pg_dump`` of a
PostgreSQL schema per release, and what that release read back (``*.expected.json``).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sqlite3
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import peewee
import psycopg2
import pytest
from playhouse.migrate import migrate

from agent_gateway.models import Event, Run
from agent_gateway.plugins.cluster_redis.coordinator import CLUSTER_MIGRATIONS
from agent_gateway.plugins.journal_peewee import PeeweeStorage
from agent_gateway.plugins.journal_peewee.migrations import (
    JOURNAL_MIGRATIONS,
    JOURNAL_VERSION,
    MigrationContext,
    SchemaVersionTooNew,
)
from tests.fixtures.journal_upgrade import dataset

FIXTURES = Path(__file__).parent / "fixtures" / "journal_upgrade"
FIXTURE_SCHEMA = "agw_upgrade_fixture"  # the schema the dumps were taken from (generate.py)
RELEASES = ("r1-core", "r2-session-index", "r3-unversioned")
POSTGRES_URL = os.environ.get("AG_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")
STARTS_AT_ONCE = 4
JOIN_SECONDS = 60.0


# -- a database of either kind, described from outside the storage ---------------------------------


class Database:
    """One journal's database (a SQLite file, or a PostgreSQL schema), with what a test needs to
    look at it without the storage: its tables, columns, indexes and row counts."""

    def __init__(self, kind: str, tmp_path: Path, admin: Any) -> None:
        self.kind = kind
        self.name = f"ag_mig_{uuid.uuid4().hex[:12]}"
        self.path = tmp_path / f"{self.name}.db"
        self._admin = admin

    def storage(self) -> PeeweeStorage:
        if self.kind == "sqlite":
            return PeeweeStorage(f"sqlite:///{self.path}")
        return PeeweeStorage(POSTGRES_URL, schema=self.name)

    def load_release(self, release: str) -> None:
        """The database as that release left it."""
        if self.kind == "sqlite":
            shutil.copyfile(FIXTURES / f"{release}.sqlite3", self.path)
            return
        dump = (FIXTURES / f"{release}.postgresql.sql").read_text().replace(FIXTURE_SCHEMA, self.name)
        # Its own connection: the dump empties the search_path of the session that runs it.
        conn = psycopg2.connect(POSTGRES_URL, connect_timeout=5)
        conn.autocommit = True
        try:
            with conn.cursor() as cur:
                cur.execute(dump)
        finally:
            conn.close()

    def query(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        if self.kind == "sqlite":
            conn = sqlite3.connect(self.path)
            try:
                with conn:  # commits
                    return conn.execute(sql, params).fetchall()
            finally:
                conn.close()
        with self._admin.cursor() as cur:
            cur.execute(sql.replace("?", "%s"), params)
            return cur.fetchall() if cur.description else []

    def table(self, name: str) -> str:
        return f'"{name}"' if self.kind == "sqlite" else f'"{self.name}"."{name}"'

    def describe(self, *, journal_only: bool = False) -> dict[str, Any]:
        """Tables (with their columns) and indexes, in a form equal for equal schemas;
        ``journal_only``: without the cluster plugin's tables."""
        skip = "ag_cluster_%" if journal_only else ""
        if self.kind == "sqlite":
            objects = self.query(
                "SELECT type, name, sql FROM sqlite_master WHERE name NOT LIKE 'sqlite_%' AND tbl_name NOT LIKE ?"
                " ORDER BY name",
                (skip,),
            )
            return {
                "objects": objects,
                "columns": {
                    name: self.query(f'PRAGMA table_info("{name}")') for kind, name, _ in objects if kind == "table"
                },
            }
        columns = self.query(
            "SELECT table_name, ordinal_position, column_name, data_type, is_nullable, column_default"
            " FROM information_schema.columns WHERE table_schema = ? AND table_name NOT LIKE ?"
            " ORDER BY table_name, ordinal_position",
            (self.name, skip),
        )
        indexes = self.query(
            "SELECT tablename, indexname, indexdef FROM pg_indexes WHERE schemaname = ? AND tablename NOT LIKE ?"
            " ORDER BY indexname",
            (self.name, skip),
        )
        # Sequence names and index definitions name the schema: equal schemas elsewhere are equal.
        return json.loads(json.dumps({"columns": columns, "indexes": indexes}, default=str).replace(self.name, "S"))

    def tables(self) -> list[str]:
        if self.kind == "sqlite":
            return [row[0] for row in self.query("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")]
        return [
            row[0]
            for row in self.query(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = ? ORDER BY table_name",
                (self.name,),
            )
        ]

    def counts(self) -> dict[str, int]:
        return {name: self.query(f"SELECT COUNT(*) FROM {self.table(name)}")[0][0] for name in self.tables()}

    def set_version(self, component: str, version: int) -> None:
        self.query(
            f"UPDATE {self.table('ag_schema_version')} SET version = ? WHERE component = ?", (version, component)
        )


@pytest.fixture
def databases(storage_kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Callable[[], Database]]:
    """Make databases of the parametrized kind (PostgreSQL schemas are dropped afterwards)."""
    admin = request.getfixturevalue("postgres_admin") if storage_kind == "postgres" else None
    made: list[Database] = []

    def make() -> Database:
        made.append(Database(storage_kind, tmp_path, admin))
        return made[-1]

    yield make
    if admin is not None:
        with admin.cursor() as cur:
            for database in made:
                cur.execute(f'DROP SCHEMA IF EXISTS "{database.name}" CASCADE')


def opened(database: Database) -> PeeweeStorage:
    storage = database.storage()
    storage.open()
    return storage


def read_back(storage: PeeweeStorage) -> dict[str, Any]:
    return json.loads(json.dumps(dataset.snapshot(storage), ensure_ascii=False))


# -- upgrades -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("release", RELEASES)
def test_a_database_a_previous_release_wrote_is_upgraded_with_everything_intact(
    release: str, databases: Callable[[], Database]
) -> None:
    old = databases()
    old.load_release(release)
    expected = json.loads((FIXTURES / f"{release}.expected.json").read_text())
    tables_before, counts_before = old.tables(), old.counts()
    assert "ag_schema_version" not in tables_before and counts_before["ag_runs"] == len(dataset.RUNS)

    storage = opened(old)
    try:
        assert storage.schema_version() == JOURNAL_VERSION
        found = read_back(storage)
    finally:
        storage.close()

    # Every run, event (from every resume point), session, receipt and preference reads back as
    # the release that wrote it read it.
    for part in ("runs", "events", "sessions", "preferences", "receipts"):
        assert found[part] == expected[part], part
    assert [run["host_run_id"] for run in found["runs"]] == [run["host_run_id"] for run in dataset.RUNS]
    assert sum(len(receipts) for receipts in found["receipts"].values()) == len(dataset.RECEIPTS)
    if "session_index" in expected:
        assert (found["session_index"], found["search"]) == (expected["session_index"], expected["search"])
    else:  # the release had no session index: it starts empty (the indexer fills it from the runs)
        assert all(row is None for row in found["session_index"].values())
    # No row was lost or added: the tables the release made keep their counts; the new ones start
    # empty, but for the version row.
    counts_after = old.counts()
    assert {name: counts_after[name] for name in tables_before} == counts_before
    internal = ("ag_session_fts_", "sqlite_")  # FTS5's own bookkeeping, SQLite's AUTOINCREMENT table
    added = {n: count for n, count in counts_after.items() if n not in tables_before and not n.startswith(internal)}
    assert added.pop("ag_schema_version") == 1
    assert not any(added.values()), added
    assert old.query("SELECT component, version FROM " + old.table("ag_schema_version")) == [
        ("journal", JOURNAL_VERSION)
    ]

    # The upgraded schema is the one a new database gets.
    fresh = databases()
    opened(fresh).close()
    assert old.describe(journal_only=True) == fresh.describe()

    # Opening it again changes nothing; it takes new runs and finds them.
    storage = opened(old)
    try:
        assert old.counts() == counts_after
        run = Run(host_run_id="run-new", request_id="r", agent_id="a", provider="p", session_id="s-new",
                  actor_id="alice", workspace_id="w", request={"message": "kilimanjaro"})  # fmt: skip
        storage.insert_run(run)
        storage.append_events([Event("run-new", 1, "run.started", "gateway", {"n": 1})])
        storage.touch_session_index(run)
        digest = {**dataset.DIGESTS[0], "host_run_id": "run-new", "session_id": "s-new", "question": "kilimanjaro"}
        storage.put_run_digest(digest)
        assert storage.read_events("run-new")[0].payload == {"n": 1}
        assert [row["session_id"] for row in storage.search_session_index("alice", "kilimanjaro")] == ["s-new"]
        assert read_back(storage)["runs"][:3] == expected["runs"]
    finally:
        storage.close()


def test_the_cluster_tables_of_a_previous_release_are_upgraded_with_their_rows(
    postgres_admin: Any, tmp_path: Path
) -> None:
    old = Database("postgres", tmp_path, postgres_admin)
    try:
        old.load_release("r3-unversioned")
        before = old.counts()
        assert before["ag_cluster_instances"] == before["ag_cluster_sessions"] == before["ag_cluster_runs"] == 1
        storage = opened(old)
        try:
            assert storage.schema_version("cluster") is None  # the journal's start-up leaves them alone
            assert storage.migrate_schema("cluster", CLUSTER_MIGRATIONS, legacy_table="cluster_instances") == 1
            assert storage.schema_version("cluster") == len(CLUSTER_MIGRATIONS)
        finally:
            storage.close()
        after = old.counts()
        assert {name: after[name] for name in before} == before
        assert old.query(f"SELECT instance_id, token, url FROM {old.table('ag_cluster_instances')}") == [
            ("node-a", 42, "http://10.0.0.1:8080")
        ]
    finally:
        postgres_admin.cursor().execute(f'DROP SCHEMA IF EXISTS "{old.name}" CASCADE')


def test_a_new_database_runs_every_migration_and_matches_the_models(databases: Callable[[], Database]) -> None:
    database = databases()
    storage = opened(database)
    try:
        assert storage.schema_version() == JOURNAL_VERSION
        # A model changed without a migration is caught here: each field has its column.
        tables = database.describe()
        for model in storage.models.all():
            table = model._meta.table_name
            if database.kind == "sqlite":
                columns = {row[1] for row in tables["columns"][table]}
            else:
                columns = {row[2] for row in tables["columns"] if row[0] == table}
            assert {field.column_name for field in model._meta.sorted_fields} <= columns, table
        dataset.write(storage, Run, Event)
        assert len(read_back(storage)["runs"]) == len(dataset.RUNS)
    finally:
        storage.close()


def test_gateways_starting_at_once_migrate_once(
    databases: Callable[[], Database], caplog: pytest.LogCaptureFixture
) -> None:
    database = databases()
    database.load_release("r1-core")
    caplog.set_level(logging.INFO, logger="agent_gateway.plugins.journal_peewee")
    storages = [database.storage() for _ in range(STARTS_AT_ONCE)]
    start = threading.Barrier(STARTS_AT_ONCE, timeout=JOIN_SECONDS)
    errors: list[BaseException] = []

    def open_one(storage: PeeweeStorage) -> None:
        try:
            start.wait()
            storage.open()
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=open_one, args=(storage,)) for storage in storages]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(JOIN_SECONDS)
    try:
        assert not any(thread.is_alive() for thread in threads)
        assert errors == []
        applied = [r for r in caplog.records if "migration 1 applied" in r.getMessage()]
        assert len(applied) == 1, [r.getMessage() for r in caplog.records]
        assert {storage.schema_version() for storage in storages} == {JOURNAL_VERSION}
        assert database.counts()["ag_runs"] == len(dataset.RUNS)
    finally:
        for storage in storages:
            storage.close()


def receipts_with_a_source(ctx: MigrationContext) -> None:
    """receipts record their source (the example in docs/storage.md)"""
    migrate(
        ctx.migrator.add_column(ctx.name("receipts"), "source", peewee.TextField(null=True)),
        ctx.migrator.add_index(ctx.name("receipts"), ("source",)),
    )


def test_a_later_migration_runs_once_in_the_journals_schema(databases: Callable[[], Database]) -> None:
    """What the next schema change will do: a migration written with playhouse.migrate applies to
    an existing database once, in the right schema, keeping the rows."""
    database = databases()
    storage = opened(database)
    try:
        dataset.write(storage, Run, Event)
        migrations = (*JOURNAL_MIGRATIONS, receipts_with_a_source)
        assert storage.migrate_schema("journal", migrations) == len(migrations)
        assert storage.migrate_schema("journal", migrations) == len(migrations)  # already applied: nothing
        assert storage.schema_version() == len(migrations)
        receipts = database.table("ag_receipts")
        assert database.query(f"SELECT COUNT(*), COUNT(source) FROM {receipts}") == [(len(dataset.RECEIPTS), 0)]
        assert read_back(storage)["receipts"] == {
            run["host_run_id"]: [r for r in dataset.RECEIPTS if r["hostRunId"] == run["host_run_id"]]
            for run in dataset.RUNS
        }
    finally:
        storage.close()
    # This release does not know version 2: it refuses the database now.
    newer = database.storage()
    try:
        with pytest.raises(SchemaVersionTooNew):
            newer.open()
    finally:
        newer.close()


# -- downgrades -----------------------------------------------------------------------------------------


def test_a_database_a_newer_release_migrated_is_refused_and_left_unchanged(databases: Callable[[], Database]) -> None:
    database = databases()
    storage = opened(database)
    try:
        dataset.write(storage, Run, Event)
    finally:
        storage.close()
    database.set_version("journal", JOURNAL_VERSION + 1)
    schema, counts = database.describe(), database.counts()

    storage = database.storage()
    try:
        with pytest.raises(SchemaVersionTooNew) as refused:
            storage.open()
    finally:
        storage.close()
    message = str(refused.value)
    assert "\n" not in message
    assert f"schema version {JOURNAL_VERSION + 1}, newer than this release knows ({JOURNAL_VERSION})" in message
    assert "a downgrade is refused; nothing was changed" in message
    assert (database.describe(), database.counts()) == (schema, counts)


def test_the_cluster_tables_refuse_a_downgrade_too(postgres_admin: Any, tmp_path: Path) -> None:
    database = Database("postgres", tmp_path, postgres_admin)
    try:
        storage = opened(database)
        try:
            storage.migrate_schema("cluster", CLUSTER_MIGRATIONS)
            database.set_version("cluster", len(CLUSTER_MIGRATIONS) + 1)
            schema, counts = database.describe(), database.counts()
            with pytest.raises(SchemaVersionTooNew, match="the cluster tables in this database are at schema"):
                storage.migrate_schema("cluster", CLUSTER_MIGRATIONS)
            assert (database.describe(), database.counts()) == (schema, counts)
        finally:
            storage.close()
    finally:
        postgres_admin.cursor().execute(f'DROP SCHEMA IF EXISTS "{database.name}" CASCADE')


def test_serve_refuses_a_newer_database_in_one_line(tmp_path: Path) -> None:
    database = Database("sqlite", tmp_path, None)
    opened(database).close()
    database.set_version("journal", JOURNAL_VERSION + 1)
    beside = Path(sys.executable).with_name("agent-gateway")
    script = str(beside) if beside.exists() else shutil.which("agent-gateway")
    assert script, "the agent-gateway console script is not installed (pip install -e .)"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENT_GATEWAY", "OPENAI_"))}
    env.update(XDG_DATA_HOME=str(tmp_path / "xdg"), AGENT_GATEWAY__STORAGE__URL=f"sqlite:///{database.path}")
    done = subprocess.run(
        [script, "serve", "--port", "0", "--data-dir", str(tmp_path / "data")],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    lines = done.stderr.strip().splitlines()
    assert done.returncode != 0 and len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert f"storage sqlite:///{database.path} could not be opened" in lines[0]
    assert f"newer than this release knows ({JOURNAL_VERSION})" in lines[0]
