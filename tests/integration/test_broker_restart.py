"""The Redis and NATS buses across a restart of their broker: a private ``redis-server``
(fsynced append-only file) or ``nats-server`` (JetStream file storage) of the test's own,
SIGKILLed and started again in place. A consumer that was blocked on the broker when it
went away gets what is published after it came back, and what it held unsettled comes
again once its lease runs out; nothing acknowledged by the broker is lost."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import signal
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from tideflow.bus import open_bus
from tideflow.bus.base import Bus, Delivery, RunEnded
from tideflow.errors import BusError
from tideflow.model.commands import DispatchTask
from tideflow.testing.brokers import PrivateBroker

WITHIN = 15.0
LEASE = 1.0

pytestmark = [pytest.mark.timeout(90)]


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


@pytest.fixture(params=["redis", "nats"])
def broker(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[PrivateBroker]:
    kind = str(request.param)
    request.getfixturevalue("broker_binary")(kind)
    with PrivateBroker(kind, tmp_path / "broker") as running:
        yield running


@pytest.fixture
async def make_bus(broker: PrivateBroker) -> AsyncIterator[Callable[[], Awaitable[Bus]]]:
    prefix = f"rs-{uuid.uuid4().hex[:10]}"
    opened: list[Bus] = []

    async def make() -> Bus:
        bus = open_bus(f"{broker.url}?prefix={prefix}&lease={LEASE:g}&partitions=4")
        await bus.open()
        opened.append(bus)
        return bus

    yield make
    for bus in opened:
        with contextlib.suppress(Exception):
            await bus.close()


async def restart(broker: PrivateBroker) -> None:
    """SIGKILL the broker, keep it down past a lease, start it again in place."""
    await asyncio.to_thread(broker.restart, signal.SIGKILL, LEASE * 1.5)


async def publish_until_accepted(publish: Callable[[], Awaitable[None]]) -> None:
    """The producer raises ``BusError`` while the broker is away: try until it takes it."""
    async with asyncio.timeout(WITHIN):
        while True:
            try:
                await publish()
                return
            except BusError:
                await asyncio.sleep(0.1)


class Taker:
    """Takes task deliveries in the background, holding them unsettled."""

    def __init__(self, bus: Bus) -> None:
        self.got: asyncio.Queue[Delivery[DispatchTask]] = asyncio.Queue()
        self._stream = bus.consume_tasks(["default"], prefetch=4)
        self._task = asyncio.create_task(self._take())

    async def _take(self) -> None:
        async for delivery in self._stream:
            await self.got.put(delivery)

    async def next(self) -> Delivery[DispatchTask]:
        async with asyncio.timeout(WITHIN):
            return await self.got.get()

    async def close(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._task
        with contextlib.suppress(Exception):
            await self._stream.aclose()


async def test_a_blocked_task_consumer_gets_what_is_published_after_a_restart(
    broker: PrivateBroker, make_bus: Callable[[], Awaitable[Bus]]
) -> None:
    producer, consumer = await make_bus(), await make_bus()
    taker = Taker(consumer)
    try:
        await producer.publish_tasks([task(1)])
        first = await taker.next()
        await first.ack()
        await asyncio.sleep(0.2)  # the taker is blocked on the broker again
        await restart(broker)
        await publish_until_accepted(lambda: producer.publish_tasks([task(2)]))
        second = await taker.next()
        assert second.body.run_id == "run-2"
        await second.ack()
    finally:
        await taker.close()


async def test_a_task_held_across_a_restart_comes_again_when_its_lease_runs_out(
    broker: PrivateBroker, make_bus: Callable[[], Awaitable[Bus]]
) -> None:
    producer, consumer = await make_bus(), await make_bus()
    taker = Taker(consumer)
    try:
        await producer.publish_tasks([task(1)])
        held = await taker.next()  # never settled: its worker "cannot report"
        assert held.deliveries == 1
        await restart(broker)
        again = await taker.next()
        assert again.body.run_id == "run-1" and again.deliveries >= 2
        await again.ack()
    finally:
        await taker.close()


async def test_a_run_end_stream_hears_ends_again_after_a_restart(
    broker: PrivateBroker, make_bus: Callable[[], Awaitable[Bus]]
) -> None:
    engine, client = await make_bus(), await make_bus()
    ends = await client.run_ends()
    try:
        await engine.publish_run_ends([RunEnded("before", "succeeded")])
        async with asyncio.timeout(WITHIN):
            assert await anext(ends) == RunEnded("before", "succeeded")
        await restart(broker)
        # at most once: what goes out before the subscription is made again is lost, so
        # publish until one is heard (the stream's subscription must come back by itself)
        async with asyncio.timeout(WITHIN):
            heard = None
            for n in itertools.count():
                with contextlib.suppress(BusError):
                    await engine.publish_run_ends([RunEnded(f"after-{n}", "failed")])
                with contextlib.suppress(TimeoutError):
                    heard = await asyncio.wait_for(anext(ends), 0.2)
                    break
        assert heard is not None and heard.run_id.startswith("after-")
    finally:
        await ends.aclose()
