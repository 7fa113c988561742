"""Signed cluster messages: the envelope around everything the coordinator publishes on Redis.

Anyone who can ``PUBLISH`` on the cluster's Redis could otherwise create runs as any actor,
cancel them, answer their permission requests, or push events into other actors' streams. So
every message carries an HMAC-SHA256 under the ``[cluster] secret`` every instance shares, and a
receiver drops whatever is unsigned, altered, stale or already seen.

Wire format (bytes), one header line then the body exactly as the sender wrote it::

    AGW1 <ts> <id> <mac>\\n<body>

- ``ts``: the sender's wall clock in milliseconds since the epoch (ASCII digits);
- ``id``: 32 lowercase hex digits, random per message (the replay key);
- ``mac``: 64 lowercase hex digits, HMAC-SHA256 under the secret of
  ``b"agent-gateway cluster v1\\0" + channel + b"\\0" + ts + b"\\0" + id + b"\\0" + body``.

Every field is inside the MAC, the version included (the domain tag), and so is the channel the
message is published on: a message signed for one instance's RPC channel is refused on
another's. There is no key id: a receiver tries each accepted secret (the current one and those
of ``previous_secrets`` during a rotation).
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import time
from collections.abc import Callable, Sequence

MAGIC = b"AGW1 "
DOMAIN = b"agent-gateway cluster v1\x00"
HEADER = re.compile(rb"AGW1 ([0-9]{1,15}) ([0-9a-f]{32}) ([0-9a-f]{64})\n")
REASONS = ("unsigned", "bad_signature", "stale", "replayed")
# Message ids remembered for replay detection. Only authentic messages are remembered, so only
# the cluster's own traffic fills it; past this many, the oldest are forgotten and anything as
# old as them is refused as stale (the effective window shrinks instead of replays passing).
SEEN_CAPACITY = 200_000


class Rejected(Exception):
    """A message that is not an authentic, fresh, first-seen cluster message."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(detail or reason)
        self.reason = reason


def _mac(key: bytes, channel: bytes, ts: bytes, message_id: bytes, body: bytes) -> bytes:
    signer = hmac.new(key, DOMAIN, hashlib.sha256)
    signer.update(channel + b"\x00" + ts + b"\x00" + message_id + b"\x00")
    signer.update(body)
    return signer.hexdigest().encode()


def seal(key: bytes, channel: bytes, body: bytes, *, ts_ms: int | None = None, message_id: str | None = None) -> bytes:
    """``body`` signed for ``channel`` under ``key``."""
    ts = str(int(time.time() * 1000) if ts_ms is None else ts_ms).encode()
    mid = (message_id or secrets.token_hex(16)).encode()
    return MAGIC + ts + b" " + mid + b" " + _mac(key, channel, ts, mid, body) + b"\n" + body


class Verifier:
    """Opens sealed messages: checks the MAC against each accepted key, the age, and that the
    message id was not seen within the window."""

    def __init__(
        self,
        keys: Sequence[bytes],
        max_age_seconds: float,
        *,
        capacity: int = SEEN_CAPACITY,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if not keys:
            raise ValueError("at least one key")
        self.keys = list(keys)
        self.window_ms = int(max_age_seconds * 1000)
        self.capacity = capacity
        self.clock = clock
        self._seen: dict[bytes, int] = {}  # message id -> its ts, in the order they arrived
        self._floor_ms = -1  # anything this old or older is refused (ids forgotten for capacity)

    def open(self, channel: bytes, data: bytes) -> bytes:
        """The body of an authentic, fresh, first-seen message on ``channel``; else raises
        :class:`Rejected` with a reason from :data:`REASONS`."""
        match = HEADER.match(data) if data.startswith(MAGIC) else None
        if match is None:
            raise Rejected("unsigned")
        ts, message_id, mac = match.groups()
        body = data[match.end() :]
        # Every key is tried (no early exit on which one matched): a rotation accepts two.
        valid = False
        for key in self.keys:
            valid |= hmac.compare_digest(_mac(key, channel, ts, message_id, body), mac)
        if not valid:
            raise Rejected("bad_signature")
        now_ms = int(self.clock() * 1000)
        sent_ms = int(ts)
        if sent_ms < now_ms - self.window_ms or sent_ms > now_ms + self.window_ms or sent_ms <= self._floor_ms:
            raise Rejected("stale", f"sent {(now_ms - sent_ms) / 1000:+.1f} s ago")
        if message_id in self._seen:
            raise Rejected("replayed")
        self._forget(now_ms)  # room for this id (after the lookup: never forget the id asked about)
        self._seen[message_id] = sent_ms
        return body

    def _forget(self, now_ms: int) -> None:
        """Drop ids whose messages are refused as stale anyway (and the oldest past capacity)."""
        seen = self._seen
        # Bounded: each turn removes one entry.
        while seen:
            message_id, sent_ms = next(iter(seen.items()))
            if sent_ms + self.window_ms < now_ms:
                del seen[message_id]
            elif len(seen) >= self.capacity:
                del seen[message_id]
                self._floor_ms = max(self._floor_ms, sent_ms)
            else:
                return

    @property
    def remembered(self) -> int:
        return len(self._seen)
