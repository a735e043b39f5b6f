"""The one wake-up mechanism (runtime/wakeup.py) that durable timers and schedule slots
share: no ask is lost, whenever it arrives on the event loop; rounds never overlap; the
wake-up is armed after every round, and after a failed one.

The racy point of issue 27 is injected deterministically: a wake-up that falls due just
after a round's last read of the store (``loop.call_soon`` from inside that read, with a
store that answers without suspending: the round ends in the same loop step, and the
wake-up runs in the next one, before the round's starter has resumed). The schedule
timers used to lose exactly that wake-up and never arm another.
"""

from __future__ import annotations

import asyncio
import logging
import math
from typing import Any

import pytest

from tideflow import Runtime
from tideflow.model.schedules import ScheduleRow
from tideflow.runtime.timers import TimerWheel
from tideflow.runtime.wakeup import Wakeup
from tideflow.store.backends.memory import MemoryStore
from tideflow.store.base import DueTimer, RunFilter
from tideflow.testing.clock import ManualClock

MONDAY = 1_799_020_800.0
"""Monday 4 January 2027, 00:00 UTC."""
log = logging.getLogger("tests.wakeup")


class Rounds:
    """A round that records when it ran and may run something at its last step."""

    def __init__(self, clock: ManualClock) -> None:
        self.clock = clock
        self.began: list[float] = []
        self.upcoming: float | None = None
        self.at_end: list[Any] = []
        self.fail = 0
        self.running = 0
        self.overlapped = False

    async def __call__(self) -> float | None:
        self.running += 1
        self.overlapped |= self.running > 1
        self.began.append(self.clock.now())
        await asyncio.sleep(0)  # a real store suspends in the middle of a round
        self.running -= 1
        if self.fail:
            self.fail -= 1
            raise ConnectionError("the store is down")
        for inject in self.at_end:
            asyncio.get_running_loop().call_soon(inject)
        self.at_end = []
        return self.upcoming


async def test_an_ask_that_lands_between_a_rounds_end_and_its_callers_resuming_runs_a_round() -> (
    None
):
    clock = ManualClock(start=MONDAY)
    rounds = Rounds(clock)
    wakeup = Wakeup(clock, rounds, what="test rounds failed", log=log)
    rounds.at_end.append(wakeup.ask)  # at the racy point
    await wakeup.run()
    await wakeup.idle()
    assert len(rounds.began) == 2 and not rounds.overlapped


async def test_asks_during_a_round_make_one_more_round_after_it_never_beside_it() -> None:
    clock = ManualClock(start=MONDAY)
    rounds = Rounds(clock)
    wakeup = Wakeup(clock, rounds, what="test rounds failed", log=log)
    waiting = [asyncio.ensure_future(wakeup.run()) for _ in range(5)]
    await asyncio.sleep(0)  # the callers have asked
    await asyncio.sleep(0)  # the first round has begun and suspended
    assert len(rounds.began) == 1
    wakeup.ask()
    wakeup.ask()
    await asyncio.gather(*waiting)
    await wakeup.idle()
    assert len(rounds.began) == 2 and not rounds.overlapped


async def test_the_wake_up_is_armed_for_what_the_round_returns_or_an_earlier_at() -> None:
    clock = ManualClock(start=MONDAY)
    rounds = Rounds(clock)
    rounds.upcoming = MONDAY + 60
    wakeup = Wakeup(clock, rounds, what="test rounds failed", log=log)
    rounds.at_end.append(lambda: None)
    run = asyncio.ensure_future(wakeup.run())
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert len(rounds.began) == 1
    wakeup.at(MONDAY + 10)  # a row committed after the round read the store
    await run
    assert clock.pending() == [MONDAY + 10]
    rounds.upcoming = None
    clock.advance(10)
    await wakeup.idle()
    assert rounds.began == [MONDAY, MONDAY + 10]
    assert clock.pending() == []  # nothing left to wake for


async def test_a_failed_round_raises_to_its_caller_and_is_tried_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = ManualClock(start=MONDAY)
    rounds = Rounds(clock)
    rounds.fail = 1
    wakeup = Wakeup(clock, rounds, what="test rounds failed", log=log, retry_after=1.0)
    with pytest.raises(ConnectionError), caplog.at_level(logging.WARNING, "tests.wakeup"):
        await wakeup.run()
    assert "test rounds failed (ConnectionError: the store is down); trying again in 1s" in (
        caplog.text
    )
    assert clock.pending() == [MONDAY + 1]
    clock.advance(1)
    await wakeup.idle()
    assert rounds.began == [MONDAY, MONDAY + 1]


# -- the schedule timers at the racy point ------------------------------------------------


class RacyStore(MemoryStore):
    """Runs ``inject`` (once) right after a round's last read: the soonest row to come."""

    def __init__(self) -> None:
        super().__init__()
        self.inject: Any = None

    async def due_schedules(
        self, before: float, limit: int = 1000, *, after: float | None = None
    ) -> list[ScheduleRow]:
        rows = await super().due_schedules(before, limit, after=after)
        if after is not None and self.inject is not None:
            asyncio.get_running_loop().call_soon(self.inject)
            self.inject = None
        return rows


def hourly(name: str, minute: int) -> dict[str, Any]:
    return {
        "name": name,
        "version": "1",
        "schedule": {"cron": f"{minute} * * * *"},
        "steps": [{"id": "a", "type": "noop"}],
    }


async def test_a_wake_up_due_as_a_schedule_round_ends_fires_its_slot_and_arms_the_next() -> None:
    store = RacyStore()
    clock = ManualClock(start=MONDAY + 120)  # 00:02
    async with Runtime(store=store, clock=clock, schedules=True, sweep_interval=0) as rt:
        assert rt.schedules is not None
        await rt.register(hourly("first", 0))
        await rt.register(hourly("second", 1))
        await rt.schedules.settled()
        assert clock.pending() == [MONDAY + 3600]  # 01:00
        # the round that fires 01:00 ends; the 01:01 wake-up falls due right then
        store.inject = lambda: clock.advance(60)
        clock.advance(3600 - 120)
        await rt.schedules.settled()
        for name, slot in (("first", "01:00"), ("second", "01:01")):
            page = await rt.client.list(RunFilter(workflow=name))
            [run] = page.runs
            assert (await rt.state(run.run_id)).input["scheduled_at"] == f"2027-01-04T{slot}:00Z"
        assert clock.pending() == [MONDAY + 2 * 3600]  # and 02:00 is armed


# -- the timer wheel on the same wake-up ------------------------------------------------


async def test_a_timer_armed_while_a_refill_reads_the_store_keeps_its_earlier_wake_up() -> None:
    """The wheel's refill read "the next stored timer" before a commit armed an earlier
    one beyond the horizon; the wake-up that ``arm`` set must survive the refill's end
    (the old wheel replaced it with the one it had read, and the timer fired late)."""
    clock = ManualClock(start=MONDAY)
    rows = [DueTimer(run_id="r1", timer_id="sleep", fire_at=MONDAY + 1000)]
    gate = asyncio.Event()
    fired: list[tuple[str, str]] = []

    async def due_timers(
        before: float, limit: int = 1000, *, after: float | None = None
    ) -> list[DueTimer]:
        low = -math.inf if after is None else after
        found = sorted((r for r in rows if low < r.fire_at <= before), key=lambda r: r.fire_at)
        if after is not None:
            await gate.wait()  # the read is done; the refill has not finished
        return found[:limit]

    def fire(run_id: str, timer_id: str) -> None:  # the TimerFired commit deletes the row
        fired.append((run_id, timer_id))
        rows[:] = [r for r in rows if (r.run_id, r.timer_id) != (run_id, timer_id)]

    wheel = TimerWheel(clock, fire, due_timers)
    refill = asyncio.ensure_future(wheel.refill())
    await asyncio.sleep(0)
    rows.append(DueTimer(run_id="r2", timer_id="sleep", fire_at=MONDAY + 500))  # committed
    wheel.arm("r2", "sleep", MONDAY + 500)  # then armed: beyond the horizon, a wake-up
    gate.set()
    await refill
    assert clock.pending() == [MONDAY + 500]
    clock.advance(500)
    await wheel.refill()  # (after the one the wake-up asked for)
    assert fired == [("r2", "sleep")]
    wheel.close()


class AheadClock(ManualClock):
    """A clock whose timers call back ``behind`` seconds before ``now()`` reaches their
    time, once: the event loop's clock running ahead of the wall clock."""

    def __init__(self, start: float) -> None:
        super().__init__(start)
        self.behind = 0.0

    def now(self) -> float:
        behind, self.behind = self.behind, 0.0
        return super().now() - behind


async def test_a_wake_up_that_calls_back_early_asks_for_no_round_before_its_time() -> None:
    clock = AheadClock(MONDAY)
    rounds = Rounds(clock)
    rounds.upcoming = MONDAY + 60
    wakeup = Wakeup(clock, rounds, what="test rounds failed", log=log)
    await wakeup.run()
    clock.behind = 0.0005
    clock.advance(60)
    await wakeup.idle()
    assert rounds.began == [MONDAY, MONDAY + 60]  # not MONDAY + 59.9995: a round for nothing
