"""The consumers of the Redis Streams bus: what each holds, and how it takes more.

Each ``consume_*`` iterator has a consumer name of its own (host, pid, a random part),
visible in ``XPENDING`` and ``XINFO CONSUMERS``. The deliveries it holds are kept in
lease order (the first runs out first); one that runs out is let go of and taken again
by the next sweep (``XAUTOCLAIM``), with its delivery count one higher.

redis-py can drop a cancel (it sends each command under a ``wait_for``, which on Python
3.11 returns the answer of a command written in the turn the cancel came): each loop here
raises such a cancel itself at its next turn (``closing.raise_dropped_cancel``), once what
it took is recorded, so a cancelled read ends and its cleanup hands that back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections import deque
from collections.abc import Collection
from typing import TYPE_CHECKING, Any

from redis.exceptions import RedisError

from tideflow.bus.backends.redis_wire import Malformed, decode_event, decode_task, fields_of
from tideflow.bus.base import PRIORITY_CYCLE, Delivery, EventBatch, Headers
from tideflow.bus.closing import cancel_and_wait, cancels_asked, raise_dropped_cancel
from tideflow.errors import BusError
from tideflow.model.commands import DispatchTask
from tideflow.model.events import Event
from tideflow.model.plan import Priority

if TYPE_CHECKING:
    from tideflow.bus.backends.redis import RedisBus

log = logging.getLogger("tideflow.bus.redis")

TASK_GROUP = "workers"
EVENT_GROUP = "engine"
PARKED = "handed-back"
"""The consumer that entries handed back by a closing event consumer are parked with."""
LONG_IDLE = 10**12
"""Milliseconds of idle time that mark an entry as expired for the next sweep."""
RANKS = (Priority.HIGH, Priority.NORMAL, Priority.LOW)
CYCLE = "".join(str(RANKS.index(p)) for p in PRIORITY_CYCLE)
FAILED = (RedisError, ConnectionError, OSError)
"""What a lost connection, or a server that refuses for now (READONLY after a failover,
out of memory), raises."""


class Entry:
    """A stream entry as delivered: where it is, how often it was delivered, its fields."""

    __slots__ = ("body", "d", "h", "id", "stream", "times")

    def __init__(self, stream: str, id: bytes, times: int, fields: dict[bytes, bytes]) -> None:
        self.stream = stream
        self.id = id
        self.times = times
        self.body = fields.get(b"b", b"")
        self.h = fields.get(b"h", b"")
        self.d = 0

    @property
    def key(self) -> tuple[str, bytes]:
        return (self.stream, self.id)


class Backoff:
    """Waits between attempts after a failure (50 ms doubling to 5 s), logging each."""

    def __init__(self, bus: RedisBus, what: str) -> None:
        self.bus = bus
        self.what = what
        self.delay = 0.0

    async def failed(self, exc: BaseException) -> None:
        self.delay = min(self.delay * 2, 5.0) if self.delay else 0.05
        log.warning(
            "redis bus %s: %s failed (%s: %s); trying again in %.2fs",
            self.bus.shown,
            self.what,
            type(exc).__name__,
            exc,
            self.delay,
        )
        await asyncio.sleep(self.delay)

    def succeeded(self) -> None:
        if self.delay:
            log.info("redis bus %s: %s works again", self.bus.shown, self.what)
            self.delay = 0.0


class TaskDelivery(Delivery[DispatchTask]):
    __slots__ = ("body", "consumer", "deadline", "deliveries", "entry", "headers")

    def __init__(
        self, consumer: TaskConsumer, entry: Entry, body: DispatchTask, headers: Headers
    ) -> None:
        self.body = body
        self.headers = headers
        self.deliveries = entry.d + entry.times
        self.entry = entry
        self.deadline = 0.0
        self.consumer = consumer

    async def ack(self) -> None:
        await self.consumer.settle(self, -1)

    async def nack(self, delay: float = 0.0) -> None:
        await self.consumer.settle(self, delay_ms(delay))

    async def extend(self) -> None:
        await self.consumer.extend(self)


class TaskConsumer:
    """One ``consume_tasks`` iterator: what it holds, and how it takes more."""

    def __init__(self, bus: RedisBus, queues: Collection[str] | None, prefetch: int) -> None:
        self.bus = bus
        self.prefetch = prefetch
        self.every = queues is None
        self.queues: list[str] = [] if queues is None else sorted(set(queues))
        self.keys: list[str] = []
        self.name = bus.consumer_name()
        self.held: dict[tuple[str, bytes], TaskDelivery] = {}
        """In lease order: the first runs out first."""
        self.ready: deque[TaskDelivery] = deque()
        self.settled = asyncio.Event()
        self.cursor = 0
        self.turn = 0
        self.next_sweep = 0.0
        self.notice = b"0-0"
        self.refresh = True

    async def next(self) -> TaskDelivery:
        asked = cancels_asked()
        backoff = Backoff(self.bus, "consume_tasks")
        while True:
            raise_dropped_cancel(asked)  # what it took is held: the close hands it back
            while self.ready:
                delivery = self.ready.popleft()
                if self.held.get(delivery.entry.key) is delivery:
                    return delivery
            try:
                await self._fill(asked)
            except FAILED as exc:
                await backoff.failed(exc)
            else:
                backoff.succeeded()

    async def _fill(self, asked: int) -> None:
        now = time.monotonic()
        if self._expire(now):
            self.next_sweep = 0.0
        if len(self.held) >= self.prefetch:
            self.settled.clear()
            await wait_until_set(self.settled, self._first_deadline() - now)
            return
        if self.refresh:
            await self._refresh()
        sweep = now >= self.next_sweep
        if sweep:
            self.next_sweep = now + self.bus.recheck
        taken, self.cursor, self.turn, last = await self.bus.script(
            "take_tasks",
            self.keys,
            TASK_GROUP,
            self.name,
            self.prefetch - len(self.held),
            self.cursor,
            self.turn,
            CYCLE,
            self.bus.lease_ms if sweep else -1,
        )
        if taken:
            await self._accept(
                [
                    (self.keys[i - 1], entry_id, fields_of(raw), times)
                    for i, entry_id, raw, times in taken
                ]
            )
            return
        raise_dropped_cancel(asked)  # before the wait on the server (up to ``recheck``)
        deadline = min(self.next_sweep, self._first_deadline())
        free = self.prefetch - len(self.held)
        if not self.every and self.keys and free >= len(self.keys):
            # nothing now: wait for the next tasks and take them in the same round trip (at
            # most free / streams from each, within the prefetch; a consumer of every queue
            # also waits for new queues, on a stream of no group, so it cannot)
            came = await self.bus.block_group(
                self.keys,
                TASK_GROUP,
                self.name,
                free // len(self.keys),
                deadline - time.monotonic(),
            )
            await self._accept([(key, entry_id, fields, 1) for key, entry_id, fields in came])
            return
        keys, ids = list(self.keys), list(last)
        if self.every:
            keys.append(self.bus.key("queues:new"))
            ids.append(self.notice)
        woken = await self.bus.block(keys, ids, deadline - time.monotonic())
        if self.every and (not woken or keys[-1] in woken):
            self.refresh = True

    async def _refresh(self) -> None:
        bus = self.bus
        if self.every:
            names, newest = await bus.run(
                ("SMEMBERS", bus.key("queues")),
                ("XREVRANGE", bus.key("queues:new"), "+", "-", "COUNT", 1),
            )
            self.queues = sorted(name.decode() for name in names)
            self.notice = newest[0][0] if newest else b"0-0"
        self.keys = [bus.task_stream(queue, rank) for queue in self.queues for rank in RANKS]
        self.refresh = False

    async def _accept(self, taken: list[tuple[str, bytes, dict[bytes, bytes], int]]) -> None:
        now = time.monotonic()
        for key, entry_id, fields, times in taken:
            entry = Entry(key, entry_id, times, fields)
            try:
                body, headers, entry.d = decode_task(fields)
            except Malformed as exc:
                await self.bus.bury(entry, TASK_GROUP, fields, str(exc))
                continue
            delivery = TaskDelivery(self, entry, body, headers)
            delivery.deadline = now + self.bus.lease
            self.held.pop(entry.key, None)
            self.held[entry.key] = delivery
            self.ready.append(delivery)

    def _expire(self, now: float) -> bool:
        """Let go of the deliveries whose lease ran out (a sweep takes them again)."""
        expired = False
        while self.held:
            key, delivery = next(iter(self.held.items()))
            if delivery.deadline > now:
                break
            del self.held[key]
            expired = True
        return expired

    def _first_deadline(self) -> float:
        for delivery in self.held.values():
            return delivery.deadline
        return math.inf

    async def settle(self, delivery: TaskDelivery, delay_ms: int) -> None:
        await self.settle_all([delivery], delay_ms)

    async def settle_all(self, deliveries: list[TaskDelivery], delay_ms: int) -> None:
        """Settle the deliveries this consumer still holds, in one script call."""
        entries = []
        for delivery in deliveries:
            if self.held.get(delivery.entry.key) is not delivery:
                continue  # settled already, or its lease ran out and it went back
            del self.held[delivery.entry.key]
            entries.append(delivery.entry)
        if entries:
            self.settled.set()
            await self.bus.settle(entries, TASK_GROUP, self.name, delay_ms)

    async def extend(self, delivery: TaskDelivery) -> None:
        key = delivery.entry.key
        if self.held.get(key) is not delivery:
            return
        kept = await self.bus.touch([delivery.entry], TASK_GROUP, self.name, self.name, 0)
        if self.held.get(key) is delivery:
            del self.held[key]
            if kept:
                delivery.deadline = time.monotonic() + self.bus.lease
                self.held[key] = delivery  # the newest goes last
            else:
                self.settled.set()

    async def close(self) -> None:
        held = [d.entry for d in self.held.values()]
        self.held.clear()
        self.ready.clear()
        try:
            if held:
                await self.bus.settle(held, TASK_GROUP, self.name, 0)
            await self.bus.release([], self.keys, self.name, TASK_GROUP)
        except (BusError, *FAILED) as exc:
            if not held:
                log.debug("redis bus %s: a closing task consumer: %s", self.bus.shown, exc)
                return
            log.warning(
                "redis bus %s: a closing task consumer could not hand back %d task(s) (%s: "
                "%s); they are delivered again when their lease runs out",
                self.bus.shown,
                len(held),
                type(exc).__name__,
                exc,
            )


class Batch(EventBatch):
    __slots__ = ("_consumer", "_entries", "_headers", "deadline", "events")

    def __init__(self, consumer: EventConsumer, items: list[tuple[Entry, Event, Headers]]) -> None:
        self._consumer = consumer
        self._entries = [(entry, event.run_id) for entry, event, _ in items]
        self.events = [event for _, event, _ in items]
        self._headers = [headers for _, _, headers in items]
        self.deadline = 0.0

    def headers(self, index: int) -> Headers:
        return self._headers[index]

    async def ack(self) -> None:
        await self._consumer.settle(self, None, -1)

    async def nack(self, delay: float = 0.0, runs: Collection[str] | None = None) -> None:
        await self._consumer.settle(self, runs, delay_ms(delay))

    async def extend(self) -> None:
        await self._consumer.extend(self)

    def take(self, runs: Collection[str] | None) -> list[Entry]:
        """The entries of ``runs`` (all when None), no longer part of the batch (``events``
        stays whole: only what is still to settle changes)."""
        keep: list[tuple[Entry, str]] = []
        taken: list[Entry] = []
        for entry, run_id in self._entries:
            if runs is None or run_id in runs:
                taken.append(entry)
            else:
                keep.append((entry, run_id))
        self._entries = keep
        return taken

    def pending(self) -> list[Entry]:
        return [entry for entry, _ in self._entries]


class EventConsumer:
    """One ``consume_events`` iterator over the partitions it holds."""

    def __init__(self, bus: RedisBus, partitions: list[int], max_batch: int) -> None:
        self.bus = bus
        self.partitions = partitions
        self.max_batch = max_batch
        self.keys = [bus.event_stream(p) for p in partitions]
        self.locks = [bus.key(f"owner:{p}") for p in partitions]
        self.name = bus.consumer_name()
        self.held: dict[Batch, float] = {}
        self.turn = 0
        self.next_sweep = 0.0
        self.lost: int | None = None
        self.renewer: asyncio.Task[None] | None = None

    async def claim(self) -> None:
        bus = self.bus
        try:
            taken = await bus.script(
                "claim_partitions",
                self.locks + self.keys,
                self.name,
                bus.lease_ms,
                EVENT_GROUP,
                PARKED,
                LONG_IDLE,
            )
        except FAILED as exc:
            raise bus.failure("claiming event partitions", exc) from exc
        if taken:
            raise BusError(
                f"partition {self.partitions[taken - 1]} is consumed by another consumer "
                f"already (on {bus.shown}): close it first, or consume other partitions"
            )
        self.renewer = asyncio.create_task(self._renew())

    async def _renew(self) -> None:
        asked = cancels_asked()
        backoff = Backoff(self.bus, "consume_events (renewing its partitions)")
        while True:
            await asyncio.sleep(self.bus.lease / 3)
            try:
                lost = await self.bus.script(
                    "renew_partitions", self.locks, self.name, self.bus.lease_ms
                )
            except FAILED as exc:
                await backoff.failed(exc)
                continue
            raise_dropped_cancel(asked)
            backoff.succeeded()
            if lost:
                self.lost = self.partitions[lost - 1]
                return

    async def next(self) -> Batch:
        asked = cancels_asked()
        backoff = Backoff(self.bus, "consume_events")
        while True:
            if self.lost is not None:
                raise BusError(
                    f"partition {self.lost} was taken over by another consumer on "
                    f"{self.bus.shown}: this one did not renew its claim within the lease "
                    f"({self.bus.lease:g}s)"
                )
            try:
                batch = await self._take(asked)
            except FAILED as exc:
                await backoff.failed(exc)
                continue
            raise_dropped_cancel(asked)  # a batch taken is held: the close hands it back
            backoff.succeeded()
            if batch is not None:
                return batch

    async def _take(self, asked: int) -> Batch | None:
        now = time.monotonic()
        while self.held:
            batch, deadline = next(iter(self.held.items()))
            if deadline > now:
                break
            del self.held[batch]  # its lease ran out: the sweep takes its entries again
            self.next_sweep = 0.0
        sweep = now >= self.next_sweep
        if sweep:
            self.next_sweep = now + self.bus.recheck
        count = len(self.keys)
        self.turn = start = (self.turn + 1) % count
        keys = self.keys[start:] + self.keys[:start]
        (taken,) = await self.bus.script(
            "take_events",
            keys,
            EVENT_GROUP,
            self.name,
            self.max_batch,
            self.bus.lease_ms if sweep else -1,
        )
        if taken:
            return await self._accept(
                [
                    (keys[index - 1], entry_id, fields_of(raw), times)
                    for index, entry_id, raw, times in taken
                ]
            )
        raise_dropped_cancel(asked)  # before the wait on the server (up to ``recheck``)
        first = next(iter(self.held.values()), math.inf)
        # nothing now: wait for the next entries and take them in the same round trip
        share = max(1, -(-self.max_batch // len(keys)))
        woken = await self.bus.block_group(
            keys, EVENT_GROUP, self.name, share, min(self.next_sweep, first) - time.monotonic()
        )
        return await self._accept([(key, entry_id, fields, 1) for key, entry_id, fields in woken])

    async def _accept(
        self, taken: list[tuple[str, bytes, dict[bytes, bytes], int]]
    ) -> Batch | None:
        items: list[tuple[Entry, Event, Headers]] = []
        for key, entry_id, fields, times in taken:
            entry = Entry(key, entry_id, times, fields)
            try:
                event, headers, entry.d = decode_event(fields)
            except Malformed as exc:
                await self.bus.bury(entry, EVENT_GROUP, fields, str(exc))
                continue
            items.append((entry, event, headers))
        if not items:
            return None
        batch = Batch(self, items)
        self.held[batch] = time.monotonic() + self.bus.lease
        return batch

    async def settle(self, batch: Batch, runs: Collection[str] | None, delay_ms: int) -> None:
        if batch not in self.held:
            return  # settled already, or its lease ran out and it went back
        entries = batch.take(runs)
        if not batch.pending():
            del self.held[batch]
        if entries:
            await self.bus.settle(entries, EVENT_GROUP, self.name, delay_ms)

    async def extend(self, batch: Batch) -> None:
        if batch not in self.held:
            return
        await self.bus.touch(batch.pending(), EVENT_GROUP, self.name, self.name, 0)
        if batch in self.held:
            del self.held[batch]
            self.held[batch] = time.monotonic() + self.bus.lease  # the newest goes last

    async def close(self) -> None:
        if self.renewer is not None:
            await cancel_and_wait(self.renewer)
        held = [entry for batch in self.held for entry in batch.pending()]
        self.held.clear()
        try:
            if held:  # marked expired, in place: the next owner takes them first, in order
                await self.bus.touch(held, EVENT_GROUP, self.name, PARKED, LONG_IDLE)
            await self.bus.release(self.locks, self.keys, self.name, EVENT_GROUP)
        except (BusError, *FAILED) as exc:
            log.warning(
                "redis bus %s: a closing event consumer could not hand back its partitions "
                "(%s: %s); another consumer can take them when their lock runs out (%gs)",
                self.bus.shown,
                type(exc).__name__,
                exc,
                self.bus.lease,
            )


async def wait_until_set(event: asyncio.Event, timeout: float) -> None:
    """Until ``event`` is set or ``timeout`` seconds have passed (at most a day)."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(max(0.0, min(timeout, 86_400.0))):
            await event.wait()


def text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def delay_ms(delay: float) -> int:
    if (
        isinstance(delay, bool)
        or not isinstance(delay, int | float)
        or not math.isfinite(delay)
        or delay < 0
    ):
        raise BusError(f"a nack delay must be a number of seconds, 0 or more, got {delay!r}")
    return math.ceil(delay * 1000)
