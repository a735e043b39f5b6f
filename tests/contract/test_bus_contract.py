"""The bus contract: what every Bus backend must do.

``bus_backend`` is parametrised over the backends (the in-process one today; Redis
Streams and NATS JetStream add one entry each to ``BACKENDS``). A backend gives a
fresh bus with a chosen lease and partition count, a way to let time pass for
leases and nack delays (a manual clock in process; real time on a server), and
``quiet()``: the wait after which a message that must not come is taken as not
coming. Tests speak of seconds; a backend on a real server scales them (``span``,
and the same factor inside ``make`` for ``lease`` and inside ``advance``) so that
its suite runs in a fraction of the time.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import pytest

from tideflow.bus import open_bus
from tideflow.bus.backends.local import LocalBus
from tideflow.bus.base import (
    DEFAULT_LEASE,
    Bus,
    CancelAttempt,
    Message,
    QueueStats,
    RunEnded,
    WorkerBeat,
    partition_of,
    presence_ttl,
)
from tideflow.bus.closing import cancel_and_wait
from tideflow.errors import BusError
from tideflow.model.commands import DispatchTask
from tideflow.model.events import SignalReceived, TaskCompleted, TaskStarted
from tideflow.model.plan import Priority
from tideflow.testing.clock import ManualClock

T = TypeVar("T")
WITHIN = 5.0
"""Seconds a message that must come may take (a bound on failure, never a pause)."""


@dataclass
class BusBackend:
    name: str
    make: Callable[..., Bus]
    advance: Callable[[float], Awaitable[None]]
    quiet: Callable[[], Awaitable[None]]
    span: Callable[[float], float] = float
    """Test seconds -> this backend's seconds (for nack delays)."""
    opened: list[Bus] = field(default_factory=list)
    cleanup: Callable[[], Awaitable[None]] | None = None
    """Run after the test's buses are closed (a backend on a server deletes its keys)."""
    send_run_ends: Callable[[Bus, bytes], Awaitable[None]] | None = None
    """Put raw bytes on the run-end channel (a broker's; in process nothing is encoded)."""

    async def open(self, **options: Any) -> Bus:
        bus = self.make(**options)
        await bus.open()
        self.opened.append(bus)
        return bus


def memory_backend(_request: pytest.FixtureRequest) -> BusBackend:
    clock = ManualClock()

    def make(**options: Any) -> Bus:
        return LocalBus(clock=clock, **options)

    async def advance(seconds: float) -> None:
        clock.advance(seconds)
        await _turns()

    return BusBackend("memory", make, advance, _turns)


async def _turns() -> None:
    """Let every ready callback of the event loop run (the in-process bus needs no more)."""
    for _ in range(20):
        await asyncio.sleep(0)


REDIS_SCALE = 0.05
"""Real seconds per test second on Redis: a 10 s lease lasts 0.5 s."""
REDIS_QUIET = 0.02
"""Real seconds without a delivery after which none is taken as coming (well under one
scaled test second: the nack test checks 4 of 5 seconds plus this)."""


def redis_backend(request: pytest.FixtureRequest) -> BusBackend:
    from tideflow.bus.backends.redis import RedisBus

    url = request.getfixturevalue("redis_url")  # skips, or fails in CI, without a server
    prefix = f"tftest-{uuid.uuid4().hex[:12]}"

    def make(**options: Any) -> Bus:
        options["lease"] = options.get("lease", DEFAULT_LEASE) * REDIS_SCALE
        return RedisBus(url, prefix=prefix, **options)

    async def advance(seconds: float) -> None:
        await asyncio.sleep(seconds * REDIS_SCALE)

    async def quiet() -> None:
        await asyncio.sleep(REDIS_QUIET)

    async def cleanup() -> None:
        import redis.asyncio as aioredis

        client = aioredis.Redis.from_url(url)
        try:
            keys = [key async for key in client.scan_iter(match=f"{prefix}:*")]
            if keys:
                await client.delete(*keys)
        finally:
            await client.aclose()

    async def send_run_ends(bus: Bus, raw: bytes) -> None:
        assert isinstance(bus, RedisBus)
        await bus.client.publish(bus.key("ended"), raw)

    return BusBackend(
        "redis",
        make,
        advance,
        quiet,
        lambda s: s * REDIS_SCALE,
        cleanup=cleanup,
        send_run_ends=send_run_ends,
    )


NATS_SCALE = 0.05
"""NATS: one test second is 50 ms of real time (a 10 s lease is 0.5 s)."""
NATS_QUIET = 0.02
"""NATS: a message that has not come within 20 ms is not coming (a local server
answers in well under a millisecond; the nack test needs quiet < 1 scaled second)."""


def nats_backend(request: pytest.FixtureRequest) -> BusBackend:
    from tideflow.bus.backends.nats import NatsBus
    from tideflow.testing.nats import delete_prefix

    url = request.getfixturevalue("nats_url")
    prefix = f"contract-{uuid.uuid4().hex[:12]}"  # streams, consumers, lock bucket

    def make(**options: Any) -> Bus:
        lease = options.pop("lease", DEFAULT_LEASE) * NATS_SCALE
        return NatsBus(url, prefix=prefix, lease=lease, **options)

    async def advance(seconds: float) -> None:
        await asyncio.sleep(seconds * NATS_SCALE)  # leases run on the server's clock

    async def quiet() -> None:
        await asyncio.sleep(NATS_QUIET)

    async def cleanup() -> None:
        bus = NatsBus(url, prefix=prefix)  # the test's buses are closed by now
        await bus.open()
        try:
            await delete_prefix(bus)
        finally:
            await bus.close()

    async def send_run_ends(bus: Bus, raw: bytes) -> None:
        assert isinstance(bus, NatsBus)
        await bus.nc.publish(f"{bus.prefix}.ended", raw)

    return BusBackend(
        "nats",
        make,
        advance,
        quiet,
        span=lambda s: s * NATS_SCALE,
        cleanup=cleanup,
        send_run_ends=send_run_ends,
    )


BACKENDS: dict[str, Callable[[pytest.FixtureRequest], BusBackend]] = {
    "memory": memory_backend,
    "redis": redis_backend,
    "nats": nats_backend,
}


async def _backend(request: pytest.FixtureRequest) -> AsyncIterator[BusBackend]:
    backend = BACKENDS[request.param](request)
    yield backend
    for bus in backend.opened:
        await bus.close()
    if backend.cleanup is not None:
        await backend.cleanup()


@pytest.fixture(params=sorted(BACKENDS))
async def bus_backend(request: pytest.FixtureRequest) -> AsyncIterator[BusBackend]:
    async for backend in _backend(request):
        yield backend


@pytest.fixture(params=sorted(set(BACKENDS) - {"memory"}))
async def broker_backend(request: pytest.FixtureRequest) -> AsyncIterator[BusBackend]:
    """The buses over a real broker (what only a wire or a connection has)."""
    async for backend in _backend(request):
        yield backend


def task(n: int, *, queue: str = "default", priority: Priority = Priority.NORMAL) -> DispatchTask:
    return DispatchTask(
        run_id=f"run-{n}",
        step_key=f"s{n}",
        step_id=f"s{n}",
        type="noop",
        config={},
        input={"n": n},
        attempt=1,
        idempotency_key=f"run-{n}:s{n}:1",
        timeout=None,
        queue=queue,
        priority=priority,
        round=n,  # it travels with the task (a retried run's attempts are in a new round)
    )


def event(run: str, n: int) -> SignalReceived:
    return SignalReceived(event_id=f"{run}-{n}", run_id=run, time=0.0, name="go", payload=n)


async def next_of(items: AsyncIterator[T]) -> T:
    return await asyncio.wait_for(anext(items), WITHIN)


async def nothing_from(items: AsyncIterator[Any], backend: BusBackend) -> asyncio.Task[Any]:
    """Start waiting for the next item, check that none comes; return the waiting task."""
    waiting = asyncio.ensure_future(anext(items))
    await backend.quiet()
    assert not waiting.done(), f"unexpected delivery: {waiting.result()!r}"
    return waiting


async def none_from(items: AsyncIterator[Any], backend: BusBackend) -> None:
    """Check that no item comes, then stop waiting for one (which ends the iterator)."""
    await stop(await nothing_from(items, backend))


async def stop(*reads: asyncio.Future[Any]) -> None:
    """Cancel each read (a task waiting on an iterator's ``anext``) once and wait until it
    is over: one that runs on after its cancel fails the test within ``WITHIN`` seconds
    instead of hanging it, and is cancelled again until it ends (``cancel_and_wait``). An
    error a read ended with comes out; an item that came with the cancel is fine."""
    for read in reads:
        read.cancel()
    await asyncio.wait(reads, timeout=WITHIN)
    running = [read for read in reads if not read.done()]
    if running:
        await cancel_and_wait(*running)
        pytest.fail(f"{len(running)} read(s) ran on for {WITHIN}s after their cancel")
    for read in reads:
        if not read.cancelled():
            read.result()


# -- delivery and ack ------------------------------------------------------------


async def test_tasks_and_events_are_delivered_with_their_headers(bus_backend: BusBackend) -> None:
    bus = await bus_backend.open()
    trace = {"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}
    await bus.publish_tasks([task(1), Message(task(2), trace)])
    await bus.publish_events([event("r", 1), Message(event("r", 2), trace)])
    async with contextlib.aclosing(bus.consume_tasks(prefetch=10)) as tasks:
        first, second = await next_of(tasks), await next_of(tasks)
        assert (first.body, dict(first.headers), first.deliveries) == (task(1), {}, 1)
        assert (second.body, dict(second.headers)) == (task(2), trace)
    async with contextlib.aclosing(bus.consume_events(max_batch=10)) as batches:
        batch = await next_of(batches)
        assert batch.events == [event("r", 1), event("r", 2)]
        assert (dict(batch.headers(0)), dict(batch.headers(1))) == ({}, trace)


async def test_headers_come_again_with_a_message_handed_back_or_redelivered(
    bus_backend: BusBackend,
) -> None:
    """A task or event nacked (events by run: the others of their batch carry on) or whose
    lease ran out comes again with its headers, ``tracestate`` and all, and a bare one
    comes again bare."""
    bus = await bus_backend.open(lease=10.0, partitions=1)
    a = {
        "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        "tracestate": "vendor=opaque,other=1",
    }
    b = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
    await bus.publish_tasks([Message(task(1), a), task(2)])
    await bus.publish_events([Message(event("a", 1), a), event("b", 1), Message(event("a", 2), b)])
    async with contextlib.aclosing(bus.consume_tasks(prefetch=10)) as tasks:
        for delivery in [await next_of(tasks), await next_of(tasks)]:
            await delivery.nack()
        again = {d.body.run_id: d for d in [await next_of(tasks), await next_of(tasks)]}
        assert [(dict(again[r].headers), again[r].deliveries) for r in ("run-1", "run-2")] == [
            (a, 2),
            ({}, 2),
        ]
    async with contextlib.aclosing(bus.consume_events(max_batch=10)) as batches:
        batch = await next_of(batches)
        await batch.nack(runs={"a"})
        await batch.ack()
        nacked = await next_of(batches)
        assert nacked.events == [event("a", 1), event("a", 2)]
        assert [dict(nacked.headers(i)) for i in range(2)] == [a, b]
        await bus_backend.advance(11.0)  # not acknowledged within its lease
        expired = await next_of(batches)
        assert expired.events == nacked.events
        assert [dict(expired.headers(i)) for i in range(2)] == [a, b]
        await expired.ack()


async def test_an_attempts_report_travels_with_its_round(bus_backend: BusBackend) -> None:
    bus = await bus_backend.open()
    common = {"run_id": "r", "time": 0.0, "step_key": "a", "attempt": 1}
    reports = [
        TaskStarted(event_id="s", **common, round=2, worker="h/1"),
        TaskCompleted(event_id="c", **common, round=2, output={"ok": True}, compensation=True),
    ]
    await bus.publish_events(reports)
    async with contextlib.aclosing(bus.consume_events(max_batch=10)) as batches:
        assert (await next_of(batches)).events == reports


async def test_an_acknowledged_message_is_gone(bus_backend: BusBackend) -> None:
    bus = await bus_backend.open(lease=10.0)
    await bus.publish_tasks([task(1), task(2)])
    await bus.publish_events([event("r", 1)])
    async with contextlib.aclosing(bus.consume_tasks(prefetch=10)) as tasks:
        await (await next_of(tasks)).ack()
        second = await next_of(tasks)
        await second.ack()
        await second.ack()  # settling twice changes nothing
        await bus_backend.advance(11.0)  # their leases would have run out
        await none_from(tasks, bus_backend)
        assert second.body == task(2)
    async with contextlib.aclosing(bus.consume_events(max_batch=10)) as batches:
        await (await next_of(batches)).ack()
        await bus_backend.advance(11.0)
        await none_from(batches, bus_backend)


async def test_tasks_acknowledged_together_are_gone(bus_backend: BusBackend) -> None:
    """``ack_tasks``: deliveries of two streams at once, one settled already (left alone),
    one nacked by then (it comes again), none at all (nothing happens)."""
    bus = await bus_backend.open(lease=10.0)
    await bus.publish_tasks([task(n) for n in range(1, 6)])
    async with (
        contextlib.aclosing(bus.consume_tasks(prefetch=2)) as one,
        contextlib.aclosing(bus.consume_tasks(prefetch=3)) as two,
    ):
        first = [await next_of(one), await next_of(one)]
        second = [await next_of(two), await next_of(two), await next_of(two)]
        await first[0].ack()  # settled already
        await second[2].nack()  # handed back before the batch
        await bus.ack_tasks([*first, *second])
        await bus.ack_tasks([])
        again = await next_of(two)
        assert (again.body, again.deliveries) == (second[2].body, 2)
        await bus.ack_tasks([again])
        await bus_backend.advance(11.0)  # their leases would have run out
        await none_from(one, bus_backend)
        await none_from(two, bus_backend)
    assert sorted(d.body.round for d in [*first, *second]) == [1, 2, 3, 4, 5]


async def test_tasks_acknowledged_together_are_no_longer_held(bus_backend: BusBackend) -> None:
    bus = await bus_backend.open()
    await bus.publish_tasks([task(1), task(2), task(3)])
    async with contextlib.aclosing(bus.consume_tasks(["default"], prefetch=3)) as tasks:
        held = [await next_of(tasks) for _ in range(3)]
        await stats_when(bus, lambda s: s["default", NORMAL].held == 3)
        await bus.ack_tasks(held)
        stats = await stats_when(bus, lambda s: s["default", NORMAL].held == 0)
        assert stats["default", NORMAL].depth == 0


# -- nack, leases --------------------------------------------------------------


async def test_a_nacked_task_comes_again_after_its_delay(bus_backend: BusBackend) -> None:
    bus = await bus_backend.open(lease=30.0)
    await bus.publish_tasks([task(1)])
    async with contextlib.aclosing(bus.consume_tasks(prefetch=10)) as tasks:
        await (await next_of(tasks)).nack(delay=bus_backend.span(5.0))
        await bus_backend.advance(4.0)
        waiting = await nothing_from(tasks, bus_backend)
        await bus_backend.advance(1.5)
        again = await asyncio.wait_for(waiting, WITHIN)
        assert (again.body, again.deliveries) == (task(1), 2)
        await again.nack()  # no delay: at once
        assert (await next_of(tasks)).deliveries == 3


async def test_a_task_whose_lease_runs_out_is_delivered_again(bus_backend: BusBackend) -> None:
    bus = await bus_backend.open(lease=10.0)
    await bus.publish_tasks([task(1)])
    async with contextlib.aclosing(bus.consume_tasks(prefetch=1)) as tasks:
        held = await next_of(tasks)
        await bus_backend.advance(6.0)
        await held.extend()  # the heartbeat: the lease starts over
        await bus_backend.advance(6.0)
        waiting = await nothing_from(tasks, bus_backend)
        await bus_backend.advance(5.0)  # 11 s since the extension: the worker is gone
        again = await asyncio.wait_for(waiting, WITHIN)
        assert (again.body, again.deliveries) == (task(1), 2)
        await held.ack()  # too late: the message went back, the new delivery decides
        await bus_backend.advance(11.0)
        assert (await next_of(tasks)).deliveries == 3


async def test_a_task_a_closed_consumer_held_goes_to_another(bus_backend: BusBackend) -> None:
    bus = await bus_backend.open(lease=30.0)
    await bus.publish_tasks([task(1)])
    async with contextlib.aclosing(bus.consume_tasks(prefetch=1)) as tasks:
        assert (await next_of(tasks)).body == task(1)
    async with contextlib.aclosing(bus.consume_tasks(prefetch=1)) as tasks:
        assert (await next_of(tasks)).deliveries == 2


async def test_an_event_batch_not_acknowledged_in_its_lease_comes_again(
    bus_backend: BusBackend,
) -> None:
    bus = await bus_backend.open(lease=10.0)
    await bus.publish_events([event("r", 1), event("r", 2)])
    async with contextlib.aclosing(bus.consume_events(max_batch=10)) as batches:
        first = await next_of(batches)
        await bus_backend.advance(11.0)
        again = await next_of(batches)
        assert again.events == first.events
        await again.ack()


async def test_nacking_some_runs_of_a_batch_hands_back_only_theirs(bus_backend: BusBackend) -> None:
    bus = await bus_backend.open(lease=30.0, partitions=1)
    await bus.publish_events([event("a", 1), event("b", 1), event("a", 2)])
    async with contextlib.aclosing(bus.consume_events(max_batch=10)) as batches:
        batch = await next_of(batches)
        # 10 s: half a second on a broker, so that a loaded machine's pause between the
        # nack and the check does not outlast it (2 s, 100 ms, did under CI's load)
        await batch.nack(delay=bus_backend.span(10.0), runs={"a"})
        await batch.ack()
        waiting = await nothing_from(batches, bus_backend)
        await bus_backend.advance(10.5)
        # Handed back in order; on NATS each message's delay runs out on its own, so a
        # busy server may hand them back in two batches.
        again = await asyncio.wait_for(waiting, WITHIN)
        seen = list(again.events)
        await again.ack()
        while len(seen) < 2:
            more = await next_of(batches)
            seen += more.events
            await more.ack()
        assert seen == [event("a", 1), event("a", 2)]
        await bus_backend.advance(31.0)
        await none_from(batches, bus_backend)


# -- prefetch ------------------------------------------------------------------


async def test_a_consumer_of_named_queues_woken_by_a_burst_holds_no_more_than_its_prefetch(
    bus_backend: BusBackend,
) -> None:
    """A burst on one lane is taken up to the prefetch at once, however the consumer waited
    (on NATS a standing request on each of the queue's lanes must not keep the others'
    tasks waiting: they were held back until a lease ran out)."""
    bus = await bus_backend.open(lease=30.0)
    async with contextlib.aclosing(bus.consume_tasks(["default"], prefetch=4)) as tasks:
        waiting = await nothing_from(tasks, bus_backend)  # it waits on the empty queue
        await bus.publish_tasks([task(n) for n in range(6)])
        first = await asyncio.wait_for(waiting, WITHIN)
        held = [first] + [await next_of(tasks) for _ in range(3)]
        waiting = await nothing_from(tasks, bus_backend)  # four held: no fifth
        await held[0].ack()
        fifth = await asyncio.wait_for(waiting, WITHIN)
    assert sorted(d.body.run_id for d in [*held, fifth]) == [task(n).run_id for n in range(5)]


async def test_prefetch_bounds_the_unacknowledged_deliveries(bus_backend: BusBackend) -> None:
    bus = await bus_backend.open()
    await bus.publish_tasks([task(n) for n in range(5)])
    async with contextlib.aclosing(bus.consume_tasks(prefetch=2)) as tasks:
        first, _second = await next_of(tasks), await next_of(tasks)
        waiting = await nothing_from(tasks, bus_backend)
        await first.ack()
        third = await asyncio.wait_for(waiting, WITHIN)
        assert third.body == task(2)
        await none_from(tasks, bus_backend)


@pytest.mark.parametrize("value", [0, -1, 1.5, True])
async def test_prefetch_and_max_batch_must_be_whole_and_positive(
    bus_backend: BusBackend, value: Any
) -> None:
    bus = await bus_backend.open()
    with pytest.raises(BusError, match="prefetch must be a whole number"):
        await anext(bus.consume_tasks(prefetch=value))
    with pytest.raises(BusError, match="max_batch must be a whole number"):
        await anext(bus.consume_events(max_batch=value))


# -- queues and priority -------------------------------------------------------


async def test_high_goes_first_and_low_still_progresses(bus_backend: BusBackend) -> None:
    bus = await bus_backend.open()
    await bus.publish_tasks([task(n, priority=Priority.LOW) for n in range(100)])
    await bus.publish_tasks([task(n, priority=Priority.NORMAL) for n in range(100, 200)])
    await bus.publish_tasks([task(n, priority=Priority.HIGH) for n in range(200, 300)])
    seen: list[Priority] = []
    async with contextlib.aclosing(bus.consume_tasks(prefetch=1)) as tasks:
        for _ in range(100):
            delivery = await next_of(tasks)
            seen.append(delivery.body.priority)
            await delivery.ack()
    assert seen[0] is Priority.HIGH
    counts = {p: seen.count(p) for p in Priority}
    assert counts[Priority.HIGH] > counts[Priority.NORMAL] > counts[Priority.LOW] >= 10
    assert Priority.LOW in seen[:10]  # low is not left until high runs out


async def test_a_high_task_overtakes_a_backlog_of_low_ones(bus_backend: BusBackend) -> None:
    bus = await bus_backend.open()
    await bus.publish_tasks([task(n, priority=Priority.LOW) for n in range(50)])
    async with contextlib.aclosing(bus.consume_tasks(prefetch=1)) as tasks:
        for _ in range(3):
            await (await next_of(tasks)).ack()
        await bus.publish_tasks([task(99, priority=Priority.HIGH)])
        next_two = [await next_of(tasks) for _ in range(1)]
        await next_two[0].ack()
        next_two.append(await next_of(tasks))
    assert task(99, priority=Priority.HIGH) in [d.body for d in next_two]


async def test_low_progresses_under_a_steady_high_load(bus_backend: BusBackend) -> None:
    bus = await bus_backend.open()
    await bus.publish_tasks([task(n, priority=Priority.LOW) for n in range(5)])
    await bus.publish_tasks([task(n, priority=Priority.HIGH) for n in range(100, 110)])
    low = 0
    async with contextlib.aclosing(bus.consume_tasks(prefetch=1)) as tasks:
        for n in range(60):
            delivery = await next_of(tasks)
            if delivery.body.priority is Priority.HIGH:  # every high one is replaced at once
                await bus.publish_tasks([task(1000 + n, priority=Priority.HIGH)])
            else:
                low += 1
            await delivery.ack()
    assert low == 5


async def test_a_consumer_reads_only_its_queues(bus_backend: BusBackend) -> None:
    bus = await bus_backend.open()
    await bus.publish_tasks([task(1, queue="gpu"), task(2, queue="io"), task(3, queue="gpu")])
    async with contextlib.aclosing(bus.consume_tasks(["gpu"], prefetch=10)) as gpu:
        held = [await next_of(gpu), await next_of(gpu)]
        assert {d.body.step_key for d in held} == {"s1", "s3"}
        for delivery in held:
            await delivery.ack()
        await none_from(gpu, bus_backend)  # nor from io
    async with contextlib.aclosing(bus.consume_tasks(["io", "gpu"], prefetch=10)) as both:
        assert (await next_of(both)).body == task(2, queue="io")
        await none_from(both, bus_backend)


# -- events: partitions and order ----------------------------------------------


async def test_a_runs_events_come_in_order_to_one_consumer(bus_backend: BusBackend) -> None:
    bus = await bus_backend.open(partitions=4)
    runs = [f"run-{n}" for n in range(8)]
    await bus.publish_events([event(run, n) for n in range(20) for run in runs])
    got: dict[str, list[int]] = {run: [] for run in runs}
    async with contextlib.aclosing(bus.consume_events(max_batch=7)) as batches:
        while sum(map(len, got.values())) < 160:
            batch = await next_of(batches)
            for e in batch.events:
                got[e.run_id].append(e.payload)
            await batch.ack()
    assert got == {run: list(range(20)) for run in runs}


async def test_partitions_are_owned_by_one_consumer_at_a_time(bus_backend: BusBackend) -> None:
    bus = await bus_backend.open(partitions=4)
    runs = [f"run-{n}" for n in range(16)]
    mine = {run for run in runs if partition_of(run, 4) in (0, 1)}
    assert mine and mine != set(runs)
    await bus.publish_events([event(run, 1) for run in runs])
    async with contextlib.aclosing(bus.consume_events([0, 1], max_batch=100)) as first:
        batch = await next_of(first)
        assert {e.run_id for e in batch.events} == mine
        with pytest.raises(BusError, match="partition 1 is consumed by another consumer"):
            await anext(bus.consume_events([1, 2], max_batch=10))
        async with contextlib.aclosing(bus.consume_events([2, 3], max_batch=100)) as second:
            assert {e.run_id for e in (await next_of(second)).events} == set(runs) - mine
    # the first consumer closed without acknowledging: its events go to the next owner
    async with contextlib.aclosing(bus.consume_events([0, 1], max_batch=100)) as third:
        assert {e.run_id for e in (await next_of(third)).events} == mine


async def test_partition_numbers_are_checked(bus_backend: BusBackend) -> None:
    bus = await bus_backend.open(partitions=4)
    with pytest.raises(BusError, match="partition 4 does not exist"):
        await anext(bus.consume_events([4], max_batch=10))
    with pytest.raises(BusError, match="at least one partition"):
        await anext(bus.consume_events([], max_batch=10))


# -- control -------------------------------------------------------------------


async def test_a_cancel_reaches_every_control_consumer(bus_backend: BusBackend) -> None:
    bus = await bus_backend.open()
    cancel = CancelAttempt(run_id="r", step_key="a", attempt=2)
    retried = CancelAttempt(run_id="r", step_key="a", attempt=2, round=1)
    compensation = CancelAttempt(run_id="r", step_key="a", attempt=2, compensation=True)
    async with (
        contextlib.aclosing(bus.consume_control()) as one,
        contextlib.aclosing(bus.consume_control()) as two,
    ):
        waiting = [asyncio.ensure_future(anext(one)), asyncio.ensure_future(anext(two))]
        await bus_backend.quiet()  # both are listening before the cancel goes out
        await bus.publish_control(cancel)
        await bus.publish_control(retried)
        await bus.publish_control(compensation)
        assert await asyncio.wait_for(asyncio.gather(*waiting), WITHIN) == [cancel, cancel]
        assert await next_of(one) == retried  # its round travels with it
        assert await next_of(one) == compensation  # and whether it is a compensation's


# -- run ends ------------------------------------------------------------------

ENDS = [RunEnded("r1", "succeeded"), RunEnded("r2", "failed")]


async def test_run_ends_reach_every_run_end_stream_of_every_bus(bus_backend: BusBackend) -> None:
    engine, client = await bus_backend.open(), await bus_backend.open()
    if isinstance(engine, LocalBus):
        client = engine  # one process: one bus
    async with (
        contextlib.aclosing(await client.run_ends()) as one,
        contextlib.aclosing(await client.run_ends()) as two,
    ):
        await engine.publish_run_ends(ENDS)  # no pause: each stream is fed once it returned
        await engine.publish_run_ends([RunEnded("r3", "cancelled")])
        assert [await next_of(one) for _ in range(3)] == [*ENDS, RunEnded("r3", "cancelled")]
        assert [await next_of(two) for _ in range(3)] == [*ENDS, RunEnded("r3", "cancelled")]
        await engine.publish_run_ends([])  # nothing to say: nothing said
        await none_from(one, bus_backend)


async def test_a_closed_run_end_stream_gets_nothing_and_the_others_carry_on(
    bus_backend: BusBackend,
) -> None:
    bus = await bus_backend.open()
    one, two = await bus.run_ends(), await bus.run_ends()
    await one.aclose()
    await bus.publish_run_ends(ENDS[:1])
    async with contextlib.aclosing(two):
        assert await next_of(two) == ENDS[0]


async def test_run_ends_and_cancels_keep_to_their_own_channels(bus_backend: BusBackend) -> None:
    bus = await bus_backend.open()
    async with (
        contextlib.aclosing(bus.consume_control()) as control,
        contextlib.aclosing(await bus.run_ends()) as ends,
    ):
        await bus_backend.quiet()  # the control consumer listens
        await bus.publish_run_ends(ENDS)
        await bus.publish_control(CancelAttempt(run_id="r", step_key="a", attempt=1))
        assert await next_of(ends) == ENDS[0]
        assert await next_of(control) == CancelAttempt(run_id="r", step_key="a", attempt=1)
        assert await next_of(ends) == ENDS[1]
        await none_from(control, bus_backend)  # a worker hears no run end
        await none_from(ends, bus_backend)  # a client no cancel


@pytest.mark.parametrize(
    "raw",
    [
        b"not json",
        b"[1, 2]",
        b'{"ends": "r1"}',
        b'{"ends": [["r1"]]}',
        b'{"ends": [["r1", 7]]}',
        b'{"ends": [["", "succeeded"]]}',
        b'{"ends": [["r1", "succeeded"], {"run_id": "r2"}]}',
    ],
)
async def test_a_malformed_run_end_message_is_dropped_and_the_stream_goes_on(
    broker_backend: BusBackend, raw: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    bus_backend = broker_backend
    assert bus_backend.send_run_ends is not None
    bus = await bus_backend.open()
    caplog.set_level(logging.DEBUG, logger=f"tideflow.bus.{bus_backend.name}")
    async with contextlib.aclosing(await bus.run_ends()) as ends:
        await bus_backend.send_run_ends(bus, raw)
        await bus.publish_run_ends(ENDS[1:])
        assert await next_of(ends) == ENDS[1]  # all or nothing of a malformed one
    assert any("dropped a run-end message" in r.getMessage() for r in caplog.records)


async def test_run_ends_need_an_open_bus(broker_backend: BusBackend) -> None:
    bus = broker_backend.make()
    with pytest.raises(BusError, match="not open"):
        await bus.run_ends()
    with pytest.raises(BusError, match="not open"):
        await bus.publish_run_ends(ENDS)


# -- options and URLs ----------------------------------------------------------


async def test_a_nack_delay_must_be_a_number_of_seconds(bus_backend: BusBackend) -> None:
    bus = await bus_backend.open()
    await bus.publish_tasks([task(1)])
    async with contextlib.aclosing(bus.consume_tasks(prefetch=1)) as tasks:
        delivery = await next_of(tasks)
        for bad in (-1.0, float("nan"), float("inf")):
            with pytest.raises(BusError, match="a nack delay must be"):
                await delivery.nack(bad)
        await delivery.ack()


# -- queue stats (what `tideflow queues` shows) ---------------------------------

HIGH, NORMAL, LOW = Priority.HIGH, Priority.NORMAL, Priority.LOW


def by_lane(rows: list[QueueStats]) -> dict[tuple[str, Priority], QueueStats]:
    return {(row.queue, row.priority): row for row in rows}


async def stats_when(
    bus: Bus, holds: Callable[[dict[tuple[str, Priority], QueueStats]], bool]
) -> dict[tuple[str, Priority], QueueStats]:
    """The stats once ``holds`` is true of them (an ack travels to the server on its
    own: NATS confirms it later), within ``WITHIN`` seconds; the last ones otherwise."""
    async with asyncio.timeout(WITHIN):
        while not holds(stats := by_lane(await bus.queue_stats())):  # noqa: ASYNC110
            await asyncio.sleep(0.01)
    return stats


async def test_tasks_nobody_consumes_are_counted_and_their_age_grows(
    bus_backend: BusBackend,
) -> None:
    bus = await bus_backend.open()
    assert await bus.queue_stats() == []
    await bus.publish_tasks(
        [
            task(1, queue="reports"),
            task(2, queue="reports"),
            task(3, queue="reports", priority=HIGH),
        ]
    )
    rows = await bus.queue_stats()
    assert [(r.queue, r.priority) for r in rows] == [
        ("reports", HIGH),
        ("reports", NORMAL),
        ("reports", LOW),
    ]
    assert [(r.depth, r.held, r.consumers) for r in rows] == [(1, 0, 0), (2, 0, 0), (0, 0, 0)]
    assert rows[2].oldest_age is None
    first = [r.oldest_age for r in rows[:2]]
    assert all(age is not None and age >= 0 for age in first)
    await bus_backend.advance(4.0)
    later = [r.oldest_age for r in (await bus.queue_stats())[:2]]
    assert all(b is not None and a is not None and b > a for a, b in zip(first, later, strict=True))


async def test_delivered_tasks_are_held_and_acknowledged_ones_are_gone(
    bus_backend: BusBackend,
) -> None:
    bus = await bus_backend.open()
    await bus.publish_tasks([task(1), task(2), task(3)])
    async with contextlib.aclosing(bus.consume_tasks(["default"], prefetch=2)) as tasks:
        one, two = await next_of(tasks), await next_of(tasks)
        stats = await stats_when(bus, lambda s: s["default", NORMAL].held == 2)
        row = stats["default", NORMAL]
        assert (row.depth, row.held, row.consumers) == (1, 2, 1)
        assert row.oldest_age is not None
        await one.ack()
        await two.ack()
        stats = await stats_when(bus, lambda s: s["default", NORMAL].held == 0)
        assert stats["default", NORMAL].depth == 1  # the third, not asked for yet
        await (await next_of(tasks)).ack()
        stats = await stats_when(bus, lambda s: s["default", NORMAL].held == 0)
        row = stats["default", NORMAL]
        assert (row.depth, row.oldest_age) == (0, None)
    stats = await stats_when(bus, lambda s: s["default", NORMAL].consumers == 0)
    assert (stats["default", NORMAL].depth, stats["default", NORMAL].held) == (0, 0)


async def test_a_queue_no_consumer_reads_keeps_its_tasks_queued_and_visible(
    bus_backend: BusBackend,
) -> None:
    bus = await bus_backend.open(lease=2.0)
    await bus.publish_tasks([task(1, queue="default"), task(2, queue="reports")])
    async with contextlib.aclosing(bus.consume_tasks(["default"], prefetch=5)) as tasks:
        await (await next_of(tasks)).ack()
        waiting = asyncio.ensure_future(anext(tasks))  # a consumer reading, as a worker's is
        await bus_backend.advance(5.0)  # leases come and go: nothing moves the reports task
        stats = await stats_when(bus, lambda s: s["default", NORMAL].held == 0)
        assert not waiting.done()
        await bus.publish_tasks([task(3)])  # what it waits for (not a cancel, which a
        await (await asyncio.wait_for(waiting, WITHIN)).ack()  # consumer may not take at once)
        assert [stats[q, p].consumers for q in ("default", "reports") for p in (HIGH, LOW)] == [
            1,
            1,
            0,
            0,
        ]
        reports = stats["reports", NORMAL]
        assert (reports.depth, reports.held) == (1, 0)
        assert reports.oldest_age is not None
    async with contextlib.aclosing(bus.consume_tasks(prefetch=1)) as every:
        delivery = await next_of(every)
        assert delivery.body == task(2, queue="reports")
        stats = await stats_when(bus, lambda s: s["reports", NORMAL].held == 1)
        assert (stats["default", NORMAL].consumers, stats["reports", NORMAL].consumers) == (1, 1)
        await delivery.ack()
    stats = await stats_when(bus, lambda s: s["reports", NORMAL].consumers == 0)
    assert (stats["reports", NORMAL].depth, stats["reports", NORMAL].held) == (0, 0)


# -- worker beats --------------------------------------------------------------

SLACK = 1.0
"""Seconds between this host's clock and the broker's (a beat is stamped by either)."""


async def beats_when(bus: Bus, holds: Callable[[list[WorkerBeat]], bool]) -> list[WorkerBeat]:
    """The beats once ``holds`` is true of them (a presence lapses on the server's own
    time), within ``WITHIN`` seconds."""
    async with asyncio.timeout(WITHIN):
        while not holds(beats := await bus.worker_beats()):  # noqa: ASYNC110
            await asyncio.sleep(0.01)
    return beats


async def test_a_named_reader_beats_while_open_and_is_forgotten_when_closed(
    bus_backend: BusBackend,
) -> None:
    bus = await bus_backend.open()
    assert await bus.worker_beats() == []
    opened = time.time()
    named = bus.consume_tasks(["reports", "default"], prefetch=1, worker="host-a/41")
    anonymous = bus.consume_tasks(prefetch=1)
    waiting = [asyncio.ensure_future(anext(s)) for s in (named, anonymous)]  # open, reading
    (beat,) = await beats_when(bus, lambda b: len(b) == 1)
    assert (beat.worker, beat.queues, beat.live) == ("host-a/41", ("default", "reports"), True)
    assert opened - SLACK <= beat.last_beat <= time.time() + SLACK
    every = bus.consume_tasks(prefetch=1, worker="host-b/7")
    waiting.append(asyncio.ensure_future(anext(every)))
    beats = await beats_when(bus, lambda b: len(b) == 2)
    assert [(b.worker, b.queues, b.live) for b in beats] == [
        ("host-a/41", ("default", "reports"), True),
        ("host-b/7", None, True),
    ]
    await stop(*waiting)  # stops waiting, which closes the stream
    assert await beats_when(bus, lambda b: not b) == []


def test_a_readers_presence_lasts_its_buss_lease_within_one_to_ten_seconds() -> None:
    assert [presence_ttl(lease) for lease in (30.0, 10.0, 2.0, 0.1)] == [10.0, 10.0, 2.0, 1.0]


SHORT_LEASE = 12.0
"""Test seconds (0.6 s on a broker): a reader's presence lapses 1 s after its last
renewal (``presence_ttl``), 10 s with the default lease."""


async def stop_renewing() -> None:
    """What a process that dies does to its readers' presence: no renewal any more (the
    renewers are the bus's ``tideflow-<bus>-presence`` tasks; each is over on return, even
    one whose broker client dropped a cancel)."""
    renewers = [t for t in asyncio.all_tasks() if t.get_name().endswith("-presence")]
    assert renewers
    await cancel_and_wait(*renewers)


async def test_a_reader_that_stops_beating_is_listed_not_live_with_its_last_beat(
    broker_backend: BusBackend,
) -> None:
    bus = await broker_backend.open(lease=SHORT_LEASE)
    await bus.publish_tasks([task(1)])
    opened = time.time()
    dying = bus.consume_tasks(["default"], prefetch=1, worker="host-a/41")
    assert (await next_of(dying)).body == task(1)  # held by it as it dies
    await beats_when(bus, lambda b: len(b) == 1)
    await stop_renewing()
    stopped = time.time()
    (beat,) = await beats_when(bus, lambda b: len(b) == 1 and not b[0].live)
    assert beat.worker == "host-a/41" and beat.queues == ("default",)
    assert opened - SLACK <= beat.last_beat <= stopped + SLACK
    await stats_when(bus, lambda s: s["default", NORMAL].consumers == 0)  # nor as a reader
    waiting = asyncio.ensure_future(anext(dying))
    await bus.publish_tasks([task(2)])
    again = bus.consume_tasks(["default"], prefetch=1, worker="host-a/41")  # restarted
    await (await next_of(again)).ack()
    beats = await beats_when(bus, lambda b: len(b) == 2)
    assert [b.live for b in beats] == [False, True]  # by last beat: the dead one first
    await again.aclose()
    await stop(waiting)  # it may have taken a task whose lease ran out: close it too
    await dying.aclose()  # closed at last: its beat is deleted too
    assert await beats_when(bus, lambda b: not b) == []


async def test_a_readers_renewer_runs_before_anyone_can_see_the_reader(
    broker_backend: BusBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reader's beat can be read as soon as its first announcement is written, before
    ``consume_tasks`` goes on: its renewer must already run then (CI once found a beat and
    no renewer to stop, in the test below)."""
    from tideflow.bus.backends import nats_presence, redis_presence

    renewing: list[bool] = []
    for module in (nats_presence, redis_presence):
        announce = module.Presence.announce

        async def noting(self: Any, announce: Any = announce) -> None:
            tasks = asyncio.all_tasks()
            renewing.append(any(t.get_name().endswith("-presence") for t in tasks))
            await announce(self)

        monkeypatch.setattr(module.Presence, "announce", noting)
    bus = await broker_backend.open(lease=SHORT_LEASE)
    reader = bus.consume_tasks(["default"], prefetch=1, worker="host-a/41")
    waiting = asyncio.ensure_future(anext(reader))
    await beats_when(bus, lambda b: len(b) == 1)
    assert renewing and all(renewing)
    await stop(waiting)
    await reader.aclose()


async def test_the_beat_of_a_reader_that_stopped_long_ago_is_trimmed(
    broker_backend: BusBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tideflow.bus.backends import nats_presence, redis_presence

    for module in (nats_presence, redis_presence):
        monkeypatch.setattr(module, "BEATS_KEPT", 1.0)
    bus = await broker_backend.open(lease=SHORT_LEASE)
    dying = bus.consume_tasks(["default"], prefetch=1, worker="host-a/41")
    waiting = [asyncio.ensure_future(anext(dying))]
    await beats_when(bus, lambda b: len(b) == 1)
    await stop_renewing()
    live = bus.consume_tasks(["default"], prefetch=1, worker="host-b/7")  # renews on
    waiting.append(asyncio.ensure_future(anext(live)))
    beats = await beats_when(bus, lambda b: [x.worker for x in b] == ["host-b/7"])
    assert beats[0].live
    await stop(*waiting)


DAMAGED = [
    b"{not json",
    b"[]",
    b'{"queues": ["default"]}',
    b'{"worker": "w", "queues": 5, "at": 1}',
]
"""Beat records no version of tideflow writes: each is left out of ``worker_beats``."""


async def test_a_damaged_beat_record_is_left_out(broker_backend: BusBackend) -> None:
    from tideflow.bus.backends.nats import NatsBus
    from tideflow.bus.backends.nats_presence import beats_bucket
    from tideflow.bus.backends.redis import RedisBus

    bus = await broker_backend.open()
    for i, record in enumerate(DAMAGED):
        if isinstance(bus, RedisBus):
            await bus.client.zadd(bus.key("beats"), {f"bad{i}": time.time() * 1000})
            await bus.client.hset(bus.key("beat_records"), f"bad{i}", record)
        else:
            assert isinstance(bus, NatsBus)
            await (await beats_bucket(bus)).put(f"bad{i}", record)
    reader = bus.consume_tasks(["default"], prefetch=1, worker="host-a/41")
    waiting = asyncio.ensure_future(anext(reader))
    beats = await beats_when(bus, lambda b: len(b) == 1)
    assert beats[0].worker == "host-a/41" and beats[0].live
    await stop(waiting)
    await reader.aclose()


# -- URLs ----------------------------------------------------------------------


def test_open_bus_builds_the_in_process_bus_with_its_options() -> None:
    bus = open_bus("memory://?partitions=8&lease=2.5")
    assert isinstance(bus, LocalBus)
    assert (bus.partitions, bus.lease) == (8, 2.5)
    assert isinstance(open_bus("local://"), LocalBus)


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("kafka://x", "unknown bus URL 'kafka://x': use memory://"),
        ("memory", "unknown bus URL"),
        ("memory://?partition=3", "unknown option 'partition'"),
        ("memory://?lease=soon", "lease='soon' is not a number"),
        ("memory://?lease=0", "lease must be a positive number"),
        ("memory://?partitions=0", "partitions must be a whole number"),
        ("memory://host/path", "takes no host or path"),
    ],
)
def test_open_bus_refuses_what_it_cannot_build(url: str, message: str) -> None:
    with pytest.raises(BusError, match=message):
        open_bus(url)
