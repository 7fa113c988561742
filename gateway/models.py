"""Records the gateway passes between its parts: run receipts and journal events.

Field names are snake_case in Python and camelCase on the wire (`to_receipt`, `to_wire`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from time import time as _time
from typing import Any

import orjson

RUN_SCHEMA = "gateway.run.v1"
EVENT_SCHEMA = "gateway.run_event.v1"

ACTIVE_STATUSES = frozenset({"pending", "queued", "running", "awaiting_permission"})
TERMINAL_STATUSES = frozenset({"completed", "failed", "cancelled", "interrupted"})
TERMINAL_KIND_BY_STATUS = {
    "completed": "run.completed",
    "failed": "run.failed",
    "cancelled": "run.cancelled",
    "interrupted": "run.interrupted",
}
STATUS_BY_TERMINAL_KIND = {kind: status for status, kind in TERMINAL_KIND_BY_STATUS.items()}
TERMINAL_KINDS = frozenset(STATUS_BY_TERMINAL_KIND)

SESSION_MODES = ("native_live", "loaded", "cold_resumed", "new_session")

# Kinds that may be merged under backpressure; everything else is delivered one by one.
MERGEABLE_KINDS = frozenset({"message.delta", "thought.delta"})

CURSOR_WIDTH = 18


def dumps(value: Any) -> bytes:
    """Compact UTF-8 JSON. orjson when it can (the event path's hottest call), else json. The
    result may sit in a buffer far larger than itself (see `kept`)."""
    try:
        return orjson.dumps(value)
    except TypeError:  # an int beyond 64 bits, a lone surrogate: ASCII escapes keep it valid UTF-8
        return json.dumps(value, ensure_ascii=True, separators=(",", ":"), default=str).encode()


def kept(data: bytes) -> bytes:
    """A copy of `data` in a buffer of its own size, for bytes that are kept. orjson (3.12 and
    later) returns even a 30-byte document in a 4 KB buffer: an event that keeps its payload JSON
    as returned holds 4 KB for it, so 20,000 events waiting for storage held 80 MB."""
    return _join((data, b""))


_join = b"".join


def loads(data: bytes | str) -> Any:
    """Parse JSON: orjson when it can, else json (an int beyond 64 bits, an escaped lone surrogate)."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return json.loads(data)


def dumps_str(text: str) -> str:
    return dumps(text).decode()


def now_ms() -> int:
    return int(time.time() * 1000)


_CURSOR_FORMAT = f"%0{CURSOR_WIDTH}d"


def format_cursor(seq: int) -> str:
    """The text cursor clients see: the seq zero-padded to 18 digits (sorts as text too)."""
    return _CURSOR_FORMAT % seq


def parse_cursor(text: str | None) -> int:
    """Parse `afterSeq` / `Last-Event-ID`: `0`, an integer, or the padded form. Raises ValueError."""
    if text is None or text == "":
        return 0
    text = text.strip()
    if not (text.isascii() and text.isdigit()) or len(text) > CURSOR_WIDTH:  # "٣" is a digit too
        raise ValueError(f"cursor must be 0 or up to {CURSOR_WIDTH} digits, got {text[:40]!r}")
    return int(text)


@dataclass
class Run:
    host_run_id: str
    request_id: str
    agent_id: str
    provider: str
    session_id: str
    actor_id: str
    workspace_id: str
    status: str = "pending"
    session_mode: str | None = None
    provider_run_id: str | None = None
    target_snapshot_hash: str | None = None
    capability_snapshot_hash: str | None = None
    parent_run_id: str | None = None
    created_at: int = field(default_factory=now_ms)
    updated_at: int = field(default_factory=now_ms)
    # Hash of the request body, to tell a retry (same body) from a conflicting reuse of the key.
    request_hash: str = ""
    # The frozen request: message, context, options.
    request: dict[str, Any] = field(default_factory=dict)
    error: str | None = None

    @property
    def is_terminal(self) -> bool:
        return self.status in TERMINAL_STATUSES

    @property
    def trace_id(self) -> str | None:
        """The run's trace id when a tracing plugin followed it (kept with the stored request)."""
        value = self.request.get("traceId") if isinstance(self.request, dict) else None
        return value if isinstance(value, str) else None

    def to_receipt(self) -> dict[str, Any]:
        return {
            "schema": RUN_SCHEMA,
            "hostRunId": self.host_run_id,
            "requestId": self.request_id,
            "agentId": self.agent_id,
            "provider": self.provider,
            "providerRunId": self.provider_run_id,
            "sessionId": self.session_id,
            "actorId": self.actor_id,
            "workspaceId": self.workspace_id,
            "status": self.status,
            "sessionMode": self.session_mode,
            "targetSnapshotHash": self.target_snapshot_hash,
            "capabilitySnapshotHash": self.capability_snapshot_hash,
            "parentRunId": self.parent_run_id,
            "error": self.error,
            "createdAt": self.created_at,
            "updatedAt": self.updated_at,
            "traceId": self.trace_id,
        }

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class Event:
    """One journal event. Serialised once: the payload JSON, the wire JSON and the SSE frame are
    built on first use and shared by the spool, storage, every SSE client and JSON pages. An event
    read back from storage keeps its stored payload JSON and decodes it only if asked
    (`Event.stored`), so a replay re-sends the stored bytes."""

    __slots__ = ("_frame", "_payload", "_payload_bytes", "_wire", "created_at", "host_run_id", "kind", "seq", "source")

    def __init__(
        self,
        host_run_id: str,
        seq: int,
        kind: str,
        source: str,
        payload: dict[str, Any],
        created_at: int | None = None,
    ) -> None:
        self.host_run_id = host_run_id
        self.seq = seq
        self.kind = kind
        self.source = source
        self._payload: dict[str, Any] | None = payload
        self.created_at = int(_time() * 1000) if created_at is None else created_at  # now_ms(), inline
        self._payload_bytes: bytes | None = None
        self._wire: bytes | None = None
        self._frame: bytes | None = None

    @classmethod
    def stored(
        cls, host_run_id: str, seq: int, kind: str, source: str, payload_json: str | bytes, created_at: int
    ) -> Event:
        """An event as storage holds it: the payload stays JSON until someone reads `payload`."""
        event = cls(host_run_id, seq, kind, source, None, created_at)  # type: ignore[arg-type]
        event._payload_bytes = payload_json.encode() if isinstance(payload_json, str) else payload_json
        return event

    @property
    def payload(self) -> dict[str, Any]:
        payload = self._payload
        if payload is None:
            payload = self._payload = loads(self._payload_bytes) if self._payload_bytes is not None else {}
        return payload

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Event):
            return NotImplemented
        return (self.host_run_id, self.seq, self.kind, self.source, self.created_at, self.payload) == (
            other.host_run_id,
            other.seq,
            other.kind,
            other.source,
            other.created_at,
            other.payload,
        )

    __hash__ = None  # type: ignore[assignment]  # mutable caches; compared by value

    def __repr__(self) -> str:
        return (
            f"Event(host_run_id={self.host_run_id!r}, seq={self.seq!r}, kind={self.kind!r}, "
            f"source={self.source!r}, payload={self.payload!r}, created_at={self.created_at!r})"
        )

    def payload_bytes(self) -> bytes:
        if self._payload_bytes is None:
            self._payload_bytes = kept(dumps(self._payload))
        return self._payload_bytes

    def payload_json(self) -> str:
        return self.payload_bytes().decode()

    def wire_bytes(self) -> bytes:
        """The event's wire JSON (`gateway.run_event.v1`), built around the payload bytes."""
        wire = self._wire
        if wire is None:
            wire = self._wire = _WIRE_FORMAT % (
                _WIRE_HEADS.get(self.host_run_id) or _wire_head(self.host_run_id),
                self.seq,
                _WIRE_KINDS.get((self.kind, self.source)) or _wire_kind(self.kind, self.source),
                self._payload_bytes or self.payload_bytes(),
                self.created_at,
            )
        return wire

    def wire_json(self) -> str:
        return self.wire_bytes().decode()

    def sse_frame(self) -> bytes:
        """The event's SSE frame (`id:`, `event:`, `data:` wire JSON), built once and shared by every
        client that streams it."""
        frame = self._frame
        if frame is None:
            frame = self._frame = sse_frames([self])
        return frame

    @classmethod
    def from_wire(cls, data: dict[str, Any]) -> Event:
        return cls(
            host_run_id=data["hostRunId"],
            seq=int(data["seq"]),
            kind=data["kind"],
            source=data["source"],
            payload=data["payload"],
            created_at=int(data["createdAt"]),
        )

    @property
    def cursor(self) -> str:
        return _CURSOR_FORMAT % self.seq

    @property
    def is_terminal(self) -> bool:
        return self.kind in TERMINAL_KINDS

    def to_wire(self) -> dict[str, Any]:
        return {
            "schema": EVENT_SCHEMA,
            "hostRunId": self.host_run_id,
            "seq": self.cursor,
            "kind": self.kind,
            "source": self.source,
            "payload": self.payload,
            "createdAt": self.created_at,
        }


def events_of_frames(blobs: Iterable[bytes]) -> Iterator[Event]:
    """The events of SSE frames built by :func:`sse_frames` (without a projection): each frame's
    `data:` line is the event's wire JSON."""
    for blob in blobs:
        for line in blob.split(b"\n"):
            if line.startswith(b"data: "):
                yield Event.from_wire(loads(line[6:]))


def sse_frames(events: list[Event], project: Callable[[Event], Any] | None = None) -> bytes:
    """The SSE frames of `events`, joined: the one place a frame is built. Each frame is `id:` (the
    padded seq), `event:` (the kind) and `data:`: the event's wire JSON, or with `project` the JSON
    of `project(event)` (an event it maps to None gets no frame). Without `project` this is the
    publish path, where the joined frames are what clients in step get and what the spool holds: it
    keeps each event's serialised payload (for storage) but no frame per event."""
    parts: list[bytes] = []
    if project is not None:
        for event in events:
            projected = project(event)
            if projected is not None:
                name = event.kind
                parts.append(
                    b"id: %b%b%b\n\n"
                    % (_SEQ_FORMAT % event.seq, _FRAME_KINDS.get(name) or _frame_kind(name), dumps(projected))
                )
        return b"".join(parts)
    append = parts.append
    # One `%` per event into the frame template of its (run, kind, source): consecutive events of
    # a batch share it, so it is looked up again only when one of the three changes.
    run = kind = source = None
    template = b""
    for event in events:
        frame = event._frame
        if frame is not None:
            append(frame)
            continue
        payload = event._payload_bytes
        if payload is None:
            try:
                payload = event._payload_bytes = _join((orjson.dumps(event._payload), b""))  # `kept(dumps())`, inline
            except TypeError:
                payload = event._payload_bytes = kept(dumps(event._payload))
        if event.kind is not kind or event.host_run_id is not run or event.source is not source:
            run, kind, source = event.host_run_id, event.kind, event.source
            template = _FRAME_TEMPLATES.get((run, kind, source)) or _frame_template(run, kind, source)
        seq = event.seq
        append(template % (seq, seq, payload, event.created_at))
    return b"".join(parts)


# The constant parts of wire JSON and SSE frames, per run / kind+source / kind, memoised (bounded).
_WIRE_FORMAT = b'%%b%%0%dd%%b%%b,"createdAt":%%d}' % CURSOR_WIDTH
_SEQ_FORMAT = b"%%0%dd" % CURSOR_WIDTH
_FRAME_TAIL = b',"createdAt":%d}\n\n'
_WIRE_HEADS: dict[str, bytes] = {}
_WIRE_KINDS: dict[tuple[str, str], bytes] = {}
_FRAME_KINDS: dict[str, bytes] = {}
_FRAME_TEMPLATES: dict[tuple[str, str, str], bytes] = {}
_MEMO_LIMIT = 4096


def _memo(cache: dict[Any, bytes], key: Any, value: bytes) -> bytes:
    if len(cache) >= _MEMO_LIMIT:
        cache.clear()
    cache[key] = value
    return value


def _wire_head(host_run_id: str) -> bytes:
    return _memo(
        _WIRE_HEADS, host_run_id, b'{"schema":"%b","hostRunId":%b,"seq":"' % (EVENT_SCHEMA.encode(), dumps(host_run_id))
    )


def _wire_kind(kind: str, source: str) -> bytes:
    return _memo(_WIRE_KINDS, (kind, source), b'","kind":%b,"source":%b,"payload":' % (dumps(kind), dumps(source)))


def _frame_kind(kind: str) -> bytes:
    # A line break in a kind would end the SSE field early: the event line never carries one.
    line = " ".join(kind.splitlines()) if ("\n" in kind or "\r" in kind) else kind
    return _memo(_FRAME_KINDS, kind, b"\nevent: %b\ndata: " % line.encode())


def _frame_template(host_run_id: str, kind: str, source: str) -> bytes:
    """A whole SSE frame with four holes: the seq (twice), the payload JSON and `createdAt`."""
    constant = (
        _FRAME_KINDS.get(kind) or _frame_kind(kind),
        _WIRE_HEADS.get(host_run_id) or _wire_head(host_run_id),
        _WIRE_KINDS.get((kind, source)) or _wire_kind(kind, source),
    )
    escaped = [part.replace(b"%", b"%%") for part in constant]  # a `%` in an id or a kind is text
    template = b"id: %b%b%b%b%b%b" % (_SEQ_FORMAT, escaped[0], escaped[1], _SEQ_FORMAT, escaped[2], b"%b" + _FRAME_TAIL)
    return _memo(_FRAME_TEMPLATES, (host_run_id, kind, source), template)
