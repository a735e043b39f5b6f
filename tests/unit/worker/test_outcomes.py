"""Attempts that end together are settled together where that pays (``batching_pays``):
their outcomes in one publish, then their tasks in one acknowledgement; in process each
alone. A failed publish fails each attempt of its batch and acknowledges none; a caller
that stops waiting leaves the others alone."""

from __future__ import annotations

import asyncio
import textwrap
from collections.abc import Sequence

import pytest

from tideflow.bus.backends.local import LocalBus
from tideflow.bus.base import Delivery, Message
from tideflow.dsl import compile_definition
from tideflow.model.commands import DispatchTask
from tideflow.model.events import Event, TaskCompleted
from tideflow.runtime.runtime import Runtime
from tideflow.worker.outcomes import Outcomes

FAN = compile_definition(
    textwrap.dedent(
        """
        name: fan
        version: "1"
        steps:
        """
    )
    + "".join(f"  - {{id: p{i}, type: noop}}\n" for i in range(20))
)
EVENT = TaskCompleted(event_id="e", run_id="r", time=0.0, step_key="a", attempt=1)
TASK = DispatchTask(
    run_id="r",
    step_key="a",
    step_id="a",
    type="noop",
    config={},
    input=None,
    attempt=1,
    idempotency_key="r:a",
    timeout=None,
)


class CountingBus(LocalBus):
    """The in-process bus, counting what each publish and acknowledgement carries."""

    def __init__(self, *, batching_pays: bool) -> None:
        super().__init__()
        self.batching_pays = batching_pays
        self.outcome_publishes: list[int] = []
        self.acks: list[int] = []
        self.failing = False

    async def publish_events(self, events: Sequence[Event | Message[Event]]) -> None:
        if self.failing:
            raise ConnectionError("the broker went away")
        outcomes = sum(isinstance(e, TaskCompleted) for e in events)
        if outcomes:
            self.outcome_publishes.append(outcomes)
        await super().publish_events(events)

    async def ack_tasks(self, deliveries: Sequence[Delivery[DispatchTask]]) -> None:
        self.acks.append(len(deliveries))
        await super().ack_tasks(deliveries)


class Held(Delivery[DispatchTask]):
    def __init__(self) -> None:
        self.body = TASK
        self.headers = {}
        self.deliveries = 1
        self.acked = 0

    async def ack(self) -> None:
        self.acked += 1

    async def nack(self, delay: float = 0.0) -> None:
        raise AssertionError("Outcomes never hands a task back: its caller does")

    async def extend(self) -> None:
        return None


async def test_attempts_that_end_together_are_settled_in_one_publish_and_one_ack() -> None:
    bus = CountingBus(batching_pays=True)
    async with Runtime(bus=bus) as rt:
        result = await asyncio.wait_for(rt.run(FAN), 10)
    assert result.status == "succeeded"
    assert sum(bus.outcome_publishes) == 20 and sum(bus.acks) == 20
    assert len(bus.outcome_publishes) < 20, bus.outcome_publishes
    assert len(bus.acks) < 20, bus.acks


async def test_in_process_each_attempt_is_settled_alone_at_once() -> None:
    bus = CountingBus(batching_pays=False)
    async with Runtime(bus=bus) as rt:
        result = await asyncio.wait_for(rt.run(FAN), 10)
    assert result.status == "succeeded"
    assert bus.outcome_publishes == [1] * 20 and bus.acks == [1] * 20


@pytest.mark.parametrize("batching_pays", [True, False])
async def test_a_failed_publish_fails_every_attempt_of_its_batch_and_acks_none(
    batching_pays: bool,
) -> None:
    bus = CountingBus(batching_pays=batching_pays)
    bus.failing = True
    outcomes = Outcomes(bus)
    held = [Held(), Held()]
    results = await asyncio.gather(
        *(outcomes.settle(EVENT, delivery) for delivery in held), return_exceptions=True
    )
    assert all(isinstance(r, ConnectionError) for r in results)
    assert [d.acked for d in held] == [0, 0] and bus.acks == []


async def test_an_attempt_with_nothing_to_report_is_acknowledged_with_the_others() -> None:
    bus = CountingBus(batching_pays=True)
    outcomes = Outcomes(bus)
    held = [Held(), Held()]
    await asyncio.gather(outcomes.settle(EVENT, held[0]), outcomes.settle(None, held[1]))
    assert bus.outcome_publishes == [1] and bus.acks == [2]
    assert [d.acked for d in held] == [1, 1]


async def test_a_caller_that_stops_waiting_leaves_the_batch_alone() -> None:
    bus = CountingBus(batching_pays=True)
    outcomes = Outcomes(bus)
    held = [Held(), Held()]
    first = asyncio.ensure_future(outcomes.settle(EVENT, held[0]))
    second = asyncio.ensure_future(outcomes.settle(EVENT, held[1]))
    await asyncio.sleep(0)  # both are in the batch
    first.cancel()
    await second
    with pytest.raises(asyncio.CancelledError):
        await first
    assert bus.outcome_publishes == [2] and [d.acked for d in held] == [1, 1]
