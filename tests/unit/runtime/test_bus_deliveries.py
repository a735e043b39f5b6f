"""The engine and the workers on Bus port v2: deliveries, leases, acknowledgements.

Each test runs a real Runtime on the in-process bus, sometimes wrapped so that a
delivery is settled the way a crash or a slow worker would leave it.
"""

from __future__ import annotations

import asyncio
import contextlib
import textwrap
from collections.abc import AsyncGenerator, Collection, Iterator
from typing import Any

import pytest

from tideflow.bus.backends import local
from tideflow.bus.backends.local import LocalBus
from tideflow.bus.base import Delivery, EventBatch, Headers
from tideflow.dsl import compile_definition
from tideflow.model.commands import DispatchTask
from tideflow.runtime.runtime import Runtime
from tideflow.store.backends.memory import MemoryStore
from tideflow.store.base import StoreUnavailable
from tideflow.testing.waiting import step_is, wait_until
from tideflow.worker.executors.functions import register, unregister

CALLS: list[str] = []
GATE: dict[str, asyncio.Event] = {}
CALLED: dict[int, asyncio.Event] = {}
"""n -> set once bd.slow has been called n times."""


@pytest.fixture(autouse=True)
def functions() -> Iterator[None]:
    CALLS.clear()
    GATE.clear()
    CALLED.clear()

    @register("bd.step")
    def step(name: str) -> str:
        CALLS.append(name)
        return name

    @register("bd.slow")
    async def slow(name: str) -> str:
        CALLS.append(name)
        CALLED.setdefault(len(CALLS), asyncio.Event()).set()
        await GATE.setdefault(name, asyncio.Event()).wait()
        return name

    yield
    unregister("bd.step")
    unregister("bd.slow")


CHAIN = compile_definition(
    textwrap.dedent(
        """
        name: chain
        version: "1"
        steps:
          - {id: a, type: python, function: bd.step, input: {name: a}}
          - {id: b, type: python, function: bd.step, input: {name: b}, depends_on: [a]}
          - {id: pause, type: sleep, duration: 0s, depends_on: [b]}
          - {id: c, type: python, function: bd.step, input: {name: c}, depends_on: [pause]}
        output: "{{ steps.c.output }}"
        """
    )
)

SLOW = compile_definition(
    textwrap.dedent(
        """
        name: slow
        version: "1"
        steps:
          - {id: s, type: python, function: bd.slow, input: {name: s}}
        output: "{{ steps.s.output }}"
        """
    )
)


class CrashBeforeAck(LocalBus):
    """Every event batch is handed back once after the engine committed it, as if the
    engine died between its commit and its acknowledgement."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[str] = set()
        self.redelivered = 0

    async def consume_events(
        self, partitions: Collection[int] | None = None, *, max_batch: int
    ) -> AsyncGenerator[EventBatch, None]:
        async with contextlib.aclosing(super().consume_events(max_batch=max_batch)) as inner:
            async for batch in inner:
                yield _HandBackOnce(batch, self)


class _HandBackOnce(EventBatch):
    def __init__(self, inner: EventBatch, bus: CrashBeforeAck) -> None:
        self.events = inner.events
        self._inner = inner
        self._bus = bus

    def headers(self, index: int) -> Headers:
        return self._inner.headers(index)

    async def ack(self) -> None:
        ids = {e.event_id for e in self.events}
        if ids <= self._bus.seen:
            await self._inner.ack()
            return
        self._bus.seen |= ids
        self._bus.redelivered += len(ids)
        await self._inner.nack()

    async def nack(self, delay: float = 0.0, runs: Collection[str] | None = None) -> None:
        await self._inner.nack(delay, runs)

    async def extend(self) -> None:
        await self._inner.extend()


async def test_a_batch_delivered_again_after_its_commit_is_not_applied_twice() -> None:
    # A start goes out alone or inside its outcome (whichever comes first, see
    # worker/starts.py), so the histories are compared without the starts.
    async with Runtime() as plain:
        expected = await plain.run(CHAIN)
        expected_history = outcomes(await plain.history(expected.run_id))
    CALLS.clear()
    bus = CrashBeforeAck()
    async with Runtime(bus=bus) as rt:
        result = await rt.run(CHAIN)
        entries = await rt.history(result.run_id)
    assert bus.redelivered >= len(entries)  # every event came twice
    assert (result.status, result.output) == ("succeeded", "c")
    assert outcomes(entries) == expected_history
    ids = [entry.event["event_id"] for entry in entries]
    assert len(ids) == len(set(ids)), "an event was applied twice"
    assert CALLS == ["a", "b", "c"]


def outcomes(history: list[Any]) -> list[str]:
    return [entry.kind for entry in history if entry.kind != "task_started"]


class Journal:
    def __init__(self) -> None:
        self.entries: list[str] = []


class JournalStore(MemoryStore):
    def __init__(self, journal: Journal, fail_once: bool = False) -> None:
        super().__init__()
        self.journal = journal
        self.fail_once = fail_once

    async def commit(self, batch: Any, relayed: Any = ()) -> None:
        if batch and self.fail_once:
            self.fail_once = False
            self.journal.entries.append("commit failed")
            raise StoreUnavailable("the disk is busy")
        await super().commit(batch, relayed)
        if batch:
            self.journal.entries.append("commit")


class JournalBus(LocalBus):
    def __init__(self, journal: Journal) -> None:
        super().__init__()
        self.journal = journal

    async def consume_events(
        self, partitions: Collection[int] | None = None, *, max_batch: int
    ) -> AsyncGenerator[EventBatch, None]:
        async with contextlib.aclosing(super().consume_events(max_batch=max_batch)) as inner:
            async for batch in inner:
                yield _Journaled(batch, self.journal)


class _Journaled(EventBatch):
    def __init__(self, inner: EventBatch, journal: Journal) -> None:
        self.events = inner.events
        self._inner = inner
        self._journal = journal

    def headers(self, index: int) -> Headers:
        return self._inner.headers(index)

    async def ack(self) -> None:
        self._journal.entries.append("ack")
        await self._inner.ack()

    async def nack(self, delay: float = 0.0, runs: Collection[str] | None = None) -> None:
        self._journal.entries.append("nack")
        await self._inner.nack(delay, runs)

    async def extend(self) -> None:
        await self._inner.extend()


@pytest.mark.parametrize("fail_once", [False, True])
async def test_an_event_batch_is_acknowledged_only_after_its_commit(fail_once: bool) -> None:
    journal = Journal()
    store = JournalStore(journal, fail_once=fail_once)
    async with Runtime(store=store, bus=JournalBus(journal)) as rt:
        result = await rt.wait(await rt.start_run(CHAIN), timeout=10)
    assert result.status == "succeeded"
    entries = journal.entries
    if fail_once:  # the store was down: the batch went back to the bus, then came again
        # (the events of that run were handed back; acknowledging the rest is a no-op)
        assert entries[:5] == ["commit failed", "nack", "ack", "commit", "ack"]
        entries = entries[3:]
    pairs = [entries[i : i + 2] for i in range(0, len(entries), 2)]
    assert pairs and all(pair == ["commit", "ack"] for pair in pairs), entries


class CountingExtends(LocalBus):
    """Counts the lease extensions of task deliveries (a worker's heartbeat)."""

    def __init__(self, lease: float) -> None:
        super().__init__(lease=lease)
        self.extends = 0
        self.extended = asyncio.Event()
        self.deliveries: list[int] = []

    async def consume_tasks(
        self, queues: Collection[str] | None = None, *, prefetch: int, worker: str | None = None
    ) -> AsyncGenerator[Delivery[DispatchTask], None]:
        inner = super().consume_tasks(queues, prefetch=prefetch, worker=worker)
        async with contextlib.aclosing(inner) as deliveries:
            async for delivery in deliveries:
                self.deliveries.append(delivery.deliveries)
                yield _Counted(delivery, self)


class _Counted(Delivery[DispatchTask]):
    __slots__ = ("_bus", "_inner", "body", "deliveries", "headers")

    def __init__(self, inner: Delivery[DispatchTask], bus: CountingExtends) -> None:
        self.body, self.headers, self.deliveries = inner.body, inner.headers, inner.deliveries
        self._inner = inner
        self._bus = bus

    async def ack(self) -> None:
        await self._inner.ack()

    async def nack(self, delay: float = 0.0) -> None:
        await self._inner.nack(delay)

    async def extend(self) -> None:
        await self._inner.extend()
        self._bus.extends += 1
        if self._bus.extends >= 5:
            self._bus.extended.set()


async def test_a_running_task_keeps_its_lease_by_heartbeat() -> None:
    bus = CountingExtends(lease=0.3)
    async with Runtime(bus=bus) as rt:
        run_id = await rt.start_run(SLOW)
        await wait_until(rt, run_id, step_is("s", "running"))
        await asyncio.wait_for(bus.extended.wait(), 10)  # 5 extensions: past its lease
        assert CALLS == ["s"]  # it was never delivered to another worker
        GATE["s"].set()
        result = await rt.wait(run_id, timeout=10)
    assert result.status == "succeeded"
    assert bus.deliveries == [1]


async def test_a_task_running_at_shutdown_goes_back_to_the_bus() -> None:
    store, bus = MemoryStore(), LocalBus()
    async with Runtime(store=store, bus=bus) as first:
        run_id = await first.start_run(SLOW)
        await wait_until(first, run_id, step_is("s", "running"))
        # dispatched is not yet called: the function must be running as the runtime stops
        await asyncio.wait_for(CALLED.setdefault(1, asyncio.Event()).wait(), 10)
    waiting = bus.lanes_of("default")[1]
    assert [task.body.step_key for task in waiting] == ["s"]  # handed back, not acked
    async with Runtime(store=store, bus=bus, recover=False) as second:
        GATE["s"].set()
        result = await second.wait(run_id, timeout=10)
    assert result.status == "succeeded"
    assert CALLS == ["s", "s"]


class FailsOutcomeOnce(LocalBus):
    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.failed = False

    async def publish_events(self, events: Any) -> None:
        if not self.failed and any(type(e).__name__ == "TaskCompleted" for e in events):
            self.failed = True
            raise ConnectionError("the broker went away")
        await super().publish_events(events)


async def test_a_task_whose_outcome_was_not_published_comes_again() -> None:
    bus = FailsOutcomeOnce()
    async with Runtime(bus=bus) as rt:
        result = await rt.wait(await rt.start_run(CHAIN), timeout=10)
    assert bus.failed
    assert result.status == "succeeded"
    assert CALLS == ["a", "a", "b", "c"]  # the task was not acknowledged: it ran again


class BrokerGoneAtTheEnd(FailsOutcomeOnce):
    """The outcome's publish fails, and so does handing its task back (the broker is
    gone for both): the task comes again only when its lease runs out."""

    def __init__(self) -> None:
        super().__init__(lease=0.3)
        self.nacks_refused = 0


async def test_a_task_whose_outcome_and_hand_back_both_failed_comes_again_after_its_lease(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    bus = BrokerGoneAtTheEnd()
    nack = local._TaskDelivery.nack

    async def refused(self: Any, delay: float = 0.0) -> None:
        if bus.nacks_refused == 0:
            bus.nacks_refused += 1
            raise ConnectionError("the broker went away")
        await nack(self, delay)

    monkeypatch.setattr(local._TaskDelivery, "nack", refused)
    loop = asyncio.get_running_loop()
    unhandled: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _, context: unhandled.append(context))
    async with Runtime(bus=bus) as rt:
        result = await rt.wait(await rt.start_run(CHAIN), timeout=10)
    assert (bus.failed, bus.nacks_refused) == (True, 1)
    assert result.status == "succeeded"
    assert CALLS == ["a", "a", "b", "c"]  # delivered again once its lease ran out
    assert unhandled == []  # no attempt's task died with the error
    assert "could not be handed back either" in caplog.text


async def test_the_workers_hold_at_most_their_concurrency_in_tasks() -> None:
    fan = compile_definition(
        {
            "name": "fan",
            "version": "1",
            "steps": [
                {"id": f"s{n}", "type": "python", "function": "bd.slow", "input": {"name": f"s{n}"}}
                for n in range(5)
            ],
        }
    )
    bus = LocalBus()
    async with Runtime(bus=bus, workers=2) as rt:
        run_id = await rt.start_run(fan)
        await asyncio.wait_for(CALLED.setdefault(2, asyncio.Event()).wait(), 10)
        await rt.state(run_id)  # one more turn of the loop: nothing else is taken
        assert len(CALLS) == 2
        assert len(bus.lanes_of("default")[1]) == 3  # the others wait on the bus, unheld
        for n in range(5):
            GATE.setdefault(f"s{n}", asyncio.Event()).set()
        result = await rt.wait(run_id, timeout=10)
    assert result.status == "succeeded"
    assert sorted(CALLS) == [f"s{n}" for n in range(5)]


async def test_a_runtime_takes_a_bus_url() -> None:
    async with Runtime(bus="memory://?partitions=4&lease=5") as rt:
        assert isinstance(rt.bus, LocalBus)
        assert (rt.bus.partitions, rt.bus.lease) == (4, 5.0)
        result = await rt.run(CHAIN)
    assert result.status == "succeeded"


class StreamFails(LocalBus):
    """The engine's event stream fails ``times`` times (a broker that went away, or
    partitions another engine still holds), mid-stream after the first batch."""

    def __init__(self, times: int) -> None:
        super().__init__()
        self.times = times
        self.opened = 0

    async def consume_events(
        self, partitions: Collection[int] | None = None, *, max_batch: int
    ) -> AsyncGenerator[EventBatch, None]:
        self.opened += 1
        if self.opened <= self.times:
            from tideflow.errors import BusError

            raise BusError("the broker went away")
        async with contextlib.aclosing(super().consume_events(max_batch=max_batch)) as inner:
            async for batch in inner:
                yield batch


@pytest.mark.parametrize("times", [1, 3])
async def test_an_event_stream_that_fails_is_opened_again(
    times: int, caplog: pytest.LogCaptureFixture
) -> None:
    bus = StreamFails(times)
    async with Runtime(bus=bus) as rt:
        result = await asyncio.wait_for(rt.run(CHAIN), 10)
    assert (result.status, result.output) == ("succeeded", "c")
    assert bus.opened == times + 1
    assert caplog.text.count("the scheduler's event stream failed (BusError") == times
