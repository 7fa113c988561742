"""SQLite WAL checkpoints on their own thread, so that no writer's commit pays for one.

By default SQLite checkpoints inside the commit that takes the write-ahead log past 1,000 pages:
that commit copies the log into the database and syncs it to disk, 40-150 ms on this kind of
machine against 1 ms for a plain commit. Whichever writer draws it waits, with SQLite's one
writer lock held: a journal group commit, or a new run's row on its way to the run's first event.

The storage's connections therefore run with ``wal_autocheckpoint=0``, and a :class:`WalCheckpointer`
thread, woken after write transactions, runs a ``PASSIVE`` checkpoint (it never blocks writers or
readers) at most every ``interval`` seconds while writes go on, and none while the storage is idle.
``journal_size_limit`` truncates the log file once a checkpoint has let it start over.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from pathlib import Path

log = logging.getLogger("agent_gateway.plugins.journal_peewee")

CHECKPOINT_INTERVAL_S = 0.25  # while writes go on; about a megabyte or two of log per checkpoint
WAL_SIZE_LIMIT_BYTES = 32 * 1024 * 1024  # the log file is truncated back to this after a checkpoint


class WalCheckpointer:
    """Checkpoints the write-ahead log of the SQLite database at ``path`` from a daemon thread."""

    def __init__(self, path: Path, *, busy_timeout_s: float, interval: float = CHECKPOINT_INTERVAL_S) -> None:
        self.path = path
        self.interval = interval
        self._busy_timeout_s = busy_timeout_s
        self._wake = threading.Event()  # a write transaction ended
        self._stopping = threading.Event()
        self._done = threading.Condition()
        self._thread: threading.Thread | None = None
        self.checkpoints = 0
        self.failures = 0

    def start(self) -> None:
        if self._thread is None:
            self._stopping.clear()
            self._thread = threading.Thread(target=self._run, name="sqlite-checkpoint", daemon=True)
            self._thread.start()

    def notify(self) -> None:
        """A write transaction ended: the log has grown (cheap; called after every write)."""
        self._wake.set()

    def stop(self, timeout: float = 10.0) -> None:
        self._stopping.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def wait_for(self, checkpoints: int, timeout: float) -> bool:
        """Wait until ``checkpoints`` checkpoints have run (for tests and shutdown); False on timeout."""
        with self._done:
            return self._done.wait_for(lambda: self.checkpoints >= checkpoints, timeout)

    def _run(self) -> None:
        connection: sqlite3.Connection | None = None
        try:
            while not self._stopping.is_set():
                self._wake.wait()
                if self._stopping.is_set():
                    break
                self._wake.clear()
                try:
                    if connection is None:
                        connection = sqlite3.connect(self.path, timeout=self._busy_timeout_s, check_same_thread=False)
                    connection.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
                except sqlite3.Error as exc:
                    self.failures += 1
                    if self.failures & (self.failures - 1) == 0:  # a line at 1, 2, 4, ... failures
                        log.warning("WAL checkpoint of %s failed (%d so far): %s", self.path, self.failures, exc)
                    if connection is not None:
                        connection.close()
                        connection = None
                else:
                    with self._done:
                        self.checkpoints += 1
                        self._done.notify_all()
                # Pacing, not synchronisation: writes that land meanwhile wait for the next pass.
                self._stopping.wait(self.interval)
        finally:
            if connection is not None:
                connection.close()
