"""WAL checkpoints of the SQLite store, off the commit path.

In WAL mode a commit appends pages to the ``-wal`` file; a *checkpoint* copies
them back into the database file, syncing the WAL before and the database after
(that is when ``synchronous=NORMAL`` makes the transactions before it survive a
power loss). SQLite runs one inside the ``COMMIT`` that takes the WAL past
``wal_autocheckpoint`` pages (1000 by default): about one step commit in a
hundred then waits for two disk flushes, which was a third of the store thread's
time one run at a time.

So the store's own connection only checkpoints when the WAL has grown past
``WRITER_PAGES`` (a bound on the file should this thread fall behind or stop), and
a thread of its own, on a connection of its own, runs a ``PASSIVE`` checkpoint
after every ``EVERY`` write transactions and after a second with any. A passive
checkpoint never blocks the writer nor waits for it; what it could not copy yet,
the next one does. Durability is the same as before or better: the WAL is synced
at least as often.
"""

from __future__ import annotations

import logging
import sqlite3
import threading

log = logging.getLogger("tideflow.store.sqlite")

EVERY = 64
"""Write transactions between two checkpoints (a step's commit writes ~10 pages)."""
IDLE = 1.0
"""Seconds after which the transactions so far are checkpointed anyway."""
WRITER_PAGES = 4000
"""``wal_autocheckpoint`` of the store's connection: the WAL pages (4 KiB each) after
which a commit checkpoints itself, as SQLite does by default at 1000."""


class Checkpointer:
    """Checkpoints one database file from a thread of its own."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._writes = 0
        """Write transactions since the last checkpoint (counted by the store's thread,
        reset by this one: a lost increment only delays a checkpoint)."""
        self.checkpoints = 0
        """Checkpoints run so far."""
        self._wake = threading.Event()
        self._stopping = False
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self._run, name="tideflow-sqlite-checkpoint", daemon=True
        )
        self._thread.start()

    def wrote(self) -> None:
        """A write transaction committed (called on the store's thread)."""
        self._writes += 1
        if self._writes >= EVERY:
            self._wake.set()

    def stop(self) -> None:
        """Stop the thread (after the checkpoint it is running, if any)."""
        thread, self._thread = self._thread, None
        if thread is not None:
            self._stopping = True
            self._wake.set()
            thread.join()

    def _run(self) -> None:
        try:
            conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        except sqlite3.Error as exc:
            log.warning("SQLite store %s: no background checkpoints (%s)", self.path, exc)
            return
        try:
            while True:
                self._wake.wait(IDLE)
                self._wake.clear()
                if self._stopping:
                    return
                if self._writes:
                    self._writes = 0
                    conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
                    self.checkpoints += 1
        except sqlite3.Error as exc:  # the store's own connection checkpoints from now on
            log.warning(
                "SQLite store %s: background checkpoints stopped (%s); commits checkpoint "
                "the WAL themselves past %d pages",
                self.path,
                exc,
                WRITER_PAGES,
            )
        finally:
            conn.close()
