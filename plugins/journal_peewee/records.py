"""Session records as this storage last read or wrote them, for `get_session_nowait`.

Every run's start reads its session's record; a worker trip for it costs the run's first event a
few ms while other runs hold the loop. The storage sees every write of the session table made in
this process (`put_session`, `delete_session_history`, retention's `delete_run_history`), so it can
keep what it read or wrote. Only valid when nothing else writes the database: the core asks for it
only when the gateway is not clustered (as it does the preferences cache).

Entries are the stored JSON text (a reader parses its own copy, so no caller sees another's
changes), or None for a session without a record. A generation counter, bumped before and after
every write or delete, keeps a read that spanned one from filling the cache with what it replaced.
"""

from __future__ import annotations

import threading

MAX_ENTRIES = 10_000
MAX_RECORD_CHARS = 32 * 1024  # larger records are not kept (nor parsed on the loop)
MAX_TOTAL_CHARS = 8 * 1024 * 1024

Key = tuple[str, str]


class SessionRecordCache:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: dict[Key, str | None] = {}
        self._chars = 0
        self.generation = 0

    def get(self, key: Key) -> tuple[bool, str | None]:
        """(True, text or None) when known, (False, None) when not."""
        with self._lock:
            if key in self._entries:
                return True, self._entries[key]
        return False, None

    def fill(self, key: Key, text: str | None, generation: int) -> None:
        """Keep what a read that started at ``generation`` found, unless a write came since."""
        with self._lock:
            if self.generation == generation:
                self._set(key, text)

    def changing(self) -> int:
        """A write or delete starts: reads in flight must not fill. Returns the generation after."""
        with self._lock:
            self.generation += 1
            return self.generation

    def changed(self, key: Key | None, text: str | None = None, since: int | None = None) -> None:
        """A write or delete is committed: ``key`` now holds ``text`` (kept if no other change came
        since ``since``, what `changing` returned), or is forgotten; None forgets every key."""
        with self._lock:
            if key is None:
                self._entries.clear()
                self._chars = 0
            elif since is not None and self.generation == since:
                self._set(key, text)
            else:
                self._pop(key)
            self.generation += 1

    def _set(self, key: Key, text: str | None) -> None:
        self._pop(key)
        if text is not None and len(text) > MAX_RECORD_CHARS:
            return
        size = len(text) if text is not None else 0
        while self._entries and (len(self._entries) >= MAX_ENTRIES or self._chars + size > MAX_TOTAL_CHARS):
            self._pop(next(iter(self._entries)))  # the oldest first
        self._entries[key] = text
        self._chars += size

    def _pop(self, key: Key) -> None:
        text = self._entries.pop(key, None)
        if text is not None:
            self._chars -= len(text)
