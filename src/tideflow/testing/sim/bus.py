"""The simulation's bus: the in-process bus, each publication faulted by the schedule.

Task and event publications can fail before or after they are made, be delivered twice,
or later (virtual seconds); an event publication can be shuffled across runs; a
worker's outcome can be lost (``faults.py`` says what each means). Control messages
(cancels) are at most once by contract: one can be lost. Deliveries themselves (leases,
nacks, redelivery) are the local bus's own, on the simulation's clock.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

from tideflow.bus.backends.local import BusClock, LocalBus
from tideflow.bus.base import Control, Delivery, Message
from tideflow.model.commands import DispatchTask
from tideflow.model.events import Event, TaskCompleted, TaskFailed
from tideflow.testing.sim.faults import Fault, Faults

M = TypeVar("M", DispatchTask, Event)

TASKS = (Fault.BEFORE, Fault.AFTER, Fault.DUPLICATE, Fault.DELAY)
EVENTS = (Fault.BEFORE, Fault.AFTER, Fault.DUPLICATE, Fault.DELAY, Fault.REORDER, Fault.LOST)
CONTROL = (Fault.LOST,)
MAX_DELAY = 60.0
"""Virtual seconds a delayed publication waits at most."""


def _key(item: DispatchTask | TaskCompleted | TaskFailed) -> tuple[str, str, int, bool]:
    return (item.run_id, item.step_key, item.attempt, item.compensation)


class SimBus(LocalBus):
    """``LocalBus`` on the simulation's clock, faulted by ``faults``."""

    def __init__(self, faults: Faults, clock: BusClock, *, partitions: int = 4) -> None:
        super().__init__(partitions=partitions, clock=clock)
        self.faults = faults
        self._deferred: set[asyncio.Task[None]] = set()
        self._crashed: set[tuple[str, str, int, bool]] = set()
        """Attempts whose outcome was lost: the worker died, so it never acknowledges
        their task either (its lease runs out and the bus hands it back)."""

    def _body(self, item: M | Message[M]) -> M:
        return item.body if isinstance(item, Message) else item

    async def publish_tasks(self, tasks: Sequence[DispatchTask | Message[DispatchTask]]) -> None:
        fault = self.faults.draw("bus.publish_tasks", TASKS)
        if fault is Fault.BEFORE:
            raise self.faults.bus_error("publish_tasks", fault)
        if fault is Fault.DELAY:
            late_tasks = list(tasks)
            self._defer(lambda: LocalBus.publish_tasks(self, late_tasks))
            return
        await super().publish_tasks(tasks)
        if fault is Fault.DUPLICATE:
            await super().publish_tasks(tasks)
        if fault is Fault.AFTER:
            raise self.faults.bus_error("publish_tasks", fault)

    async def publish_events(self, events: Sequence[Event | Message[Event]]) -> None:
        fault = self.faults.draw("bus.publish_events", EVENTS)
        if fault is Fault.BEFORE:
            raise self.faults.bus_error("publish_events", fault)
        if fault is Fault.DELAY:
            late_events = list(events)
            self._defer(lambda: LocalBus.publish_events(self, late_events))
            return
        if fault is Fault.REORDER:
            events = self._shuffled(events)
        if fault is Fault.LOST:  # the worker died before its report left it
            kept: list[Event | Message[Event]] = []
            for event in events:
                body = self._body(event)
                if isinstance(body, TaskCompleted | TaskFailed):
                    self._crashed.add(_key(body))
                else:
                    kept.append(event)
            events = kept
        await super().publish_events(events)
        if fault is Fault.DUPLICATE:
            await super().publish_events(events)
        if fault is Fault.AFTER:
            raise self.faults.bus_error("publish_events", fault)

    async def ack_tasks(self, deliveries: Sequence[Delivery[DispatchTask]]) -> None:
        alive = []
        for delivery in deliveries:
            key = _key(delivery.body)
            if key in self._crashed:
                self._crashed.discard(key)
            else:
                alive.append(delivery)
        await super().ack_tasks(alive)

    async def publish_control(self, message: Control) -> None:
        if self.faults.draw("bus.publish_control", CONTROL) is Fault.LOST:
            return
        await super().publish_control(message)

    def _shuffled(self, events: Sequence[Event | Message[Event]]) -> list[Event | Message[Event]]:
        """The events interleaved across runs at random, each run's in its order."""
        lanes: dict[str, list[Event | Message[Event]]] = {}
        for event in events:
            lanes.setdefault(self._body(event).run_id, []).append(event)
        order = [run for run, lane in lanes.items() for _ in lane]
        self.faults.rng.shuffle(order)
        cursor = dict.fromkeys(lanes, 0)
        out: list[Event | Message[Event]] = []
        for run in order:
            out.append(lanes[run][cursor[run]])
            cursor[run] += 1
        return out

    def _defer(self, publish: Callable[[], Awaitable[None]]) -> None:
        """``publish()`` after a seeded delay (the coroutine is made only then: one that
        never runs, its runtime closed first, is not left unawaited)."""
        delay = self.faults.uniform(0.0, MAX_DELAY)

        async def later() -> None:
            await asyncio.sleep(delay)
            await publish()

        task = asyncio.get_running_loop().create_task(later())
        self._deferred.add(task)
        task.add_done_callback(self._deferred.discard)
