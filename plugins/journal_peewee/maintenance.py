"""Keeping the peewee journal's disk bounded: compaction of ended runs' text deltas, and retention.

Compaction. After a run's terminal event, each stretch of consecutive ``message.delta`` (or
``thought.delta``) events of one message (same kind, source and payload keys other than
``text``) covering seqs ``a..b`` becomes ONE stored event at seq ``b`` (the last one's seq, so no
seq is reused and none is given out again) whose payload is the first one's with the joined
``text``, ``mergedFrom: a`` and ``mergedCount: b - a + 1`` (the shape the bus already uses for
deltas merged under backpressure). The length of each original delta's text goes to
``{prefix}event_spans`` (one row per compacted event), so a reader resuming after any seq ``k``
inside ``a..b-1`` gets exactly the text after ``k``: the compacted event is sliced on the way out
(``mergedFrom: k + 1``; resuming at ``b - 1`` gives back event ``b`` as it was first sent).

A run's stretches are compacted one per transaction (at most COMPACT_MAX_EVENTS deltas each), so
the journal's writer never waits long for the lock.

Raw deltas inside a compacted range can reappear only if a killed gateway's spool is written back
after the compaction committed; reads ignore them (the compacted event holds their text), so a
reader never sees a text twice, and compacting the run again deletes them.

Retention. ``expired_runs`` lists ended runs last updated before a cutoff whose session is not
pinned; ``delete_run_history`` removes one of them in bounded steps: a batch of its events per
transaction, oldest first (so the terminal event goes last, together with the run's row, receipts,
spans and digest, and a half-deleted run still reads as ended). A session left without runs loses
its record and index row; otherwise its counts and search text are recomputed.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import orjson

from agent_gateway import Event

MERGEABLE_KINDS = ("message.delta", "thought.delta")
ENDED_STATUSES = ("completed", "failed", "cancelled", "interrupted")
TERMINAL_EVENT_KINDS = ("run.completed", "run.failed", "run.cancelled", "run.interrupted")
# Most deltas folded into one stored event: bounds a compaction transaction and the text a
# resume has to slice.
COMPACT_MAX_EVENTS = 4096
# Stored rows read per step while compacting.
COMPACT_READ_PAGE = 4096
_MERGE_KEYS = ("mergedFrom", "mergedCount")


class _Stretch:
    """Consecutive deltas being gathered into one compacted event."""

    __slots__ = ("created_at", "first_seq", "key", "kind", "last_seq", "lengths", "payload", "source", "texts")

    def __init__(self, key: tuple[Any, ...], seq: int, kind: str, source: str, payload: dict[str, Any]) -> None:
        self.key = key
        self.kind = kind
        self.source = source
        self.payload = payload
        self.first_seq = self.last_seq = seq
        self.texts: list[str] = [payload["text"]]
        self.lengths: list[int] = [len(payload["text"])]
        self.created_at = 0

    def add(self, seq: int, text: str, created_at: int) -> None:
        self.last_seq = seq
        self.texts.append(text)
        self.lengths.append(len(text))
        self.created_at = created_at


def _stretch_key(kind: str, source: str, payload: Any) -> tuple[Any, ...] | None:
    """What deltas must share to be compacted together; None for an event that is not a
    compactable delta (a non-delta, a delta without string text, an already merged one)."""
    if kind not in MERGEABLE_KINDS or not isinstance(payload, dict) or not isinstance(payload.get("text"), str):
        return None
    if len(payload) == 1:  # the usual delta: {"text": ...}
        return (kind, source)
    if any(key in payload for key in _MERGE_KEYS):
        return None
    return (kind, source, tuple(sorted((key, repr(value)) for key, value in payload.items() if key != "text")))


def _decode(payload_json: str | bytes) -> Any:
    try:
        return orjson.loads(payload_json)
    except orjson.JSONDecodeError:  # an escaped lone surrogate: the json module takes it
        return json.loads(payload_json)


def _encode_lengths(lengths: Sequence[int]) -> str:
    return ",".join(map(str, lengths))


def _decode_lengths(text: str) -> list[int]:
    return [int(part) for part in text.split(",")] if text else []


class MaintenanceMixin:
    """Compaction, compacted reads and retention for :class:`PeeweeStorage` (mixed in)."""

    database: Any
    is_sqlite: bool
    table_prefix: str
    models: Any

    def _qualified(self, table: str) -> str:  # provided by PeeweeStorage
        raise NotImplementedError

    def _write(self) -> Any:  # provided by PeeweeStorage
        raise NotImplementedError

    def _sql(self, sql: str, params: Sequence[Any] = ()) -> Any:  # provided by SessionIndexMixin
        raise NotImplementedError

    def _recompute_session(self, actor_id: str, session_id: str) -> None:  # SessionIndexMixin
        raise NotImplementedError

    def _hold_session_text(self, actor_id: str, session_id: str) -> None:  # SessionIndexMixin
        raise NotImplementedError

    # -- tables ---------------------------------------------------------------------------------
    @property
    def _spans(self) -> str:
        return self._qualified(f"{self.table_prefix}event_spans")

    @property
    def _rd_table(self) -> str:
        return self._qualified(f"{self.table_prefix}run_digests")

    # -- compaction -----------------------------------------------------------------------------
    def compact_run(self, host_run_id: str, max_events: int = COMPACT_MAX_EVENTS) -> tuple[int, int]:
        """Fold the ended run's consecutive text deltas into one stored event per stretch; returns
        (stored events before, after). A run without a stored terminal event is left alone."""
        events = self._qualified(self.models.event._meta.table_name)
        last = self._sql(
            f"SELECT kind FROM {events} WHERE host_run_id = ? ORDER BY seq DESC LIMIT 1", (host_run_id,)
        ).fetchone()
        if last is None or last[0] not in TERMINAL_EVENT_KINDS:
            return (0, 0)
        before = after = 0
        covered = self._compacted_spans(host_run_id, 0)
        if covered:
            # Raw deltas a spool write-back put inside compacted ranges: their text is already in
            # the compacted event (and folding them again would tell it twice).
            with self._write():
                for first_seq, last_seq in covered:
                    before += self._sql(
                        f"DELETE FROM {events} WHERE host_run_id = ? AND seq >= ? AND seq < ?",
                        (host_run_id, first_seq, last_seq),
                    ).rowcount
        stretch: _Stretch | None = None
        after_seq = 0
        while True:
            rows = self._sql(
                f"SELECT seq, kind, source, payload, created_at FROM {events}"
                " WHERE host_run_id = ? AND seq > ? ORDER BY seq LIMIT ?",
                (host_run_id, after_seq, COMPACT_READ_PAGE),
            ).fetchall()
            for seq, kind, source, payload_json, created_at in rows:
                before += 1
                after += 1
                key, payload = None, None
                if kind in MERGEABLE_KINDS:  # decode only what may be compacted
                    payload = _decode(payload_json)
                    key = _stretch_key(kind, source, payload)
                if (
                    stretch is not None
                    and key == stretch.key
                    and payload is not None
                    and seq == stretch.last_seq + 1
                    and len(stretch.lengths) < max_events
                ):
                    stretch.add(seq, payload["text"], created_at)
                    after -= 1
                    continue
                if stretch is not None:
                    self._store_stretch(host_run_id, stretch)
                    stretch = None
                if key is not None and payload is not None:
                    stretch = _Stretch(key, seq, kind, source, payload)
                    stretch.created_at = created_at
            if len(rows) < COMPACT_READ_PAGE:
                break
            after_seq = rows[-1][0]
        if stretch is not None:
            self._store_stretch(host_run_id, stretch)
        return (before, after)

    def _store_stretch(self, host_run_id: str, stretch: _Stretch) -> None:
        if stretch.first_seq == stretch.last_seq:
            return  # a lone delta stays as it is
        events = self._qualified(self.models.event._meta.table_name)
        payload = dict(stretch.payload)
        payload["text"] = "".join(stretch.texts)
        payload["mergedFrom"] = stretch.first_seq
        payload["mergedCount"] = len(stretch.lengths)
        merged = Event(host_run_id, stretch.last_seq, stretch.kind, stretch.source, payload, stretch.created_at)
        with self._write():
            self._sql(
                f"DELETE FROM {events} WHERE host_run_id = ? AND seq >= ? AND seq < ?",
                (host_run_id, stretch.first_seq, stretch.last_seq),
            )
            self._sql(
                f"UPDATE {events} SET payload = ? WHERE host_run_id = ? AND seq = ?",
                (merged.payload_json(), host_run_id, stretch.last_seq),
            )
            self._sql(
                f"INSERT INTO {self._spans} (host_run_id, last_seq, first_seq, lengths) VALUES (?, ?, ?, ?)"
                " ON CONFLICT (host_run_id, last_seq) DO NOTHING",
                (host_run_id, stretch.last_seq, stretch.first_seq, _encode_lengths(stretch.lengths)),
            )

    # -- reads of compacted runs --------------------------------------------------------------------
    def _compacted_spans(self, host_run_id: str, after_seq: int) -> list[tuple[int, int]]:
        """(first_seq, last_seq) of the run's compacted events at seqs above ``after_seq``."""
        rows = self._sql(
            f"SELECT first_seq, last_seq FROM {self._spans} WHERE host_run_id = ? AND last_seq > ? ORDER BY last_seq",
            (host_run_id, after_seq),
        ).fetchall()
        return [(int(first), int(last)) for first, last in rows]

    def _resolve_compacted(
        self, events: list[Event], spans: list[tuple[int, int]], after_seq: int
    ) -> tuple[list[Event], int]:
        """``events`` (seq > after_seq, in order) with raw deltas a compacted event covers left out
        and a compacted event that starts at or before ``after_seq`` cut to the text after it;
        also how many were left out."""
        out: list[Event] = []
        dropped = 0
        index = 0
        for event in events:
            while index < len(spans) and spans[index][1] < event.seq:
                index += 1
            if index < len(spans):
                first, last = spans[index]
                if first <= event.seq < last:
                    dropped += 1  # a raw delta written back by spool recovery: its text is in `last`
                    continue
                if event.seq == last and first <= after_seq:
                    event = self._cut_compacted(event, first, after_seq)
            out.append(event)
        return out, dropped

    def _cut_compacted(self, event: Event, first_seq: int, after_seq: int) -> Event:
        """The part of a compacted event (covering first_seq..event.seq) after ``after_seq``."""
        row = self._sql(
            f"SELECT lengths FROM {self._spans} WHERE host_run_id = ? AND last_seq = ?",
            (event.host_run_id, event.seq),
        ).fetchone()
        lengths = _decode_lengths(row[0]) if row else []
        payload = dict(event.payload)
        text = str(payload.get("text", ""))
        payload["text"] = text[sum(lengths[: after_seq - first_seq + 1]) :]
        if after_seq + 1 == event.seq:
            for key in _MERGE_KEYS:  # the last delta alone: as it was first sent
                payload.pop(key, None)
        else:
            payload["mergedFrom"] = after_seq + 1
            payload["mergedCount"] = event.seq - after_seq
        return Event(event.host_run_id, event.seq, event.kind, event.source, payload, event.created_at)

    # -- retention --------------------------------------------------------------------------------
    def expired_runs(self, before_ms: int, limit: int = 100) -> list[str]:
        """Ended runs last updated before ``before_ms`` whose session is not pinned, oldest first."""
        runs = self._qualified(self.models.run._meta.table_name)
        si = self._qualified(f"{self.table_prefix}session_index")
        rows = self._sql(
            f"SELECT r.host_run_id FROM {runs} r WHERE r.updated_at < ? AND r.status IN (?, ?, ?, ?)"
            f" AND NOT EXISTS (SELECT 1 FROM {si} s WHERE s.actor_id = r.actor_id"
            " AND s.session_id = r.session_id AND s.pinned <> 0)"
            " ORDER BY r.updated_at, r.host_run_id LIMIT ?",
            (before_ms, *ENDED_STATUSES, limit),
        ).fetchall()
        return [host_run_id for (host_run_id,) in rows]

    def delete_run_history(self, host_run_id: str, before_ms: int, max_events: int = 2000) -> bool:
        """One bounded step of removing an expired run: up to ``max_events`` of its oldest events,
        or (when no more than that remain) everything left of it. True when the run is gone (or
        was never there); a run no longer expired (pinned since, or updated) is left alone and
        reported gone too."""
        runs = self._qualified(self.models.run._meta.table_name)
        events = self._qualified(self.models.event._meta.table_name)
        receipts = self._qualified(self.models.receipt._meta.table_name)
        si = self._qualified(f"{self.table_prefix}session_index")
        with self._write():
            # Checked again inside the transaction: the session may have been pinned meanwhile.
            run = self._sql(
                f"SELECT r.actor_id, r.session_id FROM {runs} r WHERE r.host_run_id = ? AND r.updated_at < ?"
                f" AND r.status IN (?, ?, ?, ?) AND NOT EXISTS (SELECT 1 FROM {si} s WHERE s.actor_id = r.actor_id"
                " AND s.session_id = r.session_id AND s.pinned <> 0)",
                (host_run_id, before_ms, *ENDED_STATUSES),
            ).fetchone()
            if run is None:
                return True
            self._hold_session_text(*run)  # before any delete: a digest written meanwhile waits for it
            bound = self._sql(
                f"SELECT seq FROM {events} WHERE host_run_id = ? ORDER BY seq LIMIT 1 OFFSET ?",
                (host_run_id, max_events),
            ).fetchone()
            if bound is not None:  # more than max_events left: the oldest ones only
                self._sql(f"DELETE FROM {events} WHERE host_run_id = ? AND seq < ?", (host_run_id, bound[0]))
                return False
            actor_id, session_id = run
            self._sql(f"DELETE FROM {events} WHERE host_run_id = ?", (host_run_id,))
            self._sql(f"DELETE FROM {self._spans} WHERE host_run_id = ?", (host_run_id,))
            self._sql(f"DELETE FROM {receipts} WHERE host_run_id = ?", (host_run_id,))
            self._sql(f"DELETE FROM {self._outbox} WHERE host_run_id = ?", (host_run_id,))  # type: ignore[attr-defined]
            self._sql(f"DELETE FROM {self._rd_table} WHERE host_run_id = ?", (host_run_id,))
            self._sql(f"DELETE FROM {runs} WHERE host_run_id = ?", (host_run_id,))
            left = self._sql(
                f"SELECT 1 FROM {runs} WHERE actor_id = ? AND session_id = ? LIMIT 1", (actor_id, session_id)
            ).fetchone()
            if left is not None:
                self._recompute_session(actor_id, session_id)
                return True
            records = self._qualified(self.models.session._meta.table_name)
            self._sql(f"DELETE FROM {records} WHERE actor_id = ? AND session_id = ?", (actor_id, session_id))
            found = self._sql(
                f"SELECT id FROM {si} WHERE actor_id = ? AND session_id = ?", (actor_id, session_id)
            ).fetchone()
            if found is not None:
                if self.is_sqlite:
                    fts = self._qualified(f"{self.table_prefix}session_fts")
                    self._sql(f"DELETE FROM {fts} WHERE rowid = ?", (found[0],))
                self._sql(f"DELETE FROM {si} WHERE id = ?", (found[0],))
        return True
