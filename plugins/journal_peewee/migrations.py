"""Schema versions of the peewee journal, and the numbered migrations that bring a database to
the version this code knows (docs/storage.md, "Schema versions and upgrades").

Each *component* (the journal itself, ``"journal"``; a plugin keeping its own tables beside it,
e.g. ``"cluster"``) has one row in ``{prefix}schema_version``: the number of its migrations
applied so far. A component's migrations are a sequence of functions; the Nth brings its tables
to version N. At start-up :func:`run_migrations` applies the missing ones, in order, in one
transaction (all or nothing), under the schema lock:

- PostgreSQL: the advisory lock ``SCHEMA_LOCK_KEY``, held until the transaction ends, so two
  gateways starting at once on one database never both migrate (the second then finds the
  version already current);
- SQLite: ``BEGIN IMMEDIATE``, the database's write lock.

A database whose version is higher than the code's (written by a newer release) is refused with
:class:`SchemaVersionTooNew` before anything is written.

Migration 1 of each component is its schema as of the first versioned release, written with
create-if-missing statements: a database created by an older release (tables, no version row)
is recognised and completed. Later migrations are plain changes (``playhouse.migrate``'s
``SchemaMigrator`` where it applies) and run exactly once. A migration that has shipped is never
edited: a change is a new one appended to the sequence.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol

import peewee
from playhouse.migrate import PostgresqlMigrator, SchemaMigrator, SqliteMigrator

from agent_gateway import now_ms

log = logging.getLogger(__name__)

# The PostgreSQL advisory lock key that serialises schema changes (any fixed 64-bit number).
SCHEMA_LOCK_KEY = 0x61675F736368656D  # "ag_schem"
VERSION_TABLE = "schema_version"
JOURNAL = "journal"


class PeeweeStorage(Protocol):
    """What migrations use of the storage (``store.PeeweeStorage``; declared here so the store
    imports this module and not the other way round)."""

    database: peewee.Database
    is_sqlite: bool
    table_prefix: str
    schema: str | None

    def _qualified(self, table: str) -> str: ...

    def _write(self) -> AbstractContextManager[None]: ...


class SchemaVersionTooNew(RuntimeError):
    """The database was migrated by a newer release than this one: opening it is refused (a
    downgrade), and nothing was changed."""


class MigrationContext:
    """What a migration function is given: the database, a ``playhouse.migrate`` migrator for it,
    and the storage's table naming (prefix, PostgreSQL schema). Table names passed to the
    migrator are the unqualified :meth:`name`; raw SQL uses the quoted, qualified :meth:`table`."""

    def __init__(self, storage: PeeweeStorage) -> None:
        self.database: peewee.Database = storage.database
        self.is_sqlite = storage.is_sqlite
        self.prefix = storage.table_prefix
        self.schema = storage.schema
        self._storage = storage
        self._migrator: SchemaMigrator | None = None

    @property
    def migrator(self) -> SchemaMigrator:
        """A ``SqliteMigrator`` or ``PostgresqlMigrator``; on PostgreSQL its unqualified names
        resolve in the storage's schema (``search_path`` is set for the migration's transaction)."""
        if self._migrator is None:
            if self.is_sqlite:
                self._migrator = SqliteMigrator(self.database)
            else:
                if self.schema:
                    self.sql(f'SET LOCAL search_path TO "{self.schema}"')
                self._migrator = PostgresqlMigrator(self.database)
        return self._migrator

    def name(self, table: str) -> str:
        """The table's name with the storage's prefix (``runs`` -> ``ag_runs``)."""
        return f"{self.prefix}{table}"

    def table(self, table: str) -> str:
        """The prefixed table's quoted name, schema-qualified when the storage has a schema."""
        return self._storage._qualified(self.name(table))

    def sql(self, statement: str, params: Sequence[Any] = ()) -> Any:
        """Run one statement; ``?`` placeholders on both databases."""
        if not self.is_sqlite:
            statement = statement.replace("?", "%s")
        return self.database.execute_sql(statement, list(params))

    def table_exists(self, table: str) -> bool:
        """True when the prefixed table (or virtual table) exists in the storage's schema."""
        if self.is_sqlite:
            row = self.sql("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (self.name(table),))
        else:
            row = self.sql("SELECT to_regclass(?)", (self.table(table),))
            return row.fetchone()[0] is not None
        return row.fetchone() is not None

    def column_exists(self, table: str, column: str) -> bool:
        if self.is_sqlite:
            return any(row[1] == column for row in self.sql(f"PRAGMA table_info({self.table(table)})").fetchall())
        row = self.sql(
            "SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass(?) AND attname = ? AND NOT attisdropped",
            (self.table(table), column),
        ).fetchone()
        return row is not None


Migration = Callable[[MigrationContext], None]


def _version_table(storage: PeeweeStorage) -> str:
    return storage._qualified(f"{storage.table_prefix}{VERSION_TABLE}")


def read_version(storage: PeeweeStorage, component: str, context: MigrationContext | None = None) -> int | None:
    """The component's recorded schema version; None when it has none (a new database, or one
    written by a release before schema versions)."""
    ctx = context or MigrationContext(storage)
    if not ctx.table_exists(VERSION_TABLE):
        return None
    row = ctx.sql(f"SELECT version FROM {_version_table(storage)} WHERE component = ?", (component,)).fetchone()
    return int(row[0]) if row else None


def run_migrations(
    storage: PeeweeStorage, component: str, migrations: Sequence[Migration], *, legacy_table: str | None = None
) -> int:
    """Bring ``component``'s tables to version ``len(migrations)``; returns that version. Raises
    SchemaVersionTooNew (having changed nothing) when the database's version is higher.
    ``legacy_table``: a table whose presence without a version row means the database was written
    by a release before schema versions (only for the log: migration 1 completes it either way)."""
    latest = len(migrations)
    ctx = MigrationContext(storage)
    with storage._write():
        if not storage.is_sqlite:
            # Gateways starting at once would race to create the same tables (UniqueViolation on
            # pg_type) or both apply a migration: one at a time, per database, until commit.
            ctx.sql("SELECT pg_advisory_xact_lock(?)", (SCHEMA_LOCK_KEY,))
            if storage.schema:
                ctx.sql(f'CREATE SCHEMA IF NOT EXISTS "{storage.schema}"')
        current = read_version(storage, component, ctx)
        if current is not None and current > latest:
            raise SchemaVersionTooNew(
                f"the {component} tables in this database are at schema version {current}, newer than this "
                f"release knows ({latest}): a newer release of the gateway upgraded them; run that release or "
                "a later one (a downgrade is refused; nothing was changed)"
            )
        if current == latest:
            return latest
        # A new database's creation is not news; an upgrade of one holding data is.
        upgrading = current is not None or (legacy_table is not None and ctx.table_exists(legacy_table))
        if upgrading and current is None:
            log.info("%s tables written by a release without schema versions: upgrading them", component)
        ctx.sql(
            f"CREATE TABLE IF NOT EXISTS {_version_table(storage)} (component TEXT PRIMARY KEY,"
            " version INTEGER NOT NULL, updated_at BIGINT NOT NULL)"
        )
        for version in range((current or 0) + 1, latest + 1):
            migration = migrations[version - 1]
            migration(ctx)
            ctx.sql(
                f"INSERT INTO {_version_table(storage)} (component, version, updated_at) VALUES (?, ?, ?)"
                " ON CONFLICT (component) DO UPDATE SET version = excluded.version, updated_at = excluded.updated_at",
                (component, version, now_ms()),
            )
            summary = " ".join((migration.__doc__ or migration.__name__).split())
            log.log(
                logging.INFO if upgrading else logging.DEBUG,
                "%s schema: migration %d applied (%s)",
                component,
                version,
                summary,
            )
    return latest


# -- the journal's migrations -----------------------------------------------------------------------
# Frozen: what each created is what a database of that version holds, whatever the models in
# store.py say later (a fresh database runs them all, in order, like an old one).


def _models_v1(database: peewee.Database, prefix: str, schema: str | None) -> list[type[peewee.Model]]:
    """The five core tables as the first releases created them (peewee models, so the DDL and
    index names are the ones those releases' ``create_tables`` wrote)."""
    bound_database, bound_schema = database, schema

    class Base(peewee.Model):
        class Meta:
            database = bound_database
            schema = bound_schema
            legacy_table_names = False

    class RunRow(Base):
        host_run_id = peewee.TextField(primary_key=True)
        request_id = peewee.TextField()
        agent_id = peewee.TextField()
        provider = peewee.TextField()
        session_id = peewee.TextField()
        actor_id = peewee.TextField()
        workspace_id = peewee.TextField()
        status = peewee.TextField()
        session_mode = peewee.TextField(null=True)
        provider_run_id = peewee.TextField(null=True)
        target_snapshot_hash = peewee.TextField(null=True)
        capability_snapshot_hash = peewee.TextField(null=True)
        parent_run_id = peewee.TextField(null=True)
        created_at = peewee.BigIntegerField()
        updated_at = peewee.BigIntegerField()
        request_hash = peewee.TextField(default="")
        request = peewee.TextField(default="{}")
        error = peewee.TextField(null=True)

        class Meta:
            table_name = f"{prefix}runs"
            indexes = (
                (("actor_id", "session_id", "workspace_id", "request_id"), True),
                (("session_id", "created_at"), False),
                (("status",), False),
            )

    class EventRow(Base):
        host_run_id = peewee.TextField()
        seq = peewee.BigIntegerField()
        kind = peewee.TextField()
        source = peewee.TextField()
        payload = peewee.TextField()
        created_at = peewee.BigIntegerField()

        class Meta:
            table_name = f"{prefix}events"
            primary_key = peewee.CompositeKey("host_run_id", "seq")

    class SessionRow(Base):
        actor_id = peewee.TextField()
        session_id = peewee.TextField()
        record = peewee.TextField()
        updated_at = peewee.BigIntegerField()

        class Meta:
            table_name = f"{prefix}sessions"
            primary_key = peewee.CompositeKey("actor_id", "session_id")

    class PreferenceRow(Base):
        actor_id = peewee.TextField(primary_key=True)
        values_json = peewee.TextField(column_name="values")

        class Meta:
            table_name = f"{prefix}preferences"

    class ReceiptRow(Base):
        id = peewee.AutoField()
        host_run_id = peewee.TextField(index=True)
        actor_id = peewee.TextField(index=True)
        created_at = peewee.BigIntegerField()
        record = peewee.TextField()

        class Meta:
            table_name = f"{prefix}receipts"

    return [RunRow, EventRow, SessionRow, PreferenceRow, ReceiptRow]


class _TSVector(peewee.Field):
    field_type = "TSVECTOR"


def journal_1(ctx: MigrationContext) -> None:
    """the journal as of 0.1.0: runs, events, sessions, preferences, receipts, the session index,
    compacted event spans"""
    # Every statement creates only what is missing: a database an unversioned release wrote
    # (some of these tables, no version row) is completed, its rows untouched.
    ctx.database.create_tables(_models_v1(ctx.database, ctx.prefix, ctx.schema), safe=True)
    p = ctx.prefix
    si, rd = ctx.table("session_index"), ctx.table("run_digests")
    key = "INTEGER PRIMARY KEY AUTOINCREMENT" if ctx.is_sqlite else "BIGSERIAL PRIMARY KEY"
    text = ", ".join(f"{c} TEXT NOT NULL DEFAULT ''" for c in ("questions", "answers", "tools", "files"))
    ctx.sql(
        f"CREATE TABLE IF NOT EXISTS {si} (id {key}, actor_id TEXT NOT NULL, session_id TEXT NOT NULL,"
        " workspace_id TEXT NOT NULL, agent_id TEXT NOT NULL, profile TEXT, model TEXT,"
        " title TEXT NOT NULL DEFAULT '', title_custom INTEGER NOT NULL DEFAULT 0,"
        " pinned INTEGER NOT NULL DEFAULT 0, run_count INTEGER NOT NULL DEFAULT 0,"
        " message_count INTEGER NOT NULL DEFAULT 0, tool_count INTEGER NOT NULL DEFAULT 0,"
        " last_mode TEXT, last_status TEXT, last_run_id TEXT, created_at BIGINT NOT NULL,"
        f" updated_at BIGINT NOT NULL, {text}, UNIQUE (actor_id, session_id))"
    )
    ctx.sql(f"CREATE INDEX IF NOT EXISTS {p}session_index_order ON {si} (actor_id, pinned, updated_at, session_id)")
    ctx.sql(
        f"CREATE TABLE IF NOT EXISTS {rd} (host_run_id TEXT PRIMARY KEY, actor_id TEXT NOT NULL,"
        " session_id TEXT NOT NULL, created_at BIGINT NOT NULL, status TEXT, question TEXT NOT NULL,"
        " answer TEXT NOT NULL, tools TEXT NOT NULL, files TEXT NOT NULL, message_count INTEGER NOT NULL,"
        " tool_count INTEGER NOT NULL, mode TEXT, agent_session_id TEXT)"
    )
    ctx.sql(f"CREATE INDEX IF NOT EXISTS {p}run_digests_session ON {rd} (actor_id, session_id)")
    if ctx.is_sqlite:
        ctx.sql(
            f"CREATE VIRTUAL TABLE IF NOT EXISTS {ctx.table('session_fts')} USING fts5("
            "title, questions, answers, tools, files, tokenize='unicode61')"
        )
    else:
        if not ctx.column_exists("session_index", "search_doc"):
            ctx.migrator.add_column(ctx.name("session_index"), "search_doc", _TSVector(null=True)).run()
        ctx.sql(f"CREATE INDEX IF NOT EXISTS {p}session_index_search ON {si} USING GIN (search_doc)")
    ctx.sql(
        f"CREATE TABLE IF NOT EXISTS {ctx.table('event_spans')} (host_run_id TEXT NOT NULL,"
        " last_seq BIGINT NOT NULL, first_seq BIGINT NOT NULL, lengths TEXT NOT NULL,"
        " PRIMARY KEY (host_run_id, last_seq))"
    )


def journal_2(ctx: MigrationContext) -> None:
    """the webhook outbox: one row per run with a webhook, its delivery state"""
    ob = ctx.table("webhook_outbox")
    ctx.sql(
        f"CREATE TABLE IF NOT EXISTS {ob} (id TEXT PRIMARY KEY, host_run_id TEXT NOT NULL UNIQUE,"
        " url TEXT NOT NULL, state TEXT NOT NULL, attempts INTEGER NOT NULL DEFAULT 0,"
        " next_at BIGINT NOT NULL, lease_until BIGINT NOT NULL DEFAULT 0, created_at BIGINT NOT NULL,"
        " first_attempt_at BIGINT, last_attempt_at BIGINT, last_status INTEGER, last_error TEXT,"
        " delivered_at BIGINT)"
    )
    ctx.sql(f"CREATE INDEX IF NOT EXISTS {ctx.prefix}webhook_outbox_due ON {ob} (state, next_at)")


def journal_3(ctx: MigrationContext) -> None:
    """conversation heads: the session a resent conversation continues (conversation affinity)"""
    heads = ctx.table("conversation_heads")
    ctx.sql(
        f"CREATE TABLE IF NOT EXISTS {heads} (actor_id TEXT NOT NULL, agent_id TEXT NOT NULL,"
        " digest TEXT NOT NULL, session_id TEXT NOT NULL, updated_at BIGINT NOT NULL, claimed_by TEXT,"
        " claimed_at BIGINT, PRIMARY KEY (actor_id, agent_id, digest))"
    )
    ctx.sql(f"CREATE INDEX IF NOT EXISTS {ctx.prefix}conversation_heads_session ON {heads} (actor_id, session_id)")


# Append only: the Nth function brings the journal to version N.
def journal_4(ctx: MigrationContext) -> None:
    """an index of each session's run digests by age: a run's end finds its session's newest
    digest without reading the others"""
    rd = ctx.table("run_digests")
    ctx.sql(
        f"CREATE INDEX IF NOT EXISTS {ctx.prefix}run_digests_age ON {rd}"
        " (actor_id, session_id, created_at, host_run_id)"
    )


JOURNAL_MIGRATIONS: tuple[Migration, ...] = (journal_1, journal_2, journal_3, journal_4)
JOURNAL_VERSION = len(JOURNAL_MIGRATIONS)
