"""The Redis bus behind Redis Sentinel (``redis+sentinel://``) on a topology of the
test's own (tideflow.testing.topologies.redis_sentinel: a master, two replicas, three
sentinels): it finds the master through the sentinels, and when the master is SIGKILLed
in the middle of a burst it follows the promoted replica, and nothing a publish
acknowledged (with ``wait=1``: once a replica had it) is lost. ``wait`` refuses to
acknowledge a publish no replica confirmed."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import pytest

from tideflow.bus import open_bus
from tideflow.bus.backends.redis import RedisBus
from tideflow.bus.base import Bus, EventBatch
from tideflow.errors import BusError
from tideflow.model.commands import DispatchTask
from tideflow.model.events import TaskCompleted
from tideflow.testing.topologies.redis_sentinel import RedisSentinel, binary

WITHIN = 30.0
LEASE = 1.0
BURST = 300

pytestmark = [pytest.mark.timeout(120)]


def task(n: int) -> DispatchTask:
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
        queue="default",
    )


def completed(n: int) -> TaskCompleted:
    return TaskCompleted(
        event_id=f"ev-{n}", time=0.0, run_id=f"run-{n}", step_key="s", attempt=1, output={"n": n}
    )


@pytest.fixture
def topology(tmp_path: Path, broker_binary: Callable[[str], str]) -> Iterator[RedisSentinel]:
    broker_binary("redis")  # skip (fail in CI) on a machine without redis-server
    assert binary() is not None
    with RedisSentinel(tmp_path / "sentinel") as running:
        yield running


@pytest.fixture
async def make_bus(topology: RedisSentinel) -> AsyncIterator[Callable[..., Awaitable[Bus]]]:
    prefix = f"sn-{uuid.uuid4().hex[:10]}"
    opened: list[Bus] = []

    async def make(options: str = "") -> Bus:
        bus = open_bus(f"{topology.url}?prefix={prefix}&lease={LEASE:g}&partitions=4{options}")
        await bus.open()
        opened.append(bus)
        return bus

    yield make
    for bus in opened:
        with contextlib.suppress(Exception):
            await bus.close()


async def publish_until_accepted(publish: Callable[[], Awaitable[None]]) -> int:
    """Publish until the bus acknowledges it (it raises ``BusError`` while there is no
    master); the failed tries."""
    failed = 0
    async with asyncio.timeout(WITHIN):
        while True:
            try:
                await publish()
                return failed
            except BusError:
                failed += 1
                await asyncio.sleep(0.05)


async def test_the_bus_finds_the_master_through_the_sentinels(
    topology: RedisSentinel, make_bus: Callable[..., Awaitable[Bus]]
) -> None:
    bus = await make_bus()
    assert isinstance(bus, RedisBus) and bus.sentinel is not None
    assert bus.sentinel.master == topology.master_name
    await bus.publish_tasks([task(1)])
    stream = bus.consume_tasks(["default"], prefetch=1)
    try:
        async with asyncio.timeout(WITHIN):
            delivery = await anext(stream)
        assert delivery.body.run_id == "run-1"
        await delivery.ack()
    finally:
        await stream.aclose()
    # the entry was written on the master the sentinels name, and replicated
    import redis.asyncio as aioredis

    for name in [topology.master(), *topology.replicas_of(topology.master())]:
        node = aioredis.Redis(port=topology.nodes[name].port)
        try:
            assert await node.exists(f"{bus.prefix}:queues"), name
        finally:
            await node.aclose()


async def test_tasks_and_events_ride_through_a_failover_with_nothing_acknowledged_lost(
    topology: RedisSentinel, make_bus: Callable[..., Awaitable[Bus]]
) -> None:
    """A producer publishes a burst (one task and one event at a time, each retried
    until acknowledged) while a consumer of each takes and acknowledges them; the master
    is SIGKILLed a third into the burst. Every acknowledged publish is delivered on the
    new master (a publish whose acknowledgement was lost may come twice)."""
    producer = await make_bus("&wait=1")
    workers, engine = await make_bus(), await make_bus()
    tasks_got: list[int] = []
    events_got: list[int] = []
    wanted = set(range(BURST))
    complete = asyncio.Event()

    def check() -> None:
        if wanted <= set(tasks_got) and wanted <= set(events_got):
            complete.set()

    async def take_tasks() -> None:
        async for delivery in workers.consume_tasks(["default"], prefetch=16):
            tasks_got.append(int(delivery.body.input["n"]))
            await delivery.ack()
            check()

    async def take_events() -> None:
        batches = engine.consume_events(max_batch=64)
        batch: EventBatch
        async for batch in batches:
            events_got.extend(
                int(e.output["n"]) for e in batch.events if isinstance(e, TaskCompleted)
            )
            await batch.ack()
            check()

    takers = [asyncio.create_task(take_tasks()), asyncio.create_task(take_events())]
    failed = 0
    old = ""
    try:
        for n in range(BURST):
            if n == BURST // 3:
                old = await asyncio.to_thread(topology.kill_master)
            failed += await publish_until_accepted(lambda n=n: producer.publish_tasks([task(n)]))
            failed += await publish_until_accepted(
                lambda n=n: producer.publish_events([completed(n)])
            )
        new = await asyncio.to_thread(topology.wait_failover, old)
        assert new != old
        async with asyncio.timeout(WITHIN):
            await complete.wait()
    finally:
        for taker in takers:
            taker.cancel()
        for taker in takers:
            with contextlib.suppress(BaseException):
                await taker
    assert failed > 0  # the kill was felt: publishes failed until the promotion
    assert set(tasks_got) == set(range(BURST))
    assert set(events_got) == set(range(BURST))
    # the old master comes back as a replica of the new one
    await asyncio.to_thread(topology.restart, old)
    await asyncio.to_thread(topology.wait_healthy)
    assert topology.master() == new
    assert sorted(topology.replicas_of(new)) == sorted(set(topology.nodes) - {new})


async def test_wait_refuses_a_publish_no_replica_confirmed(
    topology: RedisSentinel, make_bus: Callable[..., Awaitable[Bus]]
) -> None:
    waiting = await make_bus("&wait=1&wait_timeout=0.2")
    plain = await make_bus()
    await waiting.publish_tasks([task(1)])  # two replicas online: confirmed at once
    master = topology.master()
    for replica in topology.replicas_of(master):
        topology.kill(replica)
    with pytest.raises(BusError, match=r"0 of the 1 replica\(s\) asked for \(wait\) confirmed"):
        await waiting.publish_tasks([task(2)])
    with pytest.raises(BusError, match=r"0 of the 1 replica"):
        await waiting.publish_events([completed(2)])
    await plain.publish_tasks([task(3)])  # without wait: acknowledged by the master alone
