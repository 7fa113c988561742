"""Fair shares of a runtime's agent processes between actors.

A runtime that keeps one agent process per live binding (ACP agents, Pi) may run at most
`max_processes` of them, and one actor at most `max_processes_per_actor`, so one actor's slow
turns never take the processes another actor needs. A binding that needs a process gets one when
the runtime is under both limits; otherwise an idle binding (no turn running on it, never a busy
one) is closed to make room, chosen by this rule:

1. an actor at its own limit may close only one of its own idle bindings;
2. otherwise (the runtime is full) its own least recently used idle binding goes first, then the
   least recently used idle binding of an actor above its fair share: `max_processes` divided by
   the number of actors holding processes (the asking one counted), at least 1. An actor at or
   under its fair share never loses an idle binding to another actor.

When nothing may be closed, the request waits (first come, first served: a later request goes
first only when the earlier ones cannot be served with what is free) until a turn ends or a
binding closes, for at most `wait_seconds`; then it fails with :class:`CapacityTimeout`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter, deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from typing import Any, NamedTuple

# A waiter looks again this often even when nothing woke it: a process that exits between turns
# (no turn, no close) frees its slot without telling anyone.
RECHECK_SECONDS = 1.0


class ProcessUse(NamedTuple):
    """One live agent process as the capacity rule sees it."""

    actor_id: str
    busy: bool  # a turn runs on it (never closed to make room)
    last_used: float  # time.monotonic() of its last turn's end
    binding: Any  # what the runtime closes to free it


class CapacityTimeout(RuntimeError):
    """No agent process became free within the wait (the run fails with this message)."""


class _Waiter:
    __slots__ = ("actor_id",)

    def __init__(self, actor_id: str) -> None:
        self.actor_id = actor_id


class ProcessCapacity:
    """The process limits of one runtime, and the requests waiting for a process.

    ``max_per_actor`` 0: no per-actor limit (an actor may hold all ``max_processes``). ``what``
    names the runtime and its config section in messages (``"reasonix ([reasonix])"``)."""

    def __init__(self, what: str, max_processes: int, max_per_actor: int, wait_seconds: float) -> None:
        self.what = what
        self.max_processes = max(1, max_processes)
        self.max_per_actor = min(max_per_actor, self.max_processes) if max_per_actor > 0 else self.max_processes
        self.wait_seconds = wait_seconds
        self._waiters: deque[_Waiter] = deque()
        self._changed = asyncio.Event()
        self._reserved: Counter[str] = Counter()  # processes being started (not yet live bindings)

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    def changed(self) -> None:
        """A turn ended or a binding closed: waiting requests look again."""
        self._changed.set()
        self._changed = asyncio.Event()

    def decide(self, actor_id: str, uses: Iterable[ProcessUse]) -> tuple[bool, ProcessUse | None]:
        """(room now, the binding to close first): (True, None) a process may start at once;
        (False, use) close ``use`` and ask again; (False, None) wait."""
        uses = list(uses)
        held: Counter[str] = Counter(use.actor_id for use in uses)
        held.update(self._reserved)
        own = held[actor_id]
        own_idle = sorted((u for u in uses if u.actor_id == actor_id and not u.busy), key=lambda u: u.last_used)
        if own >= self.max_per_actor:
            return False, own_idle[0] if own_idle else None
        if sum(held.values()) < self.max_processes:
            return True, None
        if own_idle:
            return False, own_idle[0]
        actors = {a for a, n in held.items() if n > 0} | {actor_id}
        share = max(1, self.max_processes // len(actors))
        others = [u for u in uses if not u.busy and u.actor_id != actor_id and held[u.actor_id] > share]
        return False, min(others, key=lambda u: u.last_used) if others else None

    def _earlier_servable(self, waiter: _Waiter | None, uses: list[ProcessUse]) -> bool:
        """Whether a request that waits before ``waiter`` (None: a new request) could go now."""
        for other in self._waiters:
            if other is waiter:
                return False
            room, evict = self.decide(other.actor_id, uses)
            if room or evict is not None:
                return True
        return False

    async def make_room(
        self,
        actor_id: str,
        live: Callable[[], list[ProcessUse]],
        close: Callable[[Any, str], Awaitable[None]],
        *,
        lock: asyncio.Lock | None = None,
        on_wait: Callable[[str], Awaitable[None]] | None = None,
    ) -> None:
        """Return once ``actor_id`` may start one more process (closing idle bindings by the rule),
        or raise :class:`CapacityTimeout` after ``wait_seconds``. ``live``: the runtime's live
        processes now; ``close(binding, why)`` closes one. ``lock``: held by the caller, and let
        go while waiting (other bindings, other actors' among them, start meanwhile).
        ``on_wait(message)``: called once, when the request starts to wait."""
        loop = asyncio.get_running_loop()
        waiter: _Waiter | None = None
        deadline = 0.0
        claimed = False  # this request closed a binding: the room it made is its own
        try:
            while True:
                uses = live()
                room, evict = self.decide(actor_id, uses)
                if (room or evict is not None) and (claimed or not self._earlier_servable(waiter, uses)):
                    if room:
                        return
                    assert evict is not None
                    self._reserved[actor_id] += 1  # nobody else takes the slot while it is freed
                    try:
                        await close(evict.binding, self._why(actor_id, evict))
                    finally:
                        self._unreserve(actor_id)
                    claimed = True
                    continue
                changed = self._changed
                if waiter is None:
                    waiter = _Waiter(actor_id)
                    self._waiters.append(waiter)
                    deadline = loop.time() + self.wait_seconds
                    if on_wait is not None:
                        await on_wait(self._busy_message(actor_id, uses))
                        continue  # the state may have changed meanwhile
                remaining = deadline - loop.time()
                if remaining <= 0:
                    raise CapacityTimeout(
                        f"{self._busy_message(actor_id, live())}; no process became free within "
                        f"{self.wait_seconds:g} s (process_wait_seconds)"
                    )
                if lock is not None:
                    lock.release()
                try:
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(min(remaining, RECHECK_SECONDS)):
                            await changed.wait()
                finally:
                    if lock is not None:
                        await lock.acquire()
        finally:
            if waiter is not None:
                self._waiters.remove(waiter)
                self.changed()  # the next waiter may be first now

    @contextlib.asynccontextmanager
    async def reserve(
        self,
        actor_id: str,
        live: Callable[[], list[ProcessUse]],
        close: Callable[[Any, str], Awaitable[None]],
        *,
        on_wait: Callable[[str], Awaitable[None]] | None = None,
    ) -> AsyncIterator[None]:
        """`make_room`, then count a process for ``actor_id`` until the block ends (for a runtime
        that starts processes without a lock: the one starting counts before it is a binding)."""
        await self.make_room(actor_id, live, close, on_wait=on_wait)
        self._reserved[actor_id] += 1
        try:
            yield
        finally:
            self._unreserve(actor_id)
            self.changed()

    def _unreserve(self, actor_id: str) -> None:
        self._reserved[actor_id] -= 1
        if self._reserved[actor_id] <= 0:
            del self._reserved[actor_id]

    def _busy_message(self, actor_id: str, uses: list[ProcessUse]) -> str:
        own = sum(1 for u in uses if u.actor_id == actor_id) + self._reserved[actor_id]
        if own >= self.max_per_actor:
            return (
                f"{self.what}: this actor's {own} agent processes are all busy "
                f"(max_processes_per_actor = {self.max_per_actor})"
            )
        return (
            f"{self.what}: all {self.max_processes} agent processes are busy or held by actors within "
            "their fair share (max_processes)"
        )

    def _why(self, actor_id: str, evict: ProcessUse) -> str:
        idle = time.monotonic() - evict.last_used
        if evict.actor_id == actor_id:
            return f"evicted (idle {idle:.0f} s) to make room for another binding of its actor"
        return f"evicted (idle {idle:.0f} s) to make room: its actor holds more than its fair share (max_processes)"
