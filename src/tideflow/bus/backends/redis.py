"""The Redis Streams bus: streams and consumer groups, leases in the pending entries list.

Keys, all under ``<prefix>:`` (``tideflow`` unless the URL says otherwise):

- ``tasks:<queue>:<priority>``: a stream per queue and priority, consumer group
  ``workers``; ``queues`` is the set of the queue names published to, and
  ``queues:new`` a short stream that wakes consumers of every queue when a new one
  appears;
- ``events:<partition>``: a stream per event partition, consumer group ``engine``;
  ``owner:<partition>`` is the lock of the consumer that holds the partition
  (``SET NX PX lease``, renewed while it is open, deleted when it closes);
  ``partitions``: the partition count every process of the cluster must share;
- ``delayed``: a sorted set of nacked messages by due time, moved back onto their
  streams when due;
- ``dead``: a stream of the entries that could not be read (malformed), with why;
- the ``control`` channel (PUBLISH / SUBSCRIBE) for cancels.

A delivery is an entry in the group's pending entries list (PEL): its lease runs out when
it has been idle longer than ``lease`` (``XAUTOCLAIM`` then gives it to the consumer that
sweeps), ``extend`` resets its idle time (``XCLAIM … JUSTID``), ``ack`` is ``XACK`` and
``XDEL`` (a stream holds only what is not settled yet), ``nack(delay)`` acknowledges it
and adds it again, at once or from ``delayed`` when due. The delivery count is the
entry's times-delivered in the PEL, plus the deliveries before it was added again.

Consumers block on the server (``XREAD BLOCK``), waking when an entry arrives, for their
own next lease deadline, and at least every ``recheck`` seconds (a quarter of the lease,
at most 5 s) to sweep for deliveries whose consumer has gone. A lost connection is
logged and retried with backoff by the consumers; the producer raises ``BusError``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import socket
import time
import uuid
from collections import deque
from collections.abc import AsyncGenerator, Collection, Sequence
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from tideflow.bus.backends import redis_lua as lua
from tideflow.bus.backends.redis_wire import (
    Malformed,
    decode_control,
    decode_event,
    decode_task,
    encode_control,
    encode_event,
    encode_headers,
    encode_task,
    fields_of,
)
from tideflow.bus.base import (
    DEFAULT_LEASE,
    DEFAULT_PARTITIONS,
    PRIORITY_CYCLE,
    Bus,
    Control,
    Delivery,
    EventBatch,
    Headers,
    Message,
    Stream,
    partition_of,
)
from tideflow.errors import BusError
from tideflow.model.commands import DispatchTask
from tideflow.model.events import Event
from tideflow.model.plan import Priority

log = logging.getLogger("tideflow.bus.redis")

DEFAULT_PREFIX = "tideflow"
TASK_GROUP = "workers"
EVENT_GROUP = "engine"
PARKED = "handed-back"
"""The consumer that entries handed back by a closing event consumer are parked with."""
LONG_IDLE = 10**12
"""Milliseconds of idle time that mark an entry as expired for the next sweep."""
DEAD_MAX = 10_000
"""About how many entries the dead stream keeps (the oldest go first)."""
_RANKS = (Priority.HIGH, Priority.NORMAL, Priority.LOW)
_CYCLE = "".join(str(_RANKS.index(p)) for p in PRIORITY_CYCLE)
_LOST = (RedisConnectionError, RedisTimeoutError, ConnectionError, OSError)


class _Entry:
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


class _Backoff:
    """Waits between reconnection attempts (50 ms doubling to 5 s), logging each."""

    def __init__(self, bus: RedisBus, what: str) -> None:
        self.bus = bus
        self.what = what
        self.delay = 0.0

    async def failed(self, exc: BaseException) -> None:
        self.delay = min(self.delay * 2, 5.0) if self.delay else 0.05
        log.warning(
            "redis bus %s: %s lost its connection (%s: %s); reconnecting in %.2fs",
            self.bus.shown,
            self.what,
            type(exc).__name__,
            exc,
            self.delay,
        )
        await asyncio.sleep(self.delay)

    def succeeded(self) -> None:
        if self.delay:
            log.info("redis bus %s: %s reconnected", self.bus.shown, self.what)
            self.delay = 0.0


class _TaskDelivery(Delivery[DispatchTask]):
    __slots__ = ("_consumer", "body", "deadline", "deliveries", "entry", "headers")

    def __init__(
        self, consumer: _TaskConsumer, entry: _Entry, body: DispatchTask, headers: Headers
    ) -> None:
        self.body = body
        self.headers = headers
        self.deliveries = entry.d + entry.times
        self.entry = entry
        self.deadline = 0.0
        self._consumer = consumer

    async def ack(self) -> None:
        await self._consumer.settle(self, -1)

    async def nack(self, delay: float = 0.0) -> None:
        await self._consumer.settle(self, _delay_ms(delay))

    async def extend(self) -> None:
        await self._consumer.extend(self)


class _TaskConsumer:
    """One ``consume_tasks`` iterator: what it holds, and how it takes more."""

    def __init__(self, bus: RedisBus, queues: Collection[str] | None, prefetch: int) -> None:
        self.bus = bus
        self.prefetch = prefetch
        self.every = queues is None
        self.queues: list[str] = [] if queues is None else sorted(set(queues))
        self.keys: list[str] = []
        self.name = bus.consumer_name()
        self.held: dict[tuple[str, bytes], _TaskDelivery] = {}
        """In lease order: the first runs out first."""
        self.ready: deque[_TaskDelivery] = deque()
        self.settled = asyncio.Event()
        self.cursor = 0
        self.turn = 0
        self.next_sweep = 0.0
        self.notice = b"0-0"
        self.refresh = True

    async def next(self) -> _TaskDelivery:
        backoff = _Backoff(self.bus, "consume_tasks")
        while True:
            while self.ready:
                delivery = self.ready.popleft()
                if self.held.get(delivery.entry.key) is delivery:
                    return delivery
            try:
                await self._fill()
            except _LOST as exc:
                await backoff.failed(exc)
            else:
                backoff.succeeded()

    async def _fill(self) -> None:
        now = time.monotonic()
        if self._expire(now):
            self.next_sweep = 0.0
        if len(self.held) >= self.prefetch:
            self.settled.clear()
            await _wait(self.settled, self._first_deadline() - now)
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
            _CYCLE,
            self.bus.lease_ms if sweep else -1,
        )
        if taken:
            await self._accept(taken)
            return
        keys, ids = list(self.keys), list(last)
        if self.every:
            keys.append(self.bus.key("queues:new"))
            ids.append(self.notice)
        deadline = min(self.next_sweep, self._first_deadline())
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
        self.keys = [bus.task_stream(queue, rank) for queue in self.queues for rank in _RANKS]
        self.refresh = False

    async def _accept(self, taken: list[Any]) -> None:
        now = time.monotonic()
        for index, entry_id, raw, times in taken:
            fields = fields_of(raw)
            entry = _Entry(self.keys[index - 1], entry_id, times, fields)
            try:
                body, headers, entry.d = decode_task(fields)
            except Malformed as exc:
                await self.bus.bury(entry, TASK_GROUP, fields, str(exc))
                continue
            delivery = _TaskDelivery(self, entry, body, headers)
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

    async def settle(self, delivery: _TaskDelivery, delay_ms: int) -> None:
        if self.held.get(delivery.entry.key) is not delivery:
            return  # settled already, or its lease ran out and it went back
        del self.held[delivery.entry.key]
        self.settled.set()
        await self.bus.settle([delivery.entry], TASK_GROUP, self.name, delay_ms)

    async def extend(self, delivery: _TaskDelivery) -> None:
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
        except (RedisError, BusError, *_LOST) as exc:
            log.warning(
                "redis bus %s: a closing task consumer could not hand back %d task(s) (%s: "
                "%s); they are delivered again when their lease runs out",
                self.bus.shown,
                len(held),
                type(exc).__name__,
                exc,
            )


class _EventBatch(EventBatch):
    __slots__ = ("_consumer", "_entries", "_headers", "deadline", "events")

    def __init__(
        self, consumer: _EventConsumer, items: list[tuple[_Entry, Event, Headers]]
    ) -> None:
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
        await self._consumer.settle(self, runs, _delay_ms(delay))

    async def extend(self) -> None:
        await self._consumer.extend(self)

    def take(self, runs: Collection[str] | None) -> list[_Entry]:
        """The entries of ``runs`` (all when None), no longer part of the batch (``events``
        stays whole: only what is still to settle changes)."""
        keep: list[tuple[_Entry, str]] = []
        taken: list[_Entry] = []
        for entry, run_id in self._entries:
            if runs is None or run_id in runs:
                taken.append(entry)
            else:
                keep.append((entry, run_id))
        self._entries = keep
        return taken

    def pending(self) -> list[_Entry]:
        return [entry for entry, _ in self._entries]


class _EventConsumer:
    """One ``consume_events`` iterator over the partitions it holds."""

    def __init__(self, bus: RedisBus, partitions: list[int], max_batch: int) -> None:
        self.bus = bus
        self.partitions = partitions
        self.max_batch = max_batch
        self.keys = [bus.event_stream(p) for p in partitions]
        self.locks = [bus.key(f"owner:{p}") for p in partitions]
        self.name = bus.consumer_name()
        self.held: dict[_EventBatch, float] = {}
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
        except (RedisError, *_LOST) as exc:
            raise bus.failure("claiming event partitions", exc) from exc
        if taken:
            raise BusError(
                f"partition {self.partitions[taken - 1]} is consumed by another consumer "
                f"already (on {bus.shown}): close it first, or consume other partitions"
            )
        self.renewer = asyncio.create_task(self._renew())

    async def _renew(self) -> None:
        backoff = _Backoff(self.bus, "consume_events (renewing its partitions)")
        while True:
            await asyncio.sleep(self.bus.lease / 3)
            try:
                lost = await self.bus.script(
                    "renew_partitions", self.locks, self.name, self.bus.lease_ms
                )
            except _LOST as exc:
                await backoff.failed(exc)
                continue
            backoff.succeeded()
            if lost:
                self.lost = self.partitions[lost - 1]
                return

    async def next(self) -> _EventBatch:
        backoff = _Backoff(self.bus, "consume_events")
        while True:
            if self.lost is not None:
                raise BusError(
                    f"partition {self.lost} was taken over by another consumer on "
                    f"{self.bus.shown}: this one did not renew its claim within the lease "
                    f"({self.bus.lease:g}s)"
                )
            try:
                batch = await self._take()
            except _LOST as exc:
                await backoff.failed(exc)
                continue
            backoff.succeeded()
            if batch is not None:
                return batch

    async def _take(self) -> _EventBatch | None:
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
        taken, last = await self.bus.script(
            "take_events",
            keys,
            EVENT_GROUP,
            self.name,
            self.max_batch,
            self.bus.lease_ms if sweep else -1,
        )
        if taken:
            return await self._accept(keys, taken)
        first = next(iter(self.held.values()), math.inf)
        await self.bus.block(keys, list(last), min(self.next_sweep, first) - time.monotonic())
        return None

    async def _accept(self, keys: list[str], taken: list[Any]) -> _EventBatch | None:
        items: list[tuple[_Entry, Event, Headers]] = []
        for index, entry_id, raw, times in taken:
            fields = fields_of(raw)
            entry = _Entry(keys[index - 1], entry_id, times, fields)
            try:
                event, headers, entry.d = decode_event(fields)
            except Malformed as exc:
                await self.bus.bury(entry, EVENT_GROUP, fields, str(exc))
                continue
            items.append((entry, event, headers))
        if not items:
            return None
        batch = _EventBatch(self, items)
        self.held[batch] = time.monotonic() + self.bus.lease
        return batch

    async def settle(self, batch: _EventBatch, runs: Collection[str] | None, delay_ms: int) -> None:
        if batch not in self.held:
            return  # settled already, or its lease ran out and it went back
        entries = batch.take(runs)
        if not batch.pending():
            del self.held[batch]
        if entries:
            await self.bus.settle(entries, EVENT_GROUP, self.name, delay_ms)

    async def extend(self, batch: _EventBatch) -> None:
        if batch not in self.held:
            return
        await self.bus.touch(batch.pending(), EVENT_GROUP, self.name, self.name, 0)
        if batch in self.held:
            del self.held[batch]
            self.held[batch] = time.monotonic() + self.bus.lease  # the newest goes last

    async def close(self) -> None:
        if self.renewer is not None:
            self.renewer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.renewer
        held = [entry for batch in self.held for entry in batch.pending()]
        self.held.clear()
        try:
            if held:  # marked expired, in place: the next owner takes them first, in order
                await self.bus.touch(held, EVENT_GROUP, self.name, PARKED, LONG_IDLE)
            await self.bus.release(self.locks, self.keys, self.name, EVENT_GROUP)
        except (RedisError, BusError, *_LOST) as exc:
            log.warning(
                "redis bus %s: a closing event consumer could not hand back its partitions "
                "(%s: %s); another consumer can take them when their lock runs out (%gs)",
                self.bus.shown,
                type(exc).__name__,
                exc,
                self.bus.lease,
            )


class _ControlStream:
    """Subscribed from its creation: the bus holds the one subscription and fans out."""

    def __init__(self, subscribers: list[asyncio.Queue[Control]]) -> None:
        self._queue: asyncio.Queue[Control] = asyncio.Queue()
        self._subscribers = subscribers
        subscribers.append(self._queue)

    def __aiter__(self) -> _ControlStream:
        return self

    async def __anext__(self) -> Control:
        return await self._queue.get()

    async def aclose(self) -> None:
        if self._queue in self._subscribers:
            self._subscribers.remove(self._queue)


class RedisBus(Bus):
    """The bus on a Redis server (5.0 streams; 6.2 or newer for ``XAUTOCLAIM``)."""

    def __init__(
        self,
        url: str,
        *,
        prefix: str = DEFAULT_PREFIX,
        partitions: int = DEFAULT_PARTITIONS,
        lease: float = DEFAULT_LEASE,
    ) -> None:
        if isinstance(partitions, bool) or not isinstance(partitions, int) or partitions < 1:
            raise BusError(f"partitions must be a whole number of at least 1, got {partitions!r}")
        if not isinstance(lease, int | float) or not math.isfinite(lease) or lease <= 0:
            raise BusError(f"lease must be a positive number of seconds, got {lease!r}")
        if not prefix or any(c.isspace() or c in "*?[]{}" for c in prefix):
            raise BusError(
                f"prefix must be a non-empty name without spaces or * ? [ ] {{ }}, got {prefix!r}"
            )
        self.url = url
        self.shown = _redact(url)
        self.prefix = prefix
        self.partitions = partitions
        self.lease = float(lease)
        self.lease_ms = max(1, round(self.lease * 1000))
        self.recheck = min(max(self.lease / 4, 0.01), 5.0)
        self._client: aioredis.Redis | None = None
        self._scripts: dict[str, Any] = {}
        self._controls: list[asyncio.Queue[Control]] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._due = asyncio.Event()

    # -- lifecycle --------------------------------------------------------------

    async def open(self) -> None:
        if self._client is not None:
            return
        client = aioredis.Redis.from_url(self.url, socket_connect_timeout=5.0)
        pubsub: Any = client.pubsub()  # untyped in redis-py
        try:
            await client.ping()
            await self._check_partitions(client)
            await pubsub.subscribe(self.key("control"))
            await _subscribed(pubsub)
        except (RedisError, *_LOST) as exc:
            await pubsub.aclose()
            await client.aclose()
            raise self.failure("connecting", exc) from exc
        except BaseException:
            await pubsub.aclose()
            await client.aclose()
            raise
        self._client = client
        for name in ("take_tasks", "take_events", "settle", "touch", "due"):
            self._scripts[name] = client.register_script(getattr(lua, name.upper()))
        for name in ("claim_partitions", "renew_partitions", "release"):
            self._scripts[name] = client.register_script(getattr(lua, name.upper()))
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._listen(pubsub)), loop.create_task(self._move_due())]

    async def close(self) -> None:
        client, self._client = self._client, None
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        if client is not None:
            await client.aclose()

    async def _check_partitions(self, client: aioredis.Redis) -> None:
        key = self.key("partitions")
        await client.set(key, self.partitions, nx=True)
        stored = int(await client.get(key) or self.partitions)
        if stored != self.partitions:
            raise BusError(
                f"the Redis bus {self.shown} (prefix {self.prefix!r}) has {stored} event "
                f"partitions, this bus was given partitions={self.partitions}: give every "
                f"process of a cluster the same partitions, or use another prefix"
            )

    # -- producer ---------------------------------------------------------------

    async def publish_tasks(self, tasks: Sequence[DispatchTask | Message[DispatchTask]]) -> None:
        if not tasks:
            return
        commands: list[tuple[Any, ...]] = []
        queues: set[str] = set()
        for task in tasks:
            body, headers = (task.body, task.headers) if isinstance(task, Message) else (task, {})
            queues.add(body.queue)
            commands.append(
                _xadd(self.task_stream(body.queue, body.priority), encode_task(body), headers)
            )
        commands.insert(0, ("SADD", self.key("queues"), *sorted(queues)))
        try:
            replies = await self.run(*commands)
            if replies[0]:
                await self.run(
                    ("XADD", self.key("queues:new"), "MAXLEN", "~", 100, "*", "q", "new")
                )
        except (RedisError, *_LOST) as exc:
            raise self.failure(f"publishing {len(tasks)} task(s)", exc) from exc

    async def publish_events(self, events: Sequence[Event | Message[Event]]) -> None:
        if not events:
            return
        commands = []
        for event in events:
            body, headers = (
                (event.body, event.headers) if isinstance(event, Message) else (event, {})
            )
            stream = self.event_stream(partition_of(body.run_id, self.partitions))
            commands.append(_xadd(stream, encode_event(body), headers))
        try:
            await self.run(*commands)
        except (RedisError, *_LOST) as exc:
            raise self.failure(f"publishing {len(events)} event(s)", exc) from exc

    async def publish_control(self, message: Control) -> None:
        try:
            await self.client.publish(self.key("control"), encode_control(message))
        except (RedisError, *_LOST) as exc:
            raise self.failure("publishing a control message", exc) from exc

    # -- consumer ---------------------------------------------------------------

    async def consume_tasks(
        self, queues: Collection[str] | None = None, *, prefetch: int
    ) -> AsyncGenerator[Delivery[DispatchTask], None]:
        _check_count("prefetch", prefetch)
        self.client  # noqa: B018 (refuses a bus that is not open)
        consumer = _TaskConsumer(self, queues, prefetch)
        try:
            while True:
                yield await consumer.next()
        finally:
            await consumer.close()

    async def consume_events(
        self, partitions: Collection[int] | None = None, *, max_batch: int
    ) -> AsyncGenerator[EventBatch, None]:
        _check_count("max_batch", max_batch)
        consumer = _EventConsumer(self, self._wanted(partitions), max_batch)
        await consumer.claim()
        try:
            while True:
                yield await consumer.next()
        finally:
            await consumer.close()

    def consume_control(self) -> Stream[Control]:
        return _ControlStream(self._controls)

    # -- what the consumers share -----------------------------------------------

    @property
    def client(self) -> aioredis.Redis:
        if self._client is None:
            raise BusError(f"the Redis bus {self.shown} is not open: await bus.open() first")
        return self._client

    def key(self, name: str) -> str:
        return f"{self.prefix}:{name}"

    def task_stream(self, queue: str, priority: Priority) -> str:
        return f"{self.prefix}:tasks:{queue}:{priority.value}"

    def event_stream(self, partition: int) -> str:
        return f"{self.prefix}:events:{partition}"

    def consumer_name(self) -> str:
        return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"

    def failure(self, what: str, exc: BaseException) -> BusError:
        return BusError(f"redis bus {self.shown}: {what} failed ({type(exc).__name__}: {exc})")

    async def run(self, *commands: tuple[Any, ...]) -> list[Any]:
        async with self.client.pipeline(transaction=False) as pipe:
            for command in commands:
                pipe.execute_command(*command)
            replies: list[Any] = await pipe.execute()
            return replies

    async def script(self, name: str, keys: list[str], *args: Any) -> Any:
        self.client  # noqa: B018 (refuses a bus that is not open)
        return await self._scripts[name](keys=keys, args=list(args))

    async def block(self, keys: list[str], ids: list[Any], timeout: float) -> set[str]:
        """Wait on the server until an entry newer than ``ids`` arrives; the streams woken."""
        ms = max(1, math.ceil(min(timeout, self.recheck) * 1000))
        if not keys:
            await asyncio.sleep(ms / 1000)  # nothing to wait on yet: no queue exists
            return set()
        client: Any = self.client  # execute_command is untyped in redis-py
        reply = await client.execute_command(
            "XREAD", "BLOCK", ms, "COUNT", 1, "STREAMS", *keys, *ids
        )
        return {_text(stream) for stream, _ in reply or ()}

    async def settle(self, entries: list[_Entry], group: str, me: str, delay_ms: int) -> int:
        args: list[Any] = [group, me, delay_ms, uuid.uuid4().hex]
        for entry in entries:
            args += [entry.id, entry.times, entry.body, entry.h, entry.d + entry.times]
        try:
            done = int(
                await self.script(
                    "settle", [self.key("delayed")] + [e.stream for e in entries], *args
                )
            )
        except (RedisError, *_LOST) as exc:
            what = "acknowledging" if delay_ms < 0 else "handing back"
            raise self.failure(f"{what} {len(entries)} message(s)", exc) from exc
        if delay_ms > 0 and done:
            self._due.set()
        return done

    async def touch(
        self, entries: list[_Entry], group: str, me: str, target: str, idle: int
    ) -> int:
        if not entries:
            return 0
        args: list[Any] = [group, me, target, idle]
        for entry in entries:
            args += [entry.id, entry.times]
        try:
            return int(await self.script("touch", [e.stream for e in entries], *args))
        except (RedisError, *_LOST) as exc:
            raise self.failure(f"extending the lease of {len(entries)} message(s)", exc) from exc

    async def release(self, locks: list[str], keys: list[str], me: str, group: str) -> None:
        if locks or keys:
            await self.script("release", locks + keys, me, group, len(locks))

    async def bury(self, entry: _Entry, group: str, fields: dict[bytes, bytes], why: str) -> None:
        """A malformed entry: logged, acknowledged, and moved to the dead stream."""
        log.error(
            "redis bus %s: entry %s on %s cannot be read (%s); it is acknowledged and moved to %s",
            self.shown,
            _text(entry.id),
            entry.stream,
            why,
            self.key("dead"),
        )
        dead: list[Any] = ["stream", entry.stream, "id", entry.id, "error", why]
        for name, value in fields.items():
            dead += [b"field:" + name, value]
        async with self.client.pipeline(transaction=True) as pipe:
            pipe.execute_command("XADD", self.key("dead"), "MAXLEN", "~", DEAD_MAX, "*", *dead)
            pipe.execute_command("XACK", entry.stream, group, entry.id)
            pipe.execute_command("XDEL", entry.stream, entry.id)
            await pipe.execute()

    # -- background -------------------------------------------------------------

    async def _listen(self, pubsub: Any) -> None:
        backoff = _Backoff(self, "the control subscription")
        while True:
            try:
                async for message in pubsub.listen():
                    backoff.succeeded()
                    if message.get("type") == "message":
                        self._fan_out(message["data"])
            except _LOST as exc:
                await backoff.failed(exc)

    def _fan_out(self, raw: bytes) -> None:
        try:
            control = decode_control(raw)
        except Malformed as exc:
            log.error("redis bus %s: dropped a control message %r: %s", self.shown, raw[:200], exc)
            return
        for queue in self._controls:
            queue.put_nowait(control)

    async def _move_due(self) -> None:
        """Move nacked messages back onto their streams when due, waiting until then."""
        backoff = _Backoff(self, "moving delayed messages")
        while True:
            self._due.clear()
            try:
                moved, wait_ms = await self.script("due", [self.key("delayed")], 100)
            except _LOST as exc:
                await backoff.failed(exc)
                continue
            backoff.succeeded()
            if moved >= 100:
                continue
            timeout = self.recheck if wait_ms < 0 else min(self.recheck, (wait_ms + 1) / 1000)
            await _wait(self._due, timeout)

    # -- checks -----------------------------------------------------------------

    def _wanted(self, partitions: Collection[int] | None) -> list[int]:
        wanted = range(self.partitions) if partitions is None else sorted(set(partitions))
        if not wanted:
            raise BusError("consume_events needs at least one partition")
        for index in wanted:
            if isinstance(index, bool) or not isinstance(index, int):
                raise BusError(f"a partition is a whole number, got {index!r}")
            if not 0 <= index < self.partitions:
                raise BusError(
                    f"partition {index} does not exist: this bus has partitions "
                    f"0 to {self.partitions - 1}"
                )
        return list(wanted)


def _xadd(stream: str, body: bytes, headers: Headers) -> tuple[Any, ...]:
    if headers:
        return ("XADD", stream, "*", "b", body, "h", encode_headers(headers))
    return ("XADD", stream, "*", "b", body)


async def _wait(event: asyncio.Event, timeout: float) -> None:
    """Until ``event`` is set or ``timeout`` seconds have passed (at most a day)."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(event.wait(), max(0.0, min(timeout, 86_400.0)))


async def _subscribed(pubsub: Any) -> None:
    """Wait for the server's confirmation of the subscription (a few milliseconds)."""
    async with asyncio.timeout(5.0):
        while True:
            message = await pubsub.get_message(timeout=1.0)
            if message is not None and message.get("type") == "subscribe":
                return


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _redact(url: str) -> str:
    """The URL without its password, for messages and logs."""
    head, sep, rest = url.partition("://")
    auth, at, host = rest.rpartition("@")
    if not at or ":" not in auth:
        return url
    return f"{head}{sep}{auth.split(':', 1)[0]}:***@{host}"


def _delay_ms(delay: float) -> int:
    if (
        isinstance(delay, bool)
        or not isinstance(delay, int | float)
        or not math.isfinite(delay)
        or delay < 0
    ):
        raise BusError(f"a nack delay must be a number of seconds, 0 or more, got {delay!r}")
    return math.ceil(delay * 1000)


def _check_count(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise BusError(f"{name} must be a whole number of at least 1, got {value!r}")
