"""The peewee journal: runs, events, sessions, preferences and receipts in SQLite or PostgreSQL.

One :class:`PeeweeStorage` owns one peewee ``Database`` and its own model classes (built by
:func:`build_models`), so several storages with different URLs can live in one process.

URLs (the query string becomes driver connect arguments, as in ``playhouse.db_url``):

- ``sqlite:///relative/path.db`` or ``sqlite:////absolute/path.db`` (the path is what follows
  the third slash, so ``f"sqlite:///{Path('/data/gateway.db')}"`` names ``/data/gateway.db``).
  WAL mode, ``synchronous=NORMAL``, a busy timeout, and ``BEGIN IMMEDIATE`` for every write.
- ``postgresql://user:password@host:port/dbname`` (also ``postgres://``). Pass ``schema=`` to keep
  the tables in their own schema (created by ``open()``), or ``?options=-c%20search_path%3Dname``.

Connections are per thread (peewee's thread-local connection state): the core calls the storage
from worker threads. A connection the server dropped (a restart, a failover,
``pg_terminate_backend``) is thrown away and the call retried once on a fresh one: every method
is idempotent (events skip a stored (host_run_id, seq), a run whose insert did commit is taken as
inserted, receipts are stored once). When no connection can be opened the call raises
``StorageUnavailable``. PostgreSQL connections time out after ``connect_timeout`` seconds (5 unless
the URL says otherwise), so an unreachable server is reported instead of waited on.

``open()`` brings the schema to this release's version with the numbered migrations of
migrations.py (and refuses a database a newer release migrated).

The hot path, :meth:`PeeweeStorage.append_events`, bypasses the query builder
and feeds the connection's cursor directly (SQLite: multi-row ``INSERT ... VALUES`` of up to 512
rows each; psycopg2 ``execute_values``).
"""

from __future__ import annotations

import functools
import json
import logging
import re
import sqlite3
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Literal, Self, TypeVar
from urllib.parse import urlsplit

import peewee
from peewee import __exception_wrapper__ as _wrap_db_errors  # type: ignore[attr-defined]
from playhouse import db_url

from agent_gateway import Event, RequestConflict, Run, StorageUnavailable, now_ms

from .conversations import ConversationMixin
from .maintenance import MaintenanceMixin
from .migrations import JOURNAL, JOURNAL_MIGRATIONS, Migration, read_version, run_migrations
from .outbox import OutboxMixin
from .records import MAX_RECORD_CHARS, SessionRecordCache
from .sessions import SessionIndexMixin

log = logging.getLogger(__name__)

SQLITE_SCHEMES = frozenset({"sqlite"})
POSTGRES_SCHEMES = frozenset({"postgres", "postgresql"})
SUPPORTED_SCHEMES = SQLITE_SCHEMES | POSTGRES_SCHEMES

DEFAULT_TABLE_PREFIX = "ag_"
DEFAULT_BUSY_TIMEOUT_MS = 15_000
# Seconds a PostgreSQL connect may take (unless the URL sets connect_timeout).
DEFAULT_CONNECT_TIMEOUT_S = 5
# Rows per statement for the PostgreSQL multi-row VALUES insert.
PG_PAGE_SIZE = 1_000
# Rows per SQLite INSERT: 6 values each, 3,072 parameters (SQLite allows 32,766).
SQLITE_ROWS_PER_INSERT = 512

_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_RUN_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(Run))
_UPDATABLE_RUN_FIELDS = frozenset(_RUN_FIELDS) - {"host_run_id"}
_EVENT_COLUMNS = ("host_run_id", "seq", "kind", "source", "payload", "created_at")


def url_scheme(url: str) -> str:
    """The lower-cased scheme of a storage URL (``""`` when there is none)."""
    return urlsplit(url).scheme.lower()


def handles_url(url: str) -> bool:
    """True when :class:`PeeweeStorage` can open ``url``."""
    return url_scheme(url) in SUPPORTED_SCHEMES


def redact_url(url: str) -> str:
    """``url`` with its password (if any) replaced by ``***``, for logs and reprs."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.netloc.rpartition("@")[2]
    return parts._replace(netloc=f"{parts.username or ''}:***@{host}").geturl()


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _check_identifier(kind: str, value: str) -> str:
    if not _IDENTIFIER.match(value):
        raise ValueError(f"{kind} must match {_IDENTIFIER.pattern}, got {value!r}")
    return value


# -- databases that remember their connections (so close() reaches every thread's) --------------


class _ConnectionRegistry:
    """Mixin for a peewee Database: track every DB-API connection opened, in any thread, so
    ``close_all()`` can close them all. A connection whose thread has ended is closed the next
    time any thread connects, so short-lived threads do not pile up connections."""

    def _init_registry(self) -> None:
        self._open_conns: list[tuple[threading.Thread, Any]] = []
        self._open_conns_lock = threading.Lock()

    def _connect(self) -> Any:
        conn = super()._connect()  # type: ignore[misc]
        with self._open_conns_lock:
            alive: list[tuple[threading.Thread, Any]] = []
            for owner, other in self._open_conns:
                if owner.is_alive():
                    alive.append((owner, other))
                else:
                    with suppress(Exception):
                        other.close()
            alive.append((threading.current_thread(), conn))
            self._open_conns = alive
        return conn

    def _close(self, conn: Any) -> None:
        with self._open_conns_lock:
            self._open_conns = [(owner, other) for owner, other in self._open_conns if other is not conn]
        super()._close(conn)  # type: ignore[misc]

    def discard_connection(self) -> None:
        """Forget this thread's connection (the server dropped it): peewee would otherwise keep
        handing out the dead one. The next statement opens a fresh connection (autoconnect)."""
        state = self._state  # type: ignore[attr-defined]
        conn = state.conn
        with self._open_conns_lock:
            self._open_conns = [(owner, other) for owner, other in self._open_conns if other is not conn]
        state.reset()
        if conn is not None:
            with suppress(Exception):
                conn.close()

    def open_connection_count(self) -> int:
        with self._open_conns_lock:
            return len(self._open_conns)

    def close_all(self) -> None:
        """Close this thread's connection through peewee, then every other thread's directly."""
        if not self.is_closed():  # type: ignore[attr-defined]
            self.close()  # type: ignore[attr-defined]
        with self._open_conns_lock:
            conns, self._open_conns = self._open_conns, []
        for _owner, conn in conns:
            with suppress(Exception):  # best effort at shutdown
                conn.close()


class _SqliteDatabase(_ConnectionRegistry, peewee.SqliteDatabase):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._init_registry()
        super().__init__(*args, **kwargs)


class _PostgresqlDatabase(_ConnectionRegistry, peewee.PostgresqlDatabase):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._init_registry()
        super().__init__(*args, **kwargs)


# -- models ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Models:
    """The model classes of one storage, bound to its database. (Typed ``Any``: they are built at
    run time, so a type checker cannot see their fields.)"""

    run: Any
    event: Any
    session: Any
    preference: Any
    receipt: Any

    def all(self) -> list[type[peewee.Model]]:
        return [self.run, self.event, self.session, self.preference, self.receipt]


def build_models(database: peewee.Database, prefix: str, schema: str | None) -> Models:
    """Model classes bound to ``database``; table names are ``prefix + name``."""

    bound_database, bound_schema = database, schema

    class Base(peewee.Model):
        class Meta:
            database = bound_database
            schema = bound_schema
            # Index names start with the (prefixed) table name, not the class name.
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

    return Models(RunRow, EventRow, SessionRow, PreferenceRow, ReceiptRow)


# -- re-opening lost connections -------------------------------------------------------------------

_Result = TypeVar("_Result")


def _reconnecting(method: Callable[..., _Result]) -> Callable[..., _Result]:
    """Run a storage method; if it failed because the server dropped the connection, open a fresh
    one and run it once more (every method is idempotent). A connection that cannot be opened, or
    a second drop, raises StorageUnavailable. Other errors pass through untouched."""

    @functools.wraps(method)
    def wrapper(self: PeeweeStorage, *args: Any, **kwargs: Any) -> _Result:
        for attempt in (1, 2):
            try:
                return method(self, *args, **kwargs)
            except Exception as exc:
                state = self._connection_state(exc)
                if state == "usable":
                    raise
                self._forget_connection(exc, dropped=state == "dropped")
                if state == "unreachable" or attempt == 2:
                    raise StorageUnavailable(f"{redact_url(self.url)}: {exc}".strip()) from exc
        raise AssertionError("unreachable")  # the loop returns or raises

    return wrapper


# -- the storage ------------------------------------------------------------------------------------


class PeeweeStorage(SessionIndexMixin, MaintenanceMixin, OutboxMixin, ConversationMixin):
    """:class:`agent_gateway.storage.Storage` over peewee (SQLite or PostgreSQL). Thread-safe."""

    def __init__(
        self,
        url: str,
        *,
        table_prefix: str = DEFAULT_TABLE_PREFIX,
        schema: str | None = None,
        busy_timeout_ms: int = DEFAULT_BUSY_TIMEOUT_MS,
    ) -> None:
        scheme = url_scheme(url)
        if scheme not in SUPPORTED_SCHEMES:
            raise ValueError(f"PeeweeStorage handles sqlite:// and postgresql:// URLs, not {url!r}")
        self.url = url
        self.table_prefix = _check_identifier("table_prefix", table_prefix) if table_prefix else ""
        self.schema = _check_identifier("schema", schema) if schema else None
        self.is_sqlite = scheme in SQLITE_SCHEMES
        connect_kwargs: dict[str, Any] = db_url.parse(url, unquote_password=True, unquote_user=True)
        self.database: peewee.Database
        if self.is_sqlite:
            if self.schema:
                raise ValueError("schema= is for PostgreSQL; use table_prefix= with SQLite")
            path = connect_kwargs.pop("database")
            if path in ("", ":memory:"):
                raise ValueError("an in-memory SQLite journal is not supported (one per thread)")
            self.path: Path | None = Path(path)
            timeout_s = busy_timeout_ms / 1000
            self.database = _SqliteDatabase(
                path,
                pragmas={
                    "journal_mode": "wal",
                    "synchronous": 1,  # NORMAL: durable across process crashes, fast in WAL
                    "busy_timeout": busy_timeout_ms,
                    "foreign_keys": 0,
                },
                timeout=timeout_s,
                check_same_thread=False,  # each thread has its own; close() may run elsewhere
                **connect_kwargs,
            )
        else:
            self.path = None
            connect_kwargs.setdefault("connect_timeout", DEFAULT_CONNECT_TIMEOUT_S)
            self.database = _PostgresqlDatabase(**connect_kwargs)
        self.models = build_models(self.database, self.table_prefix, self.schema)
        self._events_table = self._qualified(self.models.event._meta.table_name)
        self._sqlite_insert_sql: dict[int, str] = {}
        run_columns = {f.name: f.column_name for f in self.models.run._meta.sorted_fields}
        self._find_run_sql = (
            f"SELECT {', '.join(run_columns[name] for name in _RUN_FIELDS)} "
            f"FROM {self._qualified(self.models.run._meta.table_name)} "
            "WHERE actor_id = ? AND session_id = ? AND workspace_id = ? AND request_id = ? LIMIT 1"
        )
        # A run's and a session's point reads and writes, the statements each run makes: written
        # out once here, where peewee's query builder took 70-200 µs of CPU (and the GIL) a call.
        runs_table = self._qualified(self.models.run._meta.table_name)
        sessions_table = self._qualified(self.models.session._meta.table_name)
        self._run_columns = tuple(run_columns[name] for name in _RUN_FIELDS)
        self._insert_run_sql = (
            f"INSERT INTO {runs_table} ({', '.join(self._run_columns)}) VALUES ({', '.join('?' * len(_RUN_FIELDS))})"
        )
        # One assignment per field: an update's statement joins those of its fields.
        self._update_run_sql = {name: f"{run_columns[name]} = ?" for name in _UPDATABLE_RUN_FIELDS}
        self._update_run_table = runs_table
        self._get_run_sql = f"SELECT {', '.join(self._run_columns)} FROM {runs_table} WHERE host_run_id = ?"
        self._get_session_sql = f"SELECT record FROM {sessions_table} WHERE actor_id = ? AND session_id = ?"
        self._put_session_sql = (
            f"INSERT INTO {sessions_table} (actor_id, session_id, record, updated_at) VALUES (?, ?, ?, ?) "
            "ON CONFLICT (actor_id, session_id) DO UPDATE SET record = excluded.record, "
            "updated_at = excluded.updated_at"
        )
        self._nowait_conn: sqlite3.Connection | None = None  # find_run_by_request_nowait's
        self._session_records = SessionRecordCache()  # get_session_nowait's
        self._opened = False
        self._open_lock = threading.Lock()
        # Connections found dropped by the server (and replaced by fresh ones).
        self.connections_lost = 0
        self._lost_lock = threading.Lock()

    # Compaction and retention (maintenance.py), re-opening a dropped connection like every
    # other method: each is safe to run again (a compacted stretch is not folded twice, a deletion
    # step deletes what is left).
    compact_run = _reconnecting(MaintenanceMixin.compact_run)
    expired_runs = _reconnecting(MaintenanceMixin.expired_runs)
    _delete_run_history = _reconnecting(MaintenanceMixin.delete_run_history)
    claim_conversation = _reconnecting(ConversationMixin.claim_conversation)
    release_conversation = _reconnecting(ConversationMixin.release_conversation)
    put_conversation = _reconnecting(ConversationMixin.put_conversation)

    def delete_run_history(self, host_run_id: str, before_ms: int, max_events: int = 2000) -> bool:
        # The run's session may lose its record (its last run gone): which one is known only inside.
        self._session_records.changing()
        try:
            return self._delete_run_history(host_run_id, before_ms, max_events)
        finally:
            self._session_records.changed(None)

    def delete_session_history(self, actor_id: str, session_id: str) -> bool:
        self._session_records.changing()
        try:
            return super().delete_session_history(actor_id, session_id)
        finally:
            self._session_records.changed((actor_id, session_id))

    def __repr__(self) -> str:
        return f"PeeweeStorage({redact_url(self.url)!r}, table_prefix={self.table_prefix!r}, schema={self.schema!r})"

    def _qualified(self, table: str) -> str:
        if self.schema:
            return f'"{self.schema}"."{table}"'
        return f'"{table}"'

    def _connection_state(self, exc: Exception) -> Literal["usable", "dropped", "unreachable"]:
        """This thread's connection after an error outside any transaction: ``unreachable`` (it
        could not be opened), ``dropped`` (the server closed it: psycopg2 and psycopg mark a
        connection they saw break as ``closed``), or ``usable`` (a conflict, a bad argument)."""
        if self.database.in_transaction():
            return "usable"  # the outermost call decides, once the transaction is unwound
        if self.database.is_closed():
            # Connecting failed (peewee wraps the driver's error), or the error came first.
            return "unreachable" if isinstance(exc, peewee.PeeweeException) else "usable"
        # open (just checked), so connection() hands out this thread's connection, opening none
        return "dropped" if getattr(self.database.connection(), "closed", False) else "usable"

    def _forget_connection(self, exc: Exception, *, dropped: bool) -> None:
        if dropped:
            with self._lost_lock:
                self.connections_lost += 1
            reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            log.warning("storage connection dropped by the server (%s); reconnecting", reason)
        self.database.discard_connection()  # type: ignore[attr-defined]

    @contextmanager
    def _write(self) -> Iterator[None]:
        """A write transaction. SQLite takes the write lock up front (``BEGIN IMMEDIATE``) so two
        writers wait on the busy timeout instead of failing on a lock upgrade."""
        if self.is_sqlite:
            with self.database.atomic(lock_type="IMMEDIATE"):
                yield
        else:
            with self.database.atomic():
                yield

    # -- lifecycle --------------------------------------------------------------------------
    def open(self) -> None:
        """Connect and bring the schema to this release's version (creating the tables of a new
        database, the PostgreSQL schema, the SQLite folder): the numbered migrations of
        migrations.py, under the schema lock. Raises SchemaVersionTooNew, having changed
        nothing, when a newer release migrated the database. Idempotent."""
        with self._open_lock:
            if self._opened:
                return
            if self.path is not None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
            self.database.connect(reuse_if_open=True)
            run_migrations(self, JOURNAL, JOURNAL_MIGRATIONS, legacy_table="runs")
            self._opened = True

    def migrate_schema(
        self, component: str, migrations: Sequence[Migration], *, legacy_table: str | None = None
    ) -> int:
        """Bring a plugin's own tables beside the journal's (``component``, e.g. ``"cluster"``) to
        version ``len(migrations)``, the same way ``open()`` does the journal's; returns it. Each
        migration is a function of a ``MigrationContext`` (docs/storage.md)."""
        return run_migrations(self, component, migrations, legacy_table=legacy_table)

    def schema_version(self, component: str = JOURNAL) -> int | None:
        """The component's schema version recorded in the database (None: none recorded)."""
        return read_version(self, component)

    @_reconnecting
    def ping(self) -> None:
        """One round trip (``SELECT 1``); raises StorageUnavailable if the database is unreachable."""
        self.database.execute_sql("SELECT 1").fetchone()

    def close(self) -> None:
        """Close every connection this storage opened, in every thread. Final: the storage is
        not to be used afterwards."""
        with self._open_lock:
            self.database.close_all()  # type: ignore[attr-defined]
            self._opened = False
            conn, self._nowait_conn = self._nowait_conn, None
            if conn is not None:
                conn.close()

    def __enter__(self) -> Self:
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- runs ---------------------------------------------------------------------------------
    @staticmethod
    def _run_to_row(run: Run) -> dict[str, Any]:
        row = {name: getattr(run, name) for name in _RUN_FIELDS}
        row["request"] = _dumps(run.request)
        return row

    @staticmethod
    def _row_to_run(row: dict[str, Any]) -> Run:
        values = {name: row[name] for name in _RUN_FIELDS}
        values["request"] = json.loads(values["request"]) if values["request"] else {}
        return Run(**values)

    @_reconnecting
    def insert_run(self, run: Run) -> None:
        """Insert a new run; raise RequestConflict(existing) if its idempotency key is taken.
        A duplicate ``host_run_id`` with a free key raises ``peewee.IntegrityError``. Finding the
        run itself stored (an insert retried after its commit went through) is success."""
        row = self._run_to_row(run)
        try:
            with self._write():
                self._sql(self._insert_run_sql, [row[name] for name in _RUN_FIELDS])
                self._insert_outbox(run)  # same transaction: a stored run's webhook is owed
        except peewee.IntegrityError:
            existing = self.find_run_by_request(run.actor_id, run.session_id, run.workspace_id, run.request_id)
            if existing is None:
                raise
            if existing.host_run_id == run.host_run_id:
                return
            raise RequestConflict(existing) from None

    @_reconnecting
    def update_run(self, host_run_id: str, **fields: Any) -> None:
        """Update some Run fields by their snake_case names; ``request`` takes a dict. An unknown
        field (or ``host_run_id``) raises ValueError; an unknown run is a no-op."""
        unknown = sorted(set(fields) - _UPDATABLE_RUN_FIELDS)
        if unknown:
            raise ValueError(f"update_run: not updatable Run field(s): {', '.join(unknown)}")
        if not fields:
            return
        if "request" in fields:
            fields["request"] = _dumps(fields["request"])
        assignments = ", ".join(self._update_run_sql[name] for name in fields)
        statement = f"UPDATE {self._update_run_table} SET {assignments} WHERE host_run_id = ?"
        with self._write():
            self._sql(statement, [*fields.values(), host_run_id])

    @_reconnecting
    def get_run(self, host_run_id: str) -> Run | None:
        rows = self._sql(self._get_run_sql, [host_run_id]).fetchall()  # (all: the statement ends here)
        return self._row_to_run(dict(zip(_RUN_FIELDS, rows[0], strict=True))) if rows else None

    def find_run_by_request_nowait(
        self, actor_id: str, session_id: str, workspace_id: str, request_id: str
    ) -> Run | None:
        """`find_run_by_request` on the calling thread (the event loop's), SQLite only: a point
        read of the runs table's unique index on a connection of its own that never waits (busy
        timeout 0; in WAL mode a read does not wait for writers anyway). Raises when it cannot
        answer at once (the database is locked, PostgreSQL): the caller asks a worker instead."""
        if self.path is None:
            raise NotImplementedError("PostgreSQL answers over the network: not on the loop")
        rows = self._nowait_read(self._find_run_sql, (actor_id, session_id, workspace_id, request_id))
        return self._row_to_run(dict(zip(_RUN_FIELDS, rows[0], strict=True))) if rows else None

    def _nowait_read(self, sql: str, params: Sequence[Any]) -> list[Any]:
        """A SQLite read on the calling thread's own connection that never waits (busy timeout 0)."""
        assert self.path is not None
        conn = self._nowait_conn
        if conn is None:
            # Autocommit: each read sees the latest commit (no snapshot kept between reads).
            conn = sqlite3.connect(self.path, timeout=0, isolation_level=None, check_same_thread=False)
            conn.execute("PRAGMA query_only = 1")
            self._nowait_conn = conn
        try:
            # Run to its end: no read transaction stays open between look-ups.
            return conn.execute(sql, params).fetchall()
        except sqlite3.Error:
            self._nowait_conn = None
            conn.close()
            raise

    @_reconnecting
    def find_run_by_request(self, actor_id: str, session_id: str, workspace_id: str, request_id: str) -> Run | None:
        model = self.models.run
        row = (
            model.select()
            .where(
                (model.actor_id == actor_id)
                & (model.session_id == session_id)
                & (model.workspace_id == workspace_id)
                & (model.request_id == request_id)
            )
            .dicts()
            .first()
        )
        return self._row_to_run(row) if row else None

    @_reconnecting
    def list_runs(
        self,
        *,
        actor_id: str | None = None,
        session_id: str | None = None,
        statuses: Iterable[str] | None = None,
        limit: int | None = None,
    ) -> list[Run]:
        """Runs matching every given filter, oldest first (created_at, then host_run_id)."""
        model = self.models.run
        query = model.select()
        if actor_id is not None:
            query = query.where(model.actor_id == actor_id)
        if session_id is not None:
            query = query.where(model.session_id == session_id)
        if statuses is not None:
            wanted = list(statuses)
            if not wanted:
                return []
            query = query.where(model.status.in_(wanted))
        query = query.order_by(model.created_at, model.host_run_id)
        if limit is not None:
            query = query.limit(limit)
        return [self._row_to_run(row) for row in query.dicts()]

    # -- events -------------------------------------------------------------------------------
    @_reconnecting
    def append_events(self, events: Sequence[Event]) -> None:
        """Write a batch in one transaction; a (host_run_id, seq) already stored is skipped."""
        if not events:
            return
        columns = ", ".join(_EVENT_COLUMNS)
        with self._write(), _wrap_db_errors:
            cursor = self.database.cursor()
            try:
                if self.is_sqlite:
                    self._sqlite_insert_events(cursor, columns, events)
                else:
                    rows = [(e.host_run_id, e.seq, e.kind, e.source, e.payload_json(), e.created_at) for e in events]
                    self._pg_insert_events(cursor, columns, rows)
            finally:
                cursor.close()

    def _sqlite_insert_events(self, cursor: Any, columns: str, events: Sequence[Event]) -> None:
        # Multi-row INSERTs (up to SQLITE_ROWS_PER_INSERT rows each): the sqlite3 module binds every
        # value in C and SQLite inserts the rows in one step with the GIL released, where
        # executemany takes a step, and the GIL, per row. Row counts are powers of two below the
        # maximum, so a few statements stay prepared in the connection's cache.
        start, total = 0, len(events)
        while start < total:
            count = SQLITE_ROWS_PER_INSERT
            while count > total - start:
                count //= 2
            sql = self._sqlite_insert_sql.get(count)
            if sql is None:
                sql = self._sqlite_insert_sql[count] = (
                    f"INSERT INTO {self._events_table} ({columns}) VALUES "
                    + ",".join(["(?,?,?,?,?,?)"] * count)
                    + " ON CONFLICT (host_run_id, seq) DO NOTHING"
                )
            cursor.execute(
                sql,
                [
                    value
                    for e in events[start : start + count]
                    for value in (e.host_run_id, e.seq, e.kind, e.source, e.payload_json(), e.created_at)
                ],
            )
            start += count

    def _pg_insert_events(self, cursor: Any, columns: str, rows: list[tuple[Any, ...]]) -> None:
        conflict = "ON CONFLICT (host_run_id, seq) DO NOTHING"
        try:
            from psycopg2.extras import execute_values
        except ImportError:  # another driver: plain executemany
            placeholders = ", ".join(["%s"] * len(_EVENT_COLUMNS))
            cursor.executemany(
                f"INSERT INTO {self._events_table} ({columns}) VALUES ({placeholders}) {conflict}",
                rows,
            )
            return
        execute_values(
            cursor,
            f"INSERT INTO {self._events_table} ({columns}) VALUES %s {conflict}",
            rows,
            page_size=PG_PAGE_SIZE,
        )

    @staticmethod
    def _tuple_to_event(row: tuple[Any, ...]) -> Event:
        host_run_id, seq, kind, source, payload, created_at = row
        return Event.stored(host_run_id, seq, kind, source, payload, created_at)  # decoded only if read

    def _event_query(self, host_run_id: str) -> Any:
        model = self.models.event
        return (
            model.select(
                model.host_run_id,
                model.seq,
                model.kind,
                model.source,
                model.payload,
                model.created_at,
            )
            .where(model.host_run_id == host_run_id)
            .tuples()
        )

    @_reconnecting
    def read_events(self, host_run_id: str, after_seq: int = 0, limit: int | None = None) -> list[Event]:
        """Events with seq > after_seq, in seq order, at most ``limit`` of them. A compacted event
        (maintenance.py) that covers ``after_seq`` comes back cut to the text after it."""
        model = self.models.event
        spans = self._compacted_spans(host_run_id, after_seq)
        found: list[Event] = []
        start = after_seq
        while True:  # more than once only when raw rows inside a compacted range were left out
            query = self._event_query(host_run_id).where(model.seq > start).order_by(model.seq)
            wanted = None if limit is None else limit - len(found)
            if wanted is not None:
                query = query.limit(wanted)
            rows = [self._tuple_to_event(row) for row in query]
            if not spans:
                return rows
            events, dropped = self._resolve_compacted(rows, spans, after_seq)
            found.extend(events)
            if not dropped or wanted is None or len(rows) < wanted:
                return found
            start = rows[-1].seq

    @_reconnecting
    def last_event(self, host_run_id: str) -> Event | None:
        model = self.models.event
        row = self._event_query(host_run_id).order_by(model.seq.desc()).limit(1).first()
        return self._tuple_to_event(row) if row else None

    # -- sessions -----------------------------------------------------------------------------
    @_reconnecting
    def get_session(self, actor_id: str, session_id: str) -> dict[str, Any] | None:
        generation = self._session_records.generation
        rows = self._sql(self._get_session_sql, [actor_id, session_id]).fetchall()
        text: str | None = rows[0][0] if rows else None
        if not self.database.in_transaction():  # a read inside a write may see what is not committed
            self._session_records.fill((actor_id, session_id), text, generation)
        return json.loads(text) if text is not None else None

    def get_session_nowait(self, actor_id: str, session_id: str) -> dict[str, Any] | None:
        """`get_session` on the calling thread (the event loop's): what this storage last read or
        wrote of the record (valid only while no other process writes the database: the core
        does not ask when clustered), else a SQLite point read on the connection of
        `find_run_by_request_nowait`. Raises when it cannot answer at once (PostgreSQL, a locked
        database, a record too large to parse on the loop): the caller asks a worker instead."""
        key = (actor_id, session_id)
        known, text = self._session_records.get(key)
        if not known:
            if self.path is None:
                raise NotImplementedError("PostgreSQL answers over the network: not on the loop")
            generation = self._session_records.generation
            rows = self._nowait_read(self._get_session_sql, (actor_id, session_id))
            text = rows[0][0] if rows else None
            if text is not None and len(text) > MAX_RECORD_CHARS:
                raise ValueError("a large session record: a worker parses it")
            self._session_records.fill(key, text, generation)
        return json.loads(text) if text is not None else None

    @_reconnecting
    def put_session(self, actor_id: str, session_id: str, record: dict[str, Any]) -> None:
        """Insert or replace the session record."""
        text = _dumps(record)
        since = self._session_records.changing()
        try:
            with self._write():
                self._sql(self._put_session_sql, [actor_id, session_id, text, now_ms()])
        except BaseException:
            self._session_records.changed((actor_id, session_id))
            raise
        # Inside a caller's transaction the write is not committed yet: forget, do not keep.
        committed = not self.database.in_transaction()
        self._session_records.changed((actor_id, session_id), text, since if committed else None)

    # -- preferences --------------------------------------------------------------------------
    @_reconnecting
    def get_preferences(self, actor_id: str) -> dict[str, Any]:
        """The actor's stored preferences; ``{}`` when none were stored."""
        model = self.models.preference
        row = model.select(model.values_json).where(model.actor_id == actor_id).tuples().first()
        return json.loads(row[0]) if row else {}

    @_reconnecting
    def put_preferences(self, actor_id: str, values: dict[str, Any]) -> None:
        """Replace the actor's stored preferences with ``values``."""
        model = self.models.preference
        with self._write():
            (
                model.insert(actor_id=actor_id, values_json=_dumps(values))
                .on_conflict(conflict_target=[model.actor_id], preserve=[model.values_json])
                .execute()
            )

    # -- receipts -----------------------------------------------------------------------------
    @_reconnecting
    def insert_receipt(self, receipt: dict[str, Any]) -> None:
        """Store one tool receipt (kept whole as JSON). ``hostRunId`` and ``actorId`` are
        required (ValueError); an integer ``createdAt`` (ms) is indexed, otherwise now. A receipt
        already stored (the same JSON for the run: an insert retried after its commit went
        through) is not stored twice."""
        host_run_id = receipt.get("hostRunId")
        actor_id = receipt.get("actorId")
        if not host_run_id or not actor_id:
            raise ValueError("a receipt needs hostRunId and actorId")
        created_at = receipt.get("createdAt")
        if not isinstance(created_at, int) or isinstance(created_at, bool):
            created_at = now_ms()
        model = self.models.receipt
        values = (str(host_run_id), str(actor_id), created_at, _dumps(receipt))
        table, p = self._qualified(model._meta.table_name), self.database.param
        with self._write(), _wrap_db_errors:
            cursor = self.database.cursor()
            try:
                cursor.execute(
                    f"INSERT INTO {table} (host_run_id, actor_id, created_at, record) "
                    f"SELECT {p}, {p}, {p}, {p} "
                    f"WHERE NOT EXISTS (SELECT 1 FROM {table} WHERE host_run_id = {p} AND record = {p})",
                    (*values, values[0], values[3]),
                )
            finally:
                cursor.close()

    @_reconnecting
    def list_receipts(self, host_run_id: str) -> list[dict[str, Any]]:
        """The run's receipts in insertion order."""
        model = self.models.receipt
        query = model.select(model.record).where(model.host_run_id == host_run_id).order_by(model.id).tuples()
        return [json.loads(record) for (record,) in query]
