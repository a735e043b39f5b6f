"""Schedules when something fails: the store once, N times, for a while; a slot whose
input the workflow refuses; a definition gone. The schedule timers carry on, each
affected slot ends in a stated way, and the other schedules fire on time."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from tideflow import Runtime
from tideflow.model.schedules import ScheduleRow
from tideflow.store.backends.memory import MemoryStore
from tideflow.store.base import RunFilter
from tideflow.testing.clock import ManualClock

RETRY = 1.0
HOUR = 3600.0
MONDAY = 1_799_020_800.0
"""Monday 4 January 2027, 00:00 UTC."""


async def settle(rt: Runtime) -> None:
    assert rt.schedules is not None
    await rt.schedules.settled()


async def advance(rt: Runtime, clock: ManualClock, seconds: float, *, finish: bool = True) -> None:
    """An hour at a time, letting the schedules fire (and, with ``finish``, their runs end)."""
    end = clock.now() + seconds
    while clock.now() < end:
        clock.advance(min(HOUR, end - clock.now()))
        await settle(rt)
        for run_id in await rt.unfinished() if finish else ():
            await rt.wait(run_id, 10.0)


class FlakyStore(MemoryStore):
    """``due_schedules`` fails ``failures`` times (then works)."""

    def __init__(self) -> None:
        super().__init__()
        self.failures = 0
        self.calls = 0

    async def due_schedules(
        self, before: float, limit: int = 1000, *, after: float | None = None
    ) -> list[ScheduleRow]:
        self.calls += 1
        if self.failures > 0:
            self.failures -= 1
            raise ConnectionError("the store is down")
        return await super().due_schedules(before, limit, after=after)


def hourly(name: str = "report", **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "version": "1",
        "schedule": {"every": "1h", **extra},
        "steps": [{"id": "a", "type": "noop"}],
    }


async def scheduled(rt: Runtime, workflow: str = "report") -> list[str]:
    page = await rt.client.list(RunFilter(workflow=workflow), limit=1000)
    return sorted([(await rt.state(r.run_id)).input["scheduled_at"] for r in page.runs])


async def retry_rounds(rt: Runtime, clock: ManualClock, count: int) -> None:
    for _ in range(count):
        clock.advance(RETRY)
        await settle(rt)


@pytest.mark.parametrize("failures", [1, 5])
async def test_a_store_that_fails_n_times_delays_the_slot_and_loses_nothing(
    failures: int, caplog: pytest.LogCaptureFixture
) -> None:
    store = FlakyStore()
    clock = ManualClock(start=MONDAY)
    async with Runtime(store=store, clock=clock, schedules=True, sweep_interval=0) as rt:
        await rt.register(hourly(catchup="all", overlap="allow"))
        await settle(rt)
        store.failures = failures
        with caplog.at_level(logging.WARNING, "tideflow.schedules"):
            clock.advance(HOUR)  # the slot falls due while the store is down
            await settle(rt)
            assert await scheduled(rt) == []
            await retry_rounds(rt, clock, failures)
        assert await scheduled(rt) == ["2027-01-04T01:00:00Z"]
        assert caplog.text.count("ConnectionError: the store is down") == failures
        await advance(rt, clock, HOUR)  # and the next slot is on time
        assert await scheduled(rt) == ["2027-01-04T01:00:00Z", "2027-01-04T02:00:00Z"]


async def test_a_store_down_for_slots_catches_up_once_it_is_back() -> None:
    store = FlakyStore()
    clock = ManualClock(start=MONDAY)
    async with Runtime(store=store, clock=clock, schedules=True, sweep_interval=0) as rt:
        await rt.register(hourly(catchup="latest"))
        await settle(rt)
        store.failures = 1_000_000  # forever, as far as this part goes
        clock.advance(HOUR)
        await settle(rt)
        for _ in range(3):  # three hours of retries every second, compressed
            clock.advance(HOUR)
            await settle(rt)
        assert await scheduled(rt) == []
        store.failures = 0
        await retry_rounds(rt, clock, 1)
        assert await scheduled(rt) == ["2027-01-04T04:00:00Z"]  # catchup: latest


async def test_a_slot_whose_input_is_refused_starts_nothing_and_the_others_go_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    strict = {
        **hourly("strict"),
        "input": {"type": "object", "required": ["customer"]},
    }
    clock = ManualClock(start=MONDAY)
    async with Runtime(clock=clock, schedules=True, sweep_interval=0) as rt:
        await rt.register(strict)
        await rt.register(hourly("fine"))
        with caplog.at_level(logging.WARNING, "tideflow.schedules"):
            await advance(rt, clock, 2 * HOUR)
        assert await scheduled(rt, "strict") == []
        assert await scheduled(rt, "fine") == ["2027-01-04T01:00:00Z", "2027-01-04T02:00:00Z"]
        assert "schedule strict/default: the run of slot 2027-01-04T01:00:00Z cannot start" in (
            caplog.text
        )
        [row] = await rt.client.schedules("strict")
        assert row.next_slot == MONDAY + 3 * HOUR  # the refused slots are over


async def test_a_listener_error_elsewhere_does_not_stop_buffered_starts() -> None:
    """Run-end listeners are observers: one that raises leaves the schedules' alone."""
    clock = ManualClock(start=MONDAY)
    async with Runtime(clock=clock, schedules=True, sweep_interval=0) as rt:

        def broken(*_: object) -> None:
            raise RuntimeError("a broken observer")

        rt.add_listener(broken)
        definition = hourly(overlap="buffer_one")
        definition["steps"] = [{"id": "hold", "type": "wait", "signal": "go"}]
        await rt.register(definition)
        await advance(rt, clock, 3 * HOUR, finish=False)
        page = await rt.client.list(RunFilter(workflow="report"))
        [first] = [r.run_id for r in page.runs]
        await rt.signal(first, "go")
        await rt.wait(first)
        await settle(rt)
        assert len(await scheduled(rt)) == 2
