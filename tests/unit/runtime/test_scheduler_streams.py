"""The scheduler's read of an event stream whose partitions change: a stop that comes
while the stream is still handing back what it held waits for that, then stops.

Seen in CI (the NATS partition test): a server took more partitions, so the scheduler
cancelled its read and waited for the stream's cleanup; SIGTERM's stop cancelled that wait,
the stream was closed while its read still ran, and ``aclose`` raised RuntimeError in the
stop's place. The scheduler then consumed again instead of stopping (its partition still
held: "consumed by another consumer already", over and over) and the server never exited.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest

from tideflow.bus.closing import unstoppable
from tideflow.runtime import scheduler


async def test_a_stop_during_a_streams_cleanup_waits_for_it_and_stops() -> None:
    reading, cleaning, cleaned = asyncio.Event(), asyncio.Event(), asyncio.Event()
    loop = asyncio.get_running_loop()

    async def stream() -> AsyncIterator[object]:
        try:
            while True:
                reading.set()
                await asyncio.sleep(3600)  # nothing comes
                yield object()
        finally:  # the bus hands back what the stream held: it takes a while
            cleaning.set()
            await unstoppable(slow_cleanup)

    async def slow_cleanup() -> None:
        await asyncio.sleep(1.2)  # past two of the scheduler's cancels again
        cleaned.set()

    changed: asyncio.Future[None] = loop.create_future()

    async def consume() -> object:
        async with contextlib.aclosing(stream()) as deliveries:
            return await scheduler._next_unless(deliveries, changed)  # type: ignore[arg-type]

    task = asyncio.create_task(consume())
    await reading.wait()
    changed.set_result(None)  # the partitions changed: the read is cancelled
    await cleaning.wait()
    task.cancel()  # the scheduler stops meanwhile (and cancels the read again, twice)
    with pytest.raises(asyncio.CancelledError):
        await task  # not RuntimeError: "aclose(): asynchronous generator is already running"
    assert cleaned.is_set()


async def test_a_partition_change_alone_returns_no_batch_once_the_read_is_over() -> None:
    cleaned = asyncio.Event()

    async def stream() -> AsyncIterator[object]:
        try:
            await asyncio.sleep(3600)
            yield object()
        finally:
            await asyncio.sleep(0.05)
            cleaned.set()

    changed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    changed.set_result(None)
    async with contextlib.aclosing(stream()) as deliveries:
        assert await scheduler._next_unless(deliveries, changed) is None  # type: ignore[arg-type]
        assert cleaned.is_set()
