"""Outcomes ready together go out in one publish; a failed publish fails each of them;
a sender that stops waiting leaves the others alone."""

from __future__ import annotations

import asyncio
import textwrap
from collections.abc import Sequence

import pytest

from tideflow.bus.backends.local import LocalBus
from tideflow.dsl import compile_definition
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


class CountingBus(LocalBus):
    def __init__(self) -> None:
        super().__init__()
        self.outcome_publishes: list[int] = []

    async def publish_events(self, events: Sequence[Event]) -> None:  # type: ignore[override]
        outcomes = sum(isinstance(e, TaskCompleted) for e in events)
        if outcomes:
            self.outcome_publishes.append(outcomes)
        await super().publish_events(events)


async def test_outcomes_of_attempts_that_end_together_go_out_in_one_publish() -> None:
    bus = CountingBus()
    async with Runtime(bus=bus) as rt:
        result = await asyncio.wait_for(rt.run(FAN), 10)
    assert result.status == "succeeded"
    assert sum(bus.outcome_publishes) == 20
    assert len(bus.outcome_publishes) < 20, bus.outcome_publishes


async def test_a_failed_publish_fails_every_outcome_of_its_batch() -> None:
    calls: list[int] = []

    async def publish(events: Sequence[Event]) -> None:
        calls.append(len(events))
        raise ConnectionError("the broker went away")

    outcomes = Outcomes(publish)
    results = await asyncio.gather(
        outcomes.send(EVENT), outcomes.send(EVENT), return_exceptions=True
    )
    assert calls == [2]
    assert all(isinstance(r, ConnectionError) for r in results)


async def test_a_sender_that_stops_waiting_leaves_the_batch_alone() -> None:
    published: list[int] = []

    async def publish(events: Sequence[Event]) -> None:
        await asyncio.sleep(0)
        published.append(len(events))

    outcomes = Outcomes(publish)
    first, second = outcomes.send(EVENT), outcomes.send(EVENT)
    first.cancel()
    await second
    with pytest.raises(asyncio.CancelledError):
        await first
    assert published == [2]
