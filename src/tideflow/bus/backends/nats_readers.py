"""The readers of the NATS bus: task deliveries by priority, event batches by partition.

``TaskReader`` serves one ``consume_tasks`` and ``EventReader`` one
``consume_events``; both pull through ``nats_pull.Puller`` and keep each delivery's
lease locally as well (see ``nats``).

nats-py waits for the answer of each request (a consumer made, a dead letter kept, a
stream looked at) under ``asyncio.wait_for``, which on Python 3.11 drops a cancel that
comes in the turn the answer does: each loop here raises such a cancel itself at its
next turn (``closing.raise_dropped_cancel``), once what it took is recorded, and before
it waits on the server, so a cancelled read ends and its cleanup hands that back.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import math
import re
import time
from collections import Counter
from collections.abc import Collection
from typing import TYPE_CHECKING

import nats.errors
import orjson
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from tideflow.bus.backends.local import MonotonicClock, _Leases
from tideflow.bus.backends.nats_pull import Lane
from tideflow.bus.base import PRIORITY_CYCLE, Delivery, EventBatch, Headers
from tideflow.bus.closing import cancel_and_wait, cancels_asked, raise_dropped_cancel
from tideflow.errors import BusError, StateFormatError
from tideflow.model.codec import command_from_data, event_from_data
from tideflow.model.commands import DispatchTask
from tideflow.model.events import Event
from tideflow.model.plan import Priority

if TYPE_CHECKING:
    from tideflow.bus.backends.nats import NatsBus

log = logging.getLogger("tideflow.bus.nats")

LINGER = 5.0
"""Seconds a standing pull request lives before it is renewed (the idle cost)."""
PRIORITIES = (Priority.HIGH, Priority.NORMAL, Priority.LOW)
_CYCLE = tuple(PRIORITIES.index(p) for p in PRIORITY_CYCLE)
_NAME = re.compile(r"[A-Za-z0-9_-]+")


def queue_token(queue: str) -> str:
    """A queue name as one subject token and consumer-name part (``=`` + hex when the
    name has characters that subjects or consumer names do not take)."""
    return queue if _NAME.fullmatch(queue) else "=" + queue.encode().hex()


def queue_of_token(token: str) -> str | None:
    """The queue a subject token names (None: not one this bus wrote)."""
    if not token.startswith("="):
        return token
    try:
        return bytes.fromhex(token[1:]).decode()
    except ValueError:
        return None


def _headers_of(msg: Msg) -> Headers:
    headers = msg.headers
    if not headers:
        return {}
    return {k: v for k, v in headers.items() if not k.startswith("Nats-")}


def _check_delay(delay: float) -> None:
    if not isinstance(delay, int | float) or not math.isfinite(delay) or delay < 0:
        raise BusError(f"a nack delay must be a number of seconds, 0 or more, got {delay!r}")


# -- tasks ---------------------------------------------------------------------


class TaskDelivery(Delivery[DispatchTask]):
    __slots__ = ("_msg", "_reader", "body", "deliveries", "headers")

    def __init__(self, reader: TaskReader, msg: Msg, body: DispatchTask) -> None:
        self.body = body
        self.headers = _headers_of(msg)
        self.deliveries = msg.metadata.num_delivered
        self._reader = reader
        self._msg = msg

    async def ack(self) -> None:
        if self._reader.settle(self):
            await self._msg.ack()

    async def nack(self, delay: float = 0.0) -> None:
        _check_delay(delay)
        if self._reader.settle(self):
            await self._msg.nak(delay)
            self._reader.wake_after(delay)

    async def extend(self) -> None:
        if self in self._reader.leases.held:
            self._reader.leases.extend(self)
            await self._msg.in_progress()


class TaskReader:
    """One ``consume_tasks``: asks the lanes for what its free prefetch can hold, shared
    out by ``PRIORITY_CYCLE``, with ``no_wait`` requests; when every lane is empty it
    waits with a standing request on each lane if its free prefetch covers them all, and
    otherwise on a core subscription to the lanes' subjects (a doorbell: no slot is taken
    that it could not use), renewed every ``LINGER`` seconds to see redeliveries. Serving
    every queue, it learns of a new one from the announcement its first publisher makes
    (``NatsBus.queues_subject``), and looks for new ones every ``LINGER`` seconds too."""

    def __init__(self, bus: NatsBus, queues: list[str] | None, prefetch: int) -> None:
        self.bus = bus
        self.queues = queues
        self.prefetch = prefetch
        self.puller = bus.puller(tasks=True)
        self.leases = _Leases(MonotonicClock(), bus.lease, self._expired)
        self._by_queue: dict[str, list[Lane]] = {}
        self._cursor = 0
        self._turn = 0
        self._bells: list[Subscription] = []
        self._news: Subscription | None = None
        """Serving every queue: the announcements of queues published to (``_on_news``)."""
        self._rang = False
        self._found: set[str] = set()
        self._looked = 0.0

    async def start(self) -> None:
        await self.puller.start()
        if self.queues is None:  # before looking: a queue announced meanwhile is not missed
            self._news = await self.bus.nc.subscribe(self.bus.queues_subject, cb=self._on_news)
        for queue in self.queues if self.queues is not None else await self._discover():
            await self._add(queue)

    async def next(self) -> TaskDelivery:
        asked = cancels_asked()
        while True:
            raise_dropped_cancel(asked)  # what came is recorded: the close hands it back
            delivery = await self._from_arrived(asked)
            if delivery is not None:
                return delivery
            await self._add_found()
            # Standing requests' slots do not count: one lane's standing request must not
            # keep the tasks of another waiting (a delivery past the prefetch is handed
            # back as it comes, see _from_arrived).
            free = self.prefetch - len(self.leases.held) - self.puller.open_slots(standing=False)
            if free > 0 and await self._pick(free):
                continue
            await self._wait(free, asked)

    def settle(self, delivery: TaskDelivery) -> bool:
        if not self.leases.release(delivery):
            return False  # settled already, or its lease ran out and it went back
        self.puller.wake()
        return True

    def wake_after(self, delay: float) -> None:
        asyncio.get_running_loop().call_later(delay, self.puller.wake)

    async def close(self) -> None:
        await self._silence()
        if self._news is not None:
            news, self._news = self._news, None
            with contextlib.suppress(Exception):
                await news.unsubscribe()
        await self.puller.close()
        self.bus.forget(self.puller)
        for delivery in self.leases.close():
            with contextlib.suppress(Exception):
                await delivery._msg.nak()
        while self.puller.arrived:
            with contextlib.suppress(Exception):
                await self.puller.arrived.popleft()[1].nak()

    def _expired(self, delivery: TaskDelivery) -> None:
        self.puller.wake()  # the server has put it back; its slot is free

    async def _from_arrived(self, asked: int) -> TaskDelivery | None:
        arrived = self.puller.arrived
        while arrived:
            _, msg = arrived.popleft()
            if len(self.leases.held) >= self.prefetch:  # a standing request's, past the
                await msg.nak()  # prefetch: back to the stream, for whoever asks next
                continue
            try:
                body = command_from_data(orjson.loads(msg.data))
                if not isinstance(body, DispatchTask):
                    raise StateFormatError(f"a {type(body).__name__} is not a task")
            except (
                orjson.JSONDecodeError,
                StateFormatError,
                KeyError,
                TypeError,
                ValueError,
            ) as exc:
                await self.bus.dead_letter(msg, f"malformed task message: {exc}")
                await msg.ack()
                raise_dropped_cancel(asked)  # one dropped as the dead letter was kept
                continue
            delivery = TaskDelivery(self, msg, body)
            self.leases.hold(delivery)
            return delivery
        return None

    async def _pick(self, free: int) -> bool:
        """Ask the lanes for up to ``free`` messages that are there now, all in one round
        trip: slot ``i`` goes to queue ``i mod queues`` (in turn from pick to pick) at the
        priority of the cycle's next place, so the slots are shared out as the cycle
        weighs them. Slots a lane could not fill go in a further round to the lanes not
        asked yet (higher priority first), then to those that filled theirs. Whether any
        came."""
        queues = list(self._by_queue.values())
        if not queues:
            return False
        self._turn = start = (self._turn + 1) % len(queues)
        order = queues[start:] + queues[:start]
        ranked = [queue[rank] for rank in range(len(PRIORITIES)) for queue in order]
        shares: dict[Lane, int] = {}
        for place in range(free):
            rank = _CYCLE[(self._cursor + place // len(order)) % len(_CYCLE)]
            lane = order[place % len(order)][rank]
            shares[lane] = shares.get(lane, 0) + 1
        arrived = self.puller.arrived
        asked: set[Lane] = set()
        got = 0
        while shares:
            asking = {lane: n for lane, n in shares.items() if not lane.open}
            before = len(arrived)
            for lane, n in asking.items():
                await self.puller.request(lane, n)
            for lane in asking:
                await self.puller.answered(lane)
            came = Counter(lane for lane, _ in itertools.islice(arrived, before, None))
            got += sum(came.values())
            asked.update(shares)
            left = free - got
            if left <= 0:
                break
            fresh = [lane for lane in ranked if lane not in asked and not lane.open]
            full = [lane for lane in ranked if lane in asking and came[lane] >= asking[lane]]
            more = (fresh or full)[:left]
            shares = dict.fromkeys(more, 1)
            if more:
                shares[more[0]] += left - len(more)
        if got:
            self._cursor = (self._cursor + got // len(order)) % len(_CYCLE)
        return got > 0

    async def _wait(self, free: int, asked: int) -> None:
        idle = [lane for lane in self.puller.lanes if not lane.open]
        if free > 0 and len(idle) <= free:
            for lane in idle:
                await self.puller.request(lane, 1, linger=LINGER)
        elif free > 0:
            await self._ring(idle)
            # what came before the bell listened, or rang while it asked (the wake went to
            # the request it was waiting for)
            if await self._pick(free) or self._rang:
                await self._silence()
                return
        if self._found:  # announced while it asked: the wake went to that round trip
            await self._silence()
            return
        timeout = min(LINGER, self.puller.next_deadline() - time.monotonic())
        raise_dropped_cancel(asked)  # before the wait on the server (up to ``LINGER``)
        await self.puller.wait(timeout)
        self.puller.forget_lost()
        await self._silence()

    async def _ring(self, idle: list[Lane]) -> None:
        nc = self.bus.nc
        self._rang = False
        self._bells = [await nc.subscribe(lane.label, cb=self._on_bell) for lane in idle]

    async def _silence(self) -> None:
        bells, self._bells = self._bells, []
        for bell in bells:
            with contextlib.suppress(Exception):
                await bell.unsubscribe()

    async def _on_bell(self, msg: Msg) -> None:
        self._rang = True
        self.puller.wake()

    async def _on_news(self, msg: Msg) -> None:
        try:
            queue = msg.data.decode()
        except UnicodeDecodeError:
            return
        if queue not in self._by_queue:
            self._found.add(queue)
            self.puller.wake()

    async def _add_found(self) -> bool:
        """Add the queues announced or found since the last look (and look again every
        ``LINGER`` seconds: an announcement can be lost); whether there were any."""
        if self.queues is None and time.monotonic() - self._looked > LINGER:
            try:
                self._found.update(await self._discover(consumers=False))
            except nats.errors.Error as exc:  # the next look will do
                log.warning("NATS bus %s: looking for new queues failed: %s", self.bus.url, exc)
        found = bool(self._found)
        while self._found:
            await self._add(self._found.pop())
        return found

    async def _discover(self, *, consumers: bool = True) -> list[str]:
        """Every queue with tasks waiting (and, with ``consumers``, every queue a
        consumer was made for)."""
        self._looked = time.monotonic()
        bus = self.bus
        info = await bus.js.stream_info(bus.tasks_stream, subjects_filter=">")
        tokens = {s.split(".")[-2] for s in (info.state.subjects or {})}
        for consumer in await bus.js.consumers_info(bus.tasks_stream) if consumers else ():
            subject = consumer.config.filter_subject or ""
            if subject.count(".") >= 3:
                tokens.add(subject.split(".")[-2])
        return sorted(q for q in map(queue_of_token, tokens) if q is not None)

    async def _add(self, queue: str) -> None:
        if queue in self._by_queue:
            return
        bus = self.bus
        lanes = []
        for rank, priority in enumerate(PRIORITIES):
            name = f"tasks_{queue_token(queue)}_{priority.value}"
            subject = bus.task_subject(queue, priority)
            await bus.ensure_consumer(bus.tasks_stream, name, subject, tasks=True)
            lanes.append(self.puller.add(bus.tasks_stream, name, subject, rank=rank, label=subject))
        self._by_queue[queue] = lanes


# -- events --------------------------------------------------------------------


class NatsEventBatch(EventBatch):
    __slots__ = ("_held", "_msgs", "_reader", "events")

    def __init__(self, reader: EventReader, items: list[tuple[Msg, Event]]) -> None:
        self._reader = reader
        self._msgs = [msg for msg, _ in items]
        self.events = [event for _, event in items]
        self._held: list[bool] = [True] * len(items)

    def headers(self, index: int) -> Headers:
        return _headers_of(self._msgs[index])

    async def ack(self) -> None:
        if self._reader.leases.release(self):
            for msg, held in zip(self._msgs, self._held, strict=True):
                if held:
                    await msg.ack()

    async def nack(self, delay: float = 0.0, runs: Collection[str] | None = None) -> None:
        _check_delay(delay)
        if self not in self._reader.leases.held:
            return  # settled already, or its lease ran out and it went back
        for i, (msg, event) in enumerate(zip(self._msgs, self.events, strict=True)):
            if self._held[i] and (runs is None or event.run_id in runs):
                self._held[i] = False
                await msg.nak(delay)
        if not any(self._held):
            self._reader.leases.release(self)
        self._reader.puller.wake()

    async def extend(self) -> None:
        if self in self._reader.leases.held:
            self._reader.leases.extend(self)
            for msg, held in zip(self._msgs, self._held, strict=True):
                if held:
                    await msg.in_progress()

    async def hand_back(self) -> None:
        for msg, held in zip(self._msgs, self._held, strict=True):
            if held:
                with contextlib.suppress(Exception):
                    await msg.nak()


class EventReader:
    """One ``consume_events``: holds the partitions' locks while open and keeps a standing
    request on each owned partition for its share of the batch room. What a standing
    request brings is handed on as it comes; a partition that filled its share is asked
    for the rest with ``no_wait`` requests, so that under load a batch holds what was
    waiting (in order per partition), and under light load no event waits for a round
    trip to ask for more."""

    def __init__(self, bus: NatsBus, partitions: list[int], max_batch: int) -> None:
        self.bus = bus
        self.partitions = partitions
        self.max_batch = max_batch
        self.puller = bus.puller(tasks=False)
        self.leases = _Leases(MonotonicClock(), bus.lease, lambda batch: None)
        self._held: dict[int, int] = {}
        self._renewer: asyncio.Task[None] | None = None
        self._lost: BusError | None = None

    async def start(self) -> None:
        bus = self.bus
        self._held = await bus.claim(self.partitions)
        try:
            await self.puller.start()
            for index in self.partitions:
                name = f"events_{index}"
                subject = f"{bus.prefix}.events.{index}"
                await bus.ensure_consumer(bus.events_stream, name, subject, tasks=False)
                self.puller.add(bus.events_stream, name, subject, label=f"partition {index}")
        except BaseException:
            await bus.release(self._held)
            raise
        self._renewer = asyncio.create_task(self._renew(), name="tideflow-nats-partitions")

    async def next(self) -> NatsEventBatch:
        asked = cancels_asked()
        puller = self.puller
        while True:
            if self._lost is not None:
                raise self._lost
            await self._top_up()
            batch = await self._batch()
            raise_dropped_cancel(asked)  # a batch taken is held: the close hands it back
            if batch is not None:
                return batch
            await self._stand()
            if self._lost is None:  # lost while it asked: the wake went to that round trip
                raise_dropped_cancel(asked)  # before the wait on the server
                await puller.wait(min(LINGER, puller.next_deadline() - time.monotonic()))
            puller.forget_lost()

    async def _stand(self) -> None:
        """A standing request on every partition without one, for its share of the room:
        a partition busy enough to fill its share is topped up (``_top_up``), and one that
        brings less hands on each event as it comes, with no round trip to ask again."""
        puller = self.puller
        idle = [lane for lane in puller.lanes if not lane.open]
        if not idle:
            return
        room = self.max_batch - len(puller.arrived) - puller.open_slots()
        share = max(1, room // len(idle))
        for lane in idle:
            await puller.request(lane, share, linger=LINGER)

    async def _top_up(self) -> None:
        """Ask every partition without a standing request for what it has, at once
        (room shared out), twice at most: a standing request filled meanwhile is
        followed by its partition's rest."""
        puller = self.puller
        for _ in range(2):
            room = self.max_batch - len(puller.arrived)
            idle = [lane for lane in puller.lanes if not lane.open]
            if room <= 0 or not idle:
                return
            share = max(1, room // len(idle))
            for lane in idle:
                lane.delivered = False
                await puller.request(lane, share)
            for lane in idle:
                await puller.answered(lane)
            if not any(lane.delivered for lane in puller.lanes if not lane.open):
                return

    async def _batch(self) -> NatsEventBatch | None:
        arrived = self.puller.arrived
        items: list[tuple[Msg, Event]] = []
        at: dict[int, int] = {}  # stream sequence -> its place in items
        while arrived and len(items) < self.max_batch:
            _, msg = arrived.popleft()
            sequence = msg.metadata.sequence.stream
            place = at.get(sequence)
            if place is not None:
                # delivered again while it waited here for its batch (it arrived, the loop
                # was slow, its AckWait ran out): once in the batch, by the later delivery,
                # whose ack is the one the server waits for
                items[place] = (msg, items[place][1])
                continue
            try:
                items.append((msg, event_from_data(orjson.loads(msg.data))))
                at[sequence] = len(items) - 1
            except (orjson.JSONDecodeError, StateFormatError, KeyError, TypeError) as exc:
                await self._drop(msg, f"malformed event message: {exc}")
        if not items:
            return None
        batch = NatsEventBatch(self, items)
        self.leases.hold(batch)
        return batch

    async def _drop(self, msg: Msg, reason: str) -> None:
        await self.bus.dead_letter(msg, reason)
        await msg.ack()

    async def _renew(self) -> None:
        asked = cancels_asked()
        while True:
            await asyncio.sleep(self.bus.lock_ttl / 3)  # the lock's heartbeat, not a wait
            try:
                await self.bus.renew(self._held)
            except BusError as exc:
                log.error("%s", exc)
                self._lost = exc
                self.puller.wake()
                return
            except nats.errors.Error as exc:
                log.warning("NATS bus %s: renewing partition locks failed: %s", self.bus.url, exc)
            raise_dropped_cancel(asked)  # one nats-py dropped as a renewal was answered

    async def close(self) -> None:
        if self._renewer is not None:
            await cancel_and_wait(self._renewer)
        await self.puller.close()
        self.bus.forget(self.puller)
        for batch in self.leases.close():
            await batch.hand_back()
        while self.puller.arrived:
            with contextlib.suppress(Exception):
                await self.puller.arrived.popleft()[1].nak()
        with contextlib.suppress(Exception):
            await self.bus.nc.flush(timeout=2)
        await self.bus.release(self._held)
