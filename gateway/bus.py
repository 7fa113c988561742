"""Per-client delivery buffers. Fan-out never waits on storage, and memory stays bounded.

A subscriber's buffer holds at most `capacity` events. When it is full, a `message.delta` or
`thought.delta` is merged into the buffered delta before it (same text in the end); any other
event moves the subscriber to *replay*: its buffer is dropped and its writer re-reads from the
journal after the last seq it delivered (a subscriber made with `merge_deltas=False` always
replays, never merges). A terminal event is always buffered (at most one per run).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from agent_gateway.models import MERGEABLE_KINDS, Event

log = logging.getLogger("agent_gateway.bus")


def _can_merge(last: Event, event: Event) -> bool:
    if last.kind != event.kind or event.kind not in MERGEABLE_KINDS or last.source != event.source:
        return False
    other_keys = set(last.payload) | set(event.payload)
    other_keys -= {"text", "mergedFrom", "mergedCount"}
    return all(last.payload.get(k) == event.payload.get(k) for k in other_keys)


class _Merging:
    """The deltas merged into a full buffer's last slot since it was last taken: their texts,
    joined once when the slot is taken. Merging by concatenation copied the text so far on every
    delta, quadratic in how far a client lags (6.5% of the loop's time in a 100,000-delta run)."""

    __slots__ = ("count", "first", "parts", "slot")

    def __init__(self, first: Event) -> None:
        self.first = first  # the delta the others merge into (its own text, mergedFrom, mergedCount)
        self.parts = [str(first.payload.get("text", ""))]
        self.count = int(first.payload.get("mergedCount", 1))
        self.slot = first  # what the buffer's last slot holds: the newest merged delta, as is

    def add(self, event: Event) -> None:
        self.parts.append(str(event.payload.get("text", "")))
        self.count += 1
        self.slot = event

    def event(self) -> Event:
        first, last = self.first, self.slot
        payload = dict(first.payload)
        payload["text"] = "".join(self.parts)
        payload["mergedFrom"] = first.payload.get("mergedFrom", first.seq)
        payload["mergedCount"] = self.count
        return Event(last.host_run_id, last.seq, last.kind, last.source, payload, last.created_at)


class Wakeup:
    """A flag one task waits on, as `asyncio.Event` but for one waiter and with its future made
    only while that task waits: an idle stream holds a few slots and one future, not an Event
    with its deque and a coroutine frame."""

    __slots__ = ("_flag", "_waiter")

    def __init__(self) -> None:
        self._flag = False
        self._waiter: asyncio.Future[None] | None = None

    def is_set(self) -> bool:
        return self._flag

    def set(self) -> None:
        if not self._flag:
            self._flag = True
            waiter = self._waiter
            if waiter is not None:
                self._waiter = None
                if not waiter.done():  # (cancelled if the waiting task was)
                    waiter.set_result(None)

    def clear(self) -> None:
        self._flag = False

    def wait(self) -> asyncio.Future[None]:
        """A future done once the flag is set (at once if it is). A plain future, not a
        coroutine: awaiting it holds no frame."""
        waiter = asyncio.get_running_loop().create_future()
        if self._flag:
            waiter.set_result(None)
        else:
            self._waiter = waiter
        return waiter


class Subscriber:
    # Slots: one subscriber per open stream, so per-instance dicts add up (10,000 idle clients).
    __slots__ = (
        "_merging",
        "buffer",
        "capacity",
        "merge_deltas",
        "merges",
        "needs_replay",
        "topic",
        "wakeup",
        "write_directly",
    )

    def __init__(self, topic: str, capacity: int, merge_deltas: bool = True) -> None:
        self.topic = topic
        self.capacity = capacity
        # False: a full buffer always moves to replay (a client that numbers every event densely)
        self.merge_deltas = merge_deltas
        # A list, not a deque: an empty deque already holds a 64-slot block; `take` pops from the
        # front in one slice deletion per batch instead.
        self.buffer: list[Event] = []
        self.wakeup = Wakeup()
        self.needs_replay = False
        self.merges = 0
        self._merging: _Merging | None = None  # the deltas merged into the buffer's last slot
        # Set by an idle stream writer: writes a published batch itself, or returns False.
        self.write_directly: Callable[[list[Event], bytes | None], bool] | None = None

    def offer(self, event: Event) -> None:
        if self.needs_replay:
            return  # the writer will find it in the journal
        buffer = self.buffer
        if len(buffer) < self.capacity or event.is_terminal:
            self._settle()
            buffer.append(event)
        elif self.merge_deltas and buffer and _can_merge(buffer[-1], event):
            merging = self._merging
            if merging is None or merging.slot is not buffer[-1]:
                merging = self._merging = _Merging(buffer[-1])
            merging.add(event)
            buffer[-1] = event  # its seq stands for the slot until `_settle` joins the texts
            self.merges += 1
        else:
            self.clear()
            self.needs_replay = True
        self.wakeup.set()

    def _settle(self) -> None:
        """Put the merged delta in the buffer's last slot (its texts joined once)."""
        merging, buffer = self._merging, self.buffer
        if merging is not None:
            self._merging = None
            if buffer and buffer[-1] is merging.slot:
                buffer[-1] = merging.event()

    def clear(self) -> None:
        """Drop everything buffered (the writer replays from the journal instead)."""
        self.buffer.clear()
        self._merging = None

    def take(self, limit: int) -> list[Event]:
        self._settle()
        buffer = self.buffer
        if len(buffer) <= limit:
            items = list(buffer)
            buffer.clear()
            self.wakeup.clear()
            return items
        items = buffer[:limit]
        del buffer[:limit]
        return items


class Bus:
    def __init__(self) -> None:
        self._subscribers: dict[str, set[Subscriber]] = {}
        # Per topic, the last batch of SSE frames published or encoded by a stream writer (first
        # event, last event, count, bytes): clients in step write the same events, encoded once.
        self.shared_frames: dict[str, tuple[Event, Event, int, bytes]] = {}

    def subscribe(self, topic: str, capacity: int, merge_deltas: bool = True) -> Subscriber:
        sub = Subscriber(topic, capacity, merge_deltas)
        self._subscribers.setdefault(topic, set()).add(sub)
        return sub

    def unsubscribe(self, sub: Subscriber) -> None:
        subs = self._subscribers.get(sub.topic)
        if subs is not None:
            subs.discard(sub)
            if not subs:
                del self._subscribers[sub.topic]
                self.shared_frames.pop(sub.topic, None)

    def publish_many(self, topic: str, events: list[Event], frames: bytes | None = None) -> None:
        """Offer `events` (consecutive events of `topic`, in order) to every subscriber; `frames`,
        their SSE frames joined, is what a client that takes exactly these events writes."""
        subs = self._subscribers.get(topic)
        if not subs:
            return
        count = len(events)
        if frames is not None:
            self.shared_frames[topic] = (events[0], events[-1], count, frames)
        for sub in subs:
            buffer = sub.buffer
            write_directly = sub.write_directly
            if write_directly is not None and not buffer and not sub.needs_replay:
                try:
                    if write_directly(events, frames):
                        continue
                except Exception:  # a broken stream must not break the run that publishes
                    log.exception("direct write to a %s subscriber failed; buffering instead", topic)
                    sub.write_directly = None
            if not sub.needs_replay and len(buffer) + count <= sub.capacity:
                buffer.extend(events)  # `offer`'s common case, for the whole batch
                wakeup = sub.wakeup
                if not wakeup.is_set():
                    wakeup.set()
            else:
                for event in events:
                    sub.offer(event)

    def resync(self, topics: Callable[[str], bool]) -> int:
        """Send every subscriber of a topic for which ``topics(topic)`` is true back to replay from
        the journal (their live feed may have lost events, e.g. a relay reconnected); returns how
        many subscribers that was."""
        count = 0
        for topic, subs in self._subscribers.items():
            if topics(topic):
                for sub in subs:
                    sub.clear()
                    sub.needs_replay = True
                    sub.wakeup.set()
                    count += 1
        return count

    def topics(self) -> list[str]:
        return list(self._subscribers)

    def subscriber_count(self, topic: str) -> int:
        return len(self._subscribers.get(topic, ()))

    def live_merges(self) -> int:
        """Merges of subscribers still connected (closed ones are counted by their stream)."""
        return sum(sub.merges for subs in self._subscribers.values() for sub in subs)

    def buffered(self) -> int:
        return sum(len(sub.buffer) for subs in self._subscribers.values() for sub in subs)
