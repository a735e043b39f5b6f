"""Admission: an engine keeps a bounded number of runs active; the store is the queue.

A run is *active* (busy) while it has work in flight: from its admission until the batch
that starts it is committed, and then while it has an attempt dispatched or running (a
task row in the store: from its ``DispatchTask`` to its ``TaskCompleted`` / ``TaskFailed``
/ ``TaskLost`` or ``CancelTask``; compensation attempts included). A run that only waits
(signals, events, timers incl. ``sleep`` and retry backoff, a child run) is *parked*: it
holds no slot, and the next pending run may be admitted. A parked run whose signal, timer
or child arrives goes on at once (it was admitted already), above the bound for a moment
if need be. ``Admission.applied`` keeps this from each committed batch (its events and
commands, never a scan of a run's steps). At most ``bound`` runs of the engine's
partitions are active (``Runtime(max_active_runs=…)``,
`tideflow server --max-active-runs`, ``TIDEFLOW_MAX_ACTIVE_RUNS``); the others stay
durably ``pending`` in the store and are admitted in the store's order (``PendingRun``:
priority high > normal > low, then ``created_at``, then run id) as active runs end.

Why a bound: with FIFO task queues every active run advances one step per turn of the
queue, so a run's latency is about ``steps * active / throughput``. Admitting every run
of a 100,000-run burst made each of them wait for the whole burst (breadth-first), and
cycled the run cache (a snapshot load per event). With the bound, the oldest runs finish
first and a run's latency does not grow with the backlog behind it.

How starts flow:

- the ``RunStarted`` events of a batch the scheduler applies (a client's start, a
  schedule's or a trigger's) are checked against the head of the queue (one indexed
  read, ``Engine._admit_arrived``): those of the next runs in order, while there is
  room and nothing waits, are applied in that batch, timed at their admission; any
  other only wakes the admitter (``Admission.gate``): it is acknowledged and skipped,
  and the run stays ``pending`` in the store. Nothing is lost, a start message costs
  the event stream nothing (events of admitted runs never wait behind starts, nor
  starts behind events), and the order in which starts arrive (several partitions,
  retried publishes) decides nothing;
- the ``Admitter`` reads the head of the queue from the store (``Store.pending_runs``,
  index ``runs_pending``) whenever a start arrived, room frees (a run ended) or
  partitions were taken, and starts what fits, in order, in one batch of fresh
  ``RunStarted`` events (their time is the admission's: ``started_at``). Reads coalesce:
  a burst of starts costs one read per wake-up, not one per start;
- a child run of a parent that waits for it is admitted at once: it counts as active but
  never waits (its parent, active, waits for it: queueing it behind the parent's own
  admission could deadlock).

In a cluster the bound is per server, over the partitions it owns; on takeover the new
owner reads the attempts in flight of the partitions it takes (``Store.tasks_in_flight``,
the task rows' primary key: the busy runs, not the parked ones) and admits from the store.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Awaitable, Callable, Mapping, Sequence

from tideflow.bus.closing import cancel_and_wait
from tideflow.model.commands import CancelTask, DispatchTask
from tideflow.model.events import RunStarted, TaskCompleted, TaskFailed, TaskLost
from tideflow.model.run import RunState
from tideflow.model.states import RunStatus
from tideflow.store.base import AppliedEvent, PendingRun

log = logging.getLogger("tideflow.admission")

MAX_ACTIVE_ENV = "TIDEFLOW_MAX_ACTIVE_RUNS"
CACHE_SHARE = 10
"""The default bound is the run cache's size over this: 10,000 cached runs admit 1,000.
With 1,000 active 10-step runs and a cluster that applies ~6,000 steps/s, a run's
latency is ~10 * 1,000 / 6,000 ≈ 2 s, while 1,000 runs keep every worker busy (each
active run has a step queued or running at any time)."""
PAGE_MIN = 64
"""Fewest queue rows one read of the admitter asks for."""
RETRY_DELAY = 1.0
"""Seconds before the admitter reads the queue again after the store failed."""


def default_bound(run_cache_size: int) -> int:
    """The default admission bound for an engine whose run cache holds this many runs."""
    return max(1, run_cache_size // CACHE_SHARE)


def check_bound(bound: int) -> int:
    """An admission bound must be a whole number of runs, 1 or more."""
    if isinstance(bound, bool) or not isinstance(bound, int) or bound < 1:
        raise ValueError(
            f"max active runs {bound!r}: give how many runs an engine keeps active at once "
            "(1 or more, e.g. 1000); the others wait pending and are admitted in order"
        )
    return bound


def bound_from_environment(environ: Mapping[str, str]) -> int | None:
    """``TIDEFLOW_MAX_ACTIVE_RUNS``, or None (the default, from the run cache) when unset."""
    text = environ.get(MAX_ACTIVE_ENV, "").strip()
    if not text:
        return None
    try:
        number = float(text)
        if not math.isfinite(number) or number != int(number):
            raise ValueError(text)
        return check_bound(int(number))
    except ValueError:
        raise ValueError(
            f"{MAX_ACTIVE_ENV}={text!r}: give how many runs an engine keeps active at once "
            "(1 or more, e.g. 1000)"
        ) from None


class Admission:
    """The bookkeeping (no I/O): which runs are active, whether starts wait."""

    def __init__(self, bound: int) -> None:
        self.bound = check_bound(bound)
        self.active: set[str] = set()
        """Runs busy: being admitted, or with an attempt in flight (the module docstring)."""
        self.flight: dict[str, dict[str, int]] = {}
        """Run id -> step key -> attempt of its attempts in flight (only runs with some)."""
        self.waiting = False
        """Whether the store may hold runs this engine has not admitted: a run that ends
        then wakes the admitter."""
        self.held = 0
        """How many starts were held so far (the admitter reads it to know whether a
        start was held while it read the queue)."""
        self.admitting: dict[str, RunStarted | None] = {}
        """The runs being admitted, with the start that admits them (None while it is
        being made): the only start of such a run that passes."""

    @property
    def room(self) -> int:
        return max(0, self.bound - len(self.active))

    def has_room(self) -> bool:
        return len(self.active) < self.bound

    def gate(self, event: RunStarted) -> bool:
        """A ``RunStarted`` is about to be applied: True to apply it (the admitter's own,
        or a child run's: it counts as active from here), False to hold it. A held start
        changes nothing (the run stays pending, or it started already: a duplicate); it
        only wakes the admitter, which admits in the store's order, whatever order the
        starts arrived in, at the time it admits."""
        run_id = event.run_id
        admitting = self.admitting
        if run_id in admitting:  # the admitter's own passes; another copy of it does not
            return admitting[run_id] is event
        if event.parent_run_id is not None:
            self.active.add(run_id)
            return True
        if run_id in self.active:  # a duplicate (stale), or a start whose commit failed
            return True
        self.waiting = True
        self.held += 1
        return False

    def settle(self, run_id: str, running: bool) -> None:
        """What applying a start left: the run is running (active) or not (a duplicate of
        an ended run, a run cancelled while pending, a run not stored)."""
        if running:
            self.active.add(run_id)
        else:
            self.active.discard(run_id)

    def ended(self, run_id: str) -> None:
        self.active.discard(run_id)

    def reserve(self, run_ids: Sequence[str]) -> None:
        self.active.update(run_ids)

    def forget(self, gone: Callable[[str], bool]) -> None:
        """Partitions were given up: their runs are another engine's to count."""
        self.active = {run_id for run_id in self.active if not gone(run_id)}
        self.flight = {run_id: f for run_id, f in self.flight.items() if not gone(run_id)}

    def in_flight(self, run_id: str, step_key: str, attempt: int) -> None:
        """An attempt in flight read from the store (recovery, takeover): its run is busy."""
        self.flight.setdefault(run_id, {})[step_key] = attempt
        self.active.add(run_id)

    def applied(self, batch: Sequence[AppliedEvent]) -> bool:
        """A batch was committed: follow its runs' attempts in flight (its events and
        commands only, as the store's task rows do: store/indexrows.py) and make each
        run it touched busy or parked. True when a run was parked and starts wait (the
        admitter has room to fill)."""
        flight, active = self.flight, self.active
        idle: dict[str, RunState] = {}  # runs left with nothing in flight at some event
        for applied in batch:  # exact types (no subclasses): on every commit's path
            event = applied.event
            run_id = event.run_id
            steps = flight.get(run_id)
            if steps and type(event) in _OUTCOMES:
                steps.pop(event.step_key, None)  # type: ignore[attr-defined]
            for command in applied.commands:
                if type(command) is DispatchTask:
                    if not steps:  # busy (again): it goes on at once, admitted already
                        if steps is None:
                            steps = flight[run_id] = {}
                        active.add(run_id)
                    steps[command.step_key] = command.attempt
                elif (
                    type(command) is CancelTask
                    and steps
                    and steps.get(command.step_key) == command.attempt
                ):
                    del steps[command.step_key]
            if not steps:
                idle[run_id] = applied.state
        released = False
        for run_id, state in idle.items():
            if flight.get(run_id):  # busy again later in the batch
                continue
            flight.pop(run_id, None)
            if state.status is RunStatus.PENDING:  # reserved, its start not applied yet
                continue
            if run_id in active:  # parked, or ended
                active.discard(run_id)
                released = True
        return released and self.waiting


_OUTCOMES = frozenset({TaskCompleted, TaskFailed, TaskLost})


ReadQueue = Callable[[int, PendingRun | None], Awaitable[list[PendingRun]]]
StartRuns = Callable[[list[str]], Awaitable[None]]


class Admitter:
    """The task that admits from the store as room frees (see the module docstring).

    ``read(limit, after)``: the queue (``Store.pending_runs``); ``owns``: whether a run is
    this engine's; ``start(run_ids)``: apply the runs' starts (reserved as active first)."""

    def __init__(
        self,
        admission: Admission,
        *,
        read: ReadQueue,
        owns: Callable[[str], bool],
        start: StartRuns,
    ) -> None:
        self.admission = admission
        self.owns = owns
        self._read = read
        self._start = start
        self._wanted = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._filling = False
        self.admitted = 0
        """Runs this admitter started from the queue (the sweep compares it)."""

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self._loop(), name="tideflow-admitter"
            )

    async def stop(self) -> None:
        if self._task is not None:
            await cancel_and_wait(self._task)
            self._task = None

    def wake(self) -> None:
        """Read the queue soon (room freed, a start was held, partitions changed)."""
        self._wanted.set()

    def recheck(self) -> None:
        """The store may hold pending runs nobody announced (recovery, takeover, the
        sweep): read the queue even though no start was held."""
        self.admission.waiting = True
        self._wanted.set()

    async def _loop(self) -> None:
        while True:
            await self._wanted.wait()
            self._wanted.clear()
            try:
                await self.fill()
            except Exception as exc:  # the store is down: the runs stay pending
                log.warning(
                    "the admitter could not read the queue of pending runs (%s: %s); again in %gs",
                    type(exc).__name__,
                    exc,
                    RETRY_DELAY,
                )
                await asyncio.sleep(RETRY_DELAY)
                self._wanted.set()

    async def head(self, room: int) -> list[PendingRun]:
        """The next ``room`` runs this engine would admit (its own, not active), in order."""
        book = self.admission
        found: list[PendingRun] = []
        after: PendingRun | None = None
        while len(found) < room:
            limit = max(PAGE_MIN, 2 * room)
            page = await self._read(limit, after)
            found += [p for p in page if p.run_id not in book.active and self.owns(p.run_id)]
            if len(page) < limit:
                break
            after = page[-1]
        return found[:room]

    async def repair(self, before: float) -> int:
        """The sweep's part (runtime/sweep.py): when this admitter is idle, admit what the
        queue holds and fits; how many of the runs admitted were created before ``before``
        (their start was lost: a start arriving, or room freeing, would have admitted them
        already). An admitter at its bound reads nothing and repairs nothing."""
        book = self.admission
        if self._wanted.is_set() or self._filling or book.room == 0:
            return 0
        waiting, held = book.waiting, book.held
        book.waiting = True
        try:  # younger runs are left to their start, on its way
            return len(await self.fill(before))
        finally:
            book.waiting = waiting or book.held != held

    async def fill(self, before: float | None = None) -> list[PendingRun]:
        """Admit the head of the queue while there is room (of the runs created before
        ``before``, when given); the runs admitted. When the
        queue ran out before the room did (and no start was held meanwhile), nothing
        waits any more: a run that ends reads nothing."""
        book = self.admission
        if not book.waiting:
            return []
        held = book.held
        admitted: list[PendingRun] = []
        after: PendingRun | None = None
        self._filling = True
        try:
            await self._fill(book, held, admitted, after, before)
        finally:
            self._filling = False
        return admitted

    async def _fill(
        self,
        book: Admission,
        held: int,
        admitted: list[PendingRun],
        after: PendingRun | None,
        before: float | None,
    ) -> None:
        """``before``: admit only runs created before it (the sweep's repair)."""
        while (room := book.room) > 0:
            limit = max(PAGE_MIN, 2 * room)
            page = await self._read(limit, after)
            candidates = [
                p
                for p in page
                if p.run_id not in book.active
                and self.owns(p.run_id)
                and (before is None or p.created_at < before)
            ]
            mine = candidates[:room]
            # read on after what was looked at: the last run admitted when room ran out
            # before the page did (room may free while it starts), else the whole page
            if len(candidates) > len(mine):
                after = mine[-1]
            elif page:
                after = page[-1]
            if mine:
                run_ids = [p.run_id for p in mine]
                book.reserve(run_ids)
                try:
                    await self._start(run_ids)
                except BaseException:
                    for run_id in run_ids:
                        book.ended(run_id)
                    raise
                admitted.extend(mine)
                self.admitted += len(mine)
            if len(page) < limit and len(candidates) <= room:  # the queue ran out
                if book.held == held:
                    book.waiting = False
                return


__all__ = [
    "CACHE_SHARE",
    "MAX_ACTIVE_ENV",
    "Admission",
    "Admitter",
    "bound_from_environment",
    "check_bound",
    "default_bound",
]
