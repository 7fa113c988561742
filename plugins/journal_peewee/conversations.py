"""Conversation heads (docs/sessions.md, "Conversation affinity"): per (actor, agent, digest of a
whole conversation) the session it continues, and the request that claimed it, if any."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from agent_gateway import now_ms

# The claimer of a request without an idempotency key (agent_gateway.affinity).
UNKEYED = "claim-"


class ConversationMixin:
    """Storage methods of the conversation heads (mixed into PeeweeStorage)."""

    table_prefix: str
    models: Any

    def _qualified(self, table: str) -> str:  # provided by PeeweeStorage
        raise NotImplementedError

    def _write(self) -> Any:  # provided by PeeweeStorage
        raise NotImplementedError

    def _sql(self, sql: str, params: Sequence[Any] = ()) -> Any:  # provided by SessionIndexMixin
        raise NotImplementedError

    @property
    def _heads(self) -> str:
        return self._qualified(f"{self.table_prefix}conversation_heads")

    def claim_conversation(self, actor_id: str, agent_id: str, digest: str, claimer: str, at: int) -> str | None:
        """The session whose head is ``digest``, claimed for ``claimer`` (unclaimed, or claimed by
        the same claimer: a retry); None when there is none or another request holds it."""
        key = (actor_id, agent_id, digest)
        with self._write():
            cursor = self._sql(
                f"UPDATE {self._heads} SET claimed_by = ?, claimed_at = ? WHERE actor_id = ? AND agent_id = ?"
                " AND digest = ? AND (claimed_by IS NULL OR claimed_by = ?)",
                (claimer, at, *key, claimer),
            )
            if cursor.rowcount != 1:
                return None
            row = self._sql(
                f"SELECT session_id FROM {self._heads} WHERE actor_id = ? AND agent_id = ? AND digest = ?", key
            ).fetchone()
        return str(row[0]) if row else None

    def release_conversation(self, actor_id: str, agent_id: str, digest: str) -> None:
        """The head ``digest`` may be continued again (its claiming run did not complete)."""
        with self._write():
            self._sql(
                f"UPDATE {self._heads} SET claimed_by = NULL, claimed_at = NULL"
                " WHERE actor_id = ? AND agent_id = ? AND digest = ?",
                (actor_id, agent_id, digest),
            )

    def put_conversation(self, actor_id: str, agent_id: str, digest: str, session_id: str) -> None:
        """``digest`` is now ``session_id``'s head: its earlier head goes (unless claimed under an
        idempotency key), and an other session ending with the same conversation no longer holds
        it. Nothing is stored for a session that has no run any more (deleted meanwhile)."""
        runs = self._qualified(self.models.run._meta.table_name)
        with self._write():
            # A head claimed under an idempotency key stays (claimed): that request, retried, is
            # the same run of this session; for anyone else it is taken.
            self._sql(
                f"DELETE FROM {self._heads} WHERE actor_id = ? AND session_id = ?"
                " AND (claimed_by IS NULL OR claimed_by LIKE ?)",
                (actor_id, session_id, UNKEYED + "%"),
            )
            self._sql(
                f"INSERT INTO {self._heads} (actor_id, agent_id, digest, session_id, updated_at)"
                " SELECT ?, ?, ?, ?, ? WHERE EXISTS"
                f" (SELECT 1 FROM {runs} WHERE actor_id = ? AND session_id = ?)"
                " ON CONFLICT (actor_id, agent_id, digest) DO UPDATE SET session_id = excluded.session_id,"
                " updated_at = excluded.updated_at, claimed_by = NULL, claimed_at = NULL",
                (actor_id, agent_id, digest, session_id, now_ms(), actor_id, session_id),
            )
