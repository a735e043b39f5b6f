"""The schedules' sweep is a repair: it fires only a row no wake-up fired (due for longer
than ``REPAIR_AFTER``), counts every slot it fired, logs it and reports it to the engine's
observers (``tideflow_sweep_repairs_total{kind="schedule_slot"}``); on a healthy runtime it
fires nothing."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from tideflow import Runtime
from tideflow.dsl.schedules import parse_schedule
from tideflow.model.schedules import ScheduleOrigin
from tideflow.observability.metrics import EngineMetrics
from tideflow.runtime import schedule_timers
from tideflow.runtime.schedules import fresh_row
from tideflow.store.base import RunFilter
from tideflow.testing.clock import ManualClock

HOUR = 3600.0
MONDAY = 1_799_020_800.0
"""Monday 4 January 2027, 00:00 UTC."""


def hourly(name: str, **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "version": "1",
        "schedule": {"every": "1h", "overlap": "allow", **extra},
        "steps": [{"id": "a", "type": "noop"}],
    }


async def slots(rt: Runtime, workflow: str) -> list[str]:
    page = await rt.client.list(RunFilter(workflow=workflow), limit=100)
    return sorted([(await rt.state(r.run_id)).input["scheduled_at"] for r in page.runs])


async def test_a_healthy_runtime_fires_every_slot_by_its_wake_up_and_the_sweep_repairs_none(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = ManualClock(start=MONDAY)
    async with Runtime(clock=clock, schedules=True, sweep_interval=60) as rt:
        assert rt.schedules is not None
        metrics = EngineMetrics().attach(rt)
        await rt.register(hourly("report"))
        with caplog.at_level(logging.INFO, "tideflow.schedules"):
            for _ in range(3 * 60):  # three hours, a minute (and a sweep round) at a time
                clock.advance(60)
                await rt.schedules.settled()
        assert await slots(rt, "report") == [
            "2027-01-04T01:00:00Z",
            "2027-01-04T02:00:00Z",
            "2027-01-04T03:00:00Z",
        ]
        assert rt.schedules.repaired == 0
        assert metrics.sweep_repairs.values[("schedule_slot",)] == 0
        assert "the sweep fired" not in caplog.text


async def test_a_row_no_wake_up_fired_is_fired_by_the_sweep_counted_and_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = ManualClock(start=MONDAY)
    async with Runtime(clock=clock, schedules=True, sweep_interval=2 * HOUR + 30) as rt:
        assert rt.schedules is not None
        metrics = EngineMetrics().attach(rt)
        plain = hourly("report")
        del plain["schedule"]
        await rt.register(plain)
        await rt.schedules.settled()
        # a schedule written straight into the store, as another process would: no
        # wake-up of this runtime knows of it (a lost notification)
        spec = parse_schedule(
            {"id": "nightly", "every": "1h", "overlap": "allow", "catchup": "all"}
        )
        assert await rt.store.insert_schedule(
            fresh_row("report", None, spec, MONDAY, ScheduleOrigin.CLIENT)
        )
        with caplog.at_level(logging.WARNING, "tideflow.schedules"):
            clock.advance(2 * HOUR)  # 01:00 and 02:00 pass: no wake-up fires them
            await rt.schedules.settled()
            assert await slots(rt, "report") == []
            clock.advance(30)  # the sweep
            await rt.schedules.settled()
        assert await slots(rt, "report") == ["2027-01-04T01:00:00Z", "2027-01-04T02:00:00Z"]
        assert rt.schedules.repaired == 2
        assert metrics.sweep_repairs.values[("schedule_slot",)] == 2
        assert metrics.sweep_repairs.values[("timer",)] == 0
        assert (
            "schedule report/nightly: the sweep fired 2 slot(s) due since 2027-01-04T01:00:00Z"
            in caplog.text
        )
        # and from then on its wake-up fires it: nothing more for the sweep to repair
        clock.advance(HOUR)
        await rt.schedules.settled()
        assert len(await slots(rt, "report")) == 3
        clock.advance(HOUR)  # 04:00 and the next sweep (04:01)
        await rt.schedules.settled()
        assert len(await slots(rt, "report")) == 4
        assert rt.schedules.repaired == 2


async def test_more_rows_due_at_once_than_a_round_reads_are_all_fired_by_that_wake_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(schedule_timers, "BATCH", 2)
    clock = ManualClock(start=MONDAY)
    async with Runtime(clock=clock, schedules=True, sweep_interval=0) as rt:
        assert rt.schedules is not None
        for name in ("one", "two", "three", "four", "five"):
            await rt.register(hourly(name))
        await rt.schedules.settled()
        clock.advance(HOUR)  # one wake-up: five rows due, read two at a time
        await rt.schedules.settled()
        for name in ("one", "two", "three", "four", "five"):
            assert await slots(rt, name) == ["2027-01-04T01:00:00Z"], name
        assert clock.pending() == [MONDAY + 2 * HOUR]
