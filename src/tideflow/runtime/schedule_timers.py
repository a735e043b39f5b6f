"""The schedules' timers in a runtime that fires them (``Runtime(schedules=True)``,
`tideflow server`).

Every schedule row's ``fire_at`` is a durable timer (runtime/schedules.py). This holds one
wake-up on the ``Clock`` (a ``Wakeup``, runtime/wakeup.py: the mechanism the timer wheel
uses too, which loses no wake-up whenever it arrives), for the soonest ``fire_at`` of the
live rows (``Store.due_schedules``, index ``schedules_fire_at``). At that wake-up (and at start) it *fires*:
for each row now due it works out the slots to start (``core.schedule_slots.due_slots``:
``catchup`` decides what to do with the slots that passed while no server ran), applies
``overlap`` against the schedule's previous run, starts the runs, and advances the row by
a revision-checked update; then it arms the wake-up for the next ``fire_at``. No polling:
with no live schedule there is no wake-up.

What wakes it besides its timer: a change made through this runtime's client (register,
activate, pause, resume, delete: ``changed``), the end of a run some ``buffer_one``
schedule waits for (a relay listener: ``run_changed``), and, every ``sweep_interval``
seconds, a reconciliation round for what other processes changed in the store (a
schedule paused by `tideflow schedules pause --store …`) and for a buffered run whose
end was announced while no runtime listened. That round is a repair, never the way a slot
fires on a healthy server: it fires only a row due for longer than ``REPAIR_AFTER`` (a
wake-up was lost, the store was down, another process wrote the row), and counts, logs
and reports every slot it so fired (``repaired``, ``EngineObserver.swept``, the metric
``tideflow_sweep_repairs_total{kind="schedule_slot"}``).

Several servers fire the same rows side by side: each slot's run has one idempotency key,
so the second start returns the first's run, and only one update of a row wins; the loser
reads the row again and finds nothing left to do.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
from collections.abc import Coroutine, Sequence
from typing import TYPE_CHECKING, Any

from tideflow.core.schedule_slots import due_slots, fire_time, iso_slot
from tideflow.model.events import Transition
from tideflow.model.run import RunState
from tideflow.model.schedules import Overlap, ScheduleRow
from tideflow.runtime import schedules
from tideflow.runtime.clock import Clock, TimerHandle
from tideflow.runtime.observers import Observers
from tideflow.runtime.wakeup import Wakeup
from tideflow.store.base import Store

if TYPE_CHECKING:
    from tideflow.client import Client

log = logging.getLogger("tideflow.schedules")

__all__ = ["BATCH", "IDLE_STATEMENTS_PER_ROUND", "REPAIR_AFTER", "RETRY_AFTER", "ScheduleTimers"]

BATCH = 100
"""Most due rows one round reads (more are read by the next round, at once)."""
IDLE_STATEMENTS_PER_ROUND = 1
"""SQL statements of a reconciliation round on a store with no schedule (``list_schedules``)."""
RETRY_AFTER = 1.0
"""Seconds before a round that failed (the store is down) is tried again."""
REPAIR_AFTER = 1.0
"""Seconds a row must be overdue before the sweep fires it itself (and counts it as
repaired): a wake-up fires a slot within milliseconds, and a slot is on time within 1 s."""


class ScheduleTimers:
    def __init__(
        self,
        store: Store,
        client: Client,
        clock: Clock,
        *,
        sweep_interval: float = 30.0,
        observers: Observers | None = None,
    ) -> None:
        self._store = store
        self._client = client
        self._clock = clock
        self._sweep_interval = sweep_interval
        self._observers = observers if observers is not None else Observers()
        self._wakeup = Wakeup(
            clock,
            self._one_round,
            what="schedules could not be fired",
            log=log,
            retry_after=RETRY_AFTER,
        )
        self._sweep: TimerHandle | None = None
        self._closed = True
        self._buffering: set[str] = set()
        """Workflows with a ``buffer_one`` schedule: their run ends are looked at."""
        self._tasks: set[asyncio.Task[None]] = set()
        self.repaired = 0
        """Slots the sweep had to fire (due for longer than ``REPAIR_AFTER`` with no
        round started for them): zero on a healthy server."""

    async def start(self) -> None:
        """Make the rows follow the definitions stored (registered before this version of
        tideflow, or while no server ran), then fire what is due and arm the wake-up."""
        self._closed = False
        now = self._clock.now()
        for name in sorted({d.name for d in await self._store.list_definitions()}):
            await schedules.sync_workflow(self._store, name, now)
        await self._reconcile(sweep=False)
        self._arm_sweep()

    def close(self) -> None:
        self._closed = True
        self._wakeup.close()
        if self._sweep is not None:
            self._sweep.cancel()
        self._sweep = None
        for task in self._tasks:
            task.cancel()

    async def settled(self) -> None:
        """Wait until no round is in progress or asked for (for tests)."""
        while self._tasks or self._wakeup.busy:
            await asyncio.gather(*self._tasks, return_exceptions=True)
            await self._wakeup.idle()

    # -- what wakes it ------------------------------------------------------------

    def changed(self) -> None:
        """A schedule or a definition changed through this runtime: look again now."""
        if not self._closed:
            self._wakeup.ask()

    def run_changed(self, state: RunState, transitions: Sequence[Transition]) -> None:
        """A relay listener: a run of a workflow some ``buffer_one`` schedule has ended."""
        if state.is_terminal and state.workflow in self._buffering:
            self._spawn(self._ended(state.workflow))

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        if self._closed:
            work.close()
            return
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _ended(self, workflow: str) -> None:
        try:
            await self._buffered(workflow)
        except Exception as exc:  # the store is down: the row keeps its buffered slot
            log.warning(
                "the buffered slot of workflow %s could not be started (%s: %s); the "
                "schedule's next round or the next sweep starts it",
                workflow, type(exc).__name__, exc,
            )  # fmt: skip
        self._wakeup.ask()

    def _arm_sweep(self) -> None:
        if self._sweep_interval <= 0 or self._closed:
            return
        self._sweep = self._clock.call_at(self._clock.now() + self._sweep_interval, self._swept)

    def _swept(self) -> None:
        self._sweep = None
        if not self._closed:
            self._spawn(self._sweep_round())
            self._arm_sweep()

    async def _sweep_round(self) -> None:
        try:
            await self._reconcile(sweep=True)
        except Exception as exc:
            log.warning("schedules sweep failed (%s: %s)", type(exc).__name__, exc)

    async def _reconcile(self, *, sweep: bool) -> None:
        """Read every row (a small table): which workflows buffer, which buffered runs
        are owed (their previous run ended while no runtime listened); as the sweep,
        fire the rows no wake-up fired (``_repair``); then a round."""
        rows = await self._store.list_schedules()
        self._buffering = {r.workflow for r in rows if r.spec.overlap is Overlap.BUFFER_ONE}
        for row in rows:
            if row.live and row.buffered_slot is not None:
                await self._advance(row)
        if sweep:
            await self._repair(rows)
        if rows:  # with no schedule there is nothing to fire: one statement a round
            await self._wakeup.run()

    async def _repair(self, rows: Sequence[ScheduleRow]) -> None:
        """Fire the rows due for longer than ``REPAIR_AFTER``: a wake-up was lost (or the
        store was down). Each slot so fired is counted, logged and reported to the
        observers: on a healthy server there is none."""
        late = self._clock.now() - REPAIR_AFTER
        for row in rows:
            if not row.live or row.fire_at is None or row.fire_at > late:
                continue
            fired = await self._advance(row)
            if fired:
                self.repaired += fired
                self._observers.swept("schedule_slot", fired)
                log.warning(
                    "schedule %s/%s: the sweep fired %d slot(s) due since %s that no "
                    "wake-up fired (a lost wake-up, or the store was down)",
                    row.workflow, row.schedule_id, fired, iso_slot(row.fire_at),
                )  # fmt: skip

    async def _buffered(self, workflow: str) -> None:
        for row in await self._store.list_schedules(workflow):
            if row.live and row.buffered_slot is not None:
                await self._advance(row)

    # -- firing -------------------------------------------------------------------

    async def fire(self) -> None:
        """Fire the rows due now and arm the wake-up for the next (a round of the one
        wake-up: rounds never overlap, one asked for meanwhile runs after)."""
        await self._wakeup.run()

    async def _one_round(self) -> float | None:
        """Fire the rows due now; the next fire time (None: no live row left)."""
        now = self._clock.now()
        due = await self._store.due_schedules(now, BATCH)
        retry: float | None = None
        for row in due:
            if row.spec.overlap is Overlap.BUFFER_ONE:
                self._buffering.add(row.workflow)
            try:
                await self._advance(row)
            except Exception as exc:  # this row only: the others fire on time
                log.warning(
                    "schedule %s/%s could not be fired (%s: %s); trying again in %gs",
                    row.workflow, row.schedule_id, type(exc).__name__, exc, RETRY_AFTER,
                )  # fmt: skip
                retry = now + RETRY_AFTER
        if retry is not None:
            return retry
        if len(due) >= BATCH:  # more due rows: one more round at once, the next wake-up then
            self._wakeup.ask()
            return None
        later = await self._store.due_schedules(math.inf, 1, after=now)
        return later[0].fire_at if later else None

    async def _advance(self, row: ScheduleRow) -> int:
        """Start what the row owes at this moment and write it back; when another server
        wrote it first, read it again (it then owes nothing, or what is left). How many
        slots fell due in the write that won (started, skipped or left out by
        ``catchup``)."""
        slots = 0

        async def change(current: ScheduleRow) -> ScheduleRow | None:
            nonlocal slots
            slots = 0
            if not current.live:
                return None
            new, slots = await self._owed(current, self._clock.now())
            return new

        written = await schedules.updated(self._store, row.workflow, row.schedule_id, change)
        return slots if written is not None else 0

    async def _owed(self, row: ScheduleRow, now: float) -> tuple[ScheduleRow | None, int]:
        """The row advanced past the slots due at ``now`` (None: nothing to write), and
        how many slots fell due."""
        last_run, buffered = row.last_run_id, row.buffered_slot
        started = False
        if buffered is not None and not await schedules.unfinished(self._store, last_run):
            last_run = await schedules.start_slot(self._client, row, buffered) or last_run
            buffered, started = None, True
        if row.next_slot is None or (row.fire_at is not None and row.fire_at > now):
            kept = dataclasses.replace(row, last_run_id=last_run, buffered_slot=None)
            return (kept if started else None), 0
        due = due_slots(row.spec, row.workflow, row.next_slot, now)
        if due.missed:
            log.info(
                "schedule %s/%s: %d slot(s) passed while no server fired them; catchup %s",
                row.workflow, row.schedule_id, due.missed, row.spec.catchup,
            )  # fmt: skip
        for slot in due.slots:
            if row.spec.overlap is Overlap.ALLOW or not await schedules.unfinished(
                self._store, last_run
            ):
                last_run = await schedules.start_slot(self._client, row, slot) or last_run
            elif row.spec.overlap is Overlap.BUFFER_ONE and buffered is None:
                buffered = slot
            else:
                log.info(
                    "schedule %s/%s: slot %s skipped, run %s has not ended (overlap %s)",
                    row.workflow, row.schedule_id, iso_slot(slot), last_run, row.spec.overlap,
                )  # fmt: skip
        next_slot = due.next_slot
        advanced = dataclasses.replace(
            row,
            next_slot=next_slot,
            fire_at=None if next_slot is None else fire_time(row.spec, row.workflow, next_slot),
            last_slot=due.slots[-1] if due.slots else row.last_slot,
            last_run_id=last_run,
            buffered_slot=buffered,
        )
        return advanced, len(due.slots) + due.missed
