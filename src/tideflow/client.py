"""The client: what the CLI, the HTTP API and the UI call to start, steer and read runs.

::

    client = runtime.client                          # embedded: beside a live engine
    run_id = await client.start("order-fulfillment", {"order_id": "A1"})
    await client.signal(run_id, "approval", {"approved": True})
    result = await client.wait(run_id)

A client reads from the store (``list``, ``history``) and reaches the engine that owns
runs through one port, ``EngineLink``: hand it events (a signal, a cancellation, a new
run's start), have one committed now (a retry), read a run's state, wait for a run to
end. Whether the events go to a live engine or are recorded for the next one is the
link's business: ``Client.recording()`` is a client whose events are committed at once,
for the next engine to carry out (what `tideflow runs signal` does when no engine runs).

In cluster mode a process with no engine at all opens a client on the cluster's store and
bus (``Client.connect``): events go onto the bus for the `tideflow server` that owns the
runs, reads come from the store (runtime/remote.py)::

    async with Client.connect(store="postgresql://db/tideflow", bus="redis://mq:6379/0") as c:
        run_id = await c.start("order-fulfillment", {"order_id": "A1"})
        result = await c.wait(run_id)
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import uuid
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from tideflow.bus.base import NO_HEADERS, Bus, Headers, QueueStats, WorkerBeat
from tideflow.errors import (
    BusError,
    DefinitionInactive,
    InputValidationError,
    NotFound,
    RunNotRetryable,
    StepError,
)
from tideflow.model import storable
from tideflow.model.events import CancelRequested, Event, RunRetried, RunStarted, SignalReceived
from tideflow.model.masking import mask
from tideflow.model.plan import Plan, Priority
from tideflow.model.run import RunState, run_priority
from tideflow.model.schedules import ScheduleRow
from tideflow.model.states import RUN_RETRYABLE, RunStatus, SignalOutcome
from tideflow.model.versions import version_key
from tideflow.runtime import schedules
from tideflow.runtime.admission import AdmissionLevels
from tideflow.runtime.catalog import started_event
from tideflow.runtime.correlate import Correlator
from tideflow.runtime.result import RunResult, plan_sensitive, result_of
from tideflow.runtime.signals import refuse_undeclared_signal
from tideflow.runtime.triggers import Triggered, start_triggered
from tideflow.store.base import (
    DefinitionSummary,
    HistoryEntry,
    Lease,
    RunFilter,
    RunPage,
    RunSummary,
    Store,
)

Deliver = Callable[[Sequence[Event]], Awaitable[Lease | None]]
"""Gets events to their runs from a process without an engine (``Runtime.deliver``): the
live engine's lease when they went to it, None when they were recorded for the next."""

if TYPE_CHECKING:
    from tideflow.bus.base import Bus
    from tideflow.observability.tracing import Tracing
    from tideflow.runtime.catalog import Catalog
    from tideflow.runtime.clock import Clock
    from tideflow.runtime.why import Diagnosis

__all__ = ["Client", "EngineLink"]


class EngineLink(ABC):
    """How a client reaches the engine that owns runs (the one seam between the two)."""

    engine_here: bool = False
    """Whether the engine is in this process (an embedded `Runtime`'s own)."""

    def relaying(self, run_id: str) -> list[tuple[str, int]]:
        """The run's effects this engine failed to carry out and tries again: (what,
        tries); an engine elsewhere is not asked (its outbox rows are read instead)."""
        return []

    def admission_state(self) -> AdmissionLevels | None:
        """The engine's admission now (runtime/admission.py); None for an engine elsewhere
        (each server has its own: see its metrics)."""
        return None

    @abstractmethod
    async def deliver(self, events: Sequence[Event], headers: Headers = NO_HEADERS) -> None:
        """Hand events to the engine: a live engine takes them and applies them soon, or
        they are recorded for the next engine. Raises when they could not be handed over.
        ``headers``: every event's bus headers (the sender's trace context), lost when the
        events are recorded rather than sent."""

    @abstractmethod
    async def commit(self, events: Sequence[Event], headers: Headers = NO_HEADERS) -> None:
        """Apply events and return once they are committed (``headers`` as ``deliver``)."""

    @abstractmethod
    async def start_run(self, state: RunState, event: RunStarted) -> None:
        """A new run is stored (pending): hand over its ``RunStarted``."""

    @abstractmethod
    async def state(self, run_id: str) -> RunState:
        """The run's current state as committed (never a change a crash could still undo);
        ``NotFound``."""

    @abstractmethod
    async def wait(self, run_id: str, timeout: float | None = None) -> RunResult:
        """The run's result once it is in a terminal state."""


class Client:
    def __init__(
        self,
        store: Store,
        link: EngineLink,
        catalog: Catalog,
        *,
        clock: Clock,
        new_event_id: Callable[[], str],
        max_step_output: int = storable.MAX_STEP_OUTPUT,
        bus: Bus | None = None,
        tracing: Tracing | None = None,
    ) -> None:
        """``tracing``: spans for the runs this client starts and the signals it sends
        (tideflow.observability.tracing); None: none."""
        self.store = store
        self.tracing = tracing
        self._bus = bus
        self._link = link
        self._catalog = catalog
        self._clock = clock
        self._new_id = new_event_id
        self._max_step_output = max_step_output
        self._correlator = Correlator(store)
        self._shown: dict[tuple[str, str], tuple[builtins.list[str], str | None]] = {}
        """(workflow, version) -> the names its definition declares sensitive, and its
        title (a registered version never changes: an entry never goes stale)."""
        self.schedules_changed: Callable[[], None] | None = None
        """Called after this client changed a schedule or a definition (a runtime that
        fires schedules looks at them again at once)."""

    @classmethod
    def connect(
        cls, store: Store | str, bus: Bus | str, **options: Any
    ) -> AbstractAsyncContextManager[Client]:
        """A client on a cluster's store and bus (URLs, or opened by it), with no engine in
        this process: ``async with Client.connect(store=URL, bus=URL) as client``. Events go
        onto the bus for the `tideflow server` that owns the runs; reads come from the
        store; ``wait`` wakes on the run ends the server announces on the bus (and reads
        the run's summary every ``remote.RECHECK`` seconds, in case one is lost). Options:
        ``executors``, ``clock``, ``max_step_output``, ``max_run_input``, ``apply_timeout``
        (seconds ``retry`` waits for the engine to commit; default 30), ``tracer_provider``
        (OpenTelemetry: the runs it starts join the caller's trace). See
        runtime/remote.py."""
        from tideflow.runtime.remote import connect

        return connect(store, bus, **options)

    def recording(self, via: Deliver | None = None) -> Client:
        """This client with every event committed before a call returns: for a tool that
        acts on a store no engine is running on here (the next engine carries the work
        out). ``via`` delivers instead, to an engine live in another process if there is
        one (``Runtime.deliver``); ``delivered_to`` then names it."""
        return Client(
            self.store,
            _Recording(self._link, via),
            self._catalog,
            clock=self._clock,
            new_event_id=self._new_id,
            max_step_output=self._max_step_output,
            bus=self._bus,
            tracing=self.tracing,
        )

    # -- starting and steering runs ---------------------------------------------

    async def register(self, definition: Any) -> Plan:
        """Register a definition (Plan, Workflow builder, mapping, YAML text or file path).
        Its ``schedule:`` becomes the workflow's schedules when it is the highest active
        version (runtime/schedules.py)."""
        plan = await self._catalog.register(definition)
        await self._sync_schedules(plan.name)
        return plan

    def compile(self, definition: Any) -> Plan:
        """Compile a definition without registering it (what ``register`` accepts);
        ``DefinitionError`` lists every problem."""
        return self._catalog.compile(definition)

    def action_types(self) -> Mapping[str, Mapping[str, Any]]:
        """The config schema of each step type this client's executors check (the others
        take any config): what compiling checks action steps against, in this process or
        another (the API's compiler pool, api/compiling.py)."""
        return self._catalog.action_types()

    async def definitions(self, name: str | None = None) -> builtins.list[DefinitionSummary]:
        """Registered definitions (of workflow ``name`` only, when given), by name then
        version."""
        return await self.store.list_definitions(name)

    async def definition(self, name: str, version: str | None = None) -> Plan:
        """A registered definition by name and version (the highest active one when no
        version is given, or the highest of all when every version is deactivated);
        ``NotFound``."""
        try:
            return await self.store.get_definition(name, version)
        except DefinitionInactive:
            versions = [d.version for d in await self.store.list_definitions(name)]
            return await self.store.get_definition(name, max(versions, key=version_key))

    async def activate(self, name: str, version: str, active: bool = True) -> bool:
        """Activate (or, with ``active=False``, deactivate) a registered version: whether
        that changed anything; ``NotFound``. A deactivated version starts no new run (by
        name, by version, or from an event); its runs go on. The workflow's schedules
        become those of its highest active version."""
        changed = await self.store.set_definition_active(name, version, active)
        if changed:
            await self._sync_schedules(name)
        return changed

    async def _sync_schedules(self, name: str) -> None:
        await schedules.sync_workflow(self.store, name, self._clock.now())
        self._schedules_changed()

    def _schedules_changed(self) -> None:
        if self.schedules_changed is not None:
            self.schedules_changed()

    # -- schedules (runtime/schedules.py, docs/schedules.md) ----------------------

    async def schedules(self, workflow: str | None = None) -> builtins.list[ScheduleRow]:
        """The schedules (of ``workflow`` only, when given) with their next fire times,
        by workflow then id; deleted ones are left out."""
        return [r for r in await self.store.list_schedules(workflow) if not r.deleted]

    async def schedule(self, workflow: str, schedule_id: str) -> ScheduleRow:
        """One schedule; ``NotFound``."""
        return await schedules.find(self.store, workflow, schedule_id)

    async def create_schedule(self, workflow: str, schedule: Mapping[str, Any]) -> ScheduleRow:
        """Add a schedule to a registered workflow: one mapping as ``schedule:`` takes,
        with an ``id`` (``{"id": "nightly", "cron": "0 2 * * *", "timezone": "UTC"}``). It
        starts the workflow's highest active version; registering versions leaves it
        alone. ``DefinitionError`` (every problem of the mapping), ``NotFound``,
        ``InputValidationError``, ``DefinitionConflict`` (the id is taken)."""
        row = await schedules.create(self, workflow, schedule, self._clock.now())
        self._schedules_changed()
        return row

    def check_input(self, plan: Plan, input: Any) -> None:
        """Refuse an input that does not fit the plan or cannot be stored."""
        self._catalog.check_input(plan, input)

    async def pause_schedule(self, workflow: str, schedule_id: str) -> bool:
        """Pause a schedule (it starts no run until resumed): whether it was running;
        ``NotFound``."""
        changed = await schedules.set_paused(
            self.store, workflow, schedule_id, True, self._clock.now()
        )
        self._schedules_changed()
        return changed

    async def resume_schedule(self, workflow: str, schedule_id: str) -> bool:
        """Resume a paused schedule from its next slot (the slots that passed while it was
        paused start nothing): whether it was paused; ``NotFound``."""
        changed = await schedules.set_paused(
            self.store, workflow, schedule_id, False, self._clock.now()
        )
        self._schedules_changed()
        return changed

    async def trigger_schedule(self, workflow: str, schedule_id: str) -> str:
        """Start the schedule's run now (whatever ``overlap``, paused or not), with
        ``inputs.scheduled_at`` now: its run id; ``NotFound``."""
        return await schedules.trigger(self, workflow, schedule_id, self._clock.now())

    async def delete_schedule(self, workflow: str, schedule_id: str) -> None:
        """Delete a schedule: it starts no run any more. Registering the same version
        again does not bring it back; a new version with that schedule does. ``NotFound``."""
        await schedules.delete(self.store, workflow, schedule_id)
        self._schedules_changed()

    async def start(
        self,
        workflow: str | Plan | Any,
        input: Any = None,
        *,
        version: str | None = None,
        run_id: str | None = None,
        idempotency_key: str | None = None,
        priority: Priority | str | None = None,
    ) -> str:
        """Start a run and return its id (the existing run's id for a reused idempotency key)."""
        started, _ = await self.launch(
            workflow,
            input,
            version=version,
            run_id=run_id,
            idempotency_key=idempotency_key,
            priority=priority,
        )
        return started

    async def launch(
        self,
        workflow: str | Plan | Any,
        input: Any = None,
        *,
        version: str | None = None,
        run_id: str | None = None,
        idempotency_key: str | None = None,
        priority: Priority | str | None = None,
    ) -> tuple[str, bool]:
        """``start``, saying whether a run was created: ``(run_id, True)``; for an
        idempotency key already used nothing starts: ``(the existing run's id, False)``.
        ``workflow`` may be a file (``flow.yaml``, ``flow.py[:name]``), registered first:
        what a request names goes through ``launch_registered`` instead."""
        plan = await self._catalog.resolve(workflow, version)
        return await self._launch(plan, input, run_id, idempotency_key, priority)

    async def launch_registered(
        self,
        name: str,
        input: Any = None,
        *,
        version: str | None = None,
        run_id: str | None = None,
        idempotency_key: str | None = None,
        priority: Priority | str | None = None,
    ) -> tuple[str, bool]:
        """``launch`` by the name of a registered workflow only (``Catalog.registered``):
        ``name`` is never read as a file or imported as a module, whatever it looks like
        (the HTTP API's ``POST /runs``, where the caller does not own the server's files).
        ``NotFound`` naming nothing but ``name`` and ``version`` for any other."""
        plan = await self._catalog.registered(name, version)
        return await self._launch(plan, input, run_id, idempotency_key, priority)

    async def _launch(
        self,
        plan: Plan,
        input: Any,
        run_id: str | None,
        idempotency_key: str | None,
        priority: Priority | str | None,
    ) -> tuple[str, bool]:
        """``priority``: the run's place in the admission queue (runtime/admission.py:
        high, normal, low; None: normal)."""
        catalog = self._catalog
        rank = run_priority(priority)
        await catalog.admit_input(plan, input)
        run_id = run_id or uuid.uuid4().hex
        if self.tracing is None:
            stored_id, state = await catalog.create(
                plan, run_id, idempotency_key, input, priority=rank
            )
        else:  # the run's span, under the caller's: its context is stored with the run
            with self.tracing.run_span(
                run_id=run_id, workflow=plan.name, version=plan.version
            ) as trace:
                stored_id, state = await catalog.create(
                    plan, run_id, idempotency_key, input, trace=trace, priority=rank
                )
        if state is not None:
            await self._link.start_run(state, started_event(state, self._clock.now()))
        return stored_id, state is not None

    async def deliver_event(self, name: str, payload: Any, *, event_id: str) -> builtins.list[str]:
        """Send a signal to every run waiting for ``name`` whose wait could take this
        payload, found by correlation (runtime/correlate.py), not by reading every waiting
        run: the run ids it went to ([] when none waits for it: unmatched). Each run's
        `match` decides; nothing is kept for a later wait; ``event_id`` sent again is
        applied once in each run (its id there is ``<event_id>><run id>``, as for
        `emit`). ``InputValidationError`` for a payload that cannot be
        stored."""
        try:
            storable.check(payload, f"the payload of signal {name!r}", self._max_step_output)
        except StepError as exc:
            raise InputValidationError(exc.message) from None
        run_ids = await self._correlator.candidates(name, payload)
        now = self._clock.now()
        events: builtins.list[Event] = [
            SignalReceived(
                event_id=f"{event_id}>{run_id}",  # event ids are unique across runs
                run_id=run_id,
                time=now,
                name=name,
                payload=payload,
                buffer=False,
            )
            for run_id in run_ids
        ]
        if events:  # they carry the current span's context (the gateway's `event <type>`)
            tracing = self.tracing
            await self._link.deliver(
                events, NO_HEADERS if tracing is None else tracing.current_headers()
            )
        return run_ids

    async def trigger(self, event: Mapping[str, Any], *, key: str) -> builtins.list[Triggered]:
        """Start a run of each workflow whose active version has a trigger on the event's
        ``type`` that matches it (runtime/triggers.py); ``key`` identifies the event, so
        the same key again starts nothing new. What became of each such workflow."""
        return await start_triggered(self, event, key)

    async def signal(
        self, run_id: str, name: str, payload: Any = None, *, signal_id: str | None = None
    ) -> SignalOutcome:
        """Send a signal to a run; a `wait` for ``name`` whose `match` holds receives it,
        now or, if it comes later, within its ``buffer``. A ``signal_id`` sent again is
        applied once. ``UNMATCHED`` (nothing sent) when the run has ended.

        ``UnknownSignal`` when no `wait` step of the run's plan waits for ``name``;
        ``InputValidationError`` for a payload that cannot be stored."""
        try:
            storable.check(payload, f"the payload of signal {name!r}", self._max_step_output)
        except StepError as exc:
            raise InputValidationError(exc.message) from None
        state = await self._link.state(run_id)
        refuse_undeclared_signal(await self._catalog.plans.get(state.plan_hash), run_id, name)
        if state.is_terminal:
            return SignalOutcome.UNMATCHED
        event = SignalReceived(
            event_id=signal_id or self._new_id(),
            run_id=run_id,
            time=self._clock.now(),
            name=name,
            payload=payload,
        )
        with self._sending(f"signal {name}", state, {"tideflow.signal": name}) as headers:
            await self._link.deliver([event], headers)
        return SignalOutcome.DELIVERED

    async def cancel(self, run_id: str, reason: str = "cancelled on request") -> RunStatus:
        """Ask a pending or running run to stop; return its status as it was asked (a run
        that ended, or is compensating already, is left as it is)."""
        state = await self._link.state(run_id)
        if state.status not in (RunStatus.PENDING, RunStatus.RUNNING):
            return state.status
        status = state.status
        event = CancelRequested(
            event_id=self._new_id(), run_id=run_id, time=self._clock.now(), reason=reason
        )
        with self._sending(f"cancel {state.workflow}", state) as headers:
            await self._link.deliver([event], headers)
        return status

    async def retry(self, run_id: str, reason: str = "retried on request") -> RunStatus:
        """Re-open a failed or timed-out run from the steps that did not succeed; return
        its status once that is committed. ``RunNotRetryable`` for any other run."""
        state = await self._link.state(run_id)
        if state.status not in RUN_RETRYABLE:
            raise RunNotRetryable(
                f"run {run_id} is {state.status.value}: only a failed or timed-out run can "
                "be retried"
            )
        event = RunRetried(
            event_id=self._new_id(), run_id=run_id, time=self._clock.now(), reason=reason
        )
        with self._sending(f"retry {state.workflow}", state) as headers:
            await self._link.commit([event], headers)
        return (await self._link.state(run_id)).status

    def _sending(
        self, span: str, state: RunState, attributes: Mapping[str, str] | None = None
    ) -> AbstractContextManager[Headers]:
        """With tracing on, the span ``span`` of a signal, cancel or retry: in the caller's
        trace, linked to the run's; it yields the headers its event carries. Without
        tracing, no header."""
        if self.tracing is None:
            return contextlib.nullcontext(NO_HEADERS)
        named = {"tideflow.run_id": state.run_id, "tideflow.workflow": state.workflow}
        return self.tracing.sending(
            span, state.run_id, state.trace, {**named, **(attributes or {})}
        )

    # -- reading runs -----------------------------------------------------------

    async def get(self, run_id: str) -> RunResult:
        """The run's current state, finished or not (sensitive fields masked)."""
        state = await self._link.state(run_id)
        return result_of(state, await self._catalog.plans.get(state.plan_hash))

    async def summary(self, run_id: str) -> RunSummary:
        """The run's summary row (its output masked as ``get`` masks it, with its
        definition's title); ``NotFound``."""
        return (await self._as_shown([await self.store.get_run(run_id)]))[0]

    async def list(
        self, filter: RunFilter | None = None, *, limit: int = 100, cursor: str | None = None
    ) -> RunPage:
        """Runs, newest first, one page at a time (outputs masked as ``get`` masks them,
        each with its definition's title)."""
        page = await self.store.list_runs(filter, limit=limit, cursor=cursor)
        return replace(page, runs=await self._as_shown(page.runs))

    async def _as_shown(self, summaries: builtins.list[RunSummary]) -> builtins.list[RunSummary]:
        out = []
        for summary in summaries:
            names, title = await self._shown_of(summary.workflow, summary.version)
            output = summary.output if summary.output is None else mask(summary.output, names)
            if output is not summary.output or title is not None:
                summary = replace(summary, output=output, title=title)
            out.append(summary)
        return out

    async def _shown_of(self, workflow: str, version: str) -> tuple[builtins.list[str], str | None]:
        """The sensitive names and the title of a definition version, read once."""
        known = self._shown.get((workflow, version))
        if known is not None:
            return known
        try:
            plan = await self.store.get_definition(workflow, version)
        except NotFound:  # a run of a plan that is not a registered definition (yet)
            return [], None
        known = self._shown[(workflow, version)] = (plan_sensitive(plan), plan.title)
        return known

    async def history(self, run_id: str) -> builtins.list[HistoryEntry]:
        """The run's history as a person may see it: sensitive step fields masked."""
        state = await self._link.state(run_id)  # first: a change being committed is waited for
        entries = await self.store.history(run_id)
        names = plan_sensitive(await self._catalog.plans.get(state.plan_hash))
        return [replace(e, event=mask(e.event, names)) for e in entries]

    async def state(self, run_id: str) -> RunState:
        """The run's current state (read-only: the engine owns it)."""
        return await self._link.state(run_id)

    async def plan(self, run_id: str) -> Plan:
        """The plan the run pinned when it started."""
        return await self.pinned(await self._link.state(run_id))

    async def pinned(self, state: RunState) -> Plan:
        """The plan a run state pinned (one read of the run for state and plan)."""
        return await self._catalog.plans.get(state.plan_hash)

    async def wait(self, run_id: str, timeout: float | None = None) -> RunResult:
        """Wait until the run is in a terminal state and return its result."""
        return await self._link.wait(run_id, timeout)

    @property
    def delivered_to(self) -> Lease | None:
        """The live engine the last event went to (a recording client's), or None."""
        return self._link.delivered_to if isinstance(self._link, _Recording) else None

    async def queues(self) -> builtins.list[QueueStats]:
        """The task queues of the bus this client's events go on: per queue and priority,
        what waits, what is held, the oldest one's age and the consumers
        (``Bus.queue_stats``)."""
        if self._bus is None:
            raise BusError("this client has no bus to ask for its queues")
        return await self._bus.queue_stats()

    async def worker_beats(self) -> builtins.list[WorkerBeat]:
        """The workers' task readers on this client's bus, live or stopped not long ago,
        with their last heartbeat (``Bus.worker_beats``)."""
        if self._bus is None:
            raise BusError("this client has no bus to ask for its workers")
        return await self._bus.worker_beats()

    @property
    def engine_here(self) -> bool:
        """Whether this client's engine runs in this process (a `Runtime`'s client)."""
        return self._link.engine_here

    def relaying(self, run_id: str) -> builtins.list[tuple[str, int]]:
        """The run's effects the engine tries again after a failure (`EngineLink`)."""
        return self._link.relaying(run_id)

    def admission(self) -> AdmissionLevels | None:
        """The engine's admission now, when the engine is in this process."""
        return self._link.admission_state()

    async def why(self, run_id: str) -> Diagnosis:
        """Why the run is where it is: what each of its unfinished steps waits for, read
        from the store (and the bus's queues, when this client has a bus); changes
        nothing (runtime/why.py). ``NotFound``."""
        from tideflow.runtime.why import diagnose

        return await diagnose(self, run_id, now=self._clock.now())

    async def unfinished(self) -> builtins.list[str]:
        """Ids of the runs in the store that have not ended."""
        return await self.store.unfinished_runs()


class _Recording(EngineLink):
    """Commits what it is handed at once: the next engine carries out what it unlocks."""

    def __init__(self, engine: EngineLink, via: Deliver | None = None) -> None:
        self._engine = engine
        self._via = via
        self.delivered_to: Lease | None = None

    async def deliver(self, events: Sequence[Event], headers: Headers = NO_HEADERS) -> None:
        await self.commit(events, headers)

    async def commit(self, events: Sequence[Event], headers: Headers = NO_HEADERS) -> None:
        if self._via is None:
            await self._engine.commit(events, headers)
        else:  # through the store's inbox, which keeps no headers
            self.delivered_to = await self._via(events)

    async def start_run(self, state: RunState, event: RunStarted) -> None:
        await self.commit([event])

    async def state(self, run_id: str) -> RunState:
        return await self._engine.state(run_id)

    async def wait(self, run_id: str, timeout: float | None = None) -> RunResult:
        async with asyncio.timeout(timeout):
            return await self._engine.wait(run_id)
