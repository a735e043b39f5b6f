"""The engine: the one part that owns runs and writes their state.

It joins the scheduler (events in, ``decide``, group commit), the relay (effects out,
acknowledged), the timer wheel, recovery and the reconciliation sweep, around a cache of
live runs. Clients reach it through the ``EngineLink`` port it implements (deliver
events, commit now, start a stored run, read a run's live state, wait for a run to end);
workers reach it through the bus only. ``Runtime`` composes one engine with a client and a worker pool.
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from tideflow.bus.base import NO_HEADERS, Bus, Headers, partition_of, with_headers
from tideflow.bus.closing import cancel_and_wait
from tideflow.client import EngineLink
from tideflow.model.commands import RunFinished, StartChildRun
from tideflow.model.events import Event, RunStarted, TaskStarted
from tideflow.model.plan import Priority
from tideflow.model.run import RunState
from tideflow.model.states import RunStatus
from tideflow.runtime.admission import (
    Admission,
    AdmissionLevels,
    Admitter,
    check_bound,
    default_bound,
    peak_attempts,
)
from tideflow.runtime.catalog import Catalog, started_event
from tideflow.runtime.clock import Clock
from tideflow.runtime.correlate import Correlator
from tideflow.runtime.gathering import Gathering
from tideflow.runtime.intake import hand_buffered, hand_waiting
from tideflow.runtime.observers import Observers
from tideflow.runtime.partitions import Ownership
from tideflow.runtime.recovery import Owns, every_run, recover
from tideflow.runtime.relay import EventSink, Listener, Relay, Runs, start_key
from tideflow.runtime.result import RunResult, result_of
from tideflow.runtime.runs import DEFAULT_RUN_CACHE_SIZE, RunCache
from tideflow.runtime.scheduler import Scheduler
from tideflow.runtime.sweep import Sweep
from tideflow.runtime.timers import TimerWheel
from tideflow.store.base import Store

if TYPE_CHECKING:
    from tideflow.model.commands import DispatchTask
    from tideflow.observability.tracing import Tracing

PAGE = 1000
"""Task rows per read when recovery counts the busy runs."""

log = logging.getLogger("tideflow.engine")


class Engine(EngineLink, Runs):
    engine_here = True

    def relaying(self, run_id: str) -> list[tuple[str, int]]:
        return self.relay.pending_for(run_id)

    def __init__(
        self,
        *,
        store: Store,
        bus: Bus,
        catalog: Catalog,
        clock: Clock,
        new_event_id: Callable[[], str],
        batch_size: int,
        run_cache_size: int = DEFAULT_RUN_CACHE_SIZE,
        sweep_interval: float = 0.0,
        ownership: Ownership | None = None,
        tracing: Tracing | None = None,
        max_active_runs: int | None = None,
        max_tasks_in_flight: int | None = None,
    ) -> None:
        """``tracing``: tasks (and the signals an ``emit`` step sends) carry their run's
        trace context in their headers, a child run's span is a child of its parent's, and
        each batch applied to a run is a span in the run's trace linked to the contexts
        its events carried (tideflow.observability.tracing).
        ``sweep_interval``: seconds between two rounds of the reconciliation sweep
        (runtime/sweep.py), 0 for none; it repairs only the runs this engine owns.
        ``ownership``: in a cluster, the partitions this engine applies (the partition
        manager changes them: ``take``, ``drop``); None applies every partition.
        ``max_active_runs``: the admission bound (runtime/admission.py); None: a tenth of
        the run cache. The cache is made to hold at least as many runs as are admitted.
        ``max_tasks_in_flight``: no run is admitted while this many attempts are in flight;
        None: ``max_active_runs``."""
        bound = check_bound(
            default_bound(run_cache_size) if max_active_runs is None else max_active_runs
        )
        if run_cache_size >= 1:  # (0 is refused by the cache itself)
            run_cache_size = max(run_cache_size, bound)
        self._store = store
        self.ownership = ownership
        self._bus = bus
        self._catalog = catalog
        self._clock = clock
        self.plans = catalog.plans
        self.runs = RunCache(
            store,
            self.plans,
            size=run_cache_size,
            busy=lambda run_id: self.scheduler.uncommitted(run_id),
        )
        self.listeners: list[Listener] = []
        self.sinks: list[EventSink] = []
        self.observers = Observers()
        """What metrics hear of the engine (runtime/observers.py)."""
        self._waiters: dict[str, list[asyncio.Future[RunResult]]] = defaultdict(list)
        self.timers = TimerWheel(
            clock,
            self._timer_fired,
            store.due_timers,
            owns=None if ownership is None else ownership.holds,
        )
        self.relay = Relay(
            bus=bus,
            timers=self.timers,
            runs=self,
            waiting_for=Correlator(store).candidates,
            clock=clock,
            new_event_id=new_event_id,
            listeners=self.listeners,
            sinks=self.sinks,
            observers=self.observers,
            early=lambda run_id, rows: hand_buffered(store, bus, run_id, rows, clock.now()),
        )
        self.scheduler = Scheduler(
            store=store,
            bus=bus,
            runs=self.runs,
            plans=self.plans,
            relay=self.relay,
            batch_size=batch_size,
            ownership=ownership,
            observers=self.observers,
        )
        self._starts: Gathering[RunStarted, None] = Gathering(self._publish_starts)
        """Starts published together (``start_run``)."""
        self.tracing = tracing
        if tracing is not None:
            self.relay.task_headers = self._task_headers
            self.relay.run_headers = self._run_headers
            self.scheduler.spans = tracing.apply_spans()
        self.admission = Admission(bound, max_tasks_in_flight, weigh=self._weigh)
        self._widths: dict[str, int] = {}
        """Plan hash -> ``peak_attempts`` of its plan (what a run of it claims)."""
        """Which runs are active, and whether starts wait (runtime/admission.py)."""
        self.admitter = Admitter(
            self.admission,
            read=store.pending_runs,
            owns=every_run if ownership is None else ownership.owns,
            start=self._admit,
        )
        self._watching: asyncio.Task[None] | None = None
        self.scheduler.admission = self.admission
        self.scheduler.held = self.admitter.wake
        self.scheduler.arrived = (self._admit_arrived, self._admitted_arrived)
        self.sweep = Sweep(
            store=store,
            runs=self.runs,
            timers=self.timers,
            relay=self.relay,
            clock=clock,
            interval=sweep_interval,
            owns=every_run if ownership is None else ownership.owns,
            observers=self.observers,
            lost_starts=self.admitter.repair,
        )

    # -- lifecycle --------------------------------------------------------------

    def start(self) -> None:
        self.scheduler.start()
        self.admitter.start()
        self.sweep.start()
        if self.ownership is not None and self._watching is None:
            self._watching = asyncio.get_running_loop().create_task(
                self._admit_on_change(self.ownership), name="tideflow-admission-partitions"
            )

    async def _admit_on_change(self, ownership: Ownership) -> None:
        """Partitions this engine applies changed: their queued runs are its to admit now
        (they are not admitted while they are being recovered)."""
        applied = ownership.applied
        while True:
            await ownership.changed(applied)
            applied = ownership.applied
            self.admitter.recheck()

    async def _stop_watching(self) -> None:
        if self._watching is not None:
            await cancel_and_wait(self._watching)
            self._watching = None

    async def halt(self) -> None:
        """Stop advancing runs (another engine took them over): no more batches, no more
        sweeps, no more admissions."""
        await self.sweep.stop()
        await self._stop_watching()
        await self.admitter.stop()
        await self.scheduler.stop()

    async def recover(self, owns: Owns = every_run) -> None:
        """Put back in motion what the store says was left (of the runs ``owns`` names)."""
        await recover(
            store=self._store,
            runs=self.runs,
            plans=self.plans,
            timers=self.timers,
            relay=self.relay,
            clock=self._clock,
            owns=owns,
        )
        await self._count_active(owns)
        if await self._store.pending_runs(1):  # admitted in order, as room allows, once
            self.admitter.recheck()  # the engine runs (never while recovery looks)
        try:  # the events buffered for waits a run reached while no engine handed them over
            await hand_waiting(self._store, self._bus, self._clock.now(), owns)
        except Exception as exc:  # they stay buffered, then unmatched: listed, replayable
            log.warning(
                "handing buffered events to the runs waiting for them failed (%s: %s); "
                "they stay buffered until their buffer ends, then in the dead letter",
                type(exc).__name__,
                exc,
            )

    async def take(self, partitions: frozenset[int]) -> None:
        """Recover what the previous owner of these partitions left (their events are
        applied only after this returns: see runtime/partitions.py)."""
        if self.ownership is None:
            raise RuntimeError("an engine that applies every partition takes none")
        taking = _runs_in(partitions, self.ownership.partitions)
        self.runs.evict_where(taking)  # anything cached from an earlier turn is stale
        await self.recover(taking)

    def drop(self, partitions: frozenset[int]) -> None:
        """Forget the runs and timers of partitions given up or lost (another server
        applies them now; optimistic concurrency catches a commit already under way)."""
        if self.ownership is None:
            return
        gone = _runs_in(partitions, self.ownership.partitions)
        self.runs.evict_where(gone)
        self.timers.drop(gone)
        self.admission.forget(gone)

    async def stop(self) -> None:
        """Stop after the batch in progress; what the relay still holds is relayed again by
        the next recovery (the outbox, or the runs' state)."""
        await self.sweep.stop()
        await self._stop_watching()
        await self.admitter.stop()
        await self.scheduler.stop()
        self.relay.close()
        self.timers.close()
        for futures in self._waiters.values():
            for fut in futures:
                if not fut.done():
                    fut.cancel()

    # -- the EngineLink port (what a client calls) ------------------------------

    async def deliver(self, events: Sequence[Event], headers: Headers = NO_HEADERS) -> None:
        await self._bus.publish_events(with_headers(events, headers))

    async def commit(
        self, events: Sequence[Event], headers: Headers = NO_HEADERS, *, relay: bool = True
    ) -> None:
        await self.scheduler.apply(list(events), redeliver=False, relay=relay, headers=headers)

    async def start_run(self, state: RunState, event: RunStarted) -> None:
        if (self.ownership is None or self.ownership.owns(state.run_id)) and (
            self.admission.has_room()
        ):  # a run that will wait in the queue is loaded when it is admitted
            self.runs.add(state)
        await self._starts(event)  # with the starts made meanwhile: one publication

    async def _publish_starts(self, events: list[RunStarted]) -> list[None]:
        """Publish the starts of runs just stored, together; when the bus refuses them,
        each goes as an effect of its own, retried until it goes (the runs are stored:
        their starts must go)."""
        try:
            await self._bus.publish_events(events)
        except Exception:
            for event in events:
                await self.relay.send([event], "start run", key=start_key(event.run_id))
        return [None] * len(events)

    async def state(self, run_id: str) -> RunState:
        """The run's state as committed: a change still being committed is waited for (a
        client must not see what a crash could undo: GET /runs/{id} said `succeeded`
        while the history had not been written)."""
        await self.scheduler.settled(run_id)
        return await self._live(run_id)

    async def _live(self, run_id: str) -> RunState:
        """The run's state as the engine holds it, committed or not (the engine's own use)."""
        return (await self.runs.get(run_id)).state

    async def wait(self, run_id: str, timeout: float | None = None) -> RunResult:
        state = await self._live(run_id)
        if state.is_terminal and not self.scheduler.uncommitted(run_id):
            return result_of(state, await self.plans.get(state.plan_hash))
        fut: asyncio.Future[RunResult] = asyncio.get_running_loop().create_future()
        self._waiters[run_id].append(fut)
        async with asyncio.timeout(timeout):
            return await fut

    # -- what workers call ------------------------------------------------------

    async def start_durably(self, event: TaskStarted) -> bool:
        """Commit a worker's TaskStarted now (an ``idempotent: false`` step runs only after
        its start is recorded); False when it started nothing (stale or a duplicate). A
        cancelled attempt does not cut the commit short: the batch is shielded."""
        return event.event_id in await asyncio.shield(self.scheduler.apply([event]))

    # -- the Runs port (what the relay calls) -----------------------------------

    async def finished(self, command: RunFinished) -> None:
        waiters = [f for f in self._waiters.pop(command.run_id, ()) if not f.done()]
        if waiters:  # the result is built only for someone who waits for it
            state = await self._live(command.run_id)
            result = result_of(state, await self.plans.get(state.plan_hash))
            for fut in waiters:
                fut.set_result(result)
        self.runs.evict(command.run_id)
        admission = self.admission
        admission.ended(command.run_id)
        if admission.waiting:
            self.admitter.wake()

    # -- admission (runtime/admission.py) ---------------------------------------

    async def _admit(self, run_ids: list[str]) -> int:
        """Start these runs from the queue (the admitter reserved them as active): one
        batch of fresh ``RunStarted`` events, timed now (a run starts when admitted). How
        many of them, from the first, were dealt with: the others did not fit under the
        task bound and stay pending."""
        admission = self.admission
        admitting = admission.admitting
        for run_id in run_ids:  # their starts from the stream are not the admission's
            admitting[run_id] = None
        try:
            return await self._admit_loaded(run_ids)
        finally:
            for run_id in run_ids:
                admitting.pop(run_id, None)

    async def _admit_loaded(self, run_ids: list[str]) -> int:
        admission = self.admission
        states: list[RunState] = []
        for run_id in run_ids:
            try:
                state = (await self.runs.get(run_id)).state
            except Exception as exc:  # a damaged run must not keep the others from starting
                log.error("run %s cannot be started: %s: %s", run_id, type(exc).__name__, exc)
                admission.ended(run_id)
                continue
            if state.status is not RunStatus.PENDING:  # started or cancelled since the read:
                admission.settle(run_id, run_id in admission.flight)  # busy or not
                continue
            states.append(state)
        fitting = await self._fitting(states)
        dealt = len(run_ids)
        if len(fitting) < len(states):
            dealt = run_ids.index(states[len(fitting)].run_id)
            states = fitting
        now = self._clock.now()  # one admission: one time, after the loads
        events = [started_event(state, now) for state in states]
        for event in events:
            admission.admitting[event.run_id] = event
        committed: set[str] = set()
        if events:
            committed = await self.scheduler.apply(list[Event](events))
        for event in events:  # not committed (the store failed): still queued, read again
            if event.event_id not in committed:
                admission.ended(event.run_id)
                self.admitter.recheck()
        return dealt

    async def _fitting(self, states: list[RunState]) -> list[RunState]:
        """The first of ``states`` (reserved as active, in the queue's order) whose claims
        fit under the task bound beside what is active (runtime/admission.py); the others
        go back to the queue (still pending: read again when room frees)."""
        admission = self.admission
        for state in states:  # not weighed yet: each is weighed in its turn
            admission.weights.pop(state.run_id, None)
        claimed = admission.claims(besides={state.run_id for state in states})
        for n, state in enumerate(states):
            weight = await self._weight(state.plan_hash)
            if not admission.fits(weight, claimed):
                for rest in states[n:]:
                    admission.ended(rest.run_id)
                admission.waiting = True
                admission.blocked = weight
                return states[:n]
            admission.weighed(state.run_id, weight)
            claimed += weight
        return states

    async def _weight(self, plan_hash: str) -> int:
        weight = self._widths.get(plan_hash)
        if weight is None:
            weight = self._widths[plan_hash] = peak_attempts(await self.plans.get(plan_hash))
        return weight

    def _weigh(self, plan_hash: str) -> int:
        """What a run of this plan claims, when the plan is at hand (else 1)."""
        weight = self._widths.get(plan_hash)
        if weight is None:
            plan = self.plans.known(plan_hash)
            if plan is None:
                return 1
            weight = self._widths[plan_hash] = peak_attempts(plan)
        return weight

    async def _admit_arrived(self, starts: list[RunStarted]) -> dict[str, RunStarted]:
        """Starts that arrived in a batch (the scheduler's): those of the runs at the head
        of the queue, in order up to the first whose start is not here, go in this batch
        (timed now: their admission), with no hop through the admitter; the others only
        wake it. Nothing is admitted here while runs wait (the admitter has the queue)."""
        admission = self.admission
        room = admission.room
        if admission.waiting or room == 0:
            return {}
        arrived = {event.run_id: event for event in starts}
        head = await self.admitter.head(min(room, len(arrived)))
        now = self._clock.now()
        going: dict[str, RunStarted] = {}
        for run in head:
            event = arrived.get(run.run_id)
            if event is None or run.run_id in admission.active:  # an older run's start is
                break  # not here: the admitter admits them in order
            going[run.run_id] = replace(event, time=now)
        if going:
            going = await self._fitting_arrived(going)
        admission.reserve(list(going))
        admission.admitting.update(going)
        return going

    async def _fitting_arrived(self, going: dict[str, RunStarted]) -> dict[str, RunStarted]:
        """Those of ``going`` (in order) whose claims fit under the task bound; the batch
        that applies them loads their runs anyway. The others stay pending, for the
        admitter."""
        states: list[RunState] = []
        for run_id in going:
            try:
                states.append((await self.runs.get(run_id)).state)
            except Exception:  # left to the admitter, which says why
                break
        self.admission.reserve([state.run_id for state in states])
        fitting = await self._fitting(states)
        if len(fitting) < len(going):
            self.admission.waiting = True
            self.admitter.wake()
        return {state.run_id: going[state.run_id] for state in fitting}

    def _admitted_arrived(self, going: dict[str, RunStarted]) -> None:
        """The batch that applied ``going`` is done (committed or not)."""
        for run_id in going:
            self.admission.admitting.pop(run_id, None)

    async def _count_active(self, owns: Owns) -> None:
        """Count the runs of ``owns`` that are busy (an attempt in flight: their task rows,
        not the runs that only wait): at start, and when partitions are taken over."""
        after: tuple[str, str] | None = None
        while True:
            page = await self._store.tasks_in_flight(after, PAGE)
            for task in page:
                if owns(task.run_id):
                    self.admission.in_flight(task.run_id, task.step_key, task.attempt)
            if len(page) < PAGE:
                break
            after = (page[-1].run_id, page[-1].step_key)

    def admission_state(self) -> AdmissionLevels:
        """This engine's admission now (what its metrics and `runs why` show)."""
        return self.admission.levels()

    async def start_child(self, command: StartChildRun) -> RunState:
        catalog = self._catalog
        # by name only: a subflow's `workflow:` never names a file (docs/dsl.md)
        plan = await catalog.registered(command.workflow, command.version)
        await catalog.admit_input(plan, command.input)
        parent = command.run_id if command.wait else None
        step = command.step_key if command.wait else None
        key = f"child:{command.child_run_id}"
        parent_run = self.runs.hit(command.run_id)  # a child queues as its parent did
        priority = Priority.NORMAL if parent_run is None else parent_run.state.priority
        if self.tracing is None:
            run_id, state = await catalog.create(
                plan, command.child_run_id, key, command.input, parent, step, priority=priority
            )
        else:
            with self.tracing.run_span(
                run_id=command.child_run_id,
                workflow=plan.name,
                version=plan.version,
                parent=self.tracing.run_context(command.run_id, self._trace_of(command.run_id)),
                parent_run_id=command.run_id,
            ) as trace:
                run_id, state = await catalog.create(
                    plan,
                    command.child_run_id,
                    key,
                    command.input,
                    parent,
                    step,
                    trace,
                    priority=priority,
                )
        if state is None:
            return await self._live(run_id)
        if self.ownership is None or self.ownership.owns(run_id):
            self.runs.add(state)  # another server's child is loaded by that server
        return state

    def _trace_of(self, run_id: str) -> str | None:
        """The stored trace context of a run in memory (the runs whose tasks are dispatched
        are: they were just applied, or recovered); None derives it from the run id."""
        live = self.runs.hit(run_id)
        return None if live is None else live.state.trace

    def _task_headers(self, task: DispatchTask) -> Headers:
        tracing = self.tracing
        if tracing is None:
            return NO_HEADERS
        live = self.runs.hit(task.run_id)
        if live is None:
            return tracing.task_headers(task.run_id, "", None)
        return tracing.task_headers(task.run_id, live.state.workflow, live.state.trace)

    def _run_headers(self, run_id: str) -> Headers:
        if self.tracing is None:
            return NO_HEADERS
        return self.tracing.run_headers(run_id, self._trace_of(run_id))

    def _timer_fired(self, run_id: str, timer_id: str) -> None:
        self.relay.timer_fired(run_id, timer_id)


def _runs_in(partitions: frozenset[int], count: int) -> Owns:
    """Run id -> whether the run is in one of ``partitions`` (of ``count``)."""
    return lambda run_id: partition_of(run_id, count) in partitions
