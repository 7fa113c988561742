"""The webhook outbox (docs/webhooks.md): one row per run that has a webhook, written in the same
transaction as the run's row, so a run that exists has its delivery owed whatever crashes later.
A row is due once its run's stored status is terminal (the gateway stores it after the terminal
event, or repairs it at start-up); instances claim a due row with a lease before posting it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from agent_gateway import Run, now_ms

_COLUMNS = (
    "id",
    "host_run_id",
    "url",
    "state",
    "attempts",
    "next_at",
    "lease_until",
    "created_at",
    "first_attempt_at",
    "last_attempt_at",
    "last_status",
    "last_error",
    "delivered_at",
)
_UPDATABLE = frozenset(_COLUMNS) - {"id", "host_run_id", "url", "created_at"}
_TERMINAL = ("completed", "failed", "cancelled", "interrupted")


class OutboxMixin:
    """Storage methods of the webhook outbox (mixed into PeeweeStorage)."""

    table_prefix: str
    is_sqlite: bool

    def _qualified(self, table: str) -> str:  # provided by PeeweeStorage
        raise NotImplementedError

    def _sql(self, sql: str, params: Sequence[Any] = ()) -> Any:  # provided by SessionIndexMixin
        raise NotImplementedError

    @property
    def _outbox(self) -> str:
        return self._qualified(f"{self.table_prefix}webhook_outbox")

    def _insert_outbox(self, run: Run) -> None:
        """Called inside insert_run's transaction for a run whose request names a webhook."""
        url = run.request.get("webhook")
        if not isinstance(url, str) or not url:
            return
        self._sql(
            f"INSERT INTO {self._outbox} (id, host_run_id, url, state, attempts, next_at, lease_until, created_at)"
            " VALUES (?, ?, ?, 'pending', 0, 0, 0, ?) ON CONFLICT DO NOTHING",
            ("msg_" + run.host_run_id, run.host_run_id, url, now_ms()),
        )

    def due_webhooks(self, now: int, limit: int = 50) -> list[dict[str, Any]]:
        """Pending deliveries whose run has ended, whose next attempt is due and that no instance
        holds a lease on, oldest first."""
        runs = self._qualified(f"{self.table_prefix}runs")
        marks = ", ".join("?" for _ in _TERMINAL)
        cursor = self._sql(
            f"SELECT {', '.join('o.' + c for c in _COLUMNS)} FROM {self._outbox} o JOIN {runs} r"
            f" ON r.host_run_id = o.host_run_id WHERE o.state = 'pending' AND o.next_at <= ?"
            f" AND o.lease_until <= ? AND r.status IN ({marks}) ORDER BY o.next_at, o.created_at LIMIT ?",
            (now, now, *_TERMINAL, limit),
        )
        return [dict(zip(_COLUMNS, row, strict=True)) for row in cursor.fetchall()]

    def claim_webhook(self, message_id: str, now: int, lease_until: int) -> bool:
        """Take a due delivery for this instance until ``lease_until``; False when another took it."""
        with self._write():  # type: ignore[attr-defined]
            cursor = self._sql(
                f"UPDATE {self._outbox} SET lease_until = ? WHERE id = ? AND state = 'pending' AND lease_until <= ?",
                (lease_until, message_id, now),
            )
            return bool(cursor.rowcount == 1)

    def update_webhook(self, message_id: str, **fields: Any) -> None:
        """Record an attempt's outcome (any of the outbox's state columns)."""
        unknown = sorted(set(fields) - _UPDATABLE)
        if unknown:
            raise ValueError(f"update_webhook: unknown field(s): {', '.join(unknown)}")
        if not fields:
            return
        assignments = ", ".join(f"{name} = ?" for name in fields)
        with self._write():  # type: ignore[attr-defined]
            self._sql(f"UPDATE {self._outbox} SET {assignments} WHERE id = ?", (*fields.values(), message_id))

    def get_webhook(self, host_run_id: str) -> dict[str, Any] | None:
        """The run's delivery row, or None when the run has no webhook."""
        row = self._sql(
            f"SELECT {', '.join(_COLUMNS)} FROM {self._outbox} WHERE host_run_id = ?", (host_run_id,)
        ).fetchone()
        return dict(zip(_COLUMNS, row, strict=True)) if row else None
