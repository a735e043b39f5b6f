"""The embedded runtime: joins the core, a store, a bus, timers and workers.

::

    async with Runtime() as rt:                      # in-memory store, in-process bus
        plan = await rt.register("flow.yaml")
        result = await rt.run("order-fulfillment", {"order_id": "A1"})

The scheduler loop takes every event that is available (up to ``batch_size``),
applies each through ``decide``, commits the whole batch to the store in one
call, then relays the commands: tasks to the bus, timers to the wheel, child
runs, emitted events, finished runs to whoever waits for them.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import uuid
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from tideflow.bus.backends.local import LocalBus
from tideflow.bus.base import Bus
from tideflow.core.reopen import RETRYABLE
from tideflow.core.resume import lost_events, resume_commands
from tideflow.errors import (
    InputValidationError,
    NotFound,
    RunNotRetryable,
    RuntimeNotStarted,
    StepError,
    TideflowError,
)
from tideflow.model import storable
from tideflow.model.commands import (
    CancelChildRun,
    CancelTask,
    CancelTimer,
    Command,
    DispatchTask,
    EmitEvent,
    RunFinished,
    StartChildRun,
    StartTimer,
)
from tideflow.model.events import (
    CancelRequested,
    ChildRunFinished,
    ErrorInfo,
    Event,
    RunRetried,
    RunStarted,
    SignalReceived,
    TaskStarted,
    TimerFired,
)
from tideflow.model.plan import Plan
from tideflow.model.run import RunState, new_run_state
from tideflow.model.states import RunStatus
from tideflow.runtime.clock import Clock, SystemClock
from tideflow.runtime.definitions import DefinitionSource, coerce_plan
from tideflow.runtime.lease import DEFAULT_TTL, EngineSeat
from tideflow.runtime.result import RunResult, result_of
from tideflow.runtime.runs import Plans, RunCache, WaitIndex
from tideflow.runtime.scheduler import Listener, Scheduler
from tideflow.runtime.signals import refuse_undeclared_signal
from tideflow.runtime.timers import TimerWheel
from tideflow.store.backends.memory import MemoryStore
from tideflow.store.base import HistoryEntry, Store
from tideflow.worker.executors.registry import ExecutorRegistry
from tideflow.worker.pool import WorkerPool
from tideflow.worker.secrets import SecretProvider, redact_fields

log = logging.getLogger("tideflow.runtime")

EventSink = Callable[[dict[str, Any]], Any]


class Runtime:
    """An embedded tideflow engine. Use as ``async with Runtime(...) as rt``."""

    def __init__(
        self,
        *,
        store: Store | str | None = None,
        bus: Bus | None = None,
        executors: ExecutorRegistry | None = None,
        workers: int = 32,
        clock: Clock | None = None,
        secrets: SecretProvider | None = None,
        definitions_dir: str | Path | None = None,
        batch_size: int = 512,
        recover: bool = True,
        max_step_output: int = storable.MAX_STEP_OUTPUT,
        max_run_input: int = storable.MAX_RUN_INPUT,
        lease: bool | None = None,
        lease_ttl: float = DEFAULT_TTL,
        wait_for_engine: float = 0.0,
    ) -> None:
        if isinstance(store, str):
            from tideflow.store import open_store

            store = open_store(store)
        self.store = store or MemoryStore()
        if self.store.compile_plan is None:
            self.store.compile_plan = self._compile_stored
        self.bus = bus or LocalBus()
        self.executors = executors or ExecutorRegistry()
        self.clock = clock or SystemClock()
        self._definitions = DefinitionSource(definitions_dir, self.executors)
        self._recover_on_start = recover
        self._worker_count = workers
        self._max_run_input = max_run_input
        self._max_step_output = max_step_output
        self._running = False
        self._prefix = uuid.uuid4().hex[:10]
        self._ids = itertools.count(1)
        self._plans = Plans(self.store)
        self._runs = RunCache(self.store, self._plans)
        self._waiters: dict[str, list[asyncio.Future[RunResult]]] = defaultdict(list)
        self._waits = WaitIndex()
        self._listeners: list[Listener] = [lambda state, _: self._waits.update(state)]
        self._sinks: list[EventSink] = []
        self._timers = TimerWheel(self.clock, self._timer_fired)
        self._publishing: set[asyncio.Task[None]] = set()
        self._workers = WorkerPool(
            self.bus,
            self.executors,
            concurrency=workers,
            clock=self.clock.now,
            new_event_id=self.new_event_id,
            secrets=secrets,
            start_durably=self._start_durably,
            max_output=max_step_output,
        )
        engine = lease if lease is not None else recover and self.store.url != "memory://"
        self._seat = (
            EngineSeat(
                self.store, self._apply_delivered, ttl=lease_ttl, wait_for_engine=wait_for_engine
            )
            if engine
            else None
        )
        """The store's engine lease and inbox (runtime/lease.py): one engine per store."""
        self._scheduler = Scheduler(
            store=self.store,
            bus=self.bus,
            runs=self._runs,
            plans=self._plans,
            listeners=self._listeners,
            relay=self._relay,
            batch_size=batch_size,
        )

    # -- lifecycle --------------------------------------------------------------

    async def __aenter__(self) -> Runtime:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def start(self) -> None:
        await self.store.open()
        await self.bus.open()
        if self._seat is not None:
            await self._seat.take()  # before anything of the store's runs is touched
        self._running = True
        self._scheduler.start()
        if self._worker_count:
            self._workers.start()
        if self._recover_on_start:
            await self._recover()
        if self._seat is not None:
            self._seat.start(self._lease_lost)

    async def close(self) -> None:
        self._running = False
        if self._seat is not None:
            await self._seat.stop_listening()
        await self._workers.close()
        await self._scheduler.stop()  # a batch being committed finishes first
        self._timers.close()
        for futures in self._waiters.values():
            for fut in futures:
                if not fut.done():
                    fut.cancel()
        for sink in self._sinks:
            closer = getattr(sink, "aclose", None)
            if closer is not None:
                with contextlib.suppress(Exception):
                    await closer()
        await self.executors.aclose()
        await self.bus.close()
        if self._seat is not None:
            await self._seat.release()
        await self.store.close()

    def _lease_lost(self) -> None:
        log.error("another engine took this store's lease over: this one stops advancing runs")
        self._running = False
        self._publishing.add(asyncio.get_running_loop().create_task(self._scheduler.stop()))

    async def _apply_delivered(self, events: list[Event]) -> None:
        """Apply events another process put into the inbox (runtime/inbox.py)."""
        for event in events:
            if isinstance(event, RunRetried):
                self._workers.forget_cancels(event.run_id)
        await self._scheduler.apply(events)

    def _compile_stored(self, source: Any) -> Plan:
        return coerce_plan(dict(source), self.executors)

    def new_event_id(self) -> str:
        return f"{self._prefix}-{next(self._ids)}"

    def add_listener(self, listener: Listener) -> None:
        """Call ``listener(state, transitions)`` after every committed change of a run."""
        self._listeners.append(listener)

    def remove_listener(self, listener: Listener) -> None:
        self._listeners.remove(listener)

    def add_event_sink(self, sink: EventSink) -> None:
        """Call ``sink(cloudevent)`` for every event an ``emit`` step publishes."""
        self._sinks.append(sink)

    # -- definitions and runs ---------------------------------------------------

    async def register(self, definition: Any) -> Plan:
        """Register a definition (Plan, Workflow builder, mapping, YAML text or file path)."""
        plan = coerce_plan(definition, self.executors)
        await self.store.save_definition(plan)
        self._plans.add(plan)
        return plan

    async def start_run(
        self,
        workflow: str | Plan | Any,
        input: Any = None,
        *,
        version: str | None = None,
        run_id: str | None = None,
        idempotency_key: str | None = None,
    ) -> str:
        """Start a run and return its id (the existing run's id for a reused idempotency key)."""
        self._require_started()
        plan = await self._resolve(workflow, version)
        self._check_input(plan, input)
        state, created = await self._create_run(
            plan, run_id or uuid.uuid4().hex, idempotency_key, None, None, input
        )
        if created:
            await self.bus.publish_events([self._started(state, input)])
        return state.run_id

    async def run(self, workflow: str | Plan | Any, input: Any = None, **kwargs: Any) -> RunResult:
        """Start a run and wait for it to end."""
        return await self.wait(await self.start_run(workflow, input, **kwargs))

    async def wait(self, run_id: str, timeout: float | None = None) -> RunResult:
        """Wait until the run is in a terminal state and return its result."""
        self._require_started()
        state = await self._state(run_id)
        if state.is_terminal and not self._scheduler.uncommitted(run_id):
            return result_of(state, await self._plans.get(state.plan_hash))
        fut: asyncio.Future[RunResult] = asyncio.get_running_loop().create_future()
        self._waiters[run_id].append(fut)
        return await asyncio.wait_for(fut, timeout)

    async def result(self, run_id: str) -> RunResult:
        """The run's current state, finished or not (sensitive fields masked)."""
        state = await self._state(run_id)
        return result_of(state, await self._plans.get(state.plan_hash))

    async def history(self, run_id: str) -> list[HistoryEntry]:
        """The run's history as a person may see it: sensitive step fields masked."""
        entries = await self.store.history(run_id)
        state = await self._state(run_id)
        plan = await self._plans.get(state.plan_hash)
        names = sorted({name for spec in plan.specs.values() for name in spec.sensitive})
        if not names:
            return entries
        return [replace(e, event=redact_fields(e.event, names)) for e in entries]

    async def state(self, run_id: str) -> RunState:
        """The run's live state (read-only by convention: the scheduler owns it)."""
        return await self._state(run_id)

    async def signal(
        self, run_id: str, name: str, payload: Any = None, *, signal_id: str | None = None
    ) -> None:
        """Send a signal to a run; a `wait` for ``name`` whose `match` holds receives it.

        ``UnknownSignal`` when no `wait` step of the run's plan waits for ``name``
        (runtime/signals.py); ``InputValidationError`` for a payload that cannot be stored."""
        self._require_started()
        try:
            storable.check(payload, f"the payload of signal {name!r}", self._max_step_output)
        except StepError as exc:
            raise InputValidationError(exc.message) from None
        state = await self._state(run_id)
        refuse_undeclared_signal(await self._plans.get(state.plan_hash), run_id, name)
        await self.bus.publish_events(
            [
                SignalReceived(
                    event_id=signal_id or self.new_event_id(),
                    run_id=run_id,
                    time=self.clock.now(),
                    name=name,
                    payload=payload,
                )
            ]
        )

    async def cancel(self, run_id: str, reason: str = "cancelled on request") -> RunStatus:
        """Ask a pending or running run to stop; return its status as it was asked.

        Running steps are cancelled; with `on_failure: compensate` the steps that completed
        are compensated before the run ends `cancelled` (or `compensation_failed`). A run
        that has ended, or is compensating already, is left as it is: nothing is recorded
        and its status is returned.
        """
        self._require_started()
        state = await self._state(run_id)
        if state.status not in (RunStatus.PENDING, RunStatus.RUNNING):
            return state.status
        await self.bus.publish_events([self.cancel_event(run_id, reason)])
        return state.status

    def cancel_event(self, run_id: str, reason: str) -> CancelRequested:
        return CancelRequested(
            event_id=self.new_event_id(), run_id=run_id, time=self.clock.now(), reason=reason
        )

    async def retry(self, run_id: str, reason: str = "retried on request") -> RunStatus:
        """Re-open a failed or timed-out run from the steps that did not succeed, and
        return its status once that is committed (``running``, or already ended when only
        engine steps were left).

        Succeeded steps keep their outputs and do not run again; failed, cancelled and
        skipped ones are decided again, each with a fresh attempt count; the history
        records a ``run_retried`` event. Raises ``RunNotRetryable`` for any other run.
        """
        self._require_started()
        state = await self._state(run_id)
        if state.status not in RETRYABLE:
            raise RunNotRetryable(
                f"run {run_id} is {state.status.value}: only a failed or timed-out run can "
                "be retried"
            )
        event = RunRetried(
            event_id=self.new_event_id(), run_id=run_id, time=self.clock.now(), reason=reason
        )
        self._workers.forget_cancels(run_id)
        await self._scheduler.apply([event], redeliver=False)
        return (await self._state(run_id)).status

    async def apply_now(self, event: Event, *, relay: bool = True) -> None:
        """Apply one event and commit it before returning (for tools that act on a store
        without running its workers: what the event dispatches runs on the next resume).
        ``relay=False`` carries out none of its commands (runtime/delivery.py)."""
        self._require_started()
        await self._scheduler.apply([event], redeliver=False, relay=relay)

    async def _start_durably(self, event: TaskStarted) -> bool:
        """Commit a worker's TaskStarted now (an ``idempotent: false`` step runs only after
        its start is recorded); False when it started nothing (stale or a duplicate). A
        cancelled attempt does not cut the commit short: the batch is shielded."""
        return event.event_id in await asyncio.shield(self._scheduler.apply([event]))

    async def unfinished(self) -> list[str]:
        """Ids of the runs in the store that have not ended."""
        return await self.store.unfinished_runs()

    # -- internals: runs --------------------------------------------------------

    def _require_started(self) -> None:
        if not self._running:
            raise RuntimeNotStarted()

    def _check_input(self, plan: Plan, input: Any) -> None:
        """Refuse an input that does not fit the plan or cannot be stored (no run is made)."""
        from tideflow.dsl.inputs import validate_input

        validate_input(plan, input)
        try:
            storable.check(input, "the run input", self._max_run_input)
        except StepError as exc:
            raise InputValidationError(exc.message) from None

    async def _resolve(self, workflow: Any, version: str | None) -> Plan:
        if isinstance(workflow, str) and not self._definitions.looks_like_path(workflow):
            try:
                return await self.store.get_definition(workflow, version)
            except NotFound:
                plan = self._definitions.find(workflow, version)
                if plan is None:
                    raise
                return await self.register(plan)
        return await self.register(workflow)

    async def _create_run(
        self,
        plan: Plan,
        run_id: str,
        idempotency_key: str | None,
        parent: str | None,
        parent_step: str | None,
        input: Any,
    ) -> tuple[RunState, bool]:
        self._plans.add(plan)
        state = new_run_state(
            run_id=run_id,
            workflow=plan.name,
            version=plan.version,
            plan_hash=plan.hash,
            created_at=self.clock.now(),
            parent_run_id=parent,
            parent_step_key=parent_step,
        )
        state.input = input
        run_id, created = await self.store.create_run(state, idempotency_key)
        if created:
            self._runs.add(state)
            return state, True
        return await self._state(run_id), False

    def _started(self, state: RunState, input: Any) -> RunStarted:
        return RunStarted(
            event_id=f"{state.run_id}:started",
            run_id=state.run_id,
            time=self.clock.now(),
            input=input,
            parent_run_id=state.parent_run_id,
            parent_step_key=state.parent_step_key,
        )

    async def _state(self, run_id: str) -> RunState:
        return (await self._runs.get(run_id)).state

    async def _recover(self) -> None:
        """Resume every unfinished run in the store: relay effects still in the outbox,
        start runs that were created but not started, re-arm timers, re-dispatch tasks
        whose result was never recorded (same attempt, same idempotency key); an attempt
        that a worker had started goes through the core as a ``TaskLost`` (dispatched
        again, or ``StepOutcomeUnknown`` for an ``idempotent: false`` step)."""
        pending = await self.store.pending_outbox()
        await self._relay([item.command for item in pending])
        self._scheduler.relayed([item.id for item in pending])
        for run_id in await self.store.unfinished_runs():
            try:
                state = await self._state(run_id)
                self._waits.update(state)
                if state.status.value == "pending":
                    await self.bus.publish_events([self._started(state, state.input)])
                    continue
                plan = await self._plans.get(state.plan_hash)
            except Exception as exc:  # a damaged run must not keep the others from resuming
                log.error("run %s cannot be resumed: %s: %s", run_id, type(exc).__name__, exc)
                continue
            await self._relay(resume_commands(plan, state, self.clock.now()))
            lost = lost_events(plan, state, self.clock.now())  # started, never finished
            if lost:
                await self.bus.publish_events(lost)

    async def _relay(self, commands: Sequence[Command]) -> None:
        tasks: list[DispatchTask] = []
        for command in commands:
            if isinstance(command, DispatchTask):
                tasks.append(command)
            elif isinstance(command, StartTimer):
                self._timers.arm(command.run_id, command.timer_id, command.fire_at)
            elif isinstance(command, CancelTimer):
                self._timers.cancel(command.run_id, command.timer_id)
            elif isinstance(command, CancelTask):
                if not _drop_task(tasks, command):
                    self._workers.cancel(command.run_id, command.step_key, command.attempt)
            else:
                await self._relay_other(command)
        if tasks:
            await self.bus.publish_tasks(tasks)

    async def _relay_other(self, command: Command) -> None:
        if isinstance(command, RunFinished):
            await self._run_finished(command)
        elif isinstance(command, StartChildRun):
            await self._start_child(command)
        elif isinstance(command, CancelChildRun):
            await self.bus.publish_events(
                [
                    CancelRequested(
                        event_id=self.new_event_id(),
                        run_id=command.child_run_id,
                        time=self.clock.now(),
                        reason=f"parent run {command.run_id} stopped",
                    )
                ]
            )
        elif isinstance(command, EmitEvent):
            await self._emit(command)

    async def _run_finished(self, command: RunFinished) -> None:
        waiters = [f for f in self._waiters.pop(command.run_id, ()) if not f.done()]
        if waiters:  # the result is built only for someone who waits for it
            state = await self._state(command.run_id)
            result = result_of(state, await self._plans.get(state.plan_hash))
            for fut in waiters:
                fut.set_result(result)
        self._runs.evict(command.run_id)
        if command.parent_run_id and command.parent_step_key:
            await self.bus.publish_events(
                [
                    ChildRunFinished(
                        event_id=f"{command.run_id}:finished",
                        run_id=command.parent_run_id,
                        time=self.clock.now(),
                        step_key=command.parent_step_key,
                        child_run_id=command.run_id,
                        status=command.status,
                        output=command.output,
                        error=command.error,
                    )
                ]
            )

    async def _start_child(self, command: StartChildRun) -> None:
        try:
            plan = await self._resolve(command.workflow, command.version)
            self._check_input(plan, command.input)
        except TideflowError as exc:
            if command.wait:
                await self._fail_child_start(command, exc)
            else:
                log.error(
                    "run %s: async child %s could not start: %s",
                    command.run_id,
                    command.workflow,
                    exc,
                )
            return
        parent = command.run_id if command.wait else None
        step = command.step_key if command.wait else None
        state, created = await self._create_run(
            plan, command.child_run_id, f"child:{command.child_run_id}", parent, step, command.input
        )
        if created:
            await self.bus.publish_events([self._started(state, command.input)])

    async def _fail_child_start(self, command: StartChildRun, exc: TideflowError) -> None:
        await self.bus.publish_events(
            [
                ChildRunFinished(
                    event_id=f"{command.child_run_id}:finished",
                    run_id=command.run_id,
                    time=self.clock.now(),
                    step_key=command.step_key,
                    child_run_id=command.child_run_id,
                    status="failed",
                    error=ErrorInfo(type=type(exc).__name__, message=exc.message, retryable=False),
                )
            ]
        )

    async def _emit(self, command: EmitEvent) -> None:
        event = command.event
        name = str(event.get("type"))
        now = self.clock.now()
        deliveries: list[Event] = [
            SignalReceived(
                event_id=f"{event['id']}>{run_id}",
                run_id=run_id,
                time=now,
                name=name,
                payload=event,
                buffer=False,
            )
            for run_id in self._waits.waiting_for(name)
            if run_id != command.run_id
        ]
        if deliveries:
            await self.bus.publish_events(deliveries)
        for sink in self._sinks:
            try:
                outcome = sink(event)
                if asyncio.iscoroutine(outcome):
                    await outcome
            except Exception:
                log.exception("event sink failed for event %s", event.get("id"))

    def _timer_fired(self, run_id: str, timer_id: str) -> None:
        event = TimerFired(
            event_id=f"{run_id}:{timer_id}:{self.new_event_id()}",
            run_id=run_id,
            time=self.clock.now(),
            timer_id=timer_id,
        )
        task = asyncio.get_running_loop().create_task(self.bus.publish_events([event]))
        self._publishing.add(task)  # keep a reference until it is done
        task.add_done_callback(self._publishing.discard)


def _drop_task(tasks: list[DispatchTask], cancel: CancelTask) -> bool:
    """Remove a task dispatched and cancelled in the same batch; True if it was there."""
    for index, task in enumerate(tasks):
        key = (task.run_id, task.step_key, task.attempt)
        if key == (cancel.run_id, cancel.step_key, cancel.attempt):
            del tasks[index]
            return True
    return False


__all__ = ["EventSink", "Listener", "Runtime"]
