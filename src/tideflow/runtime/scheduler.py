"""The scheduler loop: events in, ``decide``, one commit per batch, commands out.

It takes every event the bus has ready (up to ``batch_size``, one delivered
batch), applies each to its run through the pure core, commits the whole batch to
the store in one call (group commit), hands the committed batch to the relay
(runtime/relay.py), which carries out its effects until they succeed and then tells
the listeners, and acknowledges the batch to the bus: its effects do not wait for the
ack. A batch is acknowledged only after it is committed: one that comes again (its lease ran out, the process died) is
applied again harmlessly, since every event the core already applied is stale or a
duplicate to it and changes nothing. Events the
scheduler sends back to itself (a redelivery, the ``EngineFailed`` of a poison run) go
through the relay as well, so a bus that fails for a while loses none of them.

One run never holds up the others (see ``poison``). A run whose event cannot be
applied, or whose events cannot be stored, is failed with an ``EngineError``
(an ``EngineFailed`` event through the core) and the rest of its batch goes on.
When a group commit fails, the batch is forgotten (its runs reload from the
store) and, unless the store is unavailable, each run is committed alone to
find the one at fault. A store that is unavailable fails no run: the whole
batch comes again after a backoff; a run that alone could not be committed
comes again after a backoff of its own, without blocking the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any

from tideflow import faults, logcontext
from tideflow.bus.base import NO_HEADERS, TRACEPARENT, Bus, EventBatch, Headers
from tideflow.bus.closing import cancel_and_wait
from tideflow.core.decide import decide
from tideflow.errors import NotFound, StoreUnavailable
from tideflow.model.events import EngineFailed, Event, RunRetried, RunStarted
from tideflow.model.plan import Plan
from tideflow.model.states import RunStatus
from tideflow.runtime.admission import Admission
from tideflow.runtime.commits import Outcome, commit_apart
from tideflow.runtime.observers import Observers
from tideflow.runtime.partitions import Ownership
from tideflow.runtime.poison import DEFINITELY_DATA, Failure, classify, describe, engine_failed
from tideflow.runtime.relay import Relay
from tideflow.runtime.runs import LiveRun, Plans, RunCache
from tideflow.store.base import AppliedEvent, Store

log = logging.getLogger("tideflow.scheduler")

CONSUME_RETRY_FIRST = 0.05
FORGET_AFTER = 0.2
"""Seconds without a commit after which a scheduler has the store forget the outbox rows
relayed since its last commit, alone (a busy one's next commit forgets them first, and
then no commit of its own is made: at most one per this many seconds of quiet)."""
CONSUME_RETRY_MAX = 5.0
"""Seconds before an event stream that failed is opened again (doubling up to the max)."""
BatchSpans = Callable[[int, Sequence[AppliedEvent], Mapping[str, Headers]], None]
"""Told of a committed batch: when it began (ns since the epoch), its committed events,
and the headers of those that carried a ``traceparent``, by event id."""


class Scheduler:
    def __init__(
        self,
        *,
        store: Store,
        bus: Bus,
        runs: RunCache,
        plans: Plans,
        relay: Relay,
        batch_size: int,
        ownership: Ownership | None = None,
        observers: Observers | None = None,
    ) -> None:
        """``ownership``: in a cluster, the partitions to consume (runtime/partitions.py);
        None consumes every partition (embedded mode). ``observers`` hear of failed commits
        and event streams (runtime/observers.py)."""
        self._store = store
        self._observers = observers if observers is not None else Observers()
        self._ownership = ownership
        self._bus = bus
        self._runs = runs
        self._plans = plans
        self._relay = relay
        self._batch_size = batch_size
        self._lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self._in_flight: set[str] = set()
        """Runs changed by the batch being applied and not yet committed."""
        self._applier: asyncio.Task[Any] | None = None
        """The task applying the batch in progress (its listeners and sinks run in it)."""
        self._settled: asyncio.Future[None] | None = None
        """Set when the batch in progress ends: what `settled` callers wait for."""
        self._retry_delay = 0.05
        self._run_retries: dict[str, int] = {}
        """Runs whose commit alone failed while the store was up: how many times in a row."""
        self._later: set[asyncio.Task[None]] = set()
        """Redeliveries waiting out a run's own backoff."""
        self._doubt: dict[str, list[AppliedEvent]] = {}
        """Events of runs whose commit failed, until the run is loaded again (see
        ``_settle_doubt``)."""
        self._unloaded: dict[str, Exception] = {}
        """Runs of the batch being applied that the store could not load just now."""
        self._forgetting: asyncio.Task[None] | None = None
        self._commits = 0
        """Batches committed (each forgets every relayed outbox row: ``_forget`` waits
        for a quiet moment, not for a commit of its own)."""
        self._stopping = False
        relay.on_relayed = self._forget_soon
        self.admission: Admission | None = None
        """The engine's admission bound (runtime/admission.py): a ``RunStarted`` it holds
        is acknowledged and skipped (the run stays pending), and ``held`` is called once
        per batch that held any, or that parked a run while starts wait; it follows the
        attempts in flight of every committed batch (``Admission.applied``)."""
        self.held: Callable[[], None] = _nothing
        self.arrived: (
            tuple[
                Callable[[list[RunStarted]], Awaitable[dict[str, RunStarted]]],
                Callable[[dict[str, RunStarted]], None],
            ]
            | None
        ) = None
        """The engine's fast path for the starts of a batch (``Engine._admit_arrived``):
        those it returns (by run id) replace theirs and pass; then it is told they went."""
        self.spans: BatchSpans | None = None
        """Told of every committed batch with its events' trace headers (tracing on:
        ``ApplySpans``, a span per run per batch); None: nothing, and no header is read."""

    def start(self) -> None:
        self._stopping = False
        self._task = asyncio.create_task(self._loop(), name="tideflow-scheduler")

    async def stop(self) -> None:
        """Stop after the batch in progress (if any) is committed and relayed."""
        self._stopping = True
        async with self._lock:
            if self._task is not None:
                await cancel_and_wait(self._task)
                self._task = None
            for task in list(self._later):
                task.cancel()
            relayed = list(self._relay.relayed)
            if relayed:
                with contextlib.suppress(Exception):
                    await self._store.commit([], relayed)
                    self._relay.forgotten(len(relayed))

    def _forget_soon(self) -> None:
        """Have the store forget the relayed outbox rows in ``FORGET_AFTER`` seconds, unless
        a commit took them by then: on a quiet engine they would otherwise stay, and be
        counted as waiting (`tideflow db status`) until its next commit."""
        if self._forgetting is None and not self._stopping:
            self._forgetting = asyncio.get_running_loop().create_task(self._forget())
            self._later.add(self._forgetting)
            self._forgetting.add_done_callback(self._later.discard)

    async def _forget(self) -> None:
        """Until no relayed row is left: after ``FORGET_AFTER`` seconds without a commit,
        one of its own (a busy engine's commits forget the rows: no extra transaction)."""
        try:
            while True:
                commits = self._commits
                await asyncio.sleep(FORGET_AFTER)
                if self._commits == commits:  # quiet
                    async with self._lock:
                        relayed = self._relay.relayed
                        count = len(relayed)
                        if count:
                            await self._store.commit([], relayed[:count])
                            self._relay.forgotten(count)
                if not self._relay.relayed:
                    return
        except Exception as exc:  # the rows stay: the next commit (or the stop) forgets them
            log.warning("relayed outbox rows not forgotten yet (%s: %s)", type(exc).__name__, exc)
        finally:
            self._forgetting = None

    def uncommitted(self, run_id: str) -> bool:
        """Whether the run's latest change is still being committed."""
        return run_id in self._in_flight

    async def settled(self, run_id: str) -> None:
        """Return once no change of the run is being committed: at once when none is, or
        when asked from the task applying the batch (a sink of that batch must not wait
        for the batch it runs in). A run's state is changed in place before its batch is
        committed; what a client reads must not be what a crash could still undo."""
        while run_id in self._in_flight and asyncio.current_task() is not self._applier:
            if self._settled is None:
                self._settled = asyncio.get_running_loop().create_future()
            await asyncio.shield(self._settled)

    def _batch_ended(self) -> None:
        self._in_flight.clear()
        self._applier = None
        settled, self._settled = self._settled, None
        if settled is not None and not settled.done():
            settled.set_result(None)
        self._runs.trim()

    async def _loop(self) -> None:
        """Consume until stopped; an event stream that fails (a broker gone, partitions
        another engine still holds) is opened again after a backoff, never given up."""
        delay = CONSUME_RETRY_FIRST
        while True:
            try:
                async for _ in self._consume():
                    delay = CONSUME_RETRY_FIRST
                return  # the bus ended the stream: it is closing
            except Exception as exc:
                self._observers.consume_failed(exc)
                log.warning(
                    "the scheduler's event stream failed (%s: %s); consuming again in %.2fs",
                    type(exc).__name__,
                    exc,
                    delay,
                )
            await asyncio.sleep(delay)
            delay = min(delay * 2, CONSUME_RETRY_MAX)

    async def _consume(self) -> AsyncIterator[None]:
        """Apply the delivered batches; yields after each one."""
        if self._ownership is not None:
            async for _ in self._consume_owned(self._ownership):
                yield
            return
        batches = self._bus.consume_events(max_batch=self._batch_size)
        async with contextlib.aclosing(batches) as deliveries:
            async for batch in deliveries:
                await self._apply_guarded(batch)
                yield

    async def _apply_guarded(self, batch: EventBatch) -> None:
        try:
            await self._apply_delivered(batch)
        except Exception:
            log.exception("scheduler batch failed; its events come again")
            with contextlib.suppress(Exception):
                await batch.nack(self._retry_delay)  # a no-op once acknowledged

    async def _consume_owned(self, ownership: Ownership) -> AsyncIterator[None]:
        """Consume the partitions this engine owns; when they change, finish the batch in
        progress, close the stream (the bus hands back what it held) and open another."""
        while True:
            owned = ownership.applied
            if not owned:
                await ownership.changed(owned)
                continue
            batches = self._bus.consume_events(owned, max_batch=self._batch_size)
            changed = asyncio.ensure_future(ownership.changed(owned))
            try:
                async with contextlib.aclosing(batches) as deliveries:
                    ownership.consumed(owned)
                    while not changed.done():
                        try:
                            batch = await _next_unless(deliveries, changed)
                        except _Ended:
                            return
                        if batch is None:
                            break
                        await self._apply_guarded(batch)
                        yield
            finally:
                changed.cancel()
                ownership.consumed(frozenset())

    async def _apply_delivered(self, batch: EventBatch) -> None:
        """Apply a batch from the bus; acknowledge it once it is committed (events that
        must come again are handed back to the bus first)."""
        async with self._lock:
            self._applier = asyncio.current_task()
            try:
                await self._apply_committed(batch.events, delivered=batch)
            finally:
                self._batch_ended()

    async def apply(
        self,
        events: list[Event],
        *,
        redeliver: bool = True,
        relay: bool = True,
        headers: Headers = NO_HEADERS,
    ) -> set[str]:
        """Apply, commit and relay one batch; return the ids of the events that changed a
        run and were committed (the others were duplicates, stale, or not stored). Nothing
        a caller sees counts a run as ended before the batch that ended it is committed.
        With ``redeliver=False`` (a tool that applies one event and stops) a commit that
        fails raises instead of coming again later. With ``relay=False`` (a client recording
        an event while no engine is live) nothing is relayed: the commands stay derivable
        from the state and the outbox, for the next engine's recovery. ``headers``: every
        event's (the sender's trace context, as a bus delivery carries it)."""
        async with self._lock:
            self._applier = asyncio.current_task()
            try:
                return await self._apply_committed(
                    events,
                    redeliver,
                    relay=relay,
                    headers_of=(lambda _: headers) if headers else None,
                )
            finally:
                self._batch_ended()

    async def _apply_committed(
        self,
        events: list[Event],
        redeliver: bool = True,
        delivered: EventBatch | None = None,
        relay: bool = True,
        headers_of: Callable[[int], Headers] | None = None,
    ) -> set[str]:
        """``headers_of(i)``: the headers of ``events[i]`` (a delivered batch's own)."""
        began = time.time_ns() if self.spans is not None else 0
        batch = await self._apply_all(events)
        if self._unloaded:
            await self._not_loaded(events, redeliver, delivered)
        if not batch:
            if delivered is not None:
                await delivered.ack()  # nothing to commit: duplicates, stale, unknown runs
            return set()
        if faults.ARMED:
            faults.checkpoint("before_commit")
        out = await commit_apart(self._commit, batch, self._run_retries.keys())
        if faults.ARMED:
            faults.checkpoint("after_commit")
        if out.committed:
            self._retry_delay = 0.05
            if self.admission is not None and self.admission.applied(out.committed):
                self.held()  # a run parked: its slot is free for the next pending run
        if out.down or out.failures:
            self._keep_in_doubt(batch, out)
            if self._observers:
                for error in [out.down] if out.down else out.failures.values():
                    self._observers.commit_failed(error)
        if not redeliver and (out.down or out.failures):
            for run_id in self._in_flight:
                self._runs.evict(run_id)
            raise out.down or next(iter(out.failures.values()))
        if out.down or out.failures:
            await self._not_committed(out, events, delivered)
        # Committed is committed: its effects go out first (the next step's dispatch does
        # not wait for the ack's round trip), and an ack that fails (the broker went
        # away) keeps nothing from the relay: the events, coming again, are duplicates
        # that relay nothing.
        try:
            await self._relay.hand(out.committed, act=relay)
            if faults.ARMED:
                faults.checkpoint("after_relay")
        finally:
            if delivered is not None:
                await delivered.ack()
            if self.spans is not None and out.committed:
                headers = delivered.headers if delivered is not None else headers_of
                self._traced(self.spans, began, out.committed, events, headers)
        return {applied.event.event_id for applied in out.committed}

    @staticmethod
    def _traced(
        spans: BatchSpans,
        began: int,
        committed: list[AppliedEvent],
        events: list[Event],
        headers: Callable[[int], Headers] | None,
    ) -> None:
        """Hand the committed batch to ``spans``, with the headers of its events that carry
        a trace context; a failure there is logged and changes nothing."""
        try:
            carried: dict[str, Headers] = {}
            if headers is not None:
                for index, event in enumerate(events):
                    found = headers(index)
                    if TRACEPARENT in found:
                        carried[event.event_id] = found
            spans(began, committed, carried)
        except Exception:
            log.exception("the spans of a batch could not be recorded (the runs carry on)")

    async def _commit(self, part: Sequence[AppliedEvent]) -> None:
        relayed = self._relay.relayed
        count = len(relayed)
        await self._store.commit(part, relayed[:count] if count else ())
        self._commits += 1
        if count:
            self._relay.forgotten(count)
        if self._run_retries:
            for applied in part:
                self._run_retries.pop(applied.event.run_id, None)

    def _keep_in_doubt(self, batch: list[AppliedEvent], out: Outcome) -> None:
        """A commit that failed may have been written all the same (its answer was lost):
        remember what it would have done, to be settled when the run is loaded again."""
        committed = {id(applied) for applied in out.committed}
        for applied in batch:
            if id(applied) not in committed:
                self._doubt.setdefault(applied.event.run_id, []).append(applied)

    async def _settle_doubt(self, run_id: str, last_seq: int) -> None:
        """The run was reloaded: relay the effects of the events in doubt that the store
        holds after all (a commit that went through although it reported a failure)."""
        doubt = self._doubt.pop(run_id, None)
        stored = [applied for applied in doubt or () if applied.seq <= last_seq]
        if stored:
            log.warning(
                "run %s: %d event(s) whose commit reported a failure were stored; relaying "
                "their effects",
                run_id,
                len(stored),
            )
            await self._relay.hand(stored, observe=False)

    async def _not_committed(
        self, out: Outcome, events: list[Event], delivered: EventBatch | None
    ) -> None:
        if out.down is not None:
            for run_id in self._in_flight:
                self._runs.evict(run_id)
            log.warning("commit failed (%s); %d events come again", describe(out.down), len(events))
            await self._redeliver(events, delivered)
            return
        for run_id, error in out.failures.items():
            mine = [e for e in events if e.run_id == run_id]
            await self._run_failed(
                run_id, mine, error, alone=not out.committed, delivered=delivered
            )

    async def _apply_all(self, events: list[Event]) -> list[AppliedEvent]:
        """Apply each event; a run whose event cannot be applied drops out of the batch. A
        run in memory with its plan is applied without an await (every event's path)."""
        admission = self.admission
        going: dict[str, RunStarted] = {}
        if admission is not None and self.arrived is not None:
            starts = [e for e in events if type(e) is RunStarted and e.parent_run_id is None]
            if starts:
                going = await self.arrived[0](starts)
                if going:
                    events = [
                        going.get(e.run_id, e) if type(e) is RunStarted else e for e in events
                    ]
        try:
            return await self._apply_each(events, admission)
        finally:
            if going and self.arrived is not None:
                self.arrived[1](going)

    async def _apply_each(
        self, events: list[Event], admission: Admission | None
    ) -> list[AppliedEvent]:
        batch: list[AppliedEvent] = []
        failed: set[str] = set()
        held = False
        for event in events:
            run_id = event.run_id
            if run_id in failed:
                continue
            starting = False
            if admission is not None and type(event) is RunStarted:
                if not admission.gate(event):
                    held = True  # acknowledged with the batch; the run stays pending, queued
                    if run_id in self._doubt:
                        try:
                            await self._settle_held(event, admission)
                        except StoreUnavailable as exc:  # it comes again (_apply_committed)
                            self._unloaded[run_id] = exc
                            self._runs.evict(run_id)
                            failed.add(run_id)
                    continue
                starting = True
            about = logcontext.run_id.set(run_id)  # its log lines are the run's
            try:
                try:
                    found = self._cached(run_id) or await self._load(event)
                except StoreUnavailable as exc:  # its events come again (_apply_committed)
                    self._unloaded[run_id] = exc
                    self._runs.evict(run_id)
                    failed.add(run_id)
                    continue
                if found is None:
                    if starting and admission is not None:
                        admission.settle(run_id, False)
                    continue
                live, plan = found
                try:
                    decision = decide(plan, live.state, event)
                except Exception as exc:
                    self._runs.evict(run_id)
                    kind = type(event).__name__
                    await self._fail_run(
                        run_id, [event], f"applying {kind} failed: {describe(exc)}"
                    )
                    failed.add(run_id)
                    continue
                if admission is not None and (starting or type(event) is RunRetried):
                    status = live.state.status
                    admission.settle(
                        run_id, status is not RunStatus.PENDING and not live.state.is_terminal
                    )
                if decision.changed:
                    self._in_flight.add(run_id)
                    seq, snapshot = live.next_seq()
                    batch.append(
                        AppliedEvent(
                            event=event,
                            state=live.state,
                            transitions=decision.transitions,
                            commands=decision.commands,
                            seq=seq,
                            snapshot=snapshot,
                        )
                    )
            finally:
                logcontext.run_id.reset(about)
        if failed:
            batch = [a for a in batch if a.event.run_id not in failed]
            self._in_flight.difference_update(failed)
        if held:
            self.held()
        return batch

    async def _not_loaded(
        self, events: list[Event], redeliver: bool, delivered: EventBatch | None
    ) -> None:
        """Runs of the batch that could not be loaded because the store is unavailable: a
        passing failure, so their events come again (with the backoff of a failed commit),
        never dropped as the events of a run that cannot be loaded at all are."""
        unloaded, self._unloaded = self._unloaded, {}
        if not redeliver:
            for run_id in self._in_flight:
                self._runs.evict(run_id)
            raise next(iter(unloaded.values()))
        for run_id, exc in unloaded.items():
            mine = [e for e in events if e.run_id == run_id]
            await self._run_failed(run_id, mine, exc, alone=True, delivered=delivered)

    async def _settle_held(self, event: RunStarted, admission: Admission) -> None:
        """A held start of a run whose start's commit reported a failure: the commit may
        have gone through all the same (the run is running in the store, its first
        attempts never dispatched, and no start will come again to load it). Loading the
        run settles the doubt (the stored effects are relayed) and counts it active when
        it runs; a run still pending is the admitter's, as any held start's."""
        found = await self._load(event)
        if found is not None:
            state = found[0].state
            admission.settle(
                event.run_id, state.status is not RunStatus.PENDING and not state.is_terminal
            )

    async def _run_failed(
        self,
        run_id: str,
        events: list[Event],
        exc: Exception,
        *,
        alone: bool,
        delivered: EventBatch | None,
    ) -> None:
        """One run's events could not be committed (the store took the others, if any)."""
        self._runs.evict(run_id)
        self._in_flight.discard(run_id)
        kind = classify(exc)
        if kind is Failure.DATA and (not alone or isinstance(exc, DEFINITELY_DATA)):
            await self._fail_run(run_id, events, f"storing them failed: {describe(exc)}")
            return
        if kind is Failure.CONFLICT:
            await self._again(run_id, events, 0.0, delivered)  # reload and apply again, at once
            return
        tries = self._run_retries[run_id] = self._run_retries.get(run_id, 0) + 1
        delay = min(0.05 * 2 ** (tries - 1), 5.0)
        log.warning(
            "run %s: commit failed (%s), try %d; its events come again in %.2fs",
            run_id,
            describe(exc),
            tries,
            delay,
        )
        await self._again(run_id, events, delay, delivered)

    async def _again(
        self, run_id: str, events: list[Event], delay: float, delivered: EventBatch | None
    ) -> None:
        """Have one run's events come again after ``delay``, without blocking the loop:
        handed back to the bus when they came from it, sent again otherwise."""
        if delivered is not None:
            await delivered.nack(delay, {run_id})
        elif delay <= 0:
            await self._relay.send(events, "apply again")
        else:
            task = asyncio.create_task(self._publish_later(events, delay))
            self._later.add(task)
            task.add_done_callback(self._later.discard)

    async def _fail_run(self, run_id: str, events: list[Event], cause: str) -> None:
        self._run_retries.pop(run_id, None)
        failures = [e for e in events if isinstance(e, EngineFailed)]
        if failures:
            if len(failures) < len(events):  # it came with other events of the run (late
                # outcomes): store the failure alone; once the run has ended they are stale
                await self._relay.send(failures, "fail the run")
                return
            log.error("run %s could not be failed either, it is left as stored: %s", run_id, cause)
            return
        log.error("run %s fails with EngineError: %s", run_id, cause)
        await self._relay.send([engine_failed(run_id, events, cause)], "fail the run")

    async def _publish_later(self, events: list[Event], delay: float) -> None:
        await asyncio.sleep(delay)
        await self._relay.send(events, "commit again")

    async def _redeliver(self, events: list[Event], delivered: EventBatch | None) -> None:
        """The store is down: the loop pauses for the backoff (nothing newer overtakes
        the batch), then the batch comes again."""
        await asyncio.sleep(self._retry_delay)
        self._retry_delay = min(self._retry_delay * 2, 5.0)
        if delivered is not None:
            await delivered.nack()
        else:
            await self._relay.send(events, "commit again")

    def _cached(self, run_id: str) -> tuple[LiveRun, Plan] | None:
        """The run and its plan when both are in memory and nothing about it is in doubt."""
        live = self._runs.hit(run_id)
        if live is None or (self._doubt and run_id in self._doubt):
            return None
        plan = self._plans.known(live.state.plan_hash)
        return None if plan is None else (live, plan)

    async def _load(self, event: Event) -> tuple[LiveRun, Plan] | None:
        """The run and its plan, loaded from the store; None when the event cannot be
        applied (an unknown run, or one that cannot be loaded: logged)."""
        try:
            live = self._runs.hit(event.run_id) or await self._runs.get(event.run_id)
            if self._doubt:
                await self._settle_doubt(event.run_id, live.last_seq)
            plan = self._plans.known(live.state.plan_hash) or await self._plans.get(
                live.state.plan_hash
            )
        except NotFound:
            log.warning("event %s for unknown run %s dropped", type(event).__name__, event.run_id)
            return None
        except StoreUnavailable:
            raise  # a passing failure: the event comes again (``_not_loaded``)
        except Exception as exc:  # a damaged snapshot or history, a plan that no longer compiles
            log.error(
                "run %s cannot be loaded, event %s not applied: %s",
                event.run_id,
                type(event).__name__,
                describe(exc),
            )
            return None
        return live, plan


def _nothing() -> None:
    return None


async def _next_unless(
    deliveries: AsyncIterator[EventBatch], changed: asyncio.Future[None]
) -> EventBatch | None:
    """The next batch, or None when ``changed`` comes first (the wait for it is cancelled:
    what the bus had not delivered yet stays with the stream and is handed back when it
    closes). ``_Ended`` when the bus ended the stream."""
    following = asyncio.ensure_future(anext(deliveries))
    try:
        await asyncio.wait((following, changed), return_when=asyncio.FIRST_COMPLETED)
    finally:
        # the read cancelled runs the stream's cleanup; a stop meanwhile is kept for the
        # end (closing the stream while its read runs raised RuntimeError in the stop's
        # place: the scheduler consumed again, and the partitions stayed held)
        with contextlib.suppress(Exception):  # its outcome is read below
            await cancel_and_wait(following)
    if following.cancelled():
        return None
    try:
        return following.result()
    except StopAsyncIteration:
        raise _Ended from None


class _Ended(Exception):
    """The bus ended an event stream (it is closing)."""
