"""The SQLite store: the embedded default, a single file in WAL mode.

The stdlib driver is synchronous, so every operation runs on one dedicated
thread that owns the connection; a whole commit (history rows, run updates,
snapshots, outbox) is one call onto that thread and one transaction. The thread
takes calls from a queue and hands each result back with one
``call_soon_threadsafe`` (a thread-pool executor's futures cost about twice that
per call, and a step commits once). WAL checkpoints run on a thread of their own
(``sqlite_checkpoints.py``), not inside a commit.

A commit of one event (``INLINE_EVENTS``) made while the store's thread has
nothing to do runs on the caller's thread instead: the two thread hops cost more than
such a commit (about 170 µs of hops against 150 µs of work, measured on a 10-step
chain run one at a time), and a lone run's latency is the sum of its commits. It never
waits for the file's write lock there (``busy_timeout`` 0): when another process holds
it, the commit goes to the store's thread, which waits as usual (``BUSY_TIMEOUT_MS``).
The connection keeps the timeout it was last given and each side sets its own only
when it differs, so a run of inline commits issues no PRAGMA (a pair of them around
every inline commit was a tenth of its cost). Larger batches stay on the thread, where
SQLite works while the event loop goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import math
import os
import queue
import sqlite3
import threading
import time
import weakref
from collections.abc import Callable, Collection, Sequence
from pathlib import Path
from typing import Any, TypeVar

from tideflow.errors import NotFound, RunExists
from tideflow.model.events import Event
from tideflow.model.plan import Plan
from tideflow.model.run import RunState
from tideflow.model.schedules import ScheduleRow
from tideflow.model.tokens import ApiToken
from tideflow.store import sqlbase as sb
from tideflow.store.backends.sqlite_checkpoints import WRITER_PAGES, Checkpointer
from tideflow.store.backends.sqlite_gateway import GatewayRecords
from tideflow.store.base import (
    ENGINE_LEASE,
    AppliedEvent,
    Archive,
    ConcurrencyConflict,
    Created,
    DefinitionSummary,
    DueTimer,
    HistoryEntry,
    Lease,
    NewRun,
    OutboxItem,
    PendingRun,
    RunFilter,
    RunPage,
    RunSummary,
    Store,
    StoredRun,
    StoreError,
    StoreUnavailable,
    TaskLease,
    UnstorableData,
)
from tideflow.store.indexrows import IndexRows, index_rows, state_rows
from tideflow.store.sealing import Sealer, warn_if_exposed
from tideflow.store.sqlfiles import latest_version, migrations, queries, statements

T = TypeVar("T")

INLINE_EVENTS = 1
"""The most events a commit may hold to run on the caller's thread (see the docstring)."""
BUSY_TIMEOUT_MS = 10_000
"""How long a call on the store's thread waits for another process's write lock."""
Q = queries("sqlite")
DIALECT = "sqlite"


def sqlite_path(url: str) -> str:
    """``sqlite:///relative.db``, ``sqlite:////abs/path.db``, ``sqlite:///:memory:``."""
    if not url.startswith("sqlite://"):
        raise StoreError(f"not a SQLite URL: {url!r} (expected sqlite:///path/to/file.db)")
    path = url[len("sqlite://") :]
    if path.startswith("/"):
        path = path[1:]
    if not path:
        raise StoreError(f"SQLite URL {url!r} names no file (expected sqlite:///path/to/file.db)")
    return path


class SqliteStore(GatewayRecords, Store):
    def __init__(
        self,
        url: str,
        *,
        auto_upgrade: bool = True,
        compile_plan: sb.PlanCompiler | None = None,
    ) -> None:
        self.url = url
        self.path = sqlite_path(url)
        self.auto_upgrade = auto_upgrade
        self.compile_plan = compile_plan
        self._conn: sqlite3.Connection | None = None
        self._calls: queue.SimpleQueue[_Call | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._queued = 0
        """Calls handed to the store's thread and not yet answered (counted on the loop)."""
        self._lock = threading.Lock()
        """The connection, used by one thread at a time (the store's, or a caller's for a
        small commit: see the module docstring)."""
        self._busy_timeout = BUSY_TIMEOUT_MS
        """The connection's ``busy_timeout`` now (read and set under ``_lock``)."""
        self._checkpointer: Checkpointer | None = None
        weakref.finalize(self, self._calls.put, None)  # stops the thread of a store never closed
        self._plans: dict[str, Plan] = {}
        self._definitions: dict[tuple[str, str], str] = {}
        """(name, version) -> plan hash of definitions known to be stored: they never change,
        so registering one again (every ``start_run`` with a Plan does) costs no transaction."""
        in_memory = self.path == ":memory:"
        self.sealer = Sealer(
            where=f"the SQLite file {self.path}",
            key_file=None if in_memory else Path(self.path + ".key"),
            ephemeral=in_memory,
        )
        """Seals the fields a run's plan declares sensitive (``tideflow.store.sealing``)."""

    # -- plumbing ---------------------------------------------------------------

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        """Call ``fn(*args)`` on the store's thread; driver errors become ours."""
        if self._thread is None:
            self._thread = threading.Thread(
                target=_serve,
                args=(self._calls, self._lock),
                name="tideflow-sqlite",
                daemon=True,
            )
            self._thread.start()
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        self._calls.put((loop, future, self._waiting, (fn, args)))
        self._queued += 1
        try:
            return await future
        except sqlite3.DatabaseError as exc:
            raise self._translate(exc) from None
        finally:
            self._queued -= 1

    def _waiting(self, fn: Callable[..., T], args: tuple[Any, ...]) -> T:
        """``fn(*args)`` on the store's thread, which waits for another process's write
        lock up to ``BUSY_TIMEOUT_MS``."""
        if self._busy_timeout != BUSY_TIMEOUT_MS and self._conn is not None:
            self._set_busy_timeout(self._conn, BUSY_TIMEOUT_MS)
        return fn(*args)

    def _set_busy_timeout(self, conn: sqlite3.Connection, ms: int) -> None:
        conn.execute(f"PRAGMA busy_timeout = {ms}")
        self._busy_timeout = ms

    async def _commit(self, write: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``write`` in one transaction: here when the store's thread is idle and no
        other process holds the write lock (see the module docstring), else on the thread."""
        done = self._commit_here(write)
        if done is _NOT_HERE:
            return await self._run(self._transaction, write)
        return done

    def _commit_here(self, write: Callable[[sqlite3.Connection], T]) -> T | _NotHere:
        if self._queued or self._conn is None or not self._lock.acquire(blocking=False):
            return _NOT_HERE
        conn = self._conn
        try:
            if self._busy_timeout:
                self._set_busy_timeout(conn, 0)
            try:
                # The transaction itself never waits either: in WAL mode its statements
                # and COMMIT need no lock beyond the write lock taken here, and the
                # automatic checkpoint after it is passive (it never calls the busy handler).
                conn.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError:  # another process writes: the thread waits
                return _NOT_HERE
            return self._finish(conn, write)
        except sqlite3.DatabaseError as exc:
            raise self._translate(exc) from None
        finally:
            self._lock.release()

    def _translate(self, exc: sqlite3.DatabaseError) -> StoreError:
        text = str(exc)
        if "malformed" in text or "not a database" in text:
            return StoreUnavailable(
                f"the SQLite file {self.path} is damaged ({text}); restore it from a backup "
                "or point --store at another file"
            )
        if isinstance(exc, sqlite3.DataError):  # e.g. "string or blob too big"
            return UnstorableData(f"SQLite store {self.path}: {text}")
        if isinstance(exc, sqlite3.OperationalError):  # locked, disk full, I/O error, ...
            return StoreUnavailable(f"SQLite store {self.path}: {text}")
        return StoreError(f"SQLite store {self.path}: {text}")

    @property
    def conn(self) -> sqlite3.Connection:
        if self._conn is None:
            raise StoreError("the store is not open: call `await store.open()` first")
        return self._conn

    async def open(self) -> None:
        await self._run(self._open)

    def _open(self) -> None:
        self.sealer.keyring()  # a malformed key variable stops the store here, not a commit
        self._connect()
        try:
            self._check_schema()
        except BaseException:
            self.conn.close()
            self._conn = None
            raise
        self._start_checkpoints()

    def _start_checkpoints(self) -> None:
        if self._checkpointer is None and self.path != ":memory:":
            self.conn.execute(f"PRAGMA wal_autocheckpoint = {WRITER_PAGES}")
            self._checkpointer = Checkpointer(self.path)
            self._checkpointer.start()

    def _connect(self) -> None:
        existed = self.path != ":memory:" and not _private_file(Path(self.path))
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        try:
            self._set_busy_timeout(conn, BUSY_TIMEOUT_MS)
            if self.path != ":memory:":
                _enable_wal(conn)
            conn.execute("PRAGMA synchronous = NORMAL")
        except BaseException:
            conn.close()
            raise
        self._conn = conn
        if existed:  # after the checks: a file that is no database gets its error alone
            warn_if_exposed(Path(self.path), "database file")

    def _check_schema(self) -> None:
        current = self._version()
        newest = latest_version(DIALECT)
        if current > newest:
            raise StoreError(
                f"the SQLite file {self.path} was written by a newer tideflow (schema {current}, "
                f"this version knows up to {newest}); upgrade tideflow to use it"
            )
        if current < newest:
            if current and not self.auto_upgrade:
                raise StoreError(
                    f"the SQLite file {self.path} is at schema {current}, this tideflow needs "
                    f"{newest}: run `tideflow db upgrade --store {self.url}`"
                )
            self._upgrade()

    def _version(self) -> int:
        row = self.conn.execute(
            "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'schema_version'"
        ).fetchone()
        if not row[0]:
            return 0
        value = self.conn.execute(Q["schema_version"]).fetchone()[0]
        return int(value or 0)

    def _upgrade(self) -> list[int]:
        conn = self.conn
        applied = []
        conn.execute("BEGIN IMMEDIATE")
        try:
            conn.execute(
                "CREATE TABLE IF NOT EXISTS schema_version (version INTEGER PRIMARY KEY, applied_at REAL NOT NULL)"
            )
            current = self._version()
            for migration in migrations(DIALECT):
                if migration.version > current:
                    for statement in statements(migration.sql):
                        conn.execute(statement)
                    conn.execute(
                        "INSERT INTO schema_version (version, applied_at) VALUES (?, ?)",
                        (migration.version, time.time()),
                    )
                    applied.append(migration.version)
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        return applied

    async def schema_version(self) -> int:
        return await self._run(self._version)

    async def upgrade(self) -> list[int]:
        """Apply missing migrations (opening the file first if needed); the versions applied.
        A schema newer than this code is refused."""
        return await self._run(self._open_and_upgrade)

    def _open_and_upgrade(self) -> list[int]:
        if self._conn is None:
            self._connect()
        current = self._version()
        if current > latest_version(DIALECT):
            self._check_schema()
        applied = self._upgrade()
        self._start_checkpoints()
        return applied

    async def close(self) -> None:
        if self._conn is not None:
            await self._run(self._close)
        thread, self._thread = self._thread, None
        if thread is not None:
            self._calls.put(None)
            thread.join()  # it has nothing left to do: the close above was its last call

    def _close(self) -> None:
        checkpointer, self._checkpointer = self._checkpointer, None
        if checkpointer is not None:
            checkpointer.stop()
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()  # the last connection to the file checkpoints and removes the WAL

    def _transaction(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        conn = self.conn
        conn.execute("BEGIN IMMEDIATE")
        return self._finish(conn, fn)

    def _finish(self, conn: sqlite3.Connection, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``fn`` in the transaction just begun, and commit (roll back if it raises)."""
        try:
            result = fn(conn)
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")
        if self._checkpointer is not None:
            self._checkpointer.wrote()
        return result

    # -- definitions ------------------------------------------------------------

    async def save_definition(self, plan: Plan) -> bool:
        self.sealer.learn(plan)
        key = (plan.name, plan.version)
        known = self._definitions.get(key)
        if known is None:
            created: bool = await self._run(self._transaction, lambda c: _save_definition(c, plan))
            self._definitions[key] = plan.hash
            # the plan in hand is the one its source compiles to: reading it back (the
            # schedules' sync does at once) must not compile it again, on the loop
            self._plans.setdefault(plan.hash, plan)
            return created
        if known != plan.hash:
            raise sb.definition_conflict(plan.name, plan.version)
        return False

    async def get_definition(self, name: str, version: str | None = None) -> Plan:
        def find(conn: sqlite3.Connection) -> str:
            rows = conn.execute(Q["definition_versions"], (name,)).fetchall()
            plan_hash = sb.chosen_definition(name, version, rows)
            if plan_hash is None:
                raise sb.no_definition(name, version, _definition_names(conn))
            return plan_hash

        plan_hash = await self._run(lambda: find(self.conn))
        return await self._plan(plan_hash)

    async def get_plan(self, plan_hash: str) -> Plan:
        return await self._plan(plan_hash)

    async def _plan(self, plan_hash: str) -> Plan:
        plan = self._plans.get(plan_hash)
        if plan is None:
            row = await self._run(
                lambda: self.conn.execute(Q["plan_source"], (plan_hash,)).fetchone()
            )
            if row is None:
                raise NotFound(f"no plan with hash {plan_hash} in {self.path}")
            source, name, version = row
            plan = self._plans[plan_hash] = sb.plan_from_source(
                self.compile_plan, source, sb.plan_label(plan_hash, name, version), plan_hash
            )
            self.sealer.learn(plan)
        return plan

    async def list_definitions(self, name: str | None = None) -> list[DefinitionSummary]:
        rows = await self._run(lambda: self.conn.execute(Q["list_definitions"]).fetchall())
        return [sb.definition_summary(row) for row in rows if name is None or row[0] == name]

    async def set_definition_active(self, name: str, version: str, active: bool) -> bool:
        def update(conn: sqlite3.Connection) -> bool:
            known = conn.execute(Q["definition_versions"], (name,)).fetchall()
            was = next((bool(a) for v, _, a in known if v == version), None)
            if was is None:
                raise sb.no_definition(name, version, _definition_names(conn))
            if was == active:
                return False
            conn.execute(Q["set_definition_active"], (active, name, version))
            return True

        changed: bool = await self._run(self._transaction, update)
        return changed

    async def triggered_by(self, event: str) -> list[DefinitionSummary]:
        rows = await self._run(lambda: self.conn.execute(Q["triggered_by"], (event,)).fetchall())
        return [sb.definition_summary(row) for row in rows]

    # -- runs -------------------------------------------------------------------

    async def create_runs(self, runs: Sequence[NewRun]) -> list[Created | Exception]:
        unknown = [state.plan_hash for state, _ in runs]
        if not all(map(self.sealer.knows, unknown)):
            await sb.learn_plans(self.get_plan, self.sealer, unknown)
        rows = sb.new_run_rows(runs, self.sealer)

        def insert(conn: sqlite3.Connection) -> list[Created | Exception]:
            done: list[Created | Exception] = []
            for (state, key), row in zip(runs, rows, strict=True):
                if isinstance(row, Exception):
                    done.append(row)
                elif conn.execute(Q["insert_run"], row).rowcount:
                    done.append((state.run_id, True))
                else:
                    found = conn.execute(Q["run_by_idempotency_key"], (key,)).fetchone()
                    done.append(
                        RunExists(f"run {state.run_id} exists already")
                        if found is None
                        else (found[0], False)
                    )
            return done

        # One transaction for the whole batch, made here like a commit of one event: a
        # run started while nothing else is going on does not wait for two thread hops.
        return await self._commit(insert)

    async def load_run(self, run_id: str) -> StoredRun:
        def read(conn: sqlite3.Connection) -> tuple[Any, list[Any]]:
            head = conn.execute(Q["load_run"], (run_id,)).fetchone()
            if head is None:
                raise sb.no_run(run_id)
            tail = conn.execute(Q["history_after"], (run_id, head[1])).fetchall()
            return head, tail

        (snapshot, _, last_seq), tail = await self._run(lambda: read(self.conn))
        state = sb.snapshot_from_row(run_id, snapshot, self.sealer)
        events = [sb.event_from_row(run_id, seq, data, self.sealer) for seq, data in tail]
        return StoredRun(snapshot=state, tail=events, last_seq=int(last_seq))

    async def commit(self, batch: Sequence[AppliedEvent], relayed: Sequence[str] = ()) -> None:
        plans = {applied.state.plan_hash for applied in batch}
        if not self.sealer.knows_all(plans):
            await sb.learn_plans(self.get_plan, self.sealer, plans)
        rows = sb.batch_rows(batch, self.sealer.for_plans(plans))
        index = index_rows(batch)
        relayed_rows = [(outbox_id,) for outbox_id in relayed]

        def write(conn: sqlite3.Connection) -> None:
            for run in rows.runs:
                if not conn.execute(*_advance_run(run)).rowcount:
                    raise ConcurrencyConflict(f"run {run.run_id} was advanced by another applier")
            conn.executemany(Q["insert_history"], rows.history)
            for run_id, seq, snapshot in rows.snapshots:
                conn.execute(Q["save_snapshot"], (snapshot, seq, run_id))
            if rows.outbox:
                conn.executemany(Q["insert_outbox"], rows.outbox)
            if relayed_rows:
                conn.executemany(Q["delete_outbox"], relayed_rows)
            _write_index(conn, index)

        if len(batch) <= INLINE_EVENTS:
            await self._commit(write)
        else:
            await self._run(self._transaction, write)

    async def history(self, run_id: str) -> list[HistoryEntry]:
        def read(conn: sqlite3.Connection) -> list[Any]:
            if conn.execute(Q["load_run"], (run_id,)).fetchone() is None:
                raise sb.no_run(run_id)
            return conn.execute(Q["history"], (run_id,)).fetchall()

        rows = await self._run(lambda: read(self.conn))
        return [sb.history_entry(run_id, row, self.sealer) for row in rows]

    async def get_run(self, run_id: str) -> RunSummary:
        row = await self._run(lambda: self.conn.execute(Q["get_run"], (run_id,)).fetchone())
        if row is None:
            raise sb.no_run(run_id)
        return sb.summary_from_row(row, self.sealer)

    async def list_runs(
        self, filter: RunFilter | None = None, *, limit: int = 100, cursor: str | None = None
    ) -> RunPage:
        sql, params = _list_query(filter or RunFilter(), limit, cursor)
        rows = await self._run(lambda: self.conn.execute(sql, params).fetchall())
        return sb.run_page(rows, limit, self.sealer)

    async def unfinished_runs(self) -> list[str]:
        rows = await self._run(lambda: self.conn.execute(Q["unfinished_runs"]).fetchall())
        return [row[0] for row in rows]

    async def pending_runs(self, limit: int, after: PendingRun | None = None) -> list[PendingRun]:
        params = (*sb.queue_after(after), limit)
        rows = await self._run(lambda: self.conn.execute(Q["pending_runs"], params).fetchall())
        return [sb.pending_run(row) for row in rows]

    async def count_pending(self, ahead_of: str | None = None) -> int:
        if ahead_of is None:
            row = await self._run(lambda: self.conn.execute(Q["count_pending"]).fetchone())
        else:
            query, params = Q["count_pending_ahead"], (ahead_of,)
            row = await self._run(lambda: self.conn.execute(query, params).fetchone())
        return int(row[0])

    async def pending_outbox(self, limit: int = 1000) -> list[OutboxItem]:
        rows = await self._run(lambda: self.conn.execute(Q["pending_outbox"], (limit,)).fetchall())
        return [sb.outbox_item(row, self.sealer) for row in rows]

    async def unindexed_runs(self, limit: int = 1000) -> list[str]:
        rows = await self._run(lambda: self.conn.execute(Q["unindexed_runs"], (limit,)).fetchall())
        return [row[0] for row in rows]

    async def index_run(self, state: RunState, in_flight: Sequence[TaskLease]) -> None:
        rows = state_rows(state, in_flight)

        def write(conn: sqlite3.Connection) -> None:
            _write_index(conn, IndexRows(ended=[state.run_id]))
            _write_index(conn, rows)
            conn.execute(Q["indexed_run"], (state.run_id,))

        await self._run(self._transaction, write)

    async def due_timers(
        self, before: float, limit: int = 1000, *, after: float | None = None
    ) -> list[DueTimer]:
        low = -math.inf if after is None else after
        rows = await self._run(
            lambda: self.conn.execute(Q["due_timers"], (low, before, limit)).fetchall()
        )
        return [DueTimer(run_id=r, timer_id=t, fire_at=float(f)) for r, t, f in rows]

    # -- schedules ---------------------------------------------------------------

    async def list_schedules(self, workflow: str | None = None) -> list[ScheduleRow]:
        params = (workflow, workflow)
        rows = await self._run(lambda: self.conn.execute(Q["list_schedules"], params).fetchall())
        return [sb.schedule_from_row(row) for row in rows]

    async def insert_schedule(self, row: ScheduleRow) -> bool:
        params = sb.schedule_insert_params(row, time.time())
        return await self._run(self._transaction, lambda c: _changed(c, "insert_schedule", params))

    async def update_schedule(self, row: ScheduleRow) -> bool:
        params = sb.schedule_update_params(row, time.time())
        return await self._run(self._transaction, lambda c: _changed(c, "update_schedule", params))

    async def remove_schedule(self, workflow: str, schedule_id: str) -> bool:
        params = (workflow, schedule_id)
        return await self._run(self._transaction, lambda c: _changed(c, "remove_schedule", params))

    async def due_schedules(
        self, before: float, limit: int = 1000, *, after: float | None = None
    ) -> list[ScheduleRow]:
        low = -math.inf if after is None else after
        params = (low, before, limit)
        rows = await self._run(lambda: self.conn.execute(Q["due_schedules"], params).fetchall())
        return sb.due_schedule_rows(rows)

    async def runs_waiting_for(self, signal: str) -> list[str]:
        rows = await self._run(
            lambda: self.conn.execute(Q["runs_waiting_for"], (signal,)).fetchall()
        )
        return [row[0] for row in rows]

    async def claim_task(
        self, run_id: str, step_key: str, attempt: int, *, owner: str, now: float, until: float
    ) -> bool:
        params = (owner, until, run_id, step_key, attempt, owner, now)
        return await self._run(self._transaction, lambda c: _changed(c, "claim_task", params))

    async def extend_task(
        self, run_id: str, step_key: str, attempt: int, *, owner: str, until: float
    ) -> bool:
        params = (until, run_id, step_key, attempt, owner)
        return await self._run(self._transaction, lambda c: _changed(c, "extend_task", params))

    async def tasks_in_flight(
        self, after: tuple[str, str] | None = None, limit: int = 10_000
    ) -> list[TaskLease]:
        run_id, step_key = after or ("", "")
        rows = await self._run(
            lambda: self.conn.execute(Q["tasks_in_flight"], (run_id, step_key, limit)).fetchall()
        )
        return [sb.task_lease(row) for row in rows]

    async def expired_tasks(self, before: float, limit: int = 10_000) -> list[TaskLease]:
        rows = await self._run(
            lambda: self.conn.execute(Q["expired_tasks"], (before, limit)).fetchall()
        )
        return [sb.task_lease(row) for row in rows]

    # -- the engine lease and the inbox ------------------------------------------------

    async def acquire_lease(
        self, lease: Lease, *, now: float, take_from: str | None = None
    ) -> Lease:
        def take(conn: sqlite3.Connection) -> Any:
            conn.execute(Q["acquire_lease"], (*sb.lease_row(lease), now, take_from))
            return conn.execute(Q["lease_holder"], (lease.name,)).fetchone()

        held = sb.lease_from_row(await self._run(self._transaction, take))
        assert held is not None  # the row was just written or is held by another
        return held

    async def renew_leases(self, names: Collection[str], owner: str, expires_at: float) -> set[str]:
        def renew(conn: sqlite3.Connection) -> set[str]:  # one transaction, one statement each
            return {
                name
                for name in names
                if conn.execute(Q["renew_lease"], (expires_at, name, owner)).rowcount
            }

        return await self._run(self._transaction, renew)

    async def release_lease(self, name: str, owner: str) -> None:
        await self._run(self._transaction, lambda c: c.execute(Q["release_lease"], (name, owner)))

    async def lease_holder(self, name: str) -> Lease | None:
        row = await self._run(lambda: self.conn.execute(Q["lease_holder"], (name,)).fetchone())
        return sb.lease_from_row(row)

    async def list_leases(self, prefix: str) -> list[Lease]:
        rows = await self._run(
            lambda: self.conn.execute(Q["list_leases"], (prefix, prefix)).fetchall()
        )
        return sb.leases_from_rows(rows)

    async def add_to_inbox(self, events: Sequence[Event]) -> Lease | None:
        def plan_hashes(conn: sqlite3.Connection) -> dict[str, str]:
            found = {r: conn.execute(Q["run_plan_hash"], (r,)).fetchone() for r in runs}
            return {r: str(row[0]) for r, row in found.items() if row is not None}

        runs = {event.run_id for event in events}
        plans = await self._run(lambda: plan_hashes(self.conn))
        await sb.learn_plans(self.get_plan, self.sealer, plans.values())
        rows = sb.inbox_rows(events, self.sealer, plans)

        def write(conn: sqlite3.Connection) -> Any:
            conn.executemany(Q["insert_inbox"], rows)
            return conn.execute(Q["lease_holder"], (ENGINE_LEASE,)).fetchone()

        return sb.lease_from_row(await self._run(self._transaction, write))

    async def inbox(self, limit: int = 1000) -> list[Event]:
        rows = await self._run(lambda: self.conn.execute(Q["inbox"], (limit,)).fetchall())
        return [sb.inbox_event(row, self.sealer) for row in rows]

    async def remove_from_inbox(self, event_ids: Sequence[str]) -> None:
        params = [(event_id,) for event_id in event_ids]
        await self._run(self._transaction, lambda c: c.executemany(Q["delete_inbox"], params))

    # -- API tokens ------------------------------------------------------------------

    async def create_token(self, token: ApiToken) -> None:
        row = sb.token_row(token)
        if not await self._run(self._transaction, lambda c: _changed(c, "insert_token", row)):
            raise sb.token_taken(token.token_id)

    async def get_token(self, token_id: str) -> ApiToken | None:
        row = await self._run(lambda: self.conn.execute(Q["get_token"], (token_id,)).fetchone())
        return sb.token_from_row(row)

    async def list_tokens(self) -> list[ApiToken]:
        rows = await self._run(lambda: self.conn.execute(Q["list_tokens"]).fetchall())
        return sb.tokens_from_rows(rows)

    async def record_token_use(self, token_id: str, at: float) -> None:
        params = (at, token_id, at)
        await self._run(self._transaction, lambda c: c.execute(Q["record_token_use"], params))

    async def revoke_token(self, token_id: str, at: float) -> bool:
        params = (at, token_id)
        return await self._run(self._transaction, lambda c: _changed(c, "revoke_token", params))

    async def prune(
        self, older_than: float, *, batch_size: int = 500, archive: Archive | None = None
    ) -> int:
        total = 0
        while True:
            ids = await self._run(
                lambda: [
                    r[0] for r in self.conn.execute(Q["prunable_runs"], (older_than, batch_size))
                ]
            )
            if not ids:
                return total
            if archive is not None:
                for run_id in ids:
                    summary = await self.get_run(run_id)
                    entries = await self.history(run_id)
                    archive({"run": summary.to_dict(), "history": [e.to_dict() for e in entries]})
            await self._run(self._transaction, lambda c, ids=ids: _delete_runs(c, ids))
            total += len(ids)


class _NotHere(enum.Enum):
    NOT_HERE = enum.auto()


_NOT_HERE = _NotHere.NOT_HERE
"""What ``_commit_here`` returns when the commit has to go to the store's thread."""

_Call = tuple[asyncio.AbstractEventLoop, "asyncio.Future[Any]", Callable[..., Any], tuple[Any, ...]]
"""A call for the store's thread: run ``fn(*args)``, settle the future on its loop."""


def _serve(calls: queue.SimpleQueue[_Call | None], lock: threading.Lock) -> None:
    """The store's thread: one call at a time, in order, until told to stop (None)."""
    while (call := calls.get()) is not None:
        loop, future, fn, args = call
        if future.cancelled():  # nobody waits for it any more: as an executor, skip it
            continue
        try:
            with lock:
                result = fn(*args)
        except BaseException as exc:  # handed to the caller, who raises it
            _settle(loop, future, None, exc)
        else:
            _settle(loop, future, result, None)
        del call, future, fn, args


def _settle(
    loop: asyncio.AbstractEventLoop,
    future: asyncio.Future[Any],
    result: Any,
    error: BaseException | None,
) -> None:
    def settle() -> None:
        if future.cancelled():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)

    with contextlib.suppress(RuntimeError):  # a closed loop: nobody is left to tell
        loop.call_soon_threadsafe(settle)


def _private_file(path: Path) -> bool:
    """Make the database file, when it is missing, readable by its owner only (0600; the
    directories made for it 0700): whether it made it. SQLite gives the ``-wal`` and
    ``-shm`` files the mode of the database file, so they are private too. A file that
    exists keeps the mode its operator gave it (``_connect`` warns when others may read
    it)."""
    missing = [parent for parent in (path.parent, *path.parent.parents) if not parent.exists()]
    for directory in reversed(missing):
        with contextlib.suppress(FileExistsError):  # another process made it meanwhile
            directory.mkdir(mode=0o700)
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except FileExistsError:
        return False
    return True


def _enable_wal(conn: sqlite3.Connection, attempts: int = 50) -> None:
    """Switch to WAL. The switch needs a moment of exclusive access and does not wait on
    the busy timeout, so a process opening the file while another migrates retries."""
    for attempt in range(attempts):
        try:
            conn.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or attempt == attempts - 1:
                raise
            time.sleep(0.02 * (attempt + 1))


def _save_definition(conn: sqlite3.Connection, plan: Plan) -> bool:
    existing = conn.execute(Q["definition_hash"], (plan.name, plan.version)).fetchone()
    if existing is not None:
        if existing[0] != plan.hash:
            raise sb.definition_conflict(plan.name, plan.version)
        return False
    conn.execute(Q["insert_plan"], (plan.hash, sb.dumps(dict(plan.source))))
    conn.execute(Q["insert_definition"], (plan.name, plan.version, plan.hash, time.time()))
    conn.executemany(Q["insert_trigger"], sb.trigger_rows(plan))
    return True


def _definition_names(conn: sqlite3.Connection) -> list[str]:
    return [r[0] for r in conn.execute("SELECT DISTINCT name FROM definitions ORDER BY name")]


def _changed(conn: sqlite3.Connection, query: str, params: tuple[Any, ...]) -> bool:
    return bool(conn.execute(Q[query], params).rowcount)


def _advance_run(run: sb.RunUpdate) -> tuple[str, tuple[Any, ...]]:
    where = (run.run_id, run.expected_seq)
    if run.status_changed:
        moved = (run.status, run.updated_at, run.finished_at, run.output, run.error, run.last_seq)
        return Q["advance_run"], (*moved, *where)
    return Q["advance_run_in_place"], (run.updated_at, run.output, run.error, run.last_seq, *where)


def _write_index(conn: sqlite3.Connection, rows: IndexRows) -> None:
    timers, untimed = rows.timer_rows()
    if timers:
        conn.executemany(Q["upsert_timer"], timers)
    if untimed:
        conn.executemany(Q["delete_timer"], untimed)
    tasks, starts, done = rows.task_rows()
    if done:
        conn.executemany(Q["delete_task"], done)
    if tasks:
        conn.executemany(Q["upsert_task"], tasks)
    if starts:
        conn.executemany(Q["start_task"], starts)
    if rows.waits:
        conn.executemany(Q["delete_run_waits"], [(run_id,) for run_id in rows.waits])
        conn.executemany(Q["insert_wait"], rows.wait_rows())
    if rows.ended:
        ended = [(run_id,) for run_id in rows.ended]
        for query in ("delete_run_timers", "delete_run_tasks", "delete_run_waits"):
            conn.executemany(Q[query], ended)


def _delete_runs(conn: sqlite3.Connection, ids: list[str]) -> None:
    params = [(run_id,) for run_id in ids]
    conn.executemany(Q["delete_history"], params)
    conn.executemany(Q["delete_run_outbox"], params)
    conn.executemany(Q["delete_run"], params)


def _list_query(f: RunFilter, limit: int, cursor: str | None) -> tuple[str, list[Any]]:
    return sb.list_runs_query(f, limit, cursor, lambda n: "?")


__all__ = ["SqliteStore"]
