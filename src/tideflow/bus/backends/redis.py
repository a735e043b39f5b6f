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
- ``readers``: who reads which queue now; ``beats`` and ``beat_records``: the last beat
  of each reader opened with a worker name (``redis_presence``);
- the ``control`` channel (PUBLISH / SUBSCRIBE) for cancels, and the ``ended`` channel
  for run ends (one message per batch, ``bus/fanout.py``'s wire form), subscribed on a
  connection of its own at the first ``run_ends`` call (a worker or a server never
  receives them). redis-py subscribes a pub/sub connection again when it reconnects.

A delivery is an entry in the group's pending entries list (PEL): its lease runs out when
it has been idle longer than ``lease`` (``XAUTOCLAIM`` then gives it to the consumer that
sweeps), ``extend`` resets its idle time (``XCLAIM … JUSTID``), ``ack`` is ``XACK`` and
``XDEL`` (a stream holds only what is not settled yet), ``nack(delay)`` acknowledges it
and adds it again, at once or from ``delayed`` when due. The delivery count is the
entry's times-delivered in the PEL, plus the deliveries before it was added again.

Consumers block on the server, waking when an entry arrives (the engine's event
consumer with ``XREADGROUP … BLOCK``, which takes the entries in the same round trip; a
task consumer with ``XREAD BLOCK``, then a script that takes by priority), for their
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
import uuid
from collections.abc import AsyncGenerator, Callable, Collection, Sequence
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from tideflow.bus.backends import redis_lua as lua
from tideflow.bus.backends import redis_presence
from tideflow.bus.backends.redis_consumers import (
    FAILED,
    Backoff,
    Entry,
    EventConsumer,
    TaskConsumer,
    TaskDelivery,
    text,
    wait_until_set,
)
from tideflow.bus.backends.redis_wire import (
    Malformed,
    decode_control,
    encode_control,
    encode_event,
    encode_headers,
    encode_task,
)
from tideflow.bus.base import (
    DEFAULT_LEASE,
    DEFAULT_PARTITIONS,
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
from tideflow.bus.closing import (
    cancel_and_wait,
    cancels_asked,
    raise_dropped_cancel,
    unstoppable,
)
from tideflow.bus.fanout import FanOut, MalformedEnds, decode_run_ends, encode_run_ends
from tideflow.errors import BusError
from tideflow.model.commands import DispatchTask
from tideflow.model.events import Event
from tideflow.model.plan import Priority

log = logging.getLogger("tideflow.bus.redis")

DEFAULT_PREFIX = "tideflow"
DEAD_MAX = 10_000
MAX_CONNECTIONS = 64
"""Connections a bus keeps to Redis at most (blocking reads hold one each)."""
POOL_WAIT = 10.0
"""Seconds a command waits for a free connection before it fails with a BusError."""
"""About how many entries the dead stream keeps (the oldest go first)."""


class RedisBus(Bus):
    """The bus on a Redis server (5.0 streams; 6.2 or newer for ``XAUTOCLAIM``)."""

    batching_pays = True

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
        self._controls: FanOut[Control] = FanOut()
        self._ends: FanOut[RunEnded] = FanOut()
        self._ends_listened = False
        self._ends_lock = asyncio.Lock()
        self._tasks: list[asyncio.Task[None]] = []
        self._due = asyncio.Event()

    # -- lifecycle --------------------------------------------------------------

    async def open(self) -> None:
        if self._client is not None:
            return
        # A blocking pool: a burst of publishers (a client starting many runs at once)
        # waits for a free connection instead of failing with "Too many connections".
        pool = aioredis.BlockingConnectionPool.from_url(
            self.url,
            max_connections=MAX_CONNECTIONS,
            timeout=POOL_WAIT,
            socket_connect_timeout=5.0,
            socket_timeout=10.0,  # longer than any BLOCK (at most 5 s): a dead link is noticed
            client_name=f"tideflow:{self.prefix}",
            # a pooled connection the server dropped is replaced, not reported: two tries
            retry=Retry(ExponentialBackoff(cap=0.5, base=0.05), 2),
            retry_on_error=[RedisConnectionError, RedisTimeoutError],
        )
        client = aioredis.Redis.from_pool(pool)
        pubsub: Any = client.pubsub()  # untyped in redis-py
        try:
            await client.ping()
            await self._check_partitions(client)
            await pubsub.subscribe(self.key("control"))
            await _subscribed(pubsub)
        except FAILED as exc:
            await pubsub.aclose()
            await client.aclose()
            raise self.failure("connecting", exc) from exc
        except BaseException:
            await pubsub.aclose()
            await client.aclose()
            raise
        self._client = client
        self._scripts = {name: client.register_script(src) for name, src in lua.SCRIPTS.items()}
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(self._listen(pubsub, "the control subscription", self._on_control)),
            loop.create_task(self._move_due()),
        ]

    async def close(self) -> None:
        client, self._client = self._client, None
        # BusError: a loop that dropped its cancel (see cancel_and_wait) may find the bus
        # closed on its next call, before it is cancelled again
        with contextlib.suppress(BusError):
            await cancel_and_wait(*self._tasks)
        self._tasks = []
        self._ends_listened = False
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
        except FAILED as exc:
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
        except FAILED as exc:
            raise self.failure(f"publishing {len(events)} event(s)", exc) from exc

    async def publish_control(self, message: Control) -> None:
        try:
            await self.client.publish(self.key("control"), encode_control(message))
        except FAILED as exc:
            raise self.failure("publishing a control message", exc) from exc

    async def publish_run_ends(self, ends: Sequence[RunEnded]) -> None:
        if not ends:
            return
        try:
            await self.client.publish(self.key("ended"), encode_run_ends(ends))
        except FAILED as exc:
            raise self.failure(f"publishing {len(ends)} run end(s)", exc) from exc

    # -- consumer ---------------------------------------------------------------

    async def consume_tasks(
        self, queues: Collection[str] | None = None, *, prefetch: int, worker: str | None = None
    ) -> AsyncGenerator[Delivery[DispatchTask], None]:
        _check_count("prefetch", prefetch)
        self.client  # noqa: B018 (refuses a bus that is not open)
        consumer = TaskConsumer(self, queues, prefetch)
        wanted = None if queues is None else list(queues)
        presence = redis_presence.Presence(self, wanted, worker)
        asked = cancels_asked()
        try:
            await presence.start()
            raise_dropped_cancel(asked)  # one redis-py dropped as the reader announced itself
            while True:
                yield await consumer.next()
        finally:
            await unstoppable(presence.stop, consumer.close)

    async def consume_events(
        self, partitions: Collection[int] | None = None, *, max_batch: int
    ) -> AsyncGenerator[EventBatch, None]:
        _check_count("max_batch", max_batch)
        consumer = EventConsumer(self, self._wanted(partitions), max_batch)
        asked = cancels_asked()
        await consumer.claim()
        try:
            raise_dropped_cancel(asked)  # one redis-py dropped during the claim
            while True:
                yield await consumer.next()
        finally:
            await unstoppable(consumer.close)

    async def ack_tasks(self, deliveries: Sequence[Delivery[DispatchTask]]) -> None:
        """One script call (``XACK`` + ``XDEL`` of each) per consumer that holds some."""
        held: dict[TaskConsumer, list[TaskDelivery]] = {}
        for delivery in deliveries:
            if isinstance(delivery, TaskDelivery) and delivery.consumer.bus is self:
                held.setdefault(delivery.consumer, []).append(delivery)
            else:
                await delivery.ack()
        for consumer, mine in held.items():
            await consumer.settle_all(mine, -1)

    def consume_control(self) -> Stream[Control]:
        return self._controls.stream()

    async def run_ends(self) -> Stream[RunEnded]:
        async with self._ends_lock:
            if not self._ends_listened:
                await self._listen_ends()
            return self._ends.stream()

    async def _listen_ends(self) -> None:
        """Subscribe to ``ended`` on a pub/sub connection of its own and fan it out."""
        pubsub: Any = self.client.pubsub()
        try:
            await pubsub.subscribe(self.key("ended"))
            await _subscribed(pubsub)
        except FAILED as exc:
            await pubsub.aclose()
            raise self.failure("subscribing to run ends", exc) from exc
        except BaseException:
            await pubsub.aclose()
            raise
        self._ends_listened = True
        listening = self._listen(pubsub, "the run-end subscription", self._on_ends)
        self._tasks.append(asyncio.get_running_loop().create_task(listening))

    # -- operator's view --------------------------------------------------------

    async def queue_stats(self) -> list[QueueStats]:
        """Over the queues published to (the ``queues`` set): ``depth`` is the stream's
        length less the group's pending entries, ``held`` those pending entries (one whose
        lease ran out stays held until a consumer sweeps it), ``oldest_age`` from the id
        of the first entry after the group's last delivered one (Redis time), and
        ``consumers`` the open readers of the queue by their presence
        (``redis_presence``: a killed one counts for up to ``presence_ttl``, the lease
        and at most 10 s)."""
        return await redis_presence.queue_stats(self)

    async def worker_beats(self) -> list[WorkerBeat]:
        """From ``<prefix>:beats`` (Redis time of each renewal); ``live`` by the reader's
        presence, as ``queue_stats`` counts it (``redis_presence``)."""
        return await redis_presence.worker_beats(self)

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
        return {text(stream) for stream, _ in reply or ()}

    async def block_group(
        self, keys: list[str], group: str, me: str, count: int, timeout: float
    ) -> list[tuple[str, bytes, dict[bytes, bytes]]]:
        """Wait on the server until ``keys`` have entries ``group`` has not delivered yet,
        and take them for ``me`` (``XREADGROUP … BLOCK``: woken and delivered in one round
        trip); at most ``count`` from each stream. ``(stream, id, fields)`` of each."""
        ms = max(1, math.ceil(min(timeout, self.recheck) * 1000))
        client: Any = self.client  # execute_command is untyped in redis-py
        reply = await client.execute_command(
            "XREADGROUP",
            "GROUP",
            group,
            me,
            "COUNT",
            count,
            "BLOCK",
            ms,
            "STREAMS",
            *keys,
            *([">"] * len(keys)),
        )
        return [
            (text(stream), entry_id, fields)
            for stream, entries in reply or ()
            for entry_id, fields in entries
            if fields is not None  # an entry deleted while pending comes without fields
        ]

    async def settle(self, entries: list[Entry], group: str, me: str, delay_ms: int) -> int:
        args: list[Any] = [group, me, delay_ms, uuid.uuid4().hex]
        for entry in entries:
            args += [entry.id, entry.times, entry.body, entry.h, entry.d + entry.times]
        try:
            done = int(
                await self.script(
                    "settle", [self.key("delayed")] + [e.stream for e in entries], *args
                )
            )
        except FAILED as exc:
            what = "acknowledging" if delay_ms < 0 else "handing back"
            raise self.failure(f"{what} {len(entries)} message(s)", exc) from exc
        if delay_ms > 0 and done:
            self._due.set()
        return done

    async def touch(self, entries: list[Entry], group: str, me: str, target: str, idle: int) -> int:
        if not entries:
            return 0
        args: list[Any] = [group, me, target, idle]
        for entry in entries:
            args += [entry.id, entry.times]
        try:
            return int(await self.script("touch", [e.stream for e in entries], *args))
        except FAILED as exc:
            raise self.failure(f"extending the lease of {len(entries)} message(s)", exc) from exc

    async def release(self, locks: list[str], keys: list[str], me: str, group: str) -> None:
        if locks or keys:
            await self.script("release", locks + keys, me, group, len(locks))

    async def bury(self, entry: Entry, group: str, fields: dict[bytes, bytes], why: str) -> None:
        """A malformed entry: logged, acknowledged, and moved to the dead stream."""
        log.error(
            "redis bus %s: entry %s on %s cannot be read (%s); it is acknowledged and moved to %s",
            self.shown,
            text(entry.id),
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

    async def _listen(self, pubsub: Any, what: str, handle: Callable[[bytes], None]) -> None:
        """Hand each message of ``pubsub`` to ``handle``; a lost connection is retried
        with backoff, and redis-py subscribes the new one to the channels again."""
        backoff = Backoff(self, what)
        try:
            while True:
                try:
                    async for message in pubsub.listen():
                        backoff.succeeded()
                        if message.get("type") == "message":
                            handle(message["data"])
                except FAILED as exc:
                    await backoff.failed(exc)
        finally:
            with contextlib.suppress(Exception):
                await pubsub.aclose()

    def _on_control(self, raw: bytes) -> None:
        try:
            control = decode_control(raw)
        except Malformed as exc:
            log.error("redis bus %s: dropped a control message %r: %s", self.shown, raw[:200], exc)
            return
        if control is not None:
            self._controls.put((control,))

    def _on_ends(self, raw: bytes) -> None:
        try:
            ends = decode_run_ends(raw)
        except MalformedEnds as exc:
            log.debug("redis bus %s: dropped a run-end message %r: %s", self.shown, raw[:200], exc)
            return
        self._ends.put(ends)

    async def _move_due(self) -> None:
        """Move nacked messages back onto their streams when due, waiting until then."""
        asked = cancels_asked()
        backoff = Backoff(self, "moving delayed messages")
        while True:
            self._due.clear()
            try:
                moved, wait_ms = await self.script("due", [self.key("delayed")], 100)
            except FAILED as exc:
                await backoff.failed(exc)
                continue
            raise_dropped_cancel(asked)
            backoff.succeeded()
            if moved >= 100:
                continue
            timeout = self.recheck if wait_ms < 0 else min(self.recheck, (wait_ms + 1) / 1000)
            await wait_until_set(self._due, timeout)

    # -- checks -----------------------------------------------------------------

    def _wanted(self, partitions: Collection[int] | None) -> list[int]:
        return wanted_partitions(partitions, self.partitions)


def _xadd(stream: str, body: bytes, headers: Headers) -> tuple[Any, ...]:
    if headers:
        return ("XADD", stream, "*", "b", body, "h", encode_headers(headers))
    return ("XADD", stream, "*", "b", body)


async def _subscribed(pubsub: Any) -> None:
    """Wait for the server's confirmation of the subscription (a few milliseconds)."""
    async with asyncio.timeout(5.0):
        while True:
            message = await pubsub.get_message(timeout=1.0)
            if message is not None and message.get("type") == "subscribe":
                return


def _redact(url: str) -> str:
    """The URL without its password, for messages and logs."""
    head, sep, rest = url.partition("://")
    auth, at, host = rest.rpartition("@")
    if not at or ":" not in auth:
        return url
    return f"{head}{sep}{auth.split(':', 1)[0]}:***@{host}"


def _check_count(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise BusError(f"{name} must be a whole number of at least 1, got {value!r}")
