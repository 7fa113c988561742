"""Runs: receipts, idempotent creation, per-session queueing, execution, cancel, recovery.

A run's events take one path (runtime → journal → bus → SSE); this module owns the status.
The terminal event is always appended before the status flips, and exactly once.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import json
import logging
import secrets
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from agent_gateway.agent_receipts import NOT_AGENT_SOURCES, TOOL_EVENT_KINDS, AgentToolLedger
from agent_gateway.api_models import RunRequest
from agent_gateway.cluster import Coordinator
from agent_gateway.declare import VISIBLE as DECLARED_VISIBLE
from agent_gateway.declare import parse_model
from agent_gateway.descriptors import AgentAvailability
from agent_gateway.errors import ApiError
from agent_gateway.journal import Journal
from agent_gateway.locks import KeyedLocks
from agent_gateway.logs import agent_id_var, run_id_var, session_id_var, trace_id_var
from agent_gateway.models import (
    ACTIVE_STATUSES,
    STATUS_BY_TERMINAL_KIND,
    TERMINAL_KIND_BY_STATUS,
    Run,
    now_ms,
)
from agent_gateway.runtime import Runtime, SessionPlan, Turn, TurnOutcome, TurnServices
from agent_gateway.sessions import SessionStrategy, TranscriptStrategy
from agent_gateway.storage import RequestConflict, Storage
from agent_gateway.telemetry import NO_TRACE, RunTrace
from agent_gateway.tools import ToolFacade
from agent_gateway.workspace_access import WorkspaceAccess

log = logging.getLogger("agent_gateway.runs")

MAX_ID_LENGTH = 200
TRANSCRIPT_KEEP_TURNS = 50
TURN_TOOLS_KEPT = 20
TURN_FILES_KEPT = 50
# What a 429 from run admission asks the client to wait before trying again.
ADMISSION_RETRY_AFTER_SECONDS = 2
SECONDS_PER_DAY = 86_400
# The events `RunManager._observe` looks at (one set lookup for every other event).
OBSERVED_KINDS = TOOL_EVENT_KINDS | {"files.changed", "usage.updated"}


# Waiting for a run another cluster instance executes: its live events buffered here between
# wake-ups (more moves the waiter to asking the journal), and how often the journal is asked anyway.
ELSEWHERE_WAIT_CAPACITY = 256
ELSEWHERE_RECHECK_SECONDS = 5.0


class AdmissionRefused(ApiError):
    """A run refused for now (429): its session's queue or its actor's active runs are full.
    ``retry_after`` is the ``Retry-After`` header's value, in seconds."""

    def __init__(self, code: str, message: str, limit: int, retry_after: int = ADMISSION_RETRY_AFTER_SECONDS) -> None:
        super().__init__(429, code, message, limit=limit, retryAfterSeconds=retry_after)
        self.retry_after = retry_after


def agent_unavailable(agent_id: str, availability: dict[str, Any]) -> ApiError:
    """The refusal of a run for an agent that cannot run here: 503 (the request is right, the
    gateway cannot serve it until its operator installs or configures the agent), with the
    descriptor's reason (what to install or set). Clients are told not to retry it."""
    reason = availability.get("reason") or "the agent is unavailable"
    error = ApiError(
        503, "agent_unavailable", f"agent {agent_id!r} is unavailable: {reason}", agentId=agent_id, reason=reason
    )
    error.headers = {"x-should-retry": "false"}
    return error


def canonical_hash(value: Any) -> str:
    blob = json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()


# The rule of a non-blank text (a run's ids and message, sessions' ids): gateway/declare.py.
VISIBLE = DECLARED_VISIBLE


def validate_run_request(body: Any) -> dict[str, Any]:
    """A raw ``POST /v1/runs`` body as the run's request (the declared model's rules, see
    :class:`agent_gateway.api_models.RunRequest`), agentId required: for callers that apply no
    preference defaults (``GatewayApp.create_run``)."""
    return require_agent(parse_model(RunRequest, body).request())


def require_agent(request: dict[str, Any]) -> dict[str, Any]:
    """``request`` once the actor's defaults are applied: it must name its agent by now."""
    if not isinstance(request.get("agentId"), str):
        raise ApiError(400, "invalid_request", "agentId must be a non-empty string", field="agentId")
    return request


def _terminal(outcome: TurnOutcome) -> tuple[str, str | None]:
    """The terminal status and reason for a turn's outcome (an unknown status is a failure)."""
    status = outcome.status if outcome.status in TERMINAL_KIND_BY_STATUS else "failed"
    reason = outcome.reason
    if status != outcome.status:
        reason = f"runtime returned unknown status {outcome.status!r}: {reason}"
    return status, reason


@dataclass
class ActiveRun:
    run: Run
    runtime: Runtime
    task: asyncio.Task[None] | None = None
    turn: Turn | None = None
    started: bool = False
    cancel_requested: bool = False
    turn_recorded: bool = False
    permissions: dict[str, tuple[asyncio.Future[str | None], list[str]]] = field(default_factory=dict)
    # What the turn did, for the session transcript (and so for a later cold-resume packet).
    tools: list[dict[str, Any]] = field(default_factory=list)
    files: dict[str, None] = field(default_factory=dict)
    # The agent's own tool calls, for their receipts (made at the first one).
    agent_tools: AgentToolLedger | None = None
    done: asyncio.Event = field(default_factory=asyncio.Event)
    journal_bytes: int = 0  # of its published events (their SSE frames)
    # How the run ends whatever its turn returns (it went over a limit and was stopped).
    forced_outcome: TurnOutcome | None = None
    # The run of the same session that interrupted this one (multitask `interrupt`/`rollback`),
    # and whether the agent is to forget this turn (`rollback`).
    interrupted_by: str | None = None
    rolled_back: bool = False
    # A tracing plugin's handle on the run, and the run's last token counts for it.
    trace: RunTrace = NO_TRACE
    usage: dict[str, Any] | None = None


def session_busy(run: Run) -> ApiError:
    return ApiError(
        409,
        "session_busy",
        f"run {run.host_run_id} of this session is still {run.status} (multitaskStrategy reject); "
        "retry when it has ended, or send another strategy",
        hostRunId=run.host_run_id,
        runStatus=run.status,
    )


def rollback_not_supported(agent_id: str) -> ApiError:
    return ApiError(
        400,
        "rollback_not_supported",
        f"agent {agent_id!r} keeps its own session and cannot forget a turn (its policy's canRollback is "
        "false): use multitaskStrategy interrupt, reject or enqueue",
        agentId=agent_id,
    )


class RunManager:
    def __init__(
        self,
        storage: Storage,
        journal: Journal,
        runtimes: dict[str, Runtime],
        strategies: dict[str, SessionStrategy],
        executor: ThreadPoolExecutor,
        *,
        run_timeout: float = 3600.0,
        cancel_grace: float = 10.0,
        turn_services: TurnServices | None = None,
        tools: ToolFacade | None = None,
        disabled_capabilities: Callable[[str, str], Awaitable[frozenset[str]]] | None = None,
        trace_run: Callable[[Run, str, Mapping[str, str]], RunTrace | None] | None = None,
        max_queued_per_session: int = 16,
        max_active_per_actor: int = 64,
        max_run_journal_bytes: int = 0,
        max_actor_journal_bytes_per_day: int = 0,
        workspace_access: WorkspaceAccess | None = None,
        coordinator: Coordinator | None = None,
        availability: AgentAvailability | None = None,
        multitask_strategy: str = "enqueue",
        multitask_strategy_by_agent: dict[str, str] | None = None,
    ) -> None:
        self.storage = storage
        # Who else runs sessions (a cluster); a single instance owns them all.
        self.coordinator = coordinator or Coordinator()
        self.journal = journal
        self.runtimes = runtimes
        self.strategies = strategies
        self.executor = executor
        self.run_timeout = run_timeout
        self.cancel_grace = cancel_grace
        # What every turn is lent (Turn.data_dir, .sandbox, .mcp_servers(), ...).
        self.turn_services = turn_services
        # The tool facade: each run's switched-off capabilities (`disabled_capabilities`, from the
        # actor's preferences when the run starts) are kept there while it is active.
        self.tools = tools
        self.disabled_capabilities = disabled_capabilities
        # The `trace_run` hook (a tracing plugin follows the run), if any.
        self.trace_run = trace_run
        self.max_queued_per_session = max_queued_per_session
        self.max_active_per_actor = max_active_per_actor
        self.multitask_strategy = multitask_strategy
        self.multitask_strategy_by_agent = dict(multitask_strategy_by_agent or {})
        # Byte limits on the journal (0: none). The daily count is per actor and UTC day, kept in
        # this process's memory (it starts at 0 after a restart, and each cluster instance counts
        # its own runs).
        self.max_run_journal_bytes = max_run_journal_bytes
        self.max_actor_journal_bytes_per_day = max_actor_journal_bytes_per_day
        self._journal_day = 0
        self._actor_journal_bytes: dict[str, int] = {}
        self.workspace_access = workspace_access or WorkspaceAccess()
        # Whether an agent can run at all (its binary, its upstream), believed for a few seconds.
        self.availability = availability or AgentAvailability(runtimes, executor)
        self._active: dict[str, ActiveRun] = {}
        # Runs admitted but not yet in `_active` (their request key is being looked up), by (actor, session).
        self._admitting: Counter[tuple[str, str]] = Counter()
        self._session_locks: KeyedLocks[tuple[str, str]] = KeyedLocks()  # one run of a session at a time
        self._creating: KeyedLocks[tuple[str, ...]] = KeyedLocks()  # one creation per request key
        # A run's creation and its session's delete take turns (`hold_sessions`), by (actor, session).
        self._session_changes: KeyedLocks[tuple[str, str]] = KeyedLocks()
        self._shutting_down = False
        self._watchdogs: set[asyncio.Task[None]] = set()
        self._repairing: KeyedLocks[str] = KeyedLocks()  # one repair per run
        # New runs whose row the journal has not stored yet (`write_behind`), by request key: a
        # repeated requestId finds them here. A worker thread removes each once it is stored.
        self._unstored: dict[tuple[str, str, str, str], Run] = {}
        # The runs among them whose row the worker has not begun to write: it writes the run as it
        # is then, so a status change meanwhile needs no write of its own (`_set_status`).
        self._row_not_begun: set[str] = set()
        journal.on_append.append(self._observe)
        if max_run_journal_bytes > 0 or max_actor_journal_bytes_per_day > 0:
            journal.on_published_bytes = self._count_journal_bytes
        journal.record_handlers["run"] = self._recover_row
        self.finished: Counter[str] = Counter()  # runs ended by this process, by terminal status
        self.created = 0
        self.listeners: list[Callable[[Run], None]] = []
        # (actor, agent, the request's webhook) -> the run's webhook URL, or raises ApiError (the
        # gateway's webhooks); None: webhooks are not set up and a request naming one is refused.
        self.webhook_url: Callable[[str, str, str | None], str | None] | None = None

    async def _db(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.executor, lambda: fn(*args, **kwargs))

    # -- creation ---------------------------------------------------------------------------------
    async def create(
        self,
        actor_id: str,
        body: Any,
        check: Callable[[dict[str, Any]], Awaitable[None]] | None = None,
        headers: Mapping[str, str] | None = None,
        *,
        validated: bool = False,
    ) -> tuple[Run, bool]:
        """Create a run, or return the existing one for a repeated requestId (created=False).
        ``body`` is a raw ``POST /v1/runs`` body, or with ``validated`` the request its declared
        model gave (``RunRequest.request()``, the actor's defaults applied since).
        ``check(request)``, given the validated request, may refuse it (the caller's
        authorization) before anything is stored. ``headers``, the creating request's, are for a
        tracing plugin (an inbound W3C ``traceparent``)."""
        request = require_agent(dict(body)) if validated else validate_run_request(body)
        runtime = self.runtimes.get(request["agentId"])
        if runtime is None:
            raise ApiError(
                400,
                "unknown_agent",
                f"unknown agentId {request['agentId']!r}",
                knownAgents=sorted(self.runtimes),
            )
        if check is not None:
            await check(request)
        if self.webhook_url is not None:
            webhook = self.webhook_url(actor_id, request["agentId"], request.get("webhook"))
        elif request.get("webhook"):
            raise ApiError(400, "webhooks_disabled", "this gateway sends no webhooks ([webhooks] secret is not set)")
        else:
            webhook = None
        availability = await self.availability.get(request["agentId"])
        if not availability["available"]:
            raise agent_unavailable(request["agentId"], availability)
        self.workspace_access.require(actor_id, request["workspaceId"])
        strategy = request.get("multitaskStrategy") or self.multitask_strategy_by_agent.get(
            request["agentId"], self.multitask_strategy
        )
        if strategy == "rollback" and not runtime.policy.can_rollback:
            raise rollback_not_supported(request["agentId"])
        if self.coordinator.clustered:  # the session may belong to another instance
            owner = await self.coordinator.session_owner(actor_id, request["sessionId"])
            if owner is not None and owner != self.coordinator.instance_id:
                return await self._create_at(owner, actor_id, body)
        key = (actor_id, request["sessionId"], request["workspaceId"], request["requestId"])
        request_hash = canonical_hash(request)
        async with self._creating.hold(key), self._session_changes.hold((actor_id, request["sessionId"])):
            try:
                admitted = self._admit(actor_id, request["sessionId"])
            except AdmissionRefused:
                existing = await self._find_by_request(key)
                if existing is not None:  # idempotency first: a repeat is answered whatever the limits
                    return await self._existing(existing, request_hash), False
                raise
            trace: RunTrace = NO_TRACE
            try:
                if strategy != "enqueue":
                    # Idempotency first (a repeat of a run created so finds its run, not itself busy).
                    existing = await self._find_by_request(key)
                    if existing is not None:
                        return await self._existing(existing, request_hash), False
                    self._check_multitask(strategy, actor_id, request["sessionId"])
                if self.coordinator.clustered:
                    # Another instance may take the key: the insert decides (the storage's
                    # unique key), in one worker trip between two group commits.
                    run = self._new_run(actor_id, request, request_hash, runtime, webhook)
                    existing = await self.journal.write(self._insert_or_find, run)
                    if existing is None:
                        trace = self._trace(run, runtime, headers)
                        if trace is not NO_TRACE:  # the row is stored already: add its trace id
                            self._set_status(run, run.status, request=run.request)
                else:
                    # Only this process creates runs: a look-up (a read, which never waits for a
                    # group commit) decides, and the row goes to storage behind the run's first
                    # event, with the next group commit. The spool keeps it until then.
                    existing = await self._find_by_request(key)
                    if existing is None:
                        run = self._new_run(actor_id, request, request_hash, runtime, webhook)
                        trace = self._trace(run, runtime, headers)
                        self._unstored[key] = run
                        self._row_not_begun.add(run.host_run_id)
                        # vars, not asdict: the same JSON without a deep copy (40 µs a POST).
                        record = b"run " + json.dumps(vars(run), separators=(",", ":")).encode()
                        self.journal.write_behind(self._store_new_run, key, run, record=record)
                if existing is not None:  # a repeated requestId (or another process took the key)
                    return await self._existing(existing, request_hash), False
                self.journal.open_run(run.host_run_id)
                active = ActiveRun(run, runtime, trace=trace)
                if strategy in ("interrupt", "rollback"):
                    self._interrupt_session(run, strategy == "rollback")
                self._active[run.host_run_id] = active
            finally:
                self._admitting[admitted] -= 1
                if self._admitting[admitted] <= 0:
                    del self._admitting[admitted]
        self.created += 1
        await self.journal.append(run.host_run_id, "run.created", {"receipt": run.to_receipt()})
        active.task = asyncio.create_task(self._execute(active), name=f"run-{run.host_run_id}")
        return run, True

    def _live_session_runs(self, actor_id: str, session_id: str) -> list[ActiveRun]:
        """The session's runs still active here (a run whose terminal event is out is only storing
        its end: clients may have seen it end)."""
        return [
            a
            for a in self._active.values()
            if a.run.actor_id == actor_id
            and a.run.session_id == session_id
            and not (a.run.is_terminal or self.journal.has_terminal(a.run.host_run_id))
        ]

    def _check_multitask(self, strategy: str, actor_id: str, session_id: str) -> None:
        """Refuse a new run its strategy cannot take: `reject` while the session has an active
        run, `rollback` of a run whose agent cannot forget it."""
        live = self._live_session_runs(actor_id, session_id)
        if strategy == "reject" and live:
            raise session_busy(next((a.run for a in live if a.run.status != "queued"), live[0].run))
        if strategy == "rollback":
            for other in live:
                if not other.runtime.policy.can_rollback:
                    raise rollback_not_supported(other.run.agent_id)

    def _interrupt_session(self, run: Run, rollback: bool) -> None:
        """Cancel the session's active runs for the new `run` (which queues behind them on the
        session lock, so it starts the moment the agent is free). Each ends `cancelled` naming
        `run`; its turn stays in the session transcript, marked to be left out (`rollback`) or
        sent to the agent as an interrupted turn."""
        for other in self._live_session_runs(run.actor_id, run.session_id):
            other.interrupted_by = run.host_run_id
            other.rolled_back = rollback
            if not other.cancel_requested:
                other.cancel_requested = True
                self._stop(other)

    def _trace(self, run: Run, runtime: Runtime, headers: Mapping[str, str] | None) -> RunTrace:
        """Ask a tracing plugin to follow the new run; its trace id goes into the receipt (kept
        in the stored request, so no schema change: ``Run.trace_id``)."""
        if self.trace_run is None:
            return NO_TRACE
        try:
            name = str(getattr(runtime, "display_name", None) or run.agent_id)
            trace = self.trace_run(run, name, headers if headers is not None else {})
        except Exception:
            log.exception("the trace_run hook failed for run %s", run.host_run_id)
            return NO_TRACE
        if trace is None:
            return NO_TRACE
        if trace.trace_id:
            run.request["traceId"] = trace.trace_id
        return trace

    async def find_by_request(self, actor_id: str, session_id: str, workspace_id: str, request_id: str) -> Run | None:
        """The run of this idempotency key, including one whose row is not stored yet (a new
        run's row goes to storage behind its first event)."""
        return await self._find_by_request((actor_id, session_id, workspace_id, request_id))

    async def _find_by_request(self, key: tuple[str, str, str, str]) -> Run | None:
        unstored = self._unstored.get(key)
        if unstored is not None:
            return unstored
        # A worker trip costs a new run's first event a few ms while a busy run holds the loop.
        find_nowait = getattr(self.storage, "find_run_by_request_nowait", None)
        if find_nowait is not None:
            try:
                at_once: Run | None = find_nowait(*key)
            except Exception as exc:  # it could not answer at once: a worker can
                log.debug("the run look-up goes to a worker: %s", exc)
            else:
                return at_once
        found: Run | None = await self._db(self.storage.find_run_by_request, *key)
        return found

    def _store_new_run(self, key: tuple[str, str, str, str], run: Run) -> None:
        """Store a new run's row (a worker thread, from the journal's `write_behind`)."""
        # Before the row is read from `run`: a change the loop makes after this line writes itself.
        self._row_not_begun.discard(run.host_run_id)
        try:
            self.storage.insert_run(run)
        except RequestConflict as conflict:  # another process on this database took the key meanwhile
            log.error(
                "run %s was not stored: its requestId is taken by run %s (is another gateway "
                "writing to this database outside a cluster?)",
                run.host_run_id,
                conflict.existing.host_run_id,
            )
        self._unstored.pop(key, None)

    def _recover_row(self, data: dict[str, Any]) -> None:
        """At start-up (a worker thread): store the row of a run spooled before a kill took the
        process, if it is not stored yet; the start-up repair then ends it as `interrupted`."""
        try:
            self.storage.insert_run(Run(**data))
        except RequestConflict as conflict:
            log.error("a spooled run was not stored: its requestId is taken by run %s", conflict.existing.host_run_id)

    def _insert_or_find(self, run: Run) -> Run | None:
        """None once `run` is stored, or the run already stored under its request key (a worker
        thread). The insert comes first: a new run (the common case) takes one statement, and each
        statement hands the GIL back and forth with a busy loop; a repeat finds its run in the
        conflict (the storage contract)."""
        try:
            self.storage.insert_run(run)
        except RequestConflict as conflict:  # a repeated requestId, or another process took the key
            return conflict.existing
        return None

    async def _create_at(self, instance_id: str, actor_id: str, body: Any) -> tuple[Run, bool]:
        """Have the session's owner (another instance) create the run."""
        answer = await self.coordinator.forward(instance_id, "create", {"actorId": actor_id, "body": body})
        run = await self._db(self.storage.get_run, answer["hostRunId"])
        if run is None:
            raise ApiError(503, "owner_unavailable", "the session's gateway instance did not store the run; retry")
        return run, bool(answer["created"])

    def _admit(self, actor_id: str, session_id: str) -> tuple[str, str]:
        """Count the new run against the limits, or raise :class:`AdmissionRefused`. Checks and
        counts without awaiting, so concurrent creations cannot all pass; the caller un-counts
        the returned key once the run is in ``_active`` (or was not created)."""
        session = (actor_id, session_id)
        budget = self.max_actor_journal_bytes_per_day
        if budget > 0 and self.journal_bytes_today(actor_id) >= budget:
            retry_after = max(1, SECONDS_PER_DAY - int(time.time()) % SECONDS_PER_DAY)
            raise AdmissionRefused(
                "journal_budget_exhausted",
                f"this actor's runs journalled {self.journal_bytes_today(actor_id)} bytes today (UTC), the daily "
                f"limit ([gateway] max_actor_journal_bytes_per_day = {budget}); retry after midnight UTC",
                budget,
                retry_after,
            )
        of_actor = sum(n for (actor, _), n in self._admitting.items() if actor == actor_id)
        in_session = self._admitting[session]
        for active in self._active.values():
            run = active.run
            if run.actor_id != actor_id or run.is_terminal or self.journal.has_terminal(run.host_run_id):
                continue  # a run whose terminal event is out no longer counts (clients saw it end)
            of_actor += 1
            in_session += run.session_id == session_id
        if of_actor >= self.max_active_per_actor:
            raise AdmissionRefused(
                "too_many_active_runs",
                f"this actor already has {of_actor} active runs (the limit, [gateway] max_active_runs_per_actor); "
                "retry when one has ended",
                self.max_active_per_actor,
            )
        # One run of a session executes; the others queue behind it.
        if in_session > self.max_queued_per_session:
            raise AdmissionRefused(
                "session_queue_full",
                f"this session already has {in_session - 1} queued runs behind the running one (the limit, "
                "[gateway] max_queued_runs_per_session); retry when one has ended",
                self.max_queued_per_session,
            )
        self._admitting[session] += 1
        return session

    async def _existing(self, existing: Run, request_hash: str) -> Run:
        run = self._same_request(existing, request_hash)
        if run is existing and not run.is_terminal:
            # The run may have ended since `existing` was read; _finish stores the end before it
            # leaves _active, so a fresh read has it.
            run = await self._db(self.storage.get_run, run.host_run_id) or run
        return run

    def _same_request(self, existing: Run, request_hash: str) -> Run:
        if existing.request_hash != request_hash:
            raise ApiError(
                409,
                "request_conflict",
                "this requestId was already used with a different request body",
                hostRunId=existing.host_run_id,
            )
        active = self._active.get(existing.host_run_id)
        return active.run if active else existing

    def _new_run(
        self, actor_id: str, request: dict[str, Any], request_hash: str, runtime: Runtime, webhook: str | None = None
    ) -> Run:
        target = request["context"].get("target")
        stored = {k: request[k] for k in ("message", "context", "options")}
        if webhook:  # the storage writes the run's outbox row with its own (docs/webhooks.md)
            stored["webhook"] = webhook
        return Run(
            host_run_id="run_" + secrets.token_hex(12),
            request_id=request["requestId"],
            agent_id=request["agentId"],
            provider=runtime.provider,
            session_id=request["sessionId"],
            actor_id=actor_id,
            workspace_id=request["workspaceId"],
            parent_run_id=request["parentRunId"],
            target_snapshot_hash=canonical_hash(target) if target is not None else None,
            capability_snapshot_hash=canonical_hash(runtime.policy.to_wire()),
            request_hash=request_hash,
            request=stored,
        )

    # -- execution ----------------------------------------------------------------------------------
    def _set_status(self, run: Run, status: str, **fields: Any) -> None:
        """A live run's new status (or receipt fields). Stored before the journal's next group
        commit, by the worker that makes it (`Journal.write_behind`), not in a round trip of its
        own: an active run is read from memory, and an event follows each change at once. The
        terminal status waits for its event's commit instead (`_finish`)."""
        run.status = status
        run.updated_at = now_ms()
        for name, value in fields.items():
            setattr(run, name, value)
        # A new run whose row the worker has not begun to write: the row will hold this change
        # (two statements fewer a short run: running, its session mode).
        if run.host_run_id not in self._row_not_begun:
            self.journal.write_behind(
                functools.partial(
                    self.storage.update_run, run.host_run_id, status=status, updated_at=run.updated_at, **fields
                )
            )
        for listener in self.listeners:
            listener(run)

    async def _execute(self, active: ActiveRun) -> None:
        run = active.run
        run_id_var.set(run.host_run_id)  # this task's context: every log line names its run
        session_id_var.set(run.session_id)
        agent_id_var.set(run.agent_id)
        if active.trace.trace_id:
            trace_id_var.set(active.trace.trace_id)
        outcome: TurnOutcome

        async def queued() -> None:
            self._set_status(run, "queued")
            await self.journal.append(
                run.host_run_id, "run.queued", {"reason": "another run of this session is in flight"}
            )

        try:
            async with self._session_locks.hold((run.actor_id, run.session_id), if_busy=queued):
                if active.cancel_requested or active.forced_outcome is not None:
                    outcome = TurnOutcome("cancelled", "cancelled before it started")
                else:
                    active.started = True
                    outcome = await self._run_turn(active)
                    # Record the turn while the session is still ours, so the session's next run
                    # (queued, or sent the moment the terminal event arrives) sees it.
                    await self._record_turn(active, _terminal(outcome)[0])
        except asyncio.CancelledError:
            if self._shutting_down:
                outcome = TurnOutcome("interrupted", "the gateway stopped while the run was active")
            else:
                outcome = TurnOutcome("cancelled", "cancelled")
        except Exception as exc:  # the runtime broke; the run must still end
            log.exception("run %s failed", run.host_run_id)
            outcome = TurnOutcome("failed", f"{type(exc).__name__}: {exc}")
        if active.forced_outcome is not None:
            outcome = active.forced_outcome
        elif active.interrupted_by is not None and outcome.status == "cancelled":
            verb = "rolled back" if active.rolled_back else "interrupted"
            detail = {**outcome.detail, "interruptedBy": active.interrupted_by, "rolledBack": active.rolled_back}
            outcome = TurnOutcome("cancelled", f"{verb} by {active.interrupted_by}", detail)
        await self._finish(active, outcome)

    async def _run_turn(self, active: ActiveRun) -> TurnOutcome:
        run, runtime = active.run, active.runtime
        self._set_status(run, "running")
        await self.journal.append(run.host_run_id, "run.started", {"agentId": run.agent_id})
        session = await self._session_record(run) or {}
        state = dict((session.get("runtimes") or {}).get(run.agent_id) or {})

        async def emit(kind: str, payload: dict[str, Any], source: str | None) -> None:
            await self.journal.append(run.host_run_id, kind, payload, source or run.agent_id)

        async def save_state(new_state: dict[str, Any]) -> None:
            await self._update_session(
                run, lambda record: record.setdefault("runtimes", {}).__setitem__(run.agent_id, new_state)
            )

        async def on_session_mode(mode: str, detail: dict[str, Any]) -> None:
            if mode != run.session_mode:
                self._set_status(run, run.status, session_mode=mode)
            await self.journal.append(run.host_run_id, "session.info.updated", {"sessionMode": mode, **detail})

        async def ask_permission(
            tool_call: dict[str, Any], options: list[dict[str, Any]], timeout: float | None
        ) -> str | None:
            return await self._ask_permission(active, tool_call, options, timeout)

        async def update_receipt(**fields: Any) -> None:
            self._set_status(run, run.status, **fields)

        turn = Turn(
            run,
            emit,
            list(session.get("turns") or []),
            state,
            save_state,
            on_session_mode,
            services=self.turn_services,
            ask_permission=ask_permission,
            update_receipt=update_receipt,
            emit_nowait=functools.partial(self.journal.append_nowait, run.host_run_id),
        )
        turn.trace = active.trace
        active.turn = turn
        await self._resolve_capabilities(run)
        if active.cancel_requested or active.forced_outcome is not None:  # it came before the turn existed
            turn.cancel_requested.set()
        strategy = self.strategies.get(run.agent_id) or TranscriptStrategy()
        plan: SessionPlan = await strategy.plan(turn, runtime)
        turn.plan = plan
        await turn.set_session_mode(plan.mode, plan.detail)
        if plan.warning:
            await self.journal.append(run.host_run_id, "context.warning", {"message": plan.warning})
        try:
            async with asyncio.timeout(self.run_timeout):
                outcome = await runtime.run_turn(turn)
        except TimeoutError:
            return TurnOutcome("failed", f"the run exceeded {self.run_timeout:g} s")
        if active.cancel_requested and outcome.status == "completed" and not outcome.reason:
            outcome = TurnOutcome("cancelled", "cancelled", outcome.detail)
        return outcome

    async def _ask_permission(
        self, active: ActiveRun, tool_call: dict[str, Any], options: list[dict[str, Any]], timeout: float | None
    ) -> str | None:
        run = active.run
        request_id = "perm_" + secrets.token_hex(8)
        future: asyncio.Future[str | None] = asyncio.get_running_loop().create_future()
        active.permissions[request_id] = (future, [str(o.get("optionId")) for o in options])
        await self.journal.append(
            run.host_run_id,
            "permission.requested",
            {"requestId": request_id, "toolCall": tool_call, "options": options, "timeoutSeconds": timeout},
        )
        by = "client"
        cancel_wait: asyncio.Future[Any] | None = None

        async def resolved(option_id: str | None, by: str) -> None:
            await self.journal.append(
                run.host_run_id,
                "permission.resolved",
                {
                    "requestId": request_id,
                    "outcome": "selected" if option_id else "cancelled",
                    "optionId": option_id,
                    "by": by,
                },
            )
            if not run.is_terminal:
                self._set_status(run, "running")

        try:
            self._set_status(run, "awaiting_permission")
            cancel_wait = asyncio.ensure_future(active.turn.cancel_requested.wait()) if active.turn else None
            waiters = {future} | ({cancel_wait} if cancel_wait else set())
            done, _ = await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            if future in done:
                option_id = future.result()
            else:
                option_id, by = None, ("cancel" if done else "timeout")
        except asyncio.CancelledError:
            # The runtime withdrew the request (e.g. an ACP `session/cancel` answers open permission
            # requests `cancelled` by cancelling their handler): it is still resolved, in the journal.
            with contextlib.suppress(Exception):
                await resolved(None, "cancel")
            raise
        finally:
            if cancel_wait is not None:
                cancel_wait.cancel()
            active.permissions.pop(request_id, None)
        await resolved(option_id, by)
        return option_id

    async def resolve_permission(self, host_run_id: str, actor_id: str, request_id: str, option_id: Any) -> Run:
        """Answer an open permission request of a run (POST .../permissions/{requestId})."""
        active = self._active.get(host_run_id)
        if active is None or active.run.actor_id != actor_id:
            run = await self.get(host_run_id, actor_id)
            if run is None:
                raise ApiError(404, "run_not_found", "no such run")
            owner = None if run.is_terminal else await self.coordinator.owner_elsewhere(run)
            if owner is not None:
                args = {"hostRunId": host_run_id, "actorId": actor_id, "requestId": request_id, "optionId": option_id}
                await self.coordinator.forward(owner, "permission", args)
                return await self.get(host_run_id, actor_id) or run
            raise ApiError(409, "permission_closed", "the run has no open permission requests")
        pending = active.permissions.get(request_id)
        if pending is None:
            raise ApiError(404, "permission_not_found", f"no open permission request {request_id!r} on this run")
        future, option_ids = pending
        if not isinstance(option_id, str) or option_id not in option_ids:
            raise ApiError(400, "invalid_option", "optionId must be one of the offered options", options=option_ids)
        if not future.done():
            future.set_result(option_id)
        return active.run

    async def _resolve_capabilities(self, run: Run) -> None:
        """Which capabilities are off for this run, from the actor's preferences now."""
        if self.tools is None or self.disabled_capabilities is None:
            return
        disabled = await self.disabled_capabilities(run.actor_id, run.agent_id)
        self.tools.disabled_by_run[run.host_run_id] = disabled

    def _observe(self, event: Any) -> None:
        """Note tool calls and changed files of active runs (summaries only, bounded), and follow
        the agent's own tool calls for their receipts."""
        if event.kind not in OBSERVED_KINDS:
            return
        active = self._active.get(event.host_run_id)
        if active is None:
            return
        payload = event.payload
        if event.kind == "usage.updated":  # a tracer's token counts (the last that has them)
            if active.trace is not NO_TRACE and isinstance(payload, dict) and "inputTokens" in payload:
                active.usage = payload
            return
        if event.source not in NOT_AGENT_SOURCES and event.kind != "files.changed":
            self._follow_agent_tool(active, event)
            if active.trace is not NO_TRACE:
                try:
                    active.trace.agent_tool_event(event.kind, payload)
                except Exception:
                    log.exception("the trace of run %s failed on a tool event", event.host_run_id)
        if event.kind == "tool.completed" and len(active.tools) < TURN_TOOLS_KEPT:
            active.tools.append(
                {"tool": payload.get("tool"), "status": payload.get("status"), "path": payload.get("path")}
            )
        elif event.kind == "files.changed":
            for change in payload.get("changes") or ():
                if len(active.files) < TURN_FILES_KEPT and isinstance(change, dict) and change.get("path"):
                    active.files[str(change["path"])] = None

    def _follow_agent_tool(self, active: ActiveRun, event: Any) -> None:
        """Feed a tool event the agent reported to the run's ledger; a finished call's receipt
        is stored before the journal's next group commit (without an await here)."""
        ledger = active.agent_tools
        if ledger is None:
            ledger = active.agent_tools = AgentToolLedger(active.run)
        if ledger.observe(event) and not ledger.store_scheduled:
            ledger.store_scheduled = True
            self.journal.write_behind(ledger.store, self.storage)

    async def _store_agent_receipts(self, active: ActiveRun) -> None:
        """Before the terminal event: receipt the agent's unfinished calls and store every receipt
        of the run, so a client that saw the run end finds them all."""
        self.journal.publish()  # the runtime's last events reach `_observe` first
        ledger = active.agent_tools
        if ledger is None:
            return
        ledger.close()
        if not ledger.pending:
            return
        try:
            await self.journal.write(ledger.store, self.storage)
        except asyncio.CancelledError:
            # A shutdown cancelled the run while it stored them: it must still end (its terminal
            # event); the write goes on in its worker.
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
        except Exception:
            log.exception("could not store the agent tool receipts of run %s", active.run.host_run_id)

    async def _session_record(self, run: Run) -> dict[str, Any] | None:
        """The session's record at the run's start. A worker trip costs the run's first event a
        few ms while other runs hold the loop: a storage that knows the record (or can read it at
        once) answers on the loop, unless cluster instances share the database."""
        read_nowait = None if self.coordinator.clustered else getattr(self.storage, "get_session_nowait", None)
        if read_nowait is not None:
            try:
                record: dict[str, Any] | None = read_nowait(run.actor_id, run.session_id)
            except Exception as exc:  # it could not answer at once: a worker can
                log.debug("the session read goes to a worker: %s", exc)
            else:
                return record
        found: dict[str, Any] | None = await self._db(self.storage.get_session, run.actor_id, run.session_id)
        return found

    async def _update_session(self, run: Run, change: Callable[[dict[str, Any]], Any]) -> None:
        """Read, change and store the session's record in one worker call (one round trip)."""

        def read_change_write() -> None:
            record = self.storage.get_session(run.actor_id, run.session_id) or {
                "sessionId": run.session_id,
                "actorId": run.actor_id,
                "createdAt": now_ms(),
            }
            change(record)
            record["updatedAt"] = now_ms()
            self.storage.put_session(run.actor_id, run.session_id, record)

        await self.journal.write(read_change_write)

    async def _record_turn(self, active: ActiveRun, status: str) -> None:
        """Append the turn (user message, assistant final) to the session transcript, once."""
        run, turn = active.run, active.turn
        if turn is None or active.turn_recorded:
            return
        active.turn_recorded = True
        entry = {
            "hostRunId": run.host_run_id,
            "agentId": run.agent_id,
            "status": status,
            "user": turn.message,
            "assistant": turn.assistant_text,
            "tools": active.tools,
            "files": list(active.files),
            "at": now_ms(),
        }
        if active.interrupted_by is not None and status == "cancelled":
            # The session's next turn knows it (interrupt) or never sees it (rollback).
            entry["interruptedBy"] = active.interrupted_by
            if active.rolled_back:
                entry["rolledBack"] = True
        try:
            await self._update_session(
                run,
                lambda record: record.__setitem__(
                    "turns", [*(record.get("turns") or []), entry][-TRANSCRIPT_KEEP_TURNS:]
                ),
            )
        except Exception:
            log.exception("could not record the turn of run %s in its session", run.host_run_id)

    async def _finish(self, active: ActiveRun, outcome: TurnOutcome) -> None:
        run = active.run
        status, reason = _terminal(outcome)
        payload: dict[str, Any] = {"status": status, **outcome.detail}
        if reason:
            payload["reason"] = reason
        await self._store_agent_receipts(active)
        await self.journal.append(run.host_run_id, TERMINAL_KIND_BY_STATUS[status], payload)
        # One log line per run end, in the run's context (hostRunId, sessionId, agentId).
        log.log(
            logging.INFO if status in ("completed", "cancelled") else logging.WARNING,
            "run %s %s%s",
            run.host_run_id,
            status,
            f": {reason}" if reason else "",
        )
        # The event is in the journal (spooled, published); now the status may flip.
        run.status = status
        self.finished[status] += 1
        run.error = reason if status != "completed" else None
        run.updated_at = now_ms()
        try:
            await self._record_turn(active, status)  # if the run ended before recording it
            # Once its events are stored (the terminal one's commit, in the same worker trip).
            await self.journal.write_after(
                functools.partial(
                    self.storage.update_run, run.host_run_id, status=status, error=run.error, updated_at=run.updated_at
                )
            )
        except Exception:
            log.exception("could not store the end of run %s; it will be repaired on read", run.host_run_id)
        finally:
            self._active.pop(run.host_run_id, None)
            if self.tools is not None:
                self.tools.disabled_by_run.pop(run.host_run_id, None)
            # The turn's callbacks (ask_permission) refer back to `active`: a cycle that only a full
            # collection (rare in a serving process) would free, holding the turn's text with it.
            active.turn = None
            if active.trace is not NO_TRACE:
                try:
                    active.trace.end(run, active.usage)
                except Exception:
                    log.exception("the trace of run %s failed at its end", run.host_run_id)
            active.done.set()
            for listener in self.listeners:  # the journal still holds the run's events for them
                listener(run)
            self.journal.forget_run(run.host_run_id)

    # -- reads ----------------------------------------------------------------------------------------
    async def get(self, host_run_id: str, actor_id: str) -> Run | None:
        active = self._active.get(host_run_id)
        if active is not None:
            return active.run if active.run.actor_id == actor_id else None
        run: Run | None = await self._db(self.storage.get_run, host_run_id)
        if run is None or run.actor_id != actor_id:
            return None
        await self._repair(run)
        return run

    async def _repair(self, run: Run) -> None:
        """Make status and journal agree for a run no task of this process owns. Concurrent
        reads of one run repair it once: the second waits, then finds the terminal event."""
        async with self._repairing.hold(run.host_run_id):
            await self._repair_locked(run)

    async def _repair_locked(self, run: Run) -> None:
        if run.host_run_id in self._active:
            return
        if self.coordinator.clustered and run.status in ACTIVE_STATUSES:
            if await self.coordinator.owner_elsewhere(run):
                return  # another live instance executes it
            # `run` may have been read just before its owner stored the end (the owner gives the run
            # up in that same commit): read it again rather than rewrite the owner's end.
            stored: Run | None = await self._db(self.storage.get_run, run.host_run_id)
            if stored is not None and stored.is_terminal:
                run.status, run.error, run.updated_at = stored.status, stored.error, stored.updated_at
                return
        last = await self.journal.last_event(run.host_run_id)
        if last is not None and last.is_terminal:
            status = STATUS_BY_TERMINAL_KIND[last.kind]
            if run.status != status:
                run.status = status
                run.updated_at = now_ms()
                await self.journal.write(
                    self.storage.update_run, run.host_run_id, status=status, updated_at=run.updated_at
                )
            return
        if run.status in ACTIVE_STATUSES:
            run.status = "interrupted"
            run.error = run.error or "the gateway stopped while the run was active"
        self.journal.open_run(run.host_run_id, next_seq=(last.seq + 1) if last else 1)
        if last is None:
            # Killed between storing the run and spooling its first event: the journal still
            # starts with the receipt (appended with the terminal, no await between them).
            await self.journal.append(run.host_run_id, "run.created", {"receipt": run.to_receipt(), "recovered": True})
        payload = {
            "status": run.status,
            "reason": run.error or "terminal status without a terminal event",
            "synthetic": True,
        }
        await self.journal.append(run.host_run_id, TERMINAL_KIND_BY_STATUS[run.status], payload)
        await self.journal.flush()
        run.updated_at = now_ms()
        await self.journal.write(
            self.storage.update_run, run.host_run_id, status=run.status, error=run.error, updated_at=run.updated_at
        )
        self.journal.forget_run(run.host_run_id)

    async def recover(self) -> int:
        """At start-up: every run a previous process left active becomes `interrupted`."""
        runs: list[Run] = await self._db(self.storage.list_runs, statuses=sorted(ACTIVE_STATUSES))
        for run in runs:
            await self._repair(run)
        return len(runs)

    async def active_run(self, actor_id: str, session_id: str) -> Run | None:
        candidates = [
            a.run
            for a in self._active.values()
            if a.run.actor_id == actor_id and a.run.session_id == session_id and not a.run.is_terminal
        ]
        if not candidates and self.coordinator.clustered:  # it may run on another instance
            candidates = await self._db(
                self.storage.list_runs, actor_id=actor_id, session_id=session_id, statuses=sorted(ACTIVE_STATUSES)
            )
        if not candidates:
            return None
        running = [r for r in candidates if r.status != "queued"]
        return (running or candidates)[0]

    def active_runs(self) -> list[Run]:
        return [a.run for a in self._active.values()]

    @contextlib.asynccontextmanager
    async def hold_sessions(self, actor_id: str, session_ids: Iterable[str]) -> AsyncIterator[None]:
        """No run of these sessions is created while the block runs (a delete of their history):
        a creation that raced it happened wholly before (its run is in :meth:`session_busy`) or
        happens after, starting the session anew. Held in one order, so two holders of several
        sessions never wait for each other."""
        async with contextlib.AsyncExitStack() as stack:
            for session_id in sorted(set(session_ids)):
                await stack.enter_async_context(self._session_changes.hold((actor_id, session_id)))
            yield

    async def session_busy(self, actor_id: str, session_id: str) -> Run | None:
        """The session's active run (the running one first), inside :meth:`hold_sessions`. A run
        whose terminal event is out (a client may have seen it end) is only storing its end and
        its transcript: it is waited for, not reported, so nothing of it is written after."""
        mine = [a.run for a in self._active.values() if (a.run.actor_id, a.run.session_id) == (actor_id, session_id)]
        ending = [r for r in mine if r.is_terminal or self.journal.has_terminal(r.host_run_id)]
        live = [r for r in mine if not (r.is_terminal or self.journal.has_terminal(r.host_run_id))]
        if live:
            return next((r for r in live if r.status != "queued"), live[0])
        for run in ending:
            await self.wait(run.host_run_id)
        return await self.active_run(actor_id, session_id)  # (a cluster: one on another instance)

    async def wait(self, host_run_id: str) -> None:
        """Until the run has ended. A run this instance is not running has ended already, unless
        another instance of a cluster runs it: then until its terminal event arrives here."""
        active = self._active.get(host_run_id)
        if active is not None:
            await active.done.wait()
        elif self.coordinator.clustered:
            await self._wait_elsewhere(host_run_id)

    async def _wait_elsewhere(self, host_run_id: str) -> None:
        """Wait for the terminal event of a run another instance executes: its events reach this
        instance's bus; the journal is asked again after a gap in them, and every few seconds in
        case the relay is down (a takeover ends the run within a lease period)."""
        bus = self.journal.bus
        subscriber = bus.subscribe(host_run_id, ELSEWHERE_WAIT_CAPACITY)  # before the first read
        try:
            ask_journal = True
            while True:
                if ask_journal:
                    subscriber.needs_replay = False
                    subscriber.clear()
                    last = await self.journal.last_event(host_run_id)
                    if last is not None and last.is_terminal:  # (None: nothing committed yet)
                        return
                subscriber.wakeup.clear()
                if any(event.is_terminal for event in subscriber.buffer):
                    return
                subscriber.clear()
                try:
                    async with asyncio.timeout(ELSEWHERE_RECHECK_SECONDS):
                        await subscriber.wakeup.wait()
                    ask_journal = subscriber.needs_replay
                except TimeoutError:
                    ask_journal = True
        finally:
            bus.unsubscribe(subscriber)

    # -- cancel ---------------------------------------------------------------------------------------
    async def cancel(self, host_run_id: str, actor_id: str) -> Run | None:
        active = self._active.get(host_run_id)
        if active is None:
            run = await self.get(host_run_id, actor_id)
            owner = None if run is None or run.is_terminal else await self.coordinator.owner_elsewhere(run)
            if owner is not None:
                await self.coordinator.forward(owner, "cancel", {"hostRunId": host_run_id, "actorId": actor_id})
                return await self.get(host_run_id, actor_id)
            return run
        if active.run.actor_id != actor_id:
            return None
        if not active.cancel_requested:
            active.cancel_requested = True
            self._stop(active)
        return active.run

    def _stop(self, active: ActiveRun) -> None:
        """Stop a run's turn: a run not started yet at once, a running one through its runtime
        (`Turn.cancel_requested`), its task cancelled if that takes more than `cancel_grace`."""
        if not active.started:
            if active.task is not None:
                active.task.cancel()
            return
        if active.turn is not None:  # otherwise _run_turn sets it when it makes the turn
            active.turn.cancel_requested.set()
        self._watchdogs.add(asyncio.create_task(self._force_cancel_after_grace(active)))
        for task in [t for t in self._watchdogs if t.done()]:
            self._watchdogs.discard(task)

    # -- journal byte limits ----------------------------------------------------------------------
    def journal_bytes_today(self, actor_id: str) -> int:
        """Bytes this process journalled today (UTC) for the actor's runs."""
        if int(time.time()) // SECONDS_PER_DAY != self._journal_day:
            return 0
        return self._actor_journal_bytes.get(actor_id, 0)

    def _count_journal_bytes(self, host_run_id: str, size: int) -> None:
        """Count a run's published batch (the journal's `on_published_bytes`): against its
        actor's day, and against the run's own limit, which stops the run once passed."""
        active = self._active.get(host_run_id)
        if active is None:
            return
        if self.max_actor_journal_bytes_per_day > 0:
            day = int(time.time()) // SECONDS_PER_DAY
            if day != self._journal_day:
                self._journal_day = day
                self._actor_journal_bytes = {}
            actor = active.run.actor_id
            self._actor_journal_bytes[actor] = self._actor_journal_bytes.get(actor, 0) + size
        limit = self.max_run_journal_bytes
        if limit <= 0:
            return
        active.journal_bytes += size
        if active.journal_bytes <= limit or active.forced_outcome is not None or self.journal.has_terminal(host_run_id):
            return
        reason = (
            f"journal_limit: the run's events passed {limit} bytes ([gateway] max_run_journal_bytes = {limit}); "
            "the run was stopped and nothing more of it was journalled"
        )
        log.warning("run %s: %s", host_run_id, reason)
        active.forced_outcome = TurnOutcome("failed", reason, {"code": "journal_limit", "limitBytes": limit})
        self.journal.seal(host_run_id)
        self._stop(active)

    async def _force_cancel_after_grace(self, active: ActiveRun) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.cancel_grace):
                await active.done.wait()
                return
        if active.task is not None and not active.done.is_set():
            log.warning(
                "run %s ignored cancel for %.0f s; stopping its task", active.run.host_run_id, self.cancel_grace
            )
            active.task.cancel()

    def abandon(self) -> int:
        """Stop every active run without waiting (this instance lost its cluster lease: what the
        runs still write is refused, and their new owner ends them); returns how many."""
        active = [a for a in self._active.values() if a.task is not None and not a.task.done()]
        for run in active:
            assert run.task is not None
            run.task.cancel()
        return len(active)

    async def drain(self, grace: float) -> None:
        """Give active runs up to `grace` seconds to end, then interrupt the rest (`shutdown`)."""
        waiting = [asyncio.ensure_future(a.done.wait()) for a in self._active.values()]
        if waiting and grace > 0:
            await asyncio.wait(waiting, timeout=grace)
        for waiter in waiting:
            waiter.cancel()
        await self.shutdown()

    async def shutdown(self) -> None:
        self._shutting_down = True
        tasks = [a.task for a in self._active.values() if a.task is not None]
        for active in self._active.values():
            # A run whose terminal event is appended is only storing its end: let it finish.
            if active.task is not None and not self.journal.has_terminal(active.run.host_run_id):
                active.task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
