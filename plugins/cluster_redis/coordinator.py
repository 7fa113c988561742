"""RedisCoordinator: one gateway instance of several sharing PostgreSQL and Redis.

PostgreSQL holds what must be exact (instances and their leases, which instance owns which
session and run); Redis carries what may be lost and caught up (the live tail of every run, the
calls between instances).

- Lease and fencing: each instance has a row (``<prefix>cluster_instances``) with a random token
  and an expiry it renews every ``heartbeat_seconds``. Every write of a run (a run, its events,
  its status, its session, its receipts) runs in one transaction with a ``FOR KEY SHARE`` read of
  that row checking the token and the expiry: a paused instance whose lease expired (or was
  taken over) writes nothing, and a takeover (``FOR UPDATE`` of the row) waits for any write in
  flight. A transaction left idle (the process stopped mid-write) is ended by PostgreSQL after
  half a lease (``idle_in_transaction_session_timeout``), so it cannot hold a takeover back.
- Takeover: every instance sweeps every ``heartbeat_seconds`` for expired rows; under the row
  lock it ends each unfinished run of the dead instance with one ``run.interrupted`` event at the
  next seq after the last stored one (events reach clients only once stored, so no client saw a
  later one), then frees its sessions.
- Sessions: the first instance that receives a run of a session takes it (an upsert that only
  replaces a dead owner); a run for a session owned elsewhere is forwarded to the owner over Redis,
  as are cancel and permission answers.
- Signed messages: everything published on Redis is sealed (``envelope.py``: HMAC-SHA256 under
  ``[cluster] secret`` over the channel, a timestamp, a random id and the body); whatever is
  unsigned, altered, older than ``message_max_age_seconds`` or already seen is dropped and
  counted. Redis is not trusted to say who sent a message, only to carry it.
- Live tail: the journal hands each committed batch to :meth:`committed`, which publishes it on
  one pub/sub channel; each instance feeds the batches of runs it has streams for into its bus.
  Whenever the subscription (re)connects, or Redis is down, or a batch shows a gap, the streams
  concerned re-read from PostgreSQL (the bus's resync), so nothing is lost or doubled.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
import socket
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from agent_gateway import ApiError, ClusterInstance, Coordinator, Event, NotOwner, PluginError, Run, now_ms

from .envelope import REASONS, Rejected, Verifier, seal

log = logging.getLogger(__name__)

ACTIVE = ("pending", "queued", "running", "awaiting_permission")
# Writes of a run: fenced by the instance's lease.
FENCED_METHODS = frozenset({"insert_run", "update_run", "append_events", "put_session", "insert_receipt"})
# Committed batches waiting for Redis; beyond this, the oldest are dropped and every stream resyncs.
PUBLISH_BACKLOG = 10_000
RECONNECT_MAX_SECONDS = 2.0
# At shutdown, how long the journal's last commits and their publication may take.
STOP_FLUSH_SECONDS = 5.0
# A refused Redis message is logged at most this often per reason (a flood must not flood the log).
REJECTED_LOG_SECONDS = 60.0
OWNER_UNAVAILABLE = "the instance that runs this session cannot be reached right now; retry"
MIN_SECRET_BYTES = 32


def _cluster_1(ctx: Any) -> None:
    """the cluster tables as of 0.1.0: instances (leases), session owners, run owners"""
    # Create-if-missing: the tables an unversioned release made are taken as they are.
    ctx.sql(
        f"CREATE TABLE IF NOT EXISTS {ctx.table('cluster_instances')} (instance_id TEXT PRIMARY KEY, "
        "token BIGINT NOT NULL, url TEXT, started_at TIMESTAMPTZ NOT NULL DEFAULT now(), "
        "expires_at TIMESTAMPTZ NOT NULL)"
    )
    ctx.sql(
        f"CREATE TABLE IF NOT EXISTS {ctx.table('cluster_sessions')} (actor_id TEXT NOT NULL, "
        "session_id TEXT NOT NULL, instance_id TEXT NOT NULL, PRIMARY KEY (actor_id, session_id))"
    )
    ctx.sql(
        f"CREATE TABLE IF NOT EXISTS {ctx.table('cluster_runs')} (host_run_id TEXT PRIMARY KEY, "
        "instance_id TEXT NOT NULL)"
    )


# The cluster tables' numbered migrations (the journal's migration runner applies them at start;
# append only: the Nth function brings them to version N).
CLUSTER_MIGRATIONS = (_cluster_1,)


def _is_terminal_status(status: str) -> bool:
    return status not in ACTIVE


class FencedStorage:
    """The storage, with every write of a run checked against this instance's lease in the same
    transaction. Everything else passes through."""

    def __init__(self, inner: Any, coordinator: RedisCoordinator) -> None:
        self._inner = inner
        self._coordinator = coordinator

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._inner, name)
        if name in FENCED_METHODS:
            return lambda *args, **kwargs: self._fenced(name, value, args, kwargs)
        return value

    def _fenced(self, name: str, method: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        coordinator = self._coordinator
        database = self._inner.database
        for attempt in (1, 2):
            try:
                with database.atomic():
                    coordinator.check_lease()
                    result = method(*args, **kwargs)
                    if name == "insert_run":
                        coordinator.record_run(args[0])
                    elif name == "update_run" and _is_terminal_status(str(kwargs.get("status", "running"))):
                        coordinator.forget_run(args[0])
                return result
            except NotOwner:
                raise
            except Exception:
                # A connection the server dropped: a fresh one, once (every method is idempotent).
                if attempt == 2 or not getattr(database._state.conn, "closed", False):
                    raise
                database.discard_connection()
        raise AssertionError("unreachable")


class RedisCoordinator(Coordinator):
    durable_delivery = True
    clustered = True

    def __init__(self, section: dict[str, Any]) -> None:
        self.instance_id = section["instance_id"] or f"{socket.gethostname()}-{secrets.token_hex(4)}"
        self.redis_url = str(section["redis_url"])
        self.prefix = str(section["key_prefix"])
        self.lease = float(section["lease_seconds"])
        self.heartbeat = float(section["heartbeat_seconds"])
        self.forward_timeout = float(section["forward_timeout_seconds"])
        self._secret = str(section.get("secret") or "").encode()
        previous = [str(item).encode() for item in section.get("previous_secrets") or []]
        self._verifier = (
            Verifier([self._secret, *previous], float(section.get("message_max_age_seconds", 30.0)))
            if self._secret
            else None
        )
        self._tls: dict[str, Any] = {
            option: str(Path(section[key]).expanduser())
            for option, key in (
                ("ssl_ca_certs", "tls_ca_file"),
                ("ssl_certfile", "tls_cert_file"),
                ("ssl_keyfile", "tls_key_file"),
            )
            if section.get(key)
        }
        if urlsplit(self.redis_url).scheme == "rediss":
            self._tls["ssl_check_hostname"] = True  # older clients default to not checking
        self.rejected = dict.fromkeys(REASONS, 0)
        self._rejected_logged: dict[str, tuple[float, int]] = {}  # reason -> (when logged, count then)
        self.token = secrets.randbits(62)
        self.lease_lost = False
        self.renewed_at = 0.0  # monotonic time of the last renewal
        self.redis_up = False
        self.takeovers = 0
        self.rejoins = 0
        self.relayed_in = 0
        self.relayed_out = 0
        self._inner: Any = None
        # All this coordinator uses of its gateway instance (set by `start`).
        self._instance: ClusterInstance | None = None
        self._redis: Any = None
        self._tasks: list[asyncio.Task[None]] = []
        self._outbox: deque[bytes] = deque()
        self._outbox_ready = asyncio.Event()
        self._resync_everyone = False  # a batch could not be published: tell every instance
        self._relayed_seq: dict[str, int] = {}  # per run with streams here, the last seq relayed in
        self._replies: dict[str, asyncio.Future[dict[str, Any]]] = {}
        self._owned_sessions: set[tuple[str, str]] = set()
        self._stopping = False

    # -- tables ---------------------------------------------------------------------------------
    def _table(self, name: str) -> str:
        table = f"{self._inner.table_prefix}cluster_{name}"
        schema = self._inner.schema
        return f'"{schema}"."{table}"' if schema else f'"{table}"'

    def _sql(self, sql: str, params: tuple[Any, ...] = ()) -> Any:
        return self._inner.database.execute_sql(sql, params)

    def _create_tables(self) -> None:
        # Versioned beside the journal's ("cluster" in its schema_version table), under its lock.
        self._inner.migrate_schema("cluster", CLUSTER_MIGRATIONS, legacy_table="cluster_instances")

    # -- the lease ------------------------------------------------------------------------------
    def check_lease(self) -> None:
        """Inside a write transaction: this instance still holds its lease (else NotOwner)."""
        if self.lease_lost:
            raise NotOwner(f"instance {self.instance_id} lost its lease")
        # A transaction this process leaves idle (it was stopped mid-write) must not hold a
        # takeover back for longer than half a lease.
        idle_ms = max(int(self.lease * 500), 100)
        self._sql(f"SET LOCAL idle_in_transaction_session_timeout = {idle_ms}")
        row = self._sql(
            f"SELECT 1 FROM {self._table('instances')} WHERE instance_id = %s AND token = %s "
            "AND expires_at > now() FOR KEY SHARE",
            (self.instance_id, self.token),
        ).fetchone()
        if row is None:
            raise NotOwner(f"instance {self.instance_id} no longer holds its lease")

    def record_run(self, run: Run) -> None:
        self._sql(
            f"INSERT INTO {self._table('runs')} (host_run_id, instance_id) VALUES (%s, %s) "
            "ON CONFLICT (host_run_id) DO NOTHING",
            (run.host_run_id, self.instance_id),
        )

    def forget_run(self, host_run_id: str) -> None:
        self._sql(f"DELETE FROM {self._table('runs')} WHERE host_run_id = %s", (host_run_id,))

    def _register(self) -> list[Event]:
        """Take this instance's row (a new token), ending the unfinished runs an earlier holder
        of the id left behind. Returns their terminal events."""
        with self._inner.database.atomic():
            table = self._table("instances")
            # FOR UPDATE waits for any write in flight under the old token.
            self._sql(f"SELECT 1 FROM {table} WHERE instance_id = %s FOR UPDATE", (self.instance_id,))
            ended = self._take_over(self.instance_id, "the gateway instance restarted")
            self.token = secrets.randbits(62)
            self._sql(
                f"INSERT INTO {table} (instance_id, token, url, expires_at) VALUES "
                "(%s, %s, %s, now() + make_interval(secs => %s)) ON CONFLICT (instance_id) DO UPDATE SET "
                "token = EXCLUDED.token, url = EXCLUDED.url, started_at = now(), expires_at = EXCLUDED.expires_at",
                (self.instance_id, self.token, self._url(), self.lease),
            )
        self.renewed_at = time.monotonic()
        return ended

    def _url(self) -> str | None:
        return self._instance.base_url if self._instance is not None else None

    def _renew(self) -> bool:
        cursor = self._sql(
            f"UPDATE {self._table('instances')} SET expires_at = now() + make_interval(secs => %s), url = %s "
            "WHERE instance_id = %s AND token = %s AND expires_at > now()",
            (self.lease, self._url(), self.instance_id, self.token),
        )
        return bool(cursor.rowcount)

    def _sweep(self) -> list[Event]:
        """End the runs of every instance whose lease expired; their terminal events."""
        ended: list[Event] = []
        with self._inner.database.atomic():
            dead = self._sql(
                f"SELECT instance_id FROM {self._table('instances')} WHERE expires_at < now() FOR UPDATE SKIP LOCKED"
            ).fetchall()
            for (instance_id,) in dead:
                ended += self._take_over(instance_id, f"gateway instance {instance_id} stopped (its lease expired)")
                self._sql(f"DELETE FROM {self._table('instances')} WHERE instance_id = %s", (instance_id,))
                self.takeovers += 1
                log.warning("took over from instance %s: %d unfinished run(s) interrupted", instance_id, len(ended))
        return ended

    def _take_over(self, instance_id: str, reason: str) -> list[Event]:
        """Under the instance row's lock: one terminal event for each unfinished run of
        `instance_id`, at the seq after the last stored one; then free its sessions and runs."""
        inner = self._inner
        ended: list[Event] = []
        rows = self._sql(
            f"SELECT host_run_id FROM {self._table('runs')} WHERE instance_id = %s", (instance_id,)
        ).fetchall()
        for (host_run_id,) in rows:
            run = inner.get_run(host_run_id)
            if run is None or run.is_terminal:
                continue
            last = inner.last_event(host_run_id)
            if last is not None and last.is_terminal:
                inner.update_run(host_run_id, status=last.kind.removeprefix("run."), updated_at=now_ms())
                continue
            events = []
            seq = last.seq + 1 if last is not None else 1
            if last is None:  # the journal starts with the receipt, as everywhere
                events.append(Event(host_run_id, seq, "run.created", "gateway", {"receipt": run.to_receipt()}))
                seq += 1
            payload = {"status": "interrupted", "reason": reason, "takenOverBy": self.instance_id}
            events.append(Event(host_run_id, seq, "run.interrupted", "gateway", payload))
            inner.append_events(events)
            inner.update_run(host_run_id, status="interrupted", error=reason, updated_at=now_ms())
            ended += events
        self._sql(f"DELETE FROM {self._table('runs')} WHERE instance_id = %s", (instance_id,))
        self._sql(f"DELETE FROM {self._table('sessions')} WHERE instance_id = %s", (instance_id,))
        return ended

    # -- Coordinator ------------------------------------------------------------------------------
    def wrap_storage(self, storage: Any) -> Any:
        if not hasattr(storage, "database") or getattr(storage, "is_sqlite", True):
            raise PluginError("cluster mode needs the built-in peewee journal on PostgreSQL ([storage] url)")
        self._inner = storage
        return FencedStorage(storage, self)

    async def _db(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await self._local.blocking(self._reconnecting, fn, args)

    def _reconnecting(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
        """`fn(*args)` on this thread's connection; once more on a fresh one if the server had
        dropped it (a restart, a failover, pg_terminate_backend). Every call here is idempotent."""
        database = self._inner.database
        try:
            return fn(*args)
        except Exception:
            if database.in_transaction() or not getattr(database._state.conn, "closed", False):
                raise
            database.discard_connection()
            return fn(*args)

    @property
    def _local(self) -> ClusterInstance:
        """The gateway instance this coordinator belongs to (set by `start`)."""
        if self._instance is None:
            raise RuntimeError("the cluster coordinator is not started")
        return self._instance

    async def start(self, instance: ClusterInstance) -> None:
        import redis.asyncio as aioredis

        if self._verifier is None or len(self._secret) < MIN_SECRET_BYTES:
            raise PluginError(
                f"cluster mode needs [cluster] secret (at least {MIN_SECRET_BYTES} bytes): "
                "every message on Redis is signed with it"
            )
        self._instance = instance
        await self._db(self._create_tables)
        self._deliver(await self._db(self._register))
        self._redis = aioredis.from_url(
            self.redis_url,
            socket_connect_timeout=2,
            socket_timeout=max(self.heartbeat * 2, 2),
            health_check_interval=5,
            **self._tls,
        )
        self._tasks = [
            asyncio.create_task(self._listen(), name="cluster-listen"),
            asyncio.create_task(self._publish_loop(), name="cluster-publish"),
            asyncio.create_task(self._lease_loop(), name="cluster-lease"),
        ]
        log.info(
            "cluster instance %s joined (lease %.1f s, heartbeat %.1f s)", self.instance_id, self.lease, self.heartbeat
        )

    async def stop(self) -> None:
        self._stopping = True
        # The runs' last events (their terminal ones) are committed and published before the
        # relay stops, so streams on other instances end too.
        with contextlib.suppress(Exception):
            async with asyncio.timeout(STOP_FLUSH_SECONDS):
                await self._local.flush_journal()
                while self._outbox:
                    self._outbox_ready.set()
                    await asyncio.sleep(0.01)  # the publisher empties the outbox; bounded by the timeout
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self._redis is not None:
            with contextlib.suppress(Exception):
                await self._redis.aclose()
        # Leaving cleanly: its runs are over (drained), so its sessions are free now.
        if self._inner is not None and not self.lease_lost:
            with contextlib.suppress(Exception):
                await self._db(self._leave)

    def _leave(self) -> None:
        with self._inner.database.atomic():
            self._sql(
                f"SELECT 1 FROM {self._table('instances')} WHERE instance_id = %s FOR UPDATE", (self.instance_id,)
            )
            ended = self._take_over(self.instance_id, "the gateway instance stopped")
            self._sql(
                f"DELETE FROM {self._table('instances')} WHERE instance_id = %s AND token = %s",
                (self.instance_id, self.token),
            )
        if ended:
            log.warning("%d run(s) ended at shutdown without a terminal event", len(ended))

    def committed(self, events: list[Event]) -> None:
        host_run_id = events[0].host_run_id
        body = b"[" + b",".join(e.wire_bytes() for e in events) + b"]"
        self._outbox.append(b"E\x00" + self.instance_id.encode() + b"\x00" + host_run_id.encode() + b"\x00" + body)
        if len(self._outbox) > PUBLISH_BACKLOG:
            self._outbox.popleft()
            self._resync_everyone = True
        self._outbox_ready.set()

    async def session_owner(self, actor_id: str, session_id: str) -> str | None:
        if self.lease_lost:
            raise ApiError(503, "instance_fenced", "this gateway instance lost its cluster lease; retry on another")
        key = (actor_id, session_id)
        if key in self._owned_sessions:
            return None
        owner: str = await self._db(self._claim_session, actor_id, session_id)
        if owner == self.instance_id:
            self._owned_sessions.add(key)
            return None
        return owner

    def _claim_session(self, actor_id: str, session_id: str) -> str:
        sessions, instances = self._table("sessions"), self._table("instances")
        with self._inner.database.atomic():
            row = self._sql(
                f"INSERT INTO {sessions} AS s (actor_id, session_id, instance_id) VALUES (%s, %s, %s) "
                "ON CONFLICT (actor_id, session_id) DO UPDATE SET instance_id = EXCLUDED.instance_id "
                f"WHERE NOT EXISTS (SELECT 1 FROM {instances} i WHERE i.instance_id = s.instance_id "
                "AND i.expires_at > now()) RETURNING instance_id",
                (actor_id, session_id, self.instance_id),
            ).fetchone()
            if row is None:
                row = self._sql(
                    f"SELECT instance_id FROM {sessions} WHERE actor_id = %s AND session_id = %s",
                    (actor_id, session_id),
                ).fetchone()
        return str(row[0])

    async def owner_elsewhere(self, run: Run) -> str | None:
        owner = await self._db(self._run_owner, run.host_run_id)
        return owner if owner is not None and owner != self.instance_id else None

    def _run_owner(self, host_run_id: str) -> str | None:
        row = self._sql(
            f"SELECT r.instance_id FROM {self._table('runs')} r JOIN {self._table('instances')} i "
            "ON i.instance_id = r.instance_id WHERE r.host_run_id = %s",
            (host_run_id,),
        ).fetchone()
        return str(row[0]) if row else None

    async def forward(self, instance_id: str, op: str, args: dict[str, Any]) -> dict[str, Any]:
        request_id = secrets.token_hex(8)
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._replies[request_id] = future
        message = json.dumps({"id": request_id, "from": self.instance_id, "op": op, "args": args}).encode()
        # API clients learn that the owner is unavailable, never where it or Redis is: the
        # details (addresses, instance names) go to this instance's log.
        try:
            try:
                receivers = await self._publish(self._channel("rpc", instance_id), message)
            except Exception as exc:
                log.warning("cluster: forwarding %s to instance %s failed: %s", op, instance_id, exc)
                raise ApiError(503, "owner_unavailable", OWNER_UNAVAILABLE) from None
            if not receivers:
                log.warning("cluster: instance %s is not subscribed to Redis; %s not forwarded", instance_id, op)
                raise ApiError(503, "owner_unavailable", OWNER_UNAVAILABLE)
            try:
                async with asyncio.timeout(self.forward_timeout):
                    answer = await future
            except TimeoutError:
                log.warning("cluster: instance %s did not answer a forwarded %s in time", instance_id, op)
                raise ApiError(503, "owner_unavailable", OWNER_UNAVAILABLE) from None
        finally:
            self._replies.pop(request_id, None)
        error = answer.get("error")
        if error is not None:
            extra = error.get("extra") or {}
            raise ApiError(int(error["status"]), str(error["code"]), str(error["message"]), **extra)
        return dict(answer.get("ok") or {})

    def status(self) -> dict[str, Any]:
        instances = self._sql(
            f"SELECT instance_id, url, EXTRACT(EPOCH FROM (expires_at - now())) FROM {self._table('instances')} "
            "ORDER BY instance_id"
        ).fetchall()
        listed = []
        for instance_id, url, remaining in instances:
            (sessions,) = self._sql(
                f"SELECT count(*) FROM {self._table('sessions')} WHERE instance_id = %s", (instance_id,)
            ).fetchone()
            run_ids = self._sql(
                f"SELECT host_run_id FROM {self._table('runs')} WHERE instance_id = %s ORDER BY host_run_id",
                (instance_id,),
            ).fetchall()
            runs = []
            for (host_run_id,) in run_ids:
                run = self._inner.get_run(host_run_id)
                if run is not None and not run.is_terminal:
                    runs.append({"hostRunId": host_run_id, "status": run.status, "sessionId": run.session_id})
            listed.append(
                {
                    "instanceId": instance_id,
                    "url": url,
                    "alive": float(remaining) > 0,
                    "leaseRemainingSeconds": round(float(remaining), 1),
                    "sessions": int(sessions),
                    "runs": runs,
                }
            )
        return {"instances": listed}

    def health(self) -> dict[str, Any]:
        return {
            "instanceId": self.instance_id,
            "ready": not self.lease_lost,
            "lease": "lost" if self.lease_lost else "held",
            "leaseSeconds": self.lease,
            "redis": "up" if self.redis_up else "down",
            "ownedSessions": len(self._owned_sessions),
            "activeRuns": self._instance.active_run_ids() if self._instance else [],
            "takeovers": self.takeovers,
            "rejoins": self.rejoins,
            "fencedEvents": self._instance.fenced_events if self._instance else 0,
            "relayedIn": self.relayed_in,
            "relayedOut": self.relayed_out,
            "messagesRejected": dict(self.rejected),
        }

    def metrics(self) -> list[tuple[str, str, str, list[tuple[dict[str, str], float]]]]:
        return [
            (
                "agent_gateway_cluster_messages_rejected_total",
                "counter",
                "Redis messages dropped: unsigned, bad_signature (forged, altered or another secret), "
                "stale (outside message_max_age_seconds) or replayed.",
                [({"instance": self.instance_id, "reason": reason}, count) for reason, count in self.rejected.items()],
            )
        ]

    # -- delivery ------------------------------------------------------------------------------------
    def _channel(self, kind: str, instance_id: str | None = None) -> str:
        return f"{self.prefix}{kind}" + (f":{instance_id}" if instance_id else "")

    def _deliver(self, events: list[Event]) -> None:
        """Terminal events written by a takeover: to this instance's streams and the others'."""
        by_run: dict[str, list[Event]] = {}
        for event in events:
            by_run.setdefault(event.host_run_id, []).append(event)
        for host_run_id, run_events in by_run.items():
            # Not straight into the bus: the dead instance may have committed events it never
            # published, so this instance's streams re-read the run (the terminal event included).
            self._resync(host_run_id)
            self.committed(run_events)

    def _resync(self, topic: str | None = None) -> None:
        if topic is None:
            self._relayed_seq.clear()
        else:
            self._relayed_seq.pop(topic, None)
        self._local.resync(topic)

    async def _publish_loop(self) -> None:
        backoff = 0.05
        while True:
            await self._outbox_ready.wait()
            self._outbox_ready.clear()
            while self._outbox or self._resync_everyone:
                taken = list(self._outbox)
                try:
                    channel = self._channel("events")
                    async with self._redis.pipeline(transaction=False) as pipe:
                        # Signed as they leave (not when queued): a batch held back while Redis
                        # was down is not stale on arrival.
                        if self._resync_everyone:
                            pipe.publish(channel, self._seal(channel, b"R\x00" + self.instance_id.encode()))
                        for message in taken:
                            pipe.publish(channel, self._seal(channel, message))
                        await pipe.execute()
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    # Lost batches are caught up from PostgreSQL: the next publish tells everyone.
                    log.warning("cluster: publishing to Redis failed (%s); streams will resync", exc)
                    self._outbox.clear()
                    self._resync_everyone = True
                    await asyncio.sleep(backoff)  # retry pacing while Redis is down
                    backoff = min(backoff * 2, RECONNECT_MAX_SECONDS)
                    continue
                backoff = 0.05
                self._resync_everyone = False
                self.relayed_out += len(taken)
                for _ in taken:
                    self._outbox.popleft()

    async def _listen(self) -> None:
        backoff = 0.05
        channels = (
            self._channel("events"),
            self._channel("rpc", self.instance_id),
            self._channel("reply", self.instance_id),
        )
        while True:
            pubsub = self._redis.pubsub()
            try:
                await pubsub.subscribe(*channels)
                if not self.redis_up:
                    self.redis_up = True
                    log.info("cluster: subscribed to Redis")
                self._resync()  # whatever was published while not subscribed is in PostgreSQL
                backoff = 0.05
                while True:
                    message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=self.heartbeat)
                    if message is not None:
                        self._dispatch(message["channel"], message["data"])
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if self.redis_up:
                    log.warning("cluster: Redis subscription lost (%s); streams continue from PostgreSQL", exc)
                self.redis_up = False
                self._resync()  # streams re-read PostgreSQL while Redis is away
                await asyncio.sleep(backoff)  # reconnect pacing, not synchronisation
                backoff = min(backoff * 2, RECONNECT_MAX_SECONDS)
            finally:
                with contextlib.suppress(Exception):
                    await pubsub.aclose()

    def _seal(self, channel: str, body: bytes) -> bytes:
        return seal(self._secret, channel.encode(), body)

    async def _publish(self, channel: str, body: bytes) -> int:
        return int(await self._redis.publish(channel, self._seal(channel, body)))

    def _open(self, channel: bytes, data: bytes) -> bytes | None:
        """The body of an authentic message, or None (the message is counted and dropped)."""
        assert self._verifier is not None  # start() refuses to run without a secret
        try:
            return self._verifier.open(channel, data)
        except Rejected as exc:
            detail = f"{exc.reason}: {exc}" if str(exc) != exc.reason else exc.reason
            self._reject(exc.reason, channel.decode(errors="replace"), detail)
            return None

    def _reject(self, reason: str, channel: str, detail: str) -> None:
        """Count a dropped message; log it, at most once per reason every REJECTED_LOG_SECONDS."""
        self.rejected[reason] += 1
        now = time.monotonic()
        logged_at, count_then = self._rejected_logged.get(reason, (-REJECTED_LOG_SECONDS, 0))
        if now - logged_at >= REJECTED_LOG_SECONDS:
            self._rejected_logged[reason] = (now, self.rejected[reason])
            log.warning(
                "cluster: dropped a Redis message on %s (%s); %d dropped for this reason since the last report. "
                "Someone with access to Redis publishes on the cluster's channels, or an instance has "
                "another [cluster] secret or a skewed clock",
                channel,
                detail,
                self.rejected[reason] - count_then,
            )

    def _dispatch(self, channel: bytes, data: bytes) -> None:
        body = self._open(channel, data)
        if body is None:
            return
        data = body
        name = channel.decode()
        if name == self._channel("events"):
            self._relay_in(data)
        elif name.startswith(self._channel("rpc")):
            request = json.loads(data)
            task = asyncio.create_task(self._answer(request))
            self._tasks.append(task)
            task.add_done_callback(lambda done: self._tasks.remove(done) if done in self._tasks else None)
        else:
            answer = json.loads(data)
            future = self._replies.get(answer.get("id", ""))
            if future is not None and not future.done():
                future.set_result(answer)

    def _relay_in(self, data: bytes) -> None:
        kind, _, rest = data.partition(b"\x00")
        if kind == b"R":
            if rest.decode() != self.instance_id:
                self._resync()
            return
        sender, _, rest = rest.partition(b"\x00")
        if sender.decode() == self.instance_id:
            return  # this instance delivered its own events already
        topic_bytes, _, body = rest.partition(b"\x00")
        topic = topic_bytes.decode()
        instance = self._local
        if not instance.has_streams(topic):
            self._relayed_seq.pop(topic, None)
            return
        events = [Event.from_wire(item) for item in json.loads(body)]
        last = self._relayed_seq.get(topic)
        if last is None or events[0].seq > last + 1:
            # The first batch since this run has streams here (what came before it is unknown),
            # or a batch went missing: the streams re-read the run from PostgreSQL, which holds
            # this batch already (it is published once committed). Later batches are checked.
            if events[-1].is_terminal:
                self._relayed_seq.pop(topic, None)
            else:
                self._relayed_seq[topic] = events[-1].seq
            instance.resync(topic)
            return
        self.relayed_in += len(events)
        if events[-1].is_terminal:
            self._relayed_seq.pop(topic, None)
        else:
            self._relayed_seq[topic] = events[-1].seq
        instance.publish(topic, events)

    async def _answer(self, request: dict[str, Any]) -> None:
        instance = self._local
        args = request.get("args") or {}
        answer: dict[str, Any] = {"id": request.get("id")}
        try:
            op = request.get("op")
            if op == "create":
                run, created = await instance.create_run(args["actorId"], args["body"])
                answer["ok"] = {"hostRunId": run.host_run_id, "created": created}
            elif op == "cancel":
                cancelled = await instance.cancel_run(args["hostRunId"], args["actorId"])
                answer["ok"] = {"status": cancelled.status if cancelled else None}
            elif op == "permission":
                await instance.resolve_permission(
                    args["hostRunId"], args["actorId"], args["requestId"], args["optionId"]
                )
                answer["ok"] = {}
            else:
                raise ApiError(400, "invalid_request", f"unknown cluster operation {op!r}")
        except ApiError as exc:
            answer["error"] = {"status": exc.status, "code": exc.code, "message": str(exc), "extra": exc.extra}
        except Exception:
            log.exception("cluster: forwarded %s failed", request.get("op"))
            answer["error"] = {
                "status": 500,
                "code": "internal_error",
                "message": "internal error; see the gateway log",
            }
        with contextlib.suppress(Exception):
            await self._publish(self._channel("reply", str(request.get("from"))), json.dumps(answer).encode())

    # -- lease upkeep ---------------------------------------------------------------------------------
    async def _lease_loop(self) -> None:
        while True:
            await asyncio.sleep(self.heartbeat)  # the heartbeat period itself, not synchronisation
            try:
                if self.lease_lost:
                    await self._rejoin_when_idle()
                else:
                    # Bounded: a partitioned database may never answer, and after a whole lease
                    # without a renewal this instance must stop on its own.
                    async with asyncio.timeout(self.heartbeat * 2):
                        held = await self._db(self._renew)
                    if held:
                        self.renewed_at = time.monotonic()
                    else:
                        self._lose_lease("its lease expired or was taken over")
                async with asyncio.timeout(self.lease):
                    self._deliver(await self._db(self._sweep))
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("cluster: lease upkeep failed: %s", str(exc) or type(exc).__name__)
                if not self.lease_lost and time.monotonic() - self.renewed_at > self.lease:
                    self._lose_lease("it could not renew its lease for a whole lease period")

    def _lose_lease(self, why: str) -> None:
        """Stop writing: the runs here are someone else's to end now."""
        log.error("cluster: instance %s stops its runs: %s", self.instance_id, why)
        self.lease_lost = True
        self._owned_sessions.clear()
        self._local.abandon_runs()

    async def _rejoin_when_idle(self) -> None:
        """Once its abandoned runs are gone (nothing of theirs can be written any more), join
        again under a new token."""
        if self._local.active_run_ids() or self._local.journal_pending:
            return
        self._deliver(await self._db(self._register))
        self.lease_lost = False
        self.rejoins += 1
        log.warning("cluster: instance %s rejoined with a new lease", self.instance_id)
