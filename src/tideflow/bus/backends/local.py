"""The in-process bus: asyncio queues, no serialisation, nothing to start."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Sequence

from tideflow.bus.base import Bus
from tideflow.model.commands import DispatchTask
from tideflow.model.events import Event
from tideflow.model.plan import Priority

_RANK = {Priority.HIGH: 0, Priority.NORMAL: 1, Priority.LOW: 2}


class LocalBus(Bus):
    def __init__(self) -> None:
        self._tasks: asyncio.PriorityQueue[tuple[int, int, DispatchTask]] = asyncio.PriorityQueue()
        self._events: asyncio.Queue[Event] = asyncio.Queue()
        self._seq = itertools.count()

    async def publish_tasks(self, tasks: Sequence[DispatchTask]) -> None:
        put = self._tasks.put_nowait
        for task in tasks:
            put((_RANK[task.priority], next(self._seq), task))

    async def next_task(self) -> DispatchTask:
        return (await self._tasks.get())[2]

    async def publish_events(self, events: Sequence[Event]) -> None:
        put = self._events.put_nowait
        for event in events:
            put(event)

    async def next_events(self, max_batch: int) -> list[Event]:
        queue = self._events
        batch = [await queue.get()]
        while len(batch) < max_batch and not queue.empty():
            batch.append(queue.get_nowait())
        return batch
