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
`tideflow server --max-active-runs`, ``TIDEFLOW_MAX_ACTIVE_RUNS``), and a run is admitted
only while the engine's attempts in flight are under a second bound
(``max_tasks_in_flight``, `--max-tasks-in-flight`, ``TIDEFLOW_MAX_TASKS_IN_FLIGHT``;
by default the first: a run of a chain has one attempt in flight, a run of a wide DAG
dozens); the others stay durably ``pending`` in the store and are admitted in the
store's order (``PendingRun``: priority high > normal > low, then ``created_at``, then
run id) as active runs end or their attempts finish.

Why a bound: with FIFO task queues every active run advances one step per turn of the
queue, so a run's latency is about ``steps * active / throughput``. Admitting every run
of a 100,000-run burst made each of them wait for the whole burst (breadth-first), and
cycled the run cache (a snapshot load per event). With the bound, the oldest runs finish
first and a run's latency does not grow with the backlog behind it.

Why a second bound, on attempts: a step's dispatch latency (its upstream's end to its
start) is the time its task waits behind the others in flight, about ``in flight /
throughput``. Runs of a chain put one attempt each in flight; 200 runs of a 300-node DAG
put thousands (each level of each DAG at once), and every dispatch waited ~1 s. Bounding
the attempts in flight bounds that wait: a lower bound buys lower dispatch latency for
some throughput (the queue that keeps every worker busy shortens), docs/deployment.md
has the measured trade. The next run's attempts are not known before it runs, so each
active run *claims* the most it may have in flight: its attempts in flight, or more, its
plan's width (``peak_attempts``: the widest level of its graph; 1 for a chain, 36 for
bench/run.py's 300-node DAG), and a run is admitted while the claims leave room for its
own (or nothing else is active: a run wider than the bound runs alone). A run admitted
goes on whatever it dispatches (its attempts may pass the bound for a while, as a
parked run's may when its signal arrives): only the admission of the next run waits.

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
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from typing import Any, NamedTuple

from tideflow.bus.closing import cancel_and_wait
from tideflow.model.commands import CancelTask, DispatchTask
from tideflow.model.events import RunStarted, TaskCompleted, TaskFailed, TaskLost
from tideflow.model.plan import Plan
from tideflow.model.run import RunState
from tideflow.model.states import RunStatus
from tideflow.store.base import AppliedEvent, PendingRun

log = logging.getLogger("tideflow.admission")

MAX_ACTIVE_ENV = "TIDEFLOW_MAX_ACTIVE_RUNS"
MAX_TASKS_ENV = "TIDEFLOW_MAX_TASKS_IN_FLIGHT"
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


_RUNS_HELP = "how many runs an engine keeps active at once (1 or more, e.g. 1000)"
_TASKS_HELP = (
    "how many attempts an engine may have in flight before it admits no more runs "
    "(1 or more, e.g. 1000)"
)


def check_bound(bound: int) -> int:
    """An admission bound must be a whole number of runs, 1 or more."""
    if isinstance(bound, bool) or not isinstance(bound, int) or bound < 1:
        raise ValueError(
            f"max active runs {bound!r}: give {_RUNS_HELP}; the others wait pending and are "
            "admitted in order"
        )
    return bound


def check_task_bound(bound: int) -> int:
    """A bound of attempts in flight must be a whole number, 1 or more."""
    if isinstance(bound, bool) or not isinstance(bound, int) or bound < 1:
        raise ValueError(f"max tasks in flight {bound!r}: give {_TASKS_HELP}")
    return bound


def bound_from_environment(environ: Mapping[str, str]) -> int | None:
    """``TIDEFLOW_MAX_ACTIVE_RUNS``, or None (the default, from the run cache) when unset."""
    return _whole(environ, MAX_ACTIVE_ENV, _RUNS_HELP)


def task_bound_from_environment(environ: Mapping[str, str]) -> int | None:
    """``TIDEFLOW_MAX_TASKS_IN_FLIGHT``, or None (the default: the run bound) when unset."""
    return _whole(environ, MAX_TASKS_ENV, _TASKS_HELP)


def _whole(environ: Mapping[str, str], name: str, what: str) -> int | None:
    text = environ.get(name, "").strip()
    if not text:
        return None
    try:
        number = float(text)
        if not math.isfinite(number) or number != int(number) or number < 1:
            raise ValueError(text)
        return int(number)
    except ValueError:
        raise ValueError(f"{name}={text!r}: give {what}") from None


class AdmissionLevels(NamedTuple):
    """What an engine's admission holds now (its metrics and `runs why` show it)."""

    active: int
    """Runs busy (admitted, with work in flight or being started)."""
    bound: int
    """At most this many runs are admitted busy (``max_active_runs``)."""
    tasks: int
    """Attempts in flight (dispatched or running) of this engine's runs."""
    task_bound: int
    """No run is admitted while this many attempts are in flight (``max_tasks_in_flight``)."""
    claimed: int
    """What the active runs claim of ``task_bound``: each its attempts in flight or its
    plan's width, whichever is more."""


def peak_attempts(plan: Plan) -> int:
    """How many attempts a run of ``plan`` may have in flight at once, estimated from its
    graph: the most action steps at one depth (a step's depth is one more than its
    deepest upstream step's), a ``map`` counting its ``max_concurrency`` (its items are
    not known before it runs: without a bound it counts 1), a ``loop`` or ``subflow`` 1.
    A chain is 1; steps that wait, sleep or set values count nothing."""
    graph = plan.graph
    specs = plan.specs
    depth: dict[str, int] = {}
    width: dict[int, int] = {}
    for step_id in _topological(graph.steps, specs):
        spec = specs[step_id]
        level = 1 + max((depth.get(up, 0) for up in spec.depends_on), default=0)
        depth[step_id] = level
        if spec.map is not None:
            weight = spec.map.max_concurrency or 1
        elif spec.is_action or spec.loop is not None:
            weight = 1
        else:
            weight = 0
        width[level] = width.get(level, 0) + weight
    return max(1, max(width.values(), default=1))


def _topological(steps: Sequence[str], specs: Mapping[str, Any]) -> list[str]:
    """``steps`` with each after its upstream steps (Kahn's order; no recursion: a graph of
    10,000 steps in a chain is 10,000 deep)."""
    inside = set(steps)
    waiting = {s: sum(1 for up in specs[s].depends_on if up in inside) for s in steps}
    below: dict[str, list[str]] = {}
    for s in steps:
        for up in specs[s].depends_on:
            if up in inside:
                below.setdefault(up, []).append(s)
    ready = [s for s in steps if waiting[s] == 0]
    order: list[str] = []
    while ready:
        s = ready.pop()
        order.append(s)
        for down in below.get(s, ()):
            waiting[down] -= 1
            if waiting[down] == 0:
                ready.append(down)
    return order


class Admission:
    """The bookkeeping (no I/O): which runs are active, whether starts wait.

    ``weigh(plan_hash)``: the claim of a run of that plan (``peak_attempts``); runs of a
    plan it does not know claim 1."""

    def __init__(
        self,
        bound: int,
        task_bound: int | None = None,
        weigh: Callable[[str], int] | None = None,
    ) -> None:
        self.bound = check_bound(bound)
        self.task_bound = self.bound if task_bound is None else check_task_bound(task_bound)
        self.weigh: Callable[[str], int] = weigh or (lambda plan_hash: 1)
        self.weights: dict[str, int] = {}
        """Run id -> its claim (its plan's width), for active runs whose plan is known."""
        self.last_weight = 1
        """The claim of the run weighed last: what a run being admitted is taken to claim
        until its plan is known (the next runs of a burst are likely like the last)."""
        self.blocked = 0
        """The claim of the run found at the head of the queue that did not fit (0: none):
        no room until the claims leave that much (the queue is served in order)."""
        self.active: set[str] = set()
        """Runs busy: being admitted, or with an attempt in flight (the module docstring)."""
        self.flight: dict[str, dict[str, int]] = {}
        """Run id -> step key -> attempt of its attempts in flight (only runs with some)."""
        self.tasks = 0
        """How many attempts ``flight`` holds (kept as it changes: read per batch)."""
        self.waiting = False
        """Whether the store may hold runs this engine has not admitted: a run that ends
        then wakes the admitter."""
        self.held = 0
        """How many starts were held so far (the admitter reads it to know whether a
        start was held while it read the queue)."""
        self.admitting: dict[str, RunStarted | None] = {}
        """The runs being admitted, with the start that admits them (None while it is
        being made): the only start of such a run that passes."""

    def claims(self, besides: Collection[str] = ()) -> int:
        """What the active runs (but those ``besides``) claim of the task bound: each its
        attempts in flight or its plan's width, whichever is more (a run being admitted,
        plan not known yet, the last weight)."""
        weights, flight, guess = self.weights, self.flight, self.last_weight
        total = 0
        for run_id in self.active:
            if run_id in besides:
                continue
            steps = flight.get(run_id)
            total += max(weights.get(run_id, guess), len(steps) if steps else 0)
        return total

    def fits(self, weight: int, claimed: int) -> bool:
        """Whether a run claiming ``weight`` may be admitted beside ``claimed`` (what is
        active claims): under the task bound, or alone."""
        return claimed == 0 or claimed + weight <= self.task_bound

    @property
    def room(self) -> int:
        """How many more runs may be admitted now: under the run bound, and as many runs
        like the last as the claims leave room for under the task bound, at least one
        while any is left (the admitter weighs each run before it starts it: ``fits``),
        none while the run at the head of the queue was found not to fit (``blocked``)."""
        runs = self.bound - len(self.active)
        if runs <= 0:
            return 0
        claimed = self.claims()
        if claimed == 0:
            return max(1, min(runs, self.task_bound // self.last_weight))
        free = self.task_bound - claimed
        if free <= 0 or free < self.blocked:
            return 0
        return max(1, min(runs, free // self.last_weight))

    def has_room(self) -> bool:
        """Whether the run bound has room (cheap: per start; ``room`` weighs the claims)."""
        return len(self.active) < self.bound

    def levels(self) -> AdmissionLevels:
        return AdmissionLevels(
            len(self.active), self.bound, self.tasks, self.task_bound, self.claims()
        )

    def weighed(self, run_id: str, weight: int) -> None:
        self.weights[run_id] = weight
        self.last_weight = weight
        self.blocked = 0

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
            self.weights.pop(run_id, None)

    def ended(self, run_id: str) -> None:
        """The run ended: what it had in flight is stale (a worker's late outcome of it
        changes nothing) and holds no room."""
        self.active.discard(run_id)
        self.weights.pop(run_id, None)
        steps = self.flight.pop(run_id, None)
        if steps:
            self.tasks -= len(steps)

    def reserve(self, run_ids: Sequence[str]) -> None:
        self.active.update(run_ids)

    def forget(self, gone: Callable[[str], bool]) -> None:
        """Partitions were given up: their runs are another engine's to count."""
        self.active = {run_id for run_id in self.active if not gone(run_id)}
        self.flight = {run_id: f for run_id, f in self.flight.items() if not gone(run_id)}
        self.weights = {run_id: w for run_id, w in self.weights.items() if not gone(run_id)}
        self.tasks = sum(len(steps) for steps in self.flight.values())

    def in_flight(self, run_id: str, step_key: str, attempt: int) -> None:
        """An attempt in flight read from the store (recovery, takeover): its run is busy."""
        steps = self.flight.setdefault(run_id, {})
        if step_key not in steps:
            self.tasks += 1
        steps[step_key] = attempt
        self.active.add(run_id)

    def applied(self, batch: Sequence[AppliedEvent]) -> bool:
        """A batch was committed: follow its runs' attempts in flight (its events and
        commands only, as the store's task rows do: store/indexrows.py) and make each
        run it touched busy or parked. True when starts wait and room freed (a run was
        parked or ended, or attempts finished under the task bound): the admitter has
        room to fill."""
        flight, active, weights = self.flight, self.active, self.weights
        tasks = before = self.tasks
        idle: dict[str, RunState] = {}  # runs left with nothing in flight at some event
        for applied in batch:  # exact types (no subclasses): on every commit's path
            event = applied.event
            run_id = event.run_id
            steps = flight.get(run_id)
            if (
                steps and type(event) in _OUTCOMES and steps.pop(event.step_key, None) is not None  # type: ignore[attr-defined]
            ):
                tasks -= 1
            for command in applied.commands:
                if type(command) is DispatchTask:
                    if not steps:  # busy (again): it goes on at once, admitted already
                        if steps is None:
                            steps = flight[run_id] = {}
                        active.add(run_id)
                        if run_id not in weights:
                            weights[run_id] = self.last_weight = self.weigh(applied.state.plan_hash)
                    if command.step_key not in steps:
                        tasks += 1
                    steps[command.step_key] = command.attempt
                elif (
                    type(command) is CancelTask
                    and steps
                    and steps.get(command.step_key) == command.attempt
                ):
                    del steps[command.step_key]
                    tasks -= 1
            if not steps:
                idle[run_id] = applied.state
        self.tasks = tasks
        released = False
        for run_id, state in idle.items():
            if flight.get(run_id):  # busy again later in the batch
                continue
            flight.pop(run_id, None)
            if state.status is RunStatus.PENDING:  # reserved, its start not applied yet
                continue
            if run_id in active:  # parked, or ended
                active.discard(run_id)
                weights.pop(run_id, None)
                released = True
        return self.waiting and (released or tasks < before) and self.room > 0


_OUTCOMES = frozenset({TaskCompleted, TaskFailed, TaskLost})


ReadQueue = Callable[[int, PendingRun | None], Awaitable[list[PendingRun]]]
StartRuns = Callable[[list[str]], Awaitable[int]]
"""Start these runs (reserved as active); how many of them, from the first, were dealt
with (started, or found started or gone): the rest did not fit under the task bound once
their plans were known, and were given back (pending, not active)."""


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
                    dealt = await self._start(run_ids)
                except BaseException:
                    for run_id in run_ids:
                        book.ended(run_id)
                    raise
                admitted.extend(mine[:dealt])
                self.admitted += dealt
                if dealt < len(mine):  # the task bound is full: the rest wait their turn
                    return
            if len(page) < limit and len(candidates) <= room:  # the queue ran out
                if book.held == held:
                    book.waiting = False
                return


__all__ = [
    "CACHE_SHARE",
    "MAX_ACTIVE_ENV",
    "MAX_TASKS_ENV",
    "Admission",
    "AdmissionLevels",
    "Admitter",
    "bound_from_environment",
    "check_bound",
    "check_task_bound",
    "default_bound",
    "peak_attempts",
    "task_bound_from_environment",
]
