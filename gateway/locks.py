"""Per-key asyncio locks that exist only while someone holds or waits for them (internal)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable
from contextlib import asynccontextmanager
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


class _Entry:
    __slots__ = ("lock", "users")

    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.users = 0  # the holder and every waiter, counted from the moment they ask


class KeyedLocks(Generic[K]):
    """Mutual exclusion per key: `async with locks.hold(key):`. Waiters for one key get the lock in
    the order they asked; different keys never wait for each other. A key's entry is removed when
    its last holder or waiter leaves (normally, by an exception or cancelled while waiting), so the
    table stays as small as the keys in use."""

    def __init__(self) -> None:
        self._entries: dict[K, _Entry] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def locked(self, key: K) -> bool:
        """Whether someone holds `key` now."""
        entry = self._entries.get(key)
        return entry is not None and entry.lock.locked()

    @asynccontextmanager
    async def hold(self, key: K, *, if_busy: Callable[[], Awaitable[None]] | None = None) -> AsyncIterator[None]:
        """Hold `key` for the block. `if_busy`, when given, is awaited first if another task holds
        the key (e.g. to report that this one is queued); this task keeps its place meanwhile: the
        key's entry cannot be removed and replaced under it."""
        entry = self._entries.get(key)
        if entry is None:
            entry = self._entries[key] = _Entry()
        entry.users += 1
        try:
            if if_busy is not None and entry.lock.locked():
                await if_busy()
            async with entry.lock:
                yield
        finally:
            entry.users -= 1
            if not entry.users:
                del self._entries[key]
