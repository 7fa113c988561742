"""The storage contract. A storage plugin returns an object with these methods from the
`storage_backend` hook; the core calls them from worker threads (never on the event loop), so a
backend may block. Every method must be safe to call from more than one thread.

When the database cannot be reached, a method raises :class:`StorageUnavailable`: the gateway
answers such a request 503 ``storage_unavailable``, the journal keeps events spooled and retries
its commit, and ``/v1/health`` (readiness) reports storage as down. A backend that loses a
connection it already had should open a fresh one and retry the statement where that is safe
before giving up (the built-in peewee journal does, for every method).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Protocol

from agent_gateway.models import Event, Run


class RequestConflict(Exception):
    """`insert_run` found a run with the same (actor, session, workspace, requestId)."""

    def __init__(self, existing: Run) -> None:
        super().__init__(existing.host_run_id)
        self.existing = existing


class StorageUnavailable(Exception):
    """The database cannot be reached (a lost connection could not be re-opened). The message is
    for the gateway's log; clients get a generic 503 ``storage_unavailable``."""


class Storage(Protocol):
    def open(self) -> None:
        """Connect and bring the tables to this release's schema (creating them in a new database).
        Called once at start-up; an exception (e.g. a database a newer release migrated) stops
        the start with its message on one line."""

    def close(self) -> None: ...

    def ping(self) -> None:
        """Check the database answers (re-opening a lost connection); raise StorageUnavailable if
        it does not. Used by the readiness answer of `/v1/health`; a backend without `ping` is
        taken as always up."""

    # -- runs -------------------------------------------------------------------------------
    def insert_run(self, run: Run) -> None:
        """Insert a new run; raise RequestConflict(existing) if its idempotency key is taken."""

    def update_run(self, host_run_id: str, **fields: Any) -> None:
        """Update some Run fields (status, session_mode, provider_run_id, error, updated_at, ...)."""

    def get_run(self, host_run_id: str) -> Run | None: ...

    def find_run_by_request(self, actor_id: str, session_id: str, workspace_id: str, request_id: str) -> Run | None: ...

    # Optional: `find_run_by_request_nowait`, the same look-up on the event loop's thread for a
    # backend that can answer at once without waiting (a local file read, never a lock or the
    # network): it raises when it cannot, and `POST /v1/runs` then asks a worker as usual.

    def list_runs(
        self,
        *,
        actor_id: str | None = None,
        session_id: str | None = None,
        statuses: Iterable[str] | None = None,
        limit: int | None = None,
    ) -> list[Run]:
        """Runs matching every given filter, oldest first."""

    # -- events -----------------------------------------------------------------------------
    def append_events(self, events: Sequence[Event]) -> None:
        """Write a batch in one transaction (group commit). A (host_run_id, seq) already stored is
        skipped, not an error, so a batch may be replayed after a crash."""

    def read_events(self, host_run_id: str, after_seq: int = 0, limit: int | None = None) -> list[Event]:
        """Events with seq > after_seq, in seq order."""

    def last_event(self, host_run_id: str) -> Event | None: ...

    # -- sessions, preferences, receipts ------------------------------------------------------
    def get_session(self, actor_id: str, session_id: str) -> dict[str, Any] | None:
        """The stored session record (a JSON object) or None."""

    def put_session(self, actor_id: str, session_id: str, record: dict[str, Any]) -> None: ...

    # Optional: `get_session_nowait`, `get_session` on the event loop's thread (a run's start) for
    # a backend that can answer at once: from what it last read or wrote of the record, or a local
    # file read; it raises when it cannot, and the run asks a worker. Not asked when clustered.

    def get_preferences(self, actor_id: str) -> dict[str, Any]: ...

    def put_preferences(self, actor_id: str, values: dict[str, Any]) -> None:
        """Replace the actor's stored preferences with `values`."""

    def insert_receipt(self, receipt: dict[str, Any]) -> None:
        """Store one tool receipt; it carries at least `hostRunId`, `actorId` and `createdAt`."""

    def list_receipts(self, host_run_id: str) -> list[dict[str, Any]]: ...

    # -- conversation heads (conversation affinity; docs/sessions.md) ---------------------------------
    # Optional: without all three, a resent history is never matched to a session (every one
    # starts a new session given that history). `delete_session_history` removes a session's heads.
    def claim_conversation(self, actor_id: str, agent_id: str, digest: str, claimer: str, at: int) -> str | None:
        """The session whose head is ``digest``, claimed for ``claimer`` (if unclaimed or already
        ``claimer``'s), atomically; None when there is none or another claimer holds it."""

    def release_conversation(self, actor_id: str, agent_id: str, digest: str) -> None:
        """Unclaim the head ``digest`` (its claiming run did not complete)."""

    def put_conversation(self, actor_id: str, agent_id: str, digest: str, session_id: str) -> None:
        """Make ``digest`` the session's head (over another session holding it), unless the
        session has no run any more. Its other heads go, except those claimed under an
        idempotency key (a claimer not starting with ``claim-``): a retry of that request claims
        it again and is the same run."""

    # -- the session index (GET /v1/sessions; docs/sessions.md) --------------------------------------
    # Optional: a storage without these methods serves no /v1/sessions routes (they answer 501).
    def touch_session_index(self, run: Run) -> None:
        """Create or update the session's index row from one of its runs (status, agent, mode;
        the default title is the first user message). An older run changes nothing."""

    def put_run_digest(self, digest: dict[str, Any]) -> None:
        """Store what an ended run contributes (question, answer, tools, files, counts, mode),
        replacing an earlier digest of that run, and recompute its session's counts and search.
        The question and answer hold at most the first ``DIGEST_TEXT_CHARS`` characters
        (``agent_gateway.routes.sessions.indexer``)."""

    def get_session_index(self, actor_id: str, session_id: str) -> dict[str, Any] | None: ...

    def list_session_index(
        self,
        actor_id: str,
        *,
        agent_id: str | None = None,
        statuses: Sequence[str] | None = None,
        limit: int = 50,
        after: tuple[int, int, str] | None = None,
    ) -> list[dict[str, Any]]:
        """Pinned first, then most recently updated; ``after`` = (pinned, updated_at, session_id)
        of the previous page's last row (keyset)."""

    def search_session_index(
        self,
        actor_id: str,
        query: str,
        *,
        agent_id: str | None = None,
        statuses: Sequence[str] | None = None,
        limit: int = 50,
        offset: int = 0,
    ) -> list[dict[str, Any]]:
        """Full-text search, best first; each row has ``score`` and ``snippet``: a list of
        ``(text, hit)`` pieces, the text as stored (the API escapes it; nothing in it can mark a
        hit; a plain string is shown as text without hits)."""

    def update_session_index(
        self, actor_id: str, session_id: str, *, title: str | None = None, pinned: bool | None = None
    ) -> bool: ...

    def delete_session_history(self, actor_id: str, session_id: str) -> bool:
        """Remove the gateway's history of a session (runs, events, receipts, session record,
        index and search rows, conversation heads); False when there was none."""

    def runs_without_digest(self, limit: int = 1000) -> list[Run]:
        """Ended runs not yet indexed (e.g. marked interrupted at start-up)."""

    # -- keeping the disk bounded (gateway/retention.py schedules these; never on the request path) --
    # Optional: a storage without them is never compacted nor pruned. Each call is one or a few
    # short transactions, so the journal's writer never waits long behind one.
    def compact_run(self, host_run_id: str, max_events: int = 4096) -> tuple[int, int]:
        """Fold an ended run's consecutive text deltas (same kind, source and other payload keys)
        into fewer stored events; returns (stored events before, after). Invariants: no seq is
        reused (a compacted event keeps the seq of the last delta it covers), and
        ``read_events(after_seq=k)`` for ANY k returns exactly what followed k (a compacted event
        covering k comes back cut to the text after k). A run whose terminal event is not stored
        is left alone."""

    def expired_runs(self, before_ms: int, limit: int = 100) -> list[str]:
        """Ids of ended runs last updated before ``before_ms`` whose session is not pinned,
        oldest first."""

    def delete_run_history(self, host_run_id: str, before_ms: int, max_events: int = 2000) -> bool:
        """One bounded step of deleting an expired run (its events, oldest first, then its row,
        receipts and digest; a session left without runs loses its record and index row). True
        when nothing of it is left, or it is no longer expired (then it is left alone)."""
