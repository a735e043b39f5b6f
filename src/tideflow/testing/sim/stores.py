"""The simulation's stores: the memory and SQLite stores, each call of the engine's
faulted by the seed's schedule (``faults.py``).

Writes can fail before (nothing written) or after (written, and the caller told it
failed); reads can fail (nothing read). Opening and closing are never faulted, and
``close`` leaves the data be: a restarted runtime finds the store as the crashed one
left it (``shutdown`` really closes it).

``SimSqliteStore`` runs every call of the SQLite store inline on the event loop instead
of on the store's thread: the SQL and its transactions are the real ones, but a thread's
answer would reach the loop at a wall-clock moment and make the interleaving, so the
schedule, depend on the machine's speed.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, ClassVar, TypeVar

from tideflow.model.events import Event
from tideflow.model.run import RunState
from tideflow.store.backends.memory import MemoryStore
from tideflow.store.backends.sqlite import SqliteStore
from tideflow.store.base import (
    AppliedEvent,
    Created,
    DueTimer,
    Lease,
    NewRun,
    OutboxItem,
    PendingRun,
    Store,
    StoredRun,
    TaskLease,
)
from tideflow.testing.sim.faults import Fault, Faults

T = TypeVar("T")

WRITE = (Fault.BEFORE, Fault.AFTER)
READ = (Fault.BEFORE,)


class FaultyStore(Store):
    """The faulted calls, in front of a concrete store (a mixin: ``SimMemoryStore``)."""

    faults: Faults
    base: ClassVar[type[Store]]
    """The concrete store whose methods are faulted."""
    _opened = False

    async def _call(
        self,
        port: str,
        kinds: Sequence[Fault],
        call: Callable[..., Awaitable[T]],
        *args: Any,
        **kwargs: Any,
    ) -> T:
        """``call(self, *args, **kwargs)``, the concrete store's method, faulted."""
        fault = self.faults.draw(f"store.{port}", kinds)
        if fault is Fault.BEFORE:
            raise self.faults.store_error(port, fault)
        result = await call(self, *args, **kwargs)
        if fault is Fault.AFTER:
            raise self.faults.store_error(port, fault)
        return result

    async def open(self) -> None:
        if not self._opened:
            await super().open()
            self._opened = True

    async def close(self) -> None:
        """A runtime closing (or crashing) leaves the store as it is."""

    async def shutdown(self) -> None:
        if self._opened:
            self._opened = False
            await super().close()

    # -- writes -----------------------------------------------------------------

    async def commit(self, batch: Sequence[AppliedEvent], relayed: Sequence[str] = ()) -> None:
        await self._call("commit", WRITE, self.base.commit, batch, relayed)

    async def create_runs(self, runs: Sequence[NewRun]) -> list[Created | Exception]:
        return await self._call("create_runs", WRITE, self.base.create_runs, runs)

    async def claim_task(
        self, run_id: str, step_key: str, attempt: int, *, owner: str, now: float, until: float
    ) -> bool:
        return await self._call(
            "claim_task",
            WRITE,
            self.base.claim_task,
            run_id,
            step_key,
            attempt,
            owner=owner,
            now=now,
            until=until,
        )

    async def extend_task(
        self, run_id: str, step_key: str, attempt: int, *, owner: str, until: float
    ) -> bool:
        return await self._call(
            "extend_task",
            WRITE,
            self.base.extend_task,
            run_id,
            step_key,
            attempt,
            owner=owner,
            until=until,
        )

    # -- reads ------------------------------------------------------------------

    async def load_run(self, run_id: str) -> StoredRun:
        return await self._call("load_run", READ, self.base.load_run, run_id)

    async def due_timers(
        self, before: float, limit: int = 1000, *, after: float | None = None
    ) -> list[DueTimer]:
        return await self._call(
            "due_timers", READ, self.base.due_timers, before, limit, after=after
        )

    async def pending_outbox(self, limit: int = 1000) -> list[OutboxItem]:
        return await self._call("pending_outbox", READ, self.base.pending_outbox, limit)

    async def expired_tasks(self, before: float, limit: int = 10_000) -> list[TaskLease]:
        return await self._call("expired_tasks", READ, self.base.expired_tasks, before, limit)

    async def runs_waiting_for(self, signal: str) -> list[str]:
        return await self._call("runs_waiting_for", READ, self.base.runs_waiting_for, signal)

    async def pending_runs(self, limit: int, after: PendingRun | None = None) -> list[PendingRun]:
        return await self._call("pending_runs", READ, self.base.pending_runs, limit, after)

    async def unfinished_runs(self) -> list[str]:
        return await self._call("unfinished_runs", READ, self.base.unfinished_runs)

    async def index_run(self, state: RunState, in_flight: Sequence[TaskLease]) -> None:
        await self._call("index_run", WRITE, self.base.index_run, state, in_flight)

    async def add_to_inbox(self, events: Sequence[Event]) -> Lease | None:
        return await self._call("add_to_inbox", WRITE, self.base.add_to_inbox, events)

    async def remove_from_inbox(self, event_ids: Sequence[str]) -> None:
        await self._call("remove_from_inbox", WRITE, self.base.remove_from_inbox, event_ids)


class SimMemoryStore(FaultyStore, MemoryStore):
    """The memory store, faulted."""

    base = MemoryStore

    def __init__(self, faults: Faults) -> None:
        MemoryStore.__init__(self)
        self.faults = faults


class SimSqliteStore(FaultyStore, SqliteStore):
    """The SQLite store (in memory), faulted, its calls made inline (module docstring)."""

    base = SqliteStore

    def __init__(self, faults: Faults) -> None:
        SqliteStore.__init__(self, "sqlite:///:memory:")
        self.faults = faults

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        with self._lock:
            try:
                return self._waiting(fn, args)
            except sqlite3.DatabaseError as exc:
                raise self._translate(exc) from None
