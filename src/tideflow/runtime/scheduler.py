"""The scheduler loop: events in, ``decide``, one commit per batch, commands out.

It takes every event the bus has ready (up to ``batch_size``), applies each to
its run through the pure core, commits the whole batch to the store in one call
(group commit), tells the listeners, and hands the commands to ``relay``. A
batch whose commit fails is forgotten (the changed runs reload from the store)
and its events are delivered again after a backoff.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence

from tideflow.bus.base import Bus
from tideflow.core.decide import decide
from tideflow.errors import NotFound, TideflowError
from tideflow.model.commands import Command
from tideflow.model.events import Event, Transition
from tideflow.model.run import RunState
from tideflow.runtime import faults
from tideflow.runtime.runs import Plans, RunCache
from tideflow.store.base import AppliedEvent, Store

log = logging.getLogger("tideflow.scheduler")

Listener = Callable[[RunState, Sequence[Transition]], None]
Relay = Callable[[Sequence[Command]], Awaitable[None]]


class Scheduler:
    def __init__(
        self,
        *,
        store: Store,
        bus: Bus,
        runs: RunCache,
        plans: Plans,
        listeners: list[Listener],
        relay: Relay,
        batch_size: int,
    ) -> None:
        self._store = store
        self._bus = bus
        self._runs = runs
        self._plans = plans
        self._listeners = listeners
        self._relay = relay
        self._batch_size = batch_size
        self._lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self._in_flight: set[str] = set()
        """Runs changed by the batch being applied and not yet committed."""
        self._relayed: list[str] = []
        """Outbox ids relayed since the last commit; the next commit forgets them."""
        self._retry_delay = 0.05

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="tideflow-scheduler")

    async def stop(self) -> None:
        """Stop after the batch in progress (if any) is committed and relayed."""
        async with self._lock:
            if self._task is not None:
                self._task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._task
                self._task = None
            if self._relayed:
                with contextlib.suppress(Exception):
                    await self._store.commit([], self._relayed)

    def uncommitted(self, run_id: str) -> bool:
        """Whether the run's latest change is still being committed."""
        return run_id in self._in_flight

    def relayed(self, outbox_ids: Sequence[str]) -> None:
        """Outbox entries relayed outside a batch (on recovery): forget them at the next commit."""
        self._relayed.extend(outbox_ids)

    async def _loop(self) -> None:
        while True:
            events = await self._bus.next_events(self._batch_size)
            try:
                await self.apply(events)
            except Exception:
                log.exception("scheduler batch failed; its events are delivered again")

    async def apply(self, events: list[Event]) -> set[str]:
        """Apply, commit and relay one batch; return the ids of the events that changed a
        run (the others were duplicates or stale). Nothing a caller sees counts a run as
        ended before the batch that ended it is committed."""
        async with self._lock:
            try:
                return await self._apply_committed(events)
            finally:
                self._in_flight.clear()

    async def _apply_committed(self, events: list[Event]) -> set[str]:
        batch = [applied for event in events if (applied := await self._apply(event))]
        if not batch:
            return set()
        if faults.ARMED:
            faults.checkpoint("before_commit")
        try:
            await self._store.commit(batch, self._relayed)
        except Exception:
            for applied in batch:
                self._runs.evict(applied.event.run_id)
            await self._redeliver(events)
            raise
        if faults.ARMED:
            faults.checkpoint("after_commit")
        self._relayed = []
        self._retry_delay = 0.05
        commands: list[Command] = []
        for applied in batch:
            commands.extend(applied.commands)
            self._relayed.extend(outbox_id for outbox_id, _ in applied.outbox)
            for listener in self._listeners:
                listener(applied.state, applied.transitions)
        await self._relay(commands)
        if faults.ARMED:
            faults.checkpoint("after_relay")
        return {applied.event.event_id for applied in batch}

    async def _redeliver(self, events: list[Event]) -> None:
        await asyncio.sleep(self._retry_delay)
        self._retry_delay = min(self._retry_delay * 2, 5.0)
        await self._bus.publish_events(events)

    async def _apply(self, event: Event) -> AppliedEvent | None:
        kind = type(event).__name__
        try:
            live = await self._runs.get(event.run_id)
            plan = await self._plans.get(live.state.plan_hash)
        except NotFound:
            log.warning("event %s for unknown run %s dropped", kind, event.run_id)
            return None
        except TideflowError as exc:
            log.error("run %s cannot be loaded, event %s not applied: %s", event.run_id, kind, exc)
            return None
        try:
            decision = decide(plan, live.state, event)
        except TideflowError as exc:
            log.error("run %s: event %s could not be applied: %s", event.run_id, kind, exc)
            self._runs.evict(event.run_id)
            return None
        if not decision.changed:
            return None
        self._in_flight.add(event.run_id)
        seq, snapshot = live.next_seq()
        return AppliedEvent(
            event=event,
            state=live.state,
            transitions=decision.transitions,
            commands=decision.commands,
            seq=seq,
            snapshot=snapshot,
        )
