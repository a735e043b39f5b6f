"""A drained bus holds nothing: event and task streams keep no acknowledged entry, and the
broker's memory for them is back near its idle size (issue 28: a backlog that stays cheap).

Redis: ``ack`` is ``XACK`` and ``XDEL`` of the entry (one script), so a stream's length
is what is not settled yet; its memory (``MEMORY USAGE``, per key: other tests share the
server) returns under twice what the stream takes with one entry published and settled.
NATS: the tasks and events streams have WorkQueue retention, which deletes a message once
it is acknowledged: ``messages`` and ``bytes`` of the stream return to 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis.asyncio as aioredis

from tideflow.bus.backends.nats import NatsBus
from tideflow.bus.backends.redis import RedisBus
from tideflow.bus.base import Bus
from tideflow.model.plan import Priority

from .test_bus_contract import WITHIN, event, next_of, task

pytestmark = [pytest.mark.timeout(120)]

EVENTS = 4000
TASKS = 1000
PARTITIONS = 4


async def drain(bus: Bus, events: int, tasks: int) -> None:
    """Publish ``events`` events (over the partitions) and ``tasks`` tasks, and consume and
    acknowledge every one of them."""
    chunk = 500
    for start in range(0, events, chunk):
        await bus.publish_events(
            [event(f"run-{n % 97}", n) for n in range(start, min(events, start + chunk))]
        )
    for start in range(0, tasks, chunk):
        await bus.publish_tasks([task(n) for n in range(start, min(tasks, start + chunk))])
    got = 0
    async with contextlib.aclosing(bus.consume_events(max_batch=256)) as batches:
        while got < events:
            batch = await next_of(batches)
            got += len(batch.events)
            await batch.ack()
    got = 0
    async with contextlib.aclosing(bus.consume_tasks(prefetch=100)) as deliveries:
        while got < tasks:
            held = [await next_of(deliveries)]
            got += 1
            await bus.ack_tasks(held)


@pytest.fixture
async def redis_bus(redis_url: str) -> AsyncIterator[tuple[RedisBus, aioredis.Redis]]:
    prefix = f"tftrim-{uuid.uuid4().hex[:12]}"
    raw = aioredis.Redis.from_url(redis_url)
    bus = RedisBus(redis_url, prefix=prefix, partitions=PARTITIONS)
    await bus.open()
    try:
        yield bus, raw
    finally:
        await bus.close()
        keys = [key async for key in raw.scan_iter(match=f"{prefix}:*")]
        if keys:
            await raw.delete(*keys)
        await raw.aclose()


async def stream_sizes(raw: aioredis.Redis, bus: RedisBus) -> dict[str, tuple[int, int]]:
    """(length, bytes) of each event partition's stream and of the task stream."""
    keys = [bus.key(f"events:{p}") for p in range(PARTITIONS)]
    keys.append(bus.task_stream("default", Priority.NORMAL))
    sizes = {}
    for key in keys:
        usage: Any = await raw.memory_usage(key, samples=0)
        sizes[key] = (int(await raw.xlen(key)), int(usage or 0))
    return sizes


async def test_redis_streams_keep_nothing_acknowledged_and_shrink_back(
    redis_bus: tuple[RedisBus, aioredis.Redis],
) -> None:
    bus, raw = redis_bus
    await drain(bus, PARTITIONS, 1)  # one entry on each stream, settled: the idle size
    idle = await stream_sizes(raw, bus)
    assert all(length == 0 for length, _ in idle.values())
    await bus.publish_events([event(f"run-{n % 97}", n) for n in range(EVENTS)])
    full = await stream_sizes(raw, bus)
    assert sum(length for length, _ in full.values()) == EVENTS
    await drain_published(bus)
    await drain(bus, 0, TASKS)
    after = await stream_sizes(raw, bus)
    assert [length for length, _ in after.values()] == [0] * len(after)
    for key, (_, size) in after.items():
        assert size <= 2 * idle[key][1], (key, size, idle[key][1], full[key][1])
    for key in after:
        if key in full and full[key][0]:
            assert full[key][1] > 4 * idle[key][1]  # the entries did take room


async def drain_published(bus: Bus) -> None:
    got = 0
    async with contextlib.aclosing(bus.consume_events(max_batch=256)) as batches:
        while got < EVENTS:
            batch = await next_of(batches)
            got += len(batch.events)
            await batch.ack()


@pytest.fixture
async def nats_bus(nats_url: str) -> AsyncIterator[NatsBus]:
    bus = NatsBus(nats_url, prefix=f"tftrim-{uuid.uuid4().hex[:12]}", partitions=PARTITIONS)
    await bus.open()
    try:
        yield bus
    finally:
        with contextlib.suppress(Exception):
            for stream in (bus.tasks_stream, bus.events_stream, bus.dead_stream):
                await bus.js.delete_stream(stream)
        await bus.close()


async def test_nats_streams_keep_nothing_acknowledged(nats_bus: NatsBus) -> None:
    await drain(nats_bus, EVENTS, TASKS)
    for stream in (nats_bus.events_stream, nats_bus.tasks_stream):
        state = (await nats_bus.js.stream_info(stream)).state
        for _ in range(int(WITHIN * 100)):  # an ack reaches the stream a moment later
            if state.messages == 0:
                break
            await asyncio.sleep(0.01)
            state = (await nats_bus.js.stream_info(stream)).state
        assert (state.messages, state.bytes) == (0, 0), stream
