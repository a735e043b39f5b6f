"""What only the SQLite store has: the thread that owns its connection, and WAL
checkpoints on a thread of their own instead of inside a commit."""

from __future__ import annotations

import asyncio
import shutil
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tideflow.store.backends import sqlite_checkpoints
from tideflow.store.backends.sqlite import BUSY_TIMEOUT_MS, INLINE_EVENTS, SqliteStore

from .conftest import compile_stored
from .scenarios import Driver, order_plan, order_script


async def until(condition: Callable[[], bool], what: str, within: float = 5.0) -> None:
    deadline = time.monotonic() + within
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {within} s: {what}")
        await asyncio.sleep(0.01)


async def test_commits_are_checkpointed_by_a_thread_of_their_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sqlite_checkpoints, "EVERY", 1)
    path = tmp_path / "runs.db"
    store = SqliteStore(f"sqlite:///{path}", compile_plan=compile_stored)
    await store.open()
    try:
        checkpointer = store._checkpointer
        assert checkpointer is not None
        autocheckpoint = await store._run(
            lambda: store.conn.execute("PRAGMA wal_autocheckpoint").fetchone()[0]
        )
        assert autocheckpoint == sqlite_checkpoints.WRITER_PAGES
        driver = Driver(store, batch_size=2)
        h = await driver.new_run(order_plan(), "kept")
        await driver.play(order_script(h)[:3])
        await driver.play([lambda: h.complete("charge", {"amount": 5})])

        def in_the_file_alone() -> int | None:
            """The run's last_seq as the database file holds it without its WAL."""
            alone = tmp_path / "alone.db"
            shutil.copyfile(path, alone)
            conn = sqlite3.connect(alone)
            try:
                row = conn.execute("SELECT last_seq FROM runs WHERE run_id = 'kept'").fetchone()
            except sqlite3.OperationalError:  # not even the table yet
                return None
            except sqlite3.DatabaseError:  # copied while the checkpoint thread wrote pages
                return None  # into it: torn ("malformed"); the next copy tells (seen in CI)
            finally:
                conn.close()
                alone.unlink()
            return None if row is None else int(row[0])

        await until(
            lambda: in_the_file_alone() == driver.seqs["kept"],
            "the last commit checkpointed into the database file",
        )
        assert checkpointer.checkpoints >= 1
    finally:
        await store.close()


class _BrokenDisk:
    """The checkpoint thread's connection, on a disk that fails every statement."""

    def execute(self, sql: str) -> Any:
        raise sqlite3.OperationalError("disk I/O error")

    def close(self) -> None:
        pass


@pytest.mark.parametrize("fails", ["connect", "checkpoint"])
async def test_a_checkpoint_thread_that_fails_leaves_checkpoints_to_the_commits(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    fails: str,
) -> None:
    """Its connection refused, or its checkpoint failing: a warning, the thread ends, and
    the store's own connection checkpoints once the WAL passes its bound (a few pages here),
    so the WAL does not grow without end and every commit still goes through."""
    connect = sqlite3.connect

    def connecting(*args: Any, **kwargs: Any) -> Any:
        if threading.current_thread().name != "tideflow-sqlite-checkpoint":
            return connect(*args, **kwargs)
        if fails == "connect":
            raise sqlite3.OperationalError("unable to open database file")
        return _BrokenDisk()

    monkeypatch.setattr(sqlite_checkpoints.sqlite3, "connect", connecting)
    monkeypatch.setattr(sqlite_checkpoints, "EVERY", 1)
    monkeypatch.setattr("tideflow.store.backends.sqlite.WRITER_PAGES", 4)
    path = tmp_path / "runs.db"
    store = SqliteStore(f"sqlite:///{path}", compile_plan=compile_stored)
    await store.open()
    try:
        checkpointer = store._checkpointer
        assert checkpointer is not None
        driver = Driver(store)
        runs = [await driver.new_run(order_plan(), f"r{i}") for i in range(3)]
        await driver.play(*(order_script(h) for h in runs))
        await driver.flush()
        message = "no background checkpoints" if fails == "connect" else "checkpoints stopped"
        await until(
            lambda: any(message in r.getMessage() for r in caplog.records),
            "the warning that the thread ended",
        )
        assert checkpointer.checkpoints == 0
        alone = tmp_path / "alone.db"  # the database file without its WAL
        shutil.copyfile(path, alone)
        conn = sqlite3.connect(alone)
        try:
            in_the_file = conn.execute("SELECT count(*) FROM runs").fetchone()[0]
        finally:
            conn.close()
        assert in_the_file == 3  # checkpointed by the commits
        for h in runs:
            assert (await store.get_run(h.run_id)).status == "succeeded"
    finally:
        await store.close()


async def test_close_ends_the_stores_threads(tmp_path: Path) -> None:
    store = SqliteStore(f"sqlite:///{tmp_path}/runs.db", compile_plan=compile_stored)
    await store.open()
    await Driver(store).new_run(order_plan(), "one")
    thread, checkpointer = store._thread, store._checkpointer
    assert thread is not None and thread.is_alive()
    assert checkpointer is not None and checkpointer._thread is not None
    checkpoints = checkpointer._thread
    assert checkpoints.is_alive()
    await store.close()
    assert not thread.is_alive() and not checkpoints.is_alive()
    assert not (tmp_path / "runs.db-wal").exists()  # the last connection folded the WAL in
    assert await store.upgrade() == []  # a closed store opens again by itself
    await store.close()


def commit_threads(store: SqliteStore, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the threads the store's transactions are committed on, in order."""
    seen: list[str] = []
    finish = store._finish

    def recorded(conn: sqlite3.Connection, fn: Callable[[sqlite3.Connection], Any]) -> Any:
        seen.append(threading.current_thread().name)
        return finish(conn, fn)

    monkeypatch.setattr(store, "_finish", recorded)
    return seen


async def test_a_small_commit_on_an_idle_store_is_made_on_the_callers_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = SqliteStore(f"sqlite:///{tmp_path}/runs.db", compile_plan=compile_stored)
    await store.open()
    here = threading.current_thread().name
    try:
        driver = Driver(store, batch_size=100)
        h = await driver.new_run(order_plan(), "here")
        order_script(h)[0]()
        assert INLINE_EVENTS == 1
        threads = commit_threads(store, monkeypatch)
        for applied in driver.pending:
            await store.commit([applied])
        assert threads == [here] * len(driver.pending)
        assert (await store.get_run("here")).status == "running"
        driver.pending = []

        for n in range(INLINE_EVENTS + 1):  # a batch too big for that goes to the thread
            order_script(await driver.new_run(order_plan(), f"big-{n}"))[0]()
        assert len(driver.pending) > INLINE_EVENTS
        del threads[:]
        await store.commit(driver.pending)
        assert threads == ["tideflow-sqlite"]
        statuses = {(await store.get_run(f"big-{n}")).status for n in range(INLINE_EVENTS + 1)}
        assert statuses == {"running"}
    finally:
        await store.close()


async def test_a_commit_while_another_process_writes_waits_on_the_store_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The event loop never waits for another process's write lock: the commit goes to
    the store's thread, which waits for it, and lands once it is released."""
    path = tmp_path / "runs.db"
    store = SqliteStore(f"sqlite:///{path}", compile_plan=compile_stored)
    await store.open()
    other = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    try:
        driver = Driver(store, batch_size=100)
        h = await driver.new_run(order_plan(), "waits")
        order_script(h)[0]()
        threads = commit_threads(store, monkeypatch)
        other.execute("BEGIN IMMEDIATE")  # another process's transaction holds the file
        first, *rest = driver.pending
        commit = asyncio.ensure_future(store.commit([first]))
        ticks = 0
        while ticks < 20:  # the loop goes on while the commit waits
            await asyncio.sleep(0.005)
            ticks += 1
        assert not commit.done()
        other.execute("COMMIT")
        await asyncio.wait_for(commit, 10)
        assert (await store.get_run("waits")).status == "running"
        await store.commit(rest[:1])  # idle again: on this thread once more
        assert threads == ["tideflow-sqlite", threading.current_thread().name]
    finally:
        other.close()
        await store.close()


async def test_inline_commits_issue_no_pragma_and_the_thread_still_waits(
    tmp_path: Path,
) -> None:
    """The connection keeps the busy timeout it was last given: inline commits in a row
    (a new run's, then its events') set it to 0 once, and a call on the store's thread
    gets its full wait back."""
    store = SqliteStore(f"sqlite:///{tmp_path}/runs.db", compile_plan=compile_stored)
    await store.open()
    try:
        statements: list[str] = []
        store.conn.set_trace_callback(statements.append)
        driver = Driver(store, batch_size=100)
        h = await driver.new_run(order_plan(), "quiet")
        for action in order_script(h)[:3]:
            action()
        for applied in driver.pending:
            await store.commit([applied])
        store.conn.set_trace_callback(None)
        pragmas = [s for s in statements if s.startswith("PRAGMA")]
        assert pragmas == ["PRAGMA busy_timeout = 0"]
        assert statements.count("COMMIT") == 1 + len(driver.pending) > 2  # the run, its events
        timeout = await store._run(lambda: store.conn.execute("PRAGMA busy_timeout").fetchone()[0])
        assert timeout == BUSY_TIMEOUT_MS
    finally:
        await store.close()


async def test_a_run_is_created_here_when_idle_and_on_the_thread_when_another_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "runs.db"
    store = SqliteStore(f"sqlite:///{path}", compile_plan=compile_stored)
    await store.open()
    other = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    try:
        threads = commit_threads(store, monkeypatch)
        driver = Driver(store)
        await driver.new_run(order_plan(), "here")
        other.execute("BEGIN IMMEDIATE")
        create = asyncio.ensure_future(driver.new_run(order_plan(), "there"))
        await asyncio.sleep(0.05)
        assert not create.done()  # it waits on the store's thread, the loop goes on
        other.execute("COMMIT")
        await asyncio.wait_for(create, 10)
        assert threads == [threading.current_thread().name, "tideflow-sqlite"]
        assert {(await store.get_run(r)).status for r in ("here", "there")} == {"pending"}
    finally:
        other.close()
        await store.close()
