"""The in-process bus: deques and futures on the event loop, no serialisation.

Nothing is copied or wrapped on the way in: a bare body is queued as it is. A task
delivery is one small object; an event batch is one object for the whole batch.
Leases are swept by one timer per consumer, armed for its oldest delivery (the
deliveries of a consumer are kept in lease order), never by a timer per message.
"""

from __future__ import annotations

import asyncio
import bisect
import math
import time
from collections import deque
from collections.abc import AsyncGenerator, Callable, Collection, Sequence
from typing import Any, Protocol

from tideflow.bus.base import (
    DEFAULT_LEASE,
    DEFAULT_PARTITIONS,
    NO_HEADERS,
    PRIORITY_CYCLE,
    Bus,
    Control,
    Delivery,
    EventBatch,
    Headers,
    Message,
    QueueStats,
    RunEnded,
    Stream,
    WorkerBeat,
    partition_of,
    wanted_partitions,
)
from tideflow.bus.fanout import FanOut
from tideflow.errors import BusError
from tideflow.model.commands import DispatchTask
from tideflow.model.events import Event
from tideflow.model.plan import Priority

_RANK = {Priority.HIGH: 0, Priority.NORMAL: 1, Priority.LOW: 2}
_CYCLE = tuple(_RANK[p] for p in PRIORITY_CYCLE)
_NEXT = tuple((index + 1) % len(_CYCLE) for index in range(len(_CYCLE)))
"""The cursor in ``_CYCLE`` after each position."""


class Handle(Protocol):
    def cancel(self) -> None: ...


class BusClock(Protocol):
    """What the bus needs of a clock (``ManualClock`` from tideflow.testing fits)."""

    def now(self) -> float: ...

    def call_at(self, when: float, callback: Callable[[], None]) -> Handle: ...


class MonotonicClock:
    """Leases on the event loop's timers, measured on the monotonic clock."""

    # The clock itself, not a method around it: it is read for every batch put on lanes
    # and every delivery held.
    now = staticmethod(time.monotonic)

    def call_at(self, when: float, callback: Callable[[], None]) -> Handle:
        return asyncio.get_running_loop().call_later(max(0.0, when - time.monotonic()), callback)


class _Again:
    """A message handed back (nack or lease expiry), remembering its delivery count."""

    __slots__ = ("body", "deliveries", "headers")

    def __init__(self, body: Any, headers: Headers, deliveries: int) -> None:
        self.body = body
        self.headers = headers
        self.deliveries = deliveries


def _unpack(entry: Any) -> tuple[Any, Headers, int]:
    kind = type(entry)
    if kind is _Again:
        return entry.body, entry.headers, entry.deliveries
    if kind is Message:
        return entry.body, entry.headers, 0
    return entry, NO_HEADERS, 0


class _Lane(deque[Any]):
    """The tasks waiting at one priority of one queue, with when each was put there
    (``stamps``, for ``queue_stats``; a handed-back task counts from when it came back).

    Whoever puts or takes a task puts or takes its stamp alongside, at the same end: the
    deque's own methods are kept (no Python call per task put on a lane or taken)."""

    __slots__ = ("stamps",)

    def __init__(self) -> None:
        super().__init__()
        self.stamps: deque[float] = deque()

    def oldest_age(self, now: float) -> float | None:
        return now - min(self.stamps) if self.stamps else None


class _Leases:
    """Things held by one consumer, in lease order, with one sweep timer."""

    def __init__(self, clock: BusClock, lease: float, expire: Callable[[Any], None]) -> None:
        self.clock = clock
        self.lease = lease
        self.held: dict[Any, float] = {}
        self._expire = expire
        self._timer: Handle | None = None

    def hold(self, item: Any) -> None:
        deadline = self.clock.now() + self.lease
        self.held[item] = deadline
        if self._timer is None:
            self._timer = self.clock.call_at(deadline, self._sweep)

    def release(self, item: Any) -> bool:
        return self.held.pop(item, None) is not None

    def extend(self, item: Any) -> None:
        if self.held.pop(item, None) is not None:
            self.held[item] = self.clock.now() + self.lease  # the newest goes last

    def close(self) -> list[Any]:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        items = list(self.held)
        self.held.clear()
        return items

    def _sweep(self) -> None:
        self._timer = None
        now = self.clock.now()
        held = self.held
        while held:
            item, deadline = next(iter(held.items()))
            if deadline > now:
                self._timer = self.clock.call_at(deadline, self._sweep)
                return
            del held[item]
            self._expire(item)


class _Waiting:
    """A consumer that may wait for work: ``wake`` ends its wait (``waiter`` is None
    while it does not wait: the callers on every message's path look at it first)."""

    def __init__(self) -> None:
        self.waiter: asyncio.Future[None] | None = None

    def wake(self) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def wait(self) -> None:
        self.waiter = asyncio.get_running_loop().create_future()
        try:
            await self.waiter
        finally:
            self.waiter = None


class _TaskDelivery(Delivery[DispatchTask]):
    __slots__ = ("_consumer", "body", "deliveries", "headers")

    def __init__(
        self, consumer: _TaskConsumer, body: DispatchTask, headers: Headers, deliveries: int
    ) -> None:
        self.body = body
        self.headers = headers
        self.deliveries = deliveries
        self._consumer = consumer

    async def ack(self) -> None:
        self._consumer.settle(self)

    def settle(self) -> None:
        """``ack`` without a coroutine (`LocalBus.ack_tasks`)."""
        self._consumer.settle(self)

    async def nack(self, delay: float = 0.0) -> None:
        _check_delay(delay)
        if self._consumer.settle(self):
            self._consumer.bus.hand_back_task(self, delay)

    async def extend(self) -> None:
        self._consumer.leases.extend(self)


class _TaskConsumer(_Waiting):
    def __init__(
        self, bus: LocalBus, queues: Collection[str] | None, prefetch: int, worker: str | None
    ) -> None:
        super().__init__()
        self.bus = bus
        self.worker = worker
        self.queues = None if queues is None else tuple(sorted(set(queues)))
        self.names = None if queues is None else [bus.lanes_of(name) for name in queues]
        self.prefetch = prefetch
        self.leases = _Leases(bus.clock, bus.lease, self._expired)
        self._cursor = 0
        self._turn = 0

    def take(self) -> _TaskDelivery | None:
        """The next task, by priority turn (`_lane`), held under a lease; None when the
        prefetch bound is reached or no task waits."""
        if len(self.leases.held) >= self.prefetch:
            return None
        lane = self._lane()
        if lane is None:
            return None
        lane.stamps.popleft()
        entry = lane.popleft()
        kind = type(entry)
        if kind is _Again:
            delivery = _TaskDelivery(self, entry.body, entry.headers, entry.deliveries + 1)
        elif kind is Message:
            delivery = _TaskDelivery(self, entry.body, entry.headers, 1)
        else:
            delivery = _TaskDelivery(self, entry, NO_HEADERS, 1)
        self.leases.hold(delivery)
        return delivery

    def settle(self, delivery: _TaskDelivery) -> bool:
        if self.leases.held.pop(delivery, None) is None:
            return False  # settled already, or its lease ran out and it went back
        if self.waiter is not None:  # (at the prefetch bound)
            self.wake()
        return True

    def _expired(self, delivery: _TaskDelivery) -> None:
        self.bus.hand_back_task(delivery, 0.0)
        self.wake()

    def _lane(self) -> _Lane | None:
        """The lane to take from: the queues take turns, and so do the priorities (high
        first, ``PRIORITY_CYCLE``), a priority with nothing waiting giving its turn on."""
        queues = self.names if self.names is not None else self.bus.all_lanes
        count = len(queues)
        if count == 1:  # one queue (every take of a worker of one queue): no loops
            lanes = queues[0]
            lane = lanes[_CYCLE[self._cursor]] or lanes[0] or lanes[1] or lanes[2]
            if not lane:
                return None
            self._cursor = _NEXT[self._cursor]
            return lane
        if count:
            self._turn = start = (self._turn + 1) % count
            order = queues[start:] + queues[:start]
        else:
            return None
        want = _CYCLE[self._cursor]
        for ranks in ((want,), (0, 1, 2)):
            for rank in ranks:
                for lanes in order:
                    lane = lanes[rank]
                    if lane:
                        self._cursor = _NEXT[self._cursor]
                        return lane
        return None


class _EventBatch(EventBatch):
    __slots__ = ("_consumer", "_entries", "events")

    def __init__(self, consumer: _EventConsumer, entries: list[Any]) -> None:
        self._consumer = consumer
        self._entries = entries
        events: list[Any] = entries
        for entry in entries:
            if type(entry) is _Again or type(entry) is Message:
                events = [_unpack(e)[0] for e in entries]
                break
        self.events = events

    def headers(self, index: int) -> Headers:
        return _unpack(self._entries[index])[1]

    async def ack(self) -> None:
        self._consumer.leases.release(self)

    async def nack(self, delay: float = 0.0, runs: Collection[str] | None = None) -> None:
        _check_delay(delay)
        leases = self._consumer.leases
        if self not in leases.held:
            return  # settled already, or its lease ran out and it went back
        keep: list[Any] = []
        back: list[Any] = []
        for entry in self._entries:
            chosen = runs is None or _unpack(entry)[0].run_id in runs
            (back if chosen else keep).append(entry)
        self._entries = keep
        if not keep:
            leases.release(self)
        self._consumer.bus.hand_back_events(back, delay)

    async def extend(self) -> None:
        self._consumer.leases.extend(self)

    def pending(self) -> list[Any]:
        return self._entries


class _EventConsumer(_Waiting):
    def __init__(self, bus: LocalBus, partitions: list[int]) -> None:
        super().__init__()
        self.bus = bus
        self.partitions = partitions
        self.leases = _Leases(bus.clock, bus.lease, self._expired)
        self.ready = {index for index in partitions if bus.parts[index]}
        """The partitions of this consumer that have events (`LocalBus.put_event` adds
        one): a take looks at those, not at every partition."""
        self._turn = 0

    def take(self, max_batch: int) -> _EventBatch | None:
        # The partitions take turns being first, in their order (``partitions`` is sorted).
        owned = self.partitions
        self._turn = start = (self._turn + 1) % len(owned)
        ready = self.ready
        if not ready:
            return None
        order = sorted(ready)
        if len(order) > 1:
            cut = bisect.bisect_left(order, owned[start])
            order = order[cut:] + order[:cut]
        parts = self.bus.parts
        entries: list[Any] = []
        for index in order:
            part = parts[index]
            room = max_batch - len(entries)
            if len(part) <= room:
                entries.extend(part)
                part.clear()
                ready.discard(index)
            else:
                entries.extend(part.popleft() for _ in range(room))
                break
        batch = _EventBatch(self, entries)
        self.leases.hold(batch)
        return batch

    def _expired(self, batch: _EventBatch) -> None:
        self.bus.hand_back_events(batch.pending(), 0.0)


class LocalBus(Bus):
    """The in-process bus. ``clock`` drives leases and nack delays (default: monotonic)."""

    def __init__(
        self,
        *,
        partitions: int = DEFAULT_PARTITIONS,
        lease: float = DEFAULT_LEASE,
        clock: BusClock | None = None,
    ) -> None:
        if isinstance(partitions, bool) or not isinstance(partitions, int) or partitions < 1:
            raise BusError(f"partitions must be a whole number of at least 1, got {partitions!r}")
        if not isinstance(lease, int | float) or not math.isfinite(lease) or lease <= 0:
            raise BusError(f"lease must be a positive number of seconds, got {lease!r}")
        self.partitions = partitions
        self.lease = float(lease)
        self.clock: BusClock = clock or MonotonicClock()
        self.queues: dict[str, tuple[_Lane, _Lane, _Lane]] = {}
        self.all_lanes: list[tuple[_Lane, _Lane, _Lane]] = []
        """The values of ``queues``, kept as a list for consumers of every queue."""
        self.parts: list[deque[Any]] = [deque() for _ in range(partitions)]
        self._owners: list[_EventConsumer | None] = [None] * partitions
        self._task_consumers: list[_TaskConsumer] = []
        self._controls: FanOut[Control] = FanOut()
        self._ends: FanOut[RunEnded] = FanOut()

    # -- producer ---------------------------------------------------------------

    async def publish_tasks(self, tasks: Sequence[DispatchTask | Message[DispatchTask]]) -> None:
        now = self.clock.now()
        queues = self.queues
        for task in tasks:
            body = task.body if isinstance(task, Message) else task
            lanes = queues.get(body.queue) or self.lanes_of(body.queue)
            lane = lanes[_RANK[body.priority]]
            lane.append(task)
            lane.stamps.append(now)
        self._wake_task_consumers()

    async def publish_events(self, events: Sequence[Event | Message[Event]]) -> None:
        count = self.partitions
        for event in events:
            body = event.body if isinstance(event, Message) else event
            self.put_event(partition_of(body.run_id, count), event)

    def put_event(self, index: int, entry: Any, *, first: bool = False) -> None:
        """Queue an event (``first``: ahead of the others of its partition) and tell the
        partition's consumer that it has one."""
        if first:
            self.parts[index].appendleft(entry)
        else:
            self.parts[index].append(entry)
        owner = self._owners[index]
        if owner is not None:
            owner.ready.add(index)
            if owner.waiter is not None:
                owner.wake()

    async def ack_tasks(self, deliveries: Sequence[Delivery[DispatchTask]]) -> None:
        for delivery in deliveries:
            if type(delivery) is _TaskDelivery:
                delivery.settle()  # (no coroutine per task: this is every attempt's path)
            else:
                await delivery.ack()

    async def publish_control(self, message: Control) -> None:
        self._controls.put((message,))

    async def publish_run_ends(self, ends: Sequence[RunEnded]) -> None:
        self._ends.put(ends)

    @property
    def run_ends_heard(self) -> bool:
        return bool(self._ends)

    # -- consumer ---------------------------------------------------------------

    async def consume_tasks(
        self, queues: Collection[str] | None = None, *, prefetch: int, worker: str | None = None
    ) -> AsyncGenerator[Delivery[DispatchTask], None]:
        _check_count("prefetch", prefetch)
        consumer = _TaskConsumer(self, queues, prefetch, worker)
        self._task_consumers.append(consumer)
        try:
            while True:
                delivery = consumer.take()
                if delivery is None:
                    await consumer.wait()
                    continue
                yield delivery
        finally:
            self._task_consumers.remove(consumer)
            for delivery in consumer.leases.close():
                self.hand_back_task(delivery, 0.0)

    async def consume_events(
        self, partitions: Collection[int] | None = None, *, max_batch: int
    ) -> AsyncGenerator[EventBatch, None]:
        _check_count("max_batch", max_batch)
        consumer = _EventConsumer(self, self._claim(partitions))
        for index in consumer.partitions:
            self._owners[index] = consumer
        try:
            while True:
                batch = consumer.take(max_batch)
                if batch is None:
                    await consumer.wait()
                    continue
                yield batch
        finally:
            for index in consumer.partitions:
                self._owners[index] = None
            for batch in consumer.leases.close():
                self.hand_back_events(batch.pending(), 0.0)

    def consume_control(self) -> Stream[Control]:
        return self._controls.stream()

    async def run_ends(self) -> Stream[RunEnded]:
        return self._ends.stream()

    # -- operator's view --------------------------------------------------------

    async def queue_stats(self) -> list[QueueStats]:
        """``consumers``: the open ``consume_tasks`` streams of this bus that read the
        queue (one opened for every queue counts for each); ``held``: their leases."""
        rows = []
        now = self.clock.now()
        for name in sorted(self.queues):
            lanes = self.queues[name]
            readers = [
                c
                for c in self._task_consumers
                if c.names is None or any(mine is lanes for mine in c.names)
            ]
            for rank, priority in enumerate(_RANK):
                lane = lanes[rank]
                held = sum(
                    1
                    for c in readers
                    for d in c.leases.held
                    if d.body.queue == name and d.body.priority is priority
                )
                rows.append(
                    QueueStats(
                        queue=name,
                        priority=priority,
                        depth=len(lane),
                        held=held,
                        oldest_age=lane.oldest_age(now),
                        consumers=len(readers),
                    )
                )
        return rows

    async def worker_beats(self) -> list[WorkerBeat]:
        """The open named readers, live, beating now: an in-process reader stops only by
        closing (which forgets it) or with its process, and so its bus."""
        now = time.time()
        beats = [
            WorkerBeat(worker=c.worker, queues=c.queues, last_beat=now, live=True)
            for c in self._task_consumers
            if c.worker is not None
        ]
        return sorted(beats, key=lambda b: (b.worker, b.last_beat))

    # -- internals --------------------------------------------------------------

    def lanes_of(self, queue: str) -> tuple[_Lane, _Lane, _Lane]:
        lanes = self.queues.get(queue)
        if lanes is None:
            lanes = self.queues[queue] = (_Lane(), _Lane(), _Lane())
            self.all_lanes.append(lanes)
        return lanes

    def hand_back_task(self, delivery: _TaskDelivery, delay: float) -> None:
        again = _Again(delivery.body, delivery.headers, delivery.deliveries)

        def put_back() -> None:
            lane = self.lanes_of(delivery.body.queue)[_RANK[delivery.body.priority]]
            lane.appendleft(again)
            lane.stamps.appendleft(self.clock.now())
            self._wake_task_consumers()

        self._later(delay, put_back)

    def hand_back_events(self, entries: list[Any], delay: float) -> None:
        if not entries:
            return

        def put_back() -> None:
            for entry in reversed(entries):  # ahead of newer events, in their order
                body, headers, deliveries = _unpack(entry)
                index = partition_of(body.run_id, self.partitions)
                self.put_event(index, _Again(body, headers, deliveries + 1), first=True)

        self._later(delay, put_back)

    def _later(self, delay: float, callback: Callable[[], None]) -> None:
        if delay <= 0:
            callback()
        else:
            self.clock.call_at(self.clock.now() + delay, callback)

    def _wake_task_consumers(self) -> None:
        for consumer in self._task_consumers:
            if consumer.waiter is not None:
                consumer.wake()

    def _claim(self, partitions: Collection[int] | None) -> list[int]:
        wanted = wanted_partitions(partitions, self.partitions)
        for index in wanted:
            if self._owners[index] is not None:
                raise BusError(
                    f"partition {index} is consumed by another consumer already: "
                    "close it first, or consume other partitions"
                )
        return wanted


def _check_count(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise BusError(f"{name} must be a whole number of at least 1, got {value!r}")


def _check_delay(delay: float) -> None:
    if not isinstance(delay, int | float) or not math.isfinite(delay) or delay < 0:
        raise BusError(f"a nack delay must be a number of seconds, 0 or more, got {delay!r}")
