"""The embedded runtime: one engine, one client and a worker pool in one process.

::

    async with Runtime() as rt:                      # in-memory store, in-process bus
        plan = await rt.register("flow.yaml")
        result = await rt.run("order-fulfillment", {"order_id": "A1"})

``Runtime`` only composes the three parts (see docs/concepts.md): the **engine**
(runtime/engine.py: scheduler, relay, timers, recovery) owns the runs; the **client**
(``rt.client``, tideflow/client.py) starts, steers and reads them, and every run method
here is the client's; the **worker** pool (worker/pool.py) runs the tasks the engine
dispatches.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tideflow.bus.backends.local import LocalBus
from tideflow.bus.base import Bus
from tideflow.client import Client
from tideflow.errors import RuntimeNotStarted
from tideflow.model import storable
from tideflow.model.events import Event, TaskStarted
from tideflow.model.plan import Plan, Priority
from tideflow.model.run import RunState
from tideflow.model.states import RunStatus, SignalOutcome
from tideflow.runtime import gc_tuning
from tideflow.runtime.admission import AdmissionLevels
from tideflow.runtime.catalog import Catalog
from tideflow.runtime.clock import Clock, SystemClock
from tideflow.runtime.delivery import deliver
from tideflow.runtime.engine import Engine
from tideflow.runtime.lease import DEFAULT_TTL, EngineSeat
from tideflow.runtime.observers import EngineObserver
from tideflow.runtime.partitions import Ownership, PartitionManager
from tideflow.runtime.relay import EventSink, Listener
from tideflow.runtime.result import RunResult
from tideflow.runtime.runs import DEFAULT_RUN_CACHE_SIZE, Plans
from tideflow.runtime.schedule_timers import ScheduleTimers
from tideflow.runtime.sweep import DEFAULT_INTERVAL as DEFAULT_SWEEP_INTERVAL
from tideflow.runtime.sweep import check_interval
from tideflow.store.backends.memory import MemoryStore
from tideflow.store.base import HistoryEntry, Lease, Store
from tideflow.worker.executors.registry import ExecutorRegistry
from tideflow.worker.interceptors import Interceptor
from tideflow.worker.pool import WorkerPool
from tideflow.worker.secrets import SecretProvider

if TYPE_CHECKING:
    from tideflow.observability.tracing import Tracing

log = logging.getLogger("tideflow.runtime")


class Runtime:
    """An embedded tideflow engine. Use as ``async with Runtime(...) as rt``."""

    def __init__(
        self,
        *,
        store: Store | str | None = None,
        bus: Bus | str | None = None,
        executors: ExecutorRegistry | None = None,
        workers: int = 32,
        clock: Clock | None = None,
        secrets: SecretProvider | None = None,
        definitions_dir: str | Path | None = None,
        batch_size: int = 512,
        recover: bool = True,
        max_step_output: int = storable.MAX_STEP_OUTPUT,
        max_run_input: int = storable.MAX_RUN_INPUT,
        interceptors: Sequence[Interceptor] = (),
        run_cache_size: int = DEFAULT_RUN_CACHE_SIZE,
        max_active_runs: int | None = None,
        max_tasks_in_flight: int | None = None,
        lease: bool | None = None,
        lease_ttl: float = DEFAULT_TTL,
        wait_for_engine: float = 0.0,
        on_lease_lost: Callable[[], None] | None = None,
        sweep_interval: float = DEFAULT_SWEEP_INTERVAL,
        cluster: bool = False,
        tracer_provider: Any = None,
        schedules: bool = False,
        gc_threshold: int | None = gc_tuning.DEFAULT_THRESHOLD,
    ) -> None:
        """``tracer_provider`` (an OpenTelemetry ``TracerProvider``; the ``otel`` extra)
        turns tracing on: a trace per run, a span per step attempt, trace context in task
        headers and ``http`` steps' requests (tideflow.observability.tracing,
        docs/observability.md); None: no tracing, and OpenTelemetry is not imported.
        ``interceptors`` wrap every attempt the workers run, outermost first (see
        tideflow.worker.interceptors): metrics, tracing, your own policies.
        ``max_active_runs``: the admission bound (runtime/admission.py): at most this many
        runs are active at once, the others wait ``pending`` and are admitted by priority,
        then age; None: a tenth of ``run_cache_size`` (the cache is made to hold at least
        the bound).
        ``max_tasks_in_flight``: no run is admitted while this many attempts are in flight
        (a wide DAG dispatches dozens at once: the bound keeps the wait behind them short);
        None: ``max_active_runs``.
        ``sweep_interval``: seconds between two rounds of the reconciliation sweep
        (runtime/sweep.py; 0 turns it off); only a runtime that recovers (the store's
        engine) sweeps.
        ``on_lease_lost`` is called when another engine took the store's lease over (this
        one has stopped advancing runs; `tideflow server` then exits).

        ``cluster=True`` (`tideflow server`): instead of the store's one engine lease, this
        engine holds leases on a share of the bus's event partitions beside any number of
        other servers and applies only those (runtime/partitions.py); ``lease_ttl`` is
        their lifetime, ``wait_for_engine`` how long to wait for an embedded engine.

        ``schedules=True`` (`tideflow server` sets it): this runtime fires the store's
        schedules (runtime/schedule_timers.py; any number of runtimes may, each slot
        starts one run).

        ``gc_threshold``: while the runtime runs, the garbage collector's first threshold
        (``gc.get_threshold()[0]``) is raised from CPython's 700 to this many allocations,
        which saves the engine 10-15% of its CPU time; None leaves the collector alone, as
        does a threshold the application set itself (runtime/gc_tuning.py says what it
        costs in memory)."""
        if gc_threshold is not None and gc_threshold < 1:
            raise ValueError(
                f"gc_threshold must be a positive number of allocations or None, not {gc_threshold}"
            )
        self._gc_threshold = gc_threshold
        self._gc_held = False
        if isinstance(store, str):
            from tideflow.store import open_store

            store = open_store(store)
        self.store = store or MemoryStore()
        if isinstance(bus, str):
            from tideflow.bus import open_bus

            bus = open_bus(bus)
        self.bus = bus or LocalBus()
        self.executors = executors or ExecutorRegistry()
        self.clock = clock or SystemClock()
        self._recover_on_start = recover
        self._worker_count = workers
        self._running = False
        self._prefix = uuid.uuid4().hex[:10]
        self._ids = itertools.count(1)
        self.tracing = None if tracer_provider is None else _tracing(tracer_provider)
        if self.tracing is not None:
            interceptors = [self.tracing.interceptor, *interceptors]
        catalog = Catalog(
            self.store,
            self.executors,
            clock=self.clock,
            definitions_dir=definitions_dir,
            max_run_input=max_run_input,
        )
        if self.store.compile_plan is None:
            self.store.compile_plan = catalog.compile_stored
        self._workers = WorkerPool(
            self.bus,
            self.executors,
            concurrency=workers,
            clock=self.clock.now,
            new_event_id=self.new_event_id,
            secrets=secrets,
            start_durably=self._start_durably,
            max_output=max_step_output,
            interceptors=interceptors,
        )
        engine = lease if lease is not None else recover and self.store.url != "memory://"
        self._seat = (
            EngineSeat(
                self.store, self._apply_delivered, ttl=lease_ttl, wait_for_engine=wait_for_engine
            )
            if engine and not cluster
            else None
        )
        self._wait_for_engine = wait_for_engine
        ownership = Ownership(self.bus.partitions) if cluster else None
        """The store's engine lease and inbox (runtime/lease.py): one engine per store."""
        self._on_lease_lost = on_lease_lost
        sweep = check_interval(sweep_interval)
        self._stopping: set[asyncio.Task[None]] = set()
        self._engine = Engine(
            store=self.store,
            bus=self.bus,
            catalog=catalog,
            clock=self.clock,
            new_event_id=self.new_event_id,
            batch_size=batch_size,
            run_cache_size=run_cache_size,
            max_active_runs=max_active_runs,
            max_tasks_in_flight=max_tasks_in_flight,
            sweep_interval=sweep if recover else 0.0,
            ownership=ownership,
            tracing=self.tracing,
        )
        self.partitions = (
            PartitionManager(
                self.store,
                ownership,
                take=self._engine.take,
                drop=self._engine.drop,
                ttl=lease_ttl,
                bus_claim=self.bus.lease,
            )
            if ownership is not None
            else None
        )
        """In a cluster: this server's partition leases (``owns(run_id)``, ``on_taken``)."""
        self.client = Client(
            self.store,
            self._engine,
            catalog,
            clock=self.clock,
            new_event_id=self.new_event_id,
            max_step_output=max_step_output,
            bus=self.bus,
            tracing=self.tracing,
        )
        """Start, steer and read runs (every run method of the runtime is the client's)."""
        self.schedules = (
            ScheduleTimers(
                self.store,
                self.client,
                self.clock,
                sweep_interval=sweep,
                observers=self._engine.observers,
            )
            if schedules
            else None
        )
        """The schedules' timers, when this runtime fires schedules."""
        if self.schedules is not None:
            self.client.schedules_changed = self.schedules.changed
            self._engine.listeners.append(self.schedules.run_changed)

    # -- lifecycle --------------------------------------------------------------

    async def __aenter__(self) -> Runtime:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def start(self) -> None:
        if not self._gc_held:
            self._gc_held = gc_tuning.hold(self._gc_threshold)
        try:
            await self._start()
        except BaseException:
            self._release_gc()  # nobody closes a runtime that did not start
            raise

    def _release_gc(self) -> None:
        if self._gc_held:
            self._gc_held = False
            gc_tuning.release()

    async def _start(self) -> None:
        await self.store.open()
        await self.bus.open()
        if self._seat is not None:
            await self._seat.take()  # before anything of the store's runs is touched
        if self.partitions is not None:
            await self.partitions.join(wait_for_engine=self._wait_for_engine)
        self._running = True
        if self._worker_count:
            self._workers.start()
        if self.partitions is not None:  # each partition is recovered as it is taken
            self._engine.start()
            await self.partitions.start()
            await self._start_schedules()
            return
        if self._recover_on_start:
            # Before the scheduler applies anything: what recovery finds in flight must be
            # what the previous engine left, not attempts this one has just dispatched
            # (those it would report lost and dispatch again while they run).
            await self._engine.recover()
        self._engine.start()
        if self._seat is not None:
            self._seat.start(self._lease_lost)
        await self._start_schedules()

    async def _start_schedules(self) -> None:
        if self.schedules is not None:
            await self.schedules.start()

    async def close(self) -> None:
        try:
            await self._close()
        finally:
            self._release_gc()

    async def _close(self) -> None:
        self._running = False
        if self.schedules is not None:
            self.schedules.close()
        if self._seat is not None:
            await self._seat.stop_listening()
        await self._workers.close()
        if self.partitions is not None:
            await self.partitions.halt()
        await self._engine.stop()  # a batch being committed finishes first
        for sink in self._engine.sinks:
            closer = getattr(sink, "aclose", None)
            if closer is not None:
                with contextlib.suppress(Exception):
                    await closer()
        await self.executors.aclose()
        await self.bus.close()
        if self._seat is not None:
            await self._seat.release()
        if self.partitions is not None:
            await self.partitions.close()
        await self.store.close()

    def _lease_lost(self) -> None:
        log.error("another engine took this store's lease over: this one stops advancing runs")
        self._running = False
        task = asyncio.get_running_loop().create_task(self._engine.halt())
        self._stopping.add(task)  # keep a reference until it is done
        task.add_done_callback(self._stopping.discard)
        if self._on_lease_lost is not None:
            self._on_lease_lost()

    async def _apply_delivered(self, events: list[Event]) -> None:
        """Apply events another process put into the inbox (runtime/inbox.py)."""
        await self._engine.commit(events)

    async def deliver(self, events: Sequence[Event]) -> Lease | None:
        """Get events to their runs from a process that runs no engine: into the inbox of
        the live engine (whose lease is returned), or, with none live, committed here for
        the next one without relaying anything (runtime/delivery.py)."""
        return await deliver(self.store, events, self._record)

    async def _record(self, events: Sequence[Event]) -> None:
        await self._engine.commit(events, relay=False)

    def new_event_id(self) -> str:
        return f"{self._prefix}-{next(self._ids)}"

    def add_listener(self, listener: Listener) -> None:
        """Call ``listener(state, transitions)`` after every committed change of a run (once
        its effects are relayed; an exception it raises is logged and changes nothing)."""
        self._engine.listeners.append(listener)

    def remove_listener(self, listener: Listener) -> None:
        self._engine.listeners.remove(listener)

    def add_observer(self, observer: EngineObserver) -> None:
        """Tell ``observer`` what the engine does: committed batches, failed effects,
        commits and event streams (runtime/observers.py; metrics hook in here)."""
        self._engine.observers.append(observer)

    def add_event_sink(self, sink: EventSink) -> None:
        """Call ``sink(cloudevent)`` for every event an ``emit`` step publishes."""
        self._engine.sinks.append(sink)

    @property
    def plans(self) -> Plans:
        """The plans this engine has loaded, by hash (``known(hash)`` reads without I/O)."""
        return self._engine.plans

    @property
    def relayed_outbox(self) -> frozenset[str]:
        """Outbox ids whose effect is done and that the next commit makes the store forget
        (still in ``Store.pending_outbox`` until then, and no backlog)."""
        return frozenset(self._engine.relay.relayed)

    @property
    def admission(self) -> AdmissionLevels:
        """The runs this engine admitted busy and its bound, its attempts in flight and
        their bound (runtime/admission.py)."""
        return self._engine.admission_state()

    @property
    def pending_effects(self) -> int:
        """Effects of committed batches that failed and are being tried again (the relay)."""
        return self._engine.relay.pending

    # -- definitions and runs (the client's) ------------------------------------

    async def register(self, definition: Any) -> Plan:
        """Register a definition (Plan, Workflow builder, mapping, YAML text or file path)."""
        return await self.client.register(definition)

    async def start_run(
        self,
        workflow: str | Plan | Any,
        input: Any = None,
        *,
        version: str | None = None,
        run_id: str | None = None,
        idempotency_key: str | None = None,
        priority: Priority | str | None = None,
    ) -> str:
        """Start a run and return its id (the existing run's id for a reused idempotency
        key); ``priority``: its place in the admission queue (high, normal, low)."""
        self._require_started()
        return await self.client.start(
            workflow,
            input,
            version=version,
            run_id=run_id,
            idempotency_key=idempotency_key,
            priority=priority,
        )

    async def run(self, workflow: str | Plan | Any, input: Any = None, **kwargs: Any) -> RunResult:
        """Start a run and wait for it to end."""
        return await self.wait(await self.start_run(workflow, input, **kwargs))

    async def wait(self, run_id: str, timeout: float | None = None) -> RunResult:
        """Wait until the run is in a terminal state and return its result."""
        self._require_started()
        return await self.client.wait(run_id, timeout)

    async def result(self, run_id: str) -> RunResult:
        """The run's current state, finished or not (sensitive fields masked)."""
        return await self.client.get(run_id)

    async def history(self, run_id: str) -> list[HistoryEntry]:
        """The run's history as a person may see it: sensitive step fields masked."""
        return await self.client.history(run_id)

    async def state(self, run_id: str) -> RunState:
        """The run's state as committed (read-only by convention: the engine owns it); a
        change being committed is waited for."""
        return await self.client.state(run_id)

    async def signal(
        self, run_id: str, name: str, payload: Any = None, *, signal_id: str | None = None
    ) -> SignalOutcome:
        """Send a signal to a run; a `wait` for ``name`` whose `match` holds receives it
        (``UNMATCHED``, changing nothing, when the run has ended).

        ``UnknownSignal`` when no `wait` step of the run's plan waits for ``name``
        (runtime/signals.py); ``InputValidationError`` for a payload that cannot be stored."""
        self._require_started()
        return await self.client.signal(run_id, name, payload, signal_id=signal_id)

    async def cancel(self, run_id: str, reason: str = "cancelled on request") -> RunStatus:
        """Ask a pending or running run to stop; return its status as it was asked.

        Running steps are cancelled; with `on_failure: compensate` the steps that completed
        are compensated before the run ends `cancelled` (or `compensation_failed`). A run
        that has ended, or is compensating already, is left as it is: nothing is recorded
        and its status is returned.
        """
        self._require_started()
        return await self.client.cancel(run_id, reason)

    async def retry(self, run_id: str, reason: str = "retried on request") -> RunStatus:
        """Re-open a failed or timed-out run from the steps that did not succeed, and
        return its status once that is committed (``running``, or already ended when only
        engine steps were left).

        Succeeded steps keep their outputs and do not run again; failed, cancelled and
        skipped ones are decided again, each with a fresh attempt count; the history
        records a ``run_retried`` event. Raises ``RunNotRetryable`` for any other run.
        """
        self._require_started()
        return await self.client.retry(run_id, reason)

    async def unfinished(self) -> list[str]:
        """Ids of the runs in the store that have not ended."""
        return await self.client.unfinished()

    def _require_started(self) -> None:
        if not self._running:
            raise RuntimeNotStarted()

    async def _start_durably(self, event: TaskStarted) -> bool:
        return await self._engine.start_durably(event)


__all__ = ["EventSink", "Listener", "Runtime"]


def _tracing(tracer_provider: Any) -> Tracing:
    from tideflow.observability.tracing import Tracing

    return Tracing(tracer_provider)
