"""Schedules on the injectable clock: slots, catch-up, overlap, pause and resume, DST.

Each test registers a definition with ``schedule:`` in a ``Runtime(schedules=True)`` on a
``ManualClock`` and moves time forward one step at a time, waiting after each step until
the schedule timers have settled (a condition, not a sleep).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from tideflow import Runtime
from tideflow.errors import NotFound
from tideflow.store.base import RunFilter
from tideflow.testing.clock import ManualClock
from tideflow.testing.waiting import step_is, wait_until

HOUR = 3600.0
DAY = 86400.0
MONDAY = datetime(2027, 1, 4, tzinfo=UTC).timestamp()
"""Monday 4 January 2027, 00:00 UTC (01:00 in Paris)."""


def definition(schedule: Any, *, version: str = "1", waits: bool = False) -> dict[str, Any]:
    step: dict[str, Any] = (
        {"id": "hold", "type": "wait", "signal": "go"}
        if waits
        else {
            "id": "work",
            "type": "noop",
        }
    )
    return {"name": "report", "version": version, "schedule": schedule, "steps": [step]}


@pytest.fixture
async def clock() -> ManualClock:
    return ManualClock(start=MONDAY - DAY)  # Sunday


def runtime(clock: ManualClock, store: Any = None) -> Runtime:
    return Runtime(clock=clock, schedules=True, store=store, sweep_interval=0)


@pytest.fixture
async def rt(clock: ManualClock) -> AsyncIterator[Runtime]:
    async with runtime(clock) as started:
        yield started


async def settle(rt: Runtime) -> None:
    assert rt.schedules is not None
    await rt.schedules.settled()


async def advance(
    rt: Runtime, clock: ManualClock, seconds: float, step: float = HOUR, *, finish: bool = True
) -> None:
    """Move time forward ``step`` at a time, letting the schedules fire after each step
    and (with ``finish``) the runs they started end."""
    end = clock.now() + seconds
    while clock.now() < end:
        clock.advance(min(step, end - clock.now()))
        await settle(rt)
        for run_id in await rt.unfinished() if finish else ():
            await rt.wait(run_id, 10.0)


async def scheduled(rt: Runtime) -> list[str]:
    """``inputs.scheduled_at`` of every run of the workflow, oldest first."""
    page = await rt.client.list(RunFilter(workflow="report"), limit=1000)
    states = [await rt.state(summary.run_id) for summary in page.runs]
    return sorted(state.input["scheduled_at"] for state in states)


async def run_ids(rt: Runtime) -> list[str]:
    page = await rt.client.list(RunFilter(workflow="report"), limit=1000)
    return [r.run_id for r in sorted(page.runs, key=lambda r: r.created_at)]


# -- slots ----------------------------------------------------------------------------


async def test_a_weekday_0600_cron_fires_ten_runs_over_two_weeks(
    rt: Runtime, clock: ManualClock
) -> None:
    await rt.register(definition({"cron": "0 6 * * 1-5", "timezone": "Europe/Paris"}))
    await advance(rt, clock, 14 * DAY)
    expected = [
        f"2027-01-{day:02d}T05:00:00Z" for day in (4, 5, 6, 7, 8, 11, 12, 13, 14, 15)
    ]  # 06:00 in Paris is 05:00 UTC in winter
    assert await scheduled(rt) == expected


async def test_the_schedule_input_reaches_the_run_beside_scheduled_at(
    rt: Runtime, clock: ManualClock
) -> None:
    await rt.register(definition({"every": "1h", "input": {"full": True}}))
    await advance(rt, clock, HOUR)
    [run_id] = await run_ids(rt)
    assert (await rt.state(run_id)).input == {"full": True, "scheduled_at": "2027-01-03T01:00:00Z"}
    assert (await rt.wait(run_id)).status == "succeeded"


async def test_next_fire_times_are_listed_and_armed_as_one_wake_up(
    rt: Runtime, clock: ManualClock
) -> None:
    await rt.register(
        definition(
            [
                {"id": "morning", "cron": "0 6 * * *", "timezone": "Europe/Paris"},
                {"id": "often", "every": "15m"},
            ]
        )
    )
    await settle(rt)
    rows = {row.schedule_id: row for row in await rt.client.schedules("report")}
    assert rows["often"].next_slot == MONDAY - DAY + 900
    assert rows["morning"].next_slot == MONDAY - DAY + 5 * HOUR
    assert MONDAY - DAY + 900 in clock.pending()  # the soonest row, armed on the clock


async def test_jitter_delays_the_start_but_not_scheduled_at(
    rt: Runtime, clock: ManualClock
) -> None:
    await rt.register(definition({"every": "1h", "jitter": "10m"}))
    await settle(rt)
    [row] = await rt.client.schedules("report")
    assert row.next_slot is not None and row.fire_at is not None
    assert row.next_slot < row.fire_at < row.next_slot + 600
    clock.advance(row.next_slot - clock.now())
    await settle(rt)
    assert await scheduled(rt) == []
    clock.advance(row.fire_at - clock.now())
    await settle(rt)
    assert await scheduled(rt) == ["2027-01-03T01:00:00Z"]


async def test_end_at_stops_the_schedule(rt: Runtime, clock: ManualClock) -> None:
    await rt.register(definition({"every": "1h", "end_at": "2027-01-03T03:00:00Z"}))
    await advance(rt, clock, 6 * HOUR)
    assert await scheduled(rt) == [f"2027-01-03T0{h}:00:00Z" for h in (1, 2, 3)]
    [row] = await rt.client.schedules("report")
    assert row.next_slot is None and row.fire_at is None


# -- catch-up after downtime ------------------------------------------------------------


@pytest.mark.parametrize(("catchup", "runs"), [("none", 0), ("latest", 1), ("all", 3)])
async def test_a_server_down_for_three_slots_catches_up_as_told(
    tmp_path: Path, clock: ManualClock, catchup: str, runs: int
) -> None:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    # overlap: allow, so that the caught-up runs do not skip each other (with the default
    # skip, catch-up starts one run and skips the slots after it while it is unfinished)
    spec = {"cron": "0 6 * * *", "timezone": "Europe/Paris", "catchup": catchup, "overlap": "allow"}
    async with runtime(clock, url) as rt:
        await rt.register(definition(spec))
        await advance(rt, clock, DAY)  # Sunday 06:00 Paris fires
        assert len(await scheduled(rt)) == 1
    clock.advance(3 * DAY)  # down: the slots of Monday, Tuesday, Wednesday pass
    async with runtime(clock, url) as rt:
        await settle(rt)
        after = await scheduled(rt)
        assert len(after) == 1 + runs
        missed = ["2027-01-04T05:00:00Z", "2027-01-05T05:00:00Z", "2027-01-06T05:00:00Z"]
        assert after[1:] == missed[3 - runs :]
        await advance(rt, clock, DAY)  # then on time again
        assert (await scheduled(rt))[-1] == "2027-01-07T05:00:00Z"
        assert len(await scheduled(rt)) == 2 + runs


# -- overlap ----------------------------------------------------------------------------


async def overlapping(rt: Runtime, clock: ManualClock, overlap: str) -> list[str]:
    """An hourly schedule whose first run waits for a signal over three slots."""
    await rt.register(definition({"every": "1h", "overlap": overlap}, waits=True))
    await advance(rt, clock, HOUR, finish=False)
    [first] = await run_ids(rt)
    await wait_until(rt, first, step_is("hold", "waiting"))
    await advance(rt, clock, 3 * HOUR, finish=False)  # three more slots while it waits
    return [first]


async def test_overlap_skip_starts_nothing_while_the_previous_run_is_unfinished(
    rt: Runtime, clock: ManualClock
) -> None:
    [first] = await overlapping(rt, clock, "skip")
    assert await run_ids(rt) == [first]
    await rt.signal(first, "go")
    await rt.wait(first)
    await settle(rt)
    assert await run_ids(rt) == [first]  # nothing was kept
    await advance(rt, clock, HOUR, finish=False)
    assert len(await run_ids(rt)) == 2


async def test_overlap_buffer_one_starts_one_run_when_the_previous_ends(
    rt: Runtime, clock: ManualClock
) -> None:
    [first] = await overlapping(rt, clock, "buffer_one")
    assert await run_ids(rt) == [first]
    await rt.signal(first, "go")
    await rt.wait(first)
    await settle(rt)
    ids = await run_ids(rt)
    assert len(ids) == 2  # one, not three
    assert (await rt.state(ids[1])).input["scheduled_at"] == "2027-01-03T02:00:00Z"


async def test_overlap_allow_starts_every_slot(rt: Runtime, clock: ManualClock) -> None:
    await overlapping(rt, clock, "allow")
    assert len(await run_ids(rt)) == 4


async def test_a_buffered_slot_survives_a_restart(tmp_path: Path, clock: ManualClock) -> None:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    async with runtime(clock, url) as rt:
        [first] = await overlapping(rt, clock, "buffer_one")
        [row] = await rt.client.schedules("report")
        assert row.buffered_slot is not None
    async with runtime(clock, url) as rt:
        await rt.signal(first, "go")
        await rt.wait(first)
        await settle(rt)
        assert len(await run_ids(rt)) == 2


# -- pause, resume, trigger, delete -----------------------------------------------------


async def test_a_paused_schedule_starts_nothing_and_resumes_from_its_next_slot(
    rt: Runtime, clock: ManualClock
) -> None:
    await rt.register(definition({"every": "1h", "catchup": "all"}))
    await advance(rt, clock, HOUR)
    assert await rt.client.pause_schedule("report", "default")
    assert not await rt.client.pause_schedule("report", "default")  # already
    await advance(rt, clock, 3 * HOUR)
    assert len(await scheduled(rt)) == 1
    assert await rt.client.resume_schedule("report", "default")
    await settle(rt)
    assert len(await scheduled(rt)) == 1  # the paused slots are not caught up
    await advance(rt, clock, HOUR)
    assert await scheduled(rt) == ["2027-01-03T01:00:00Z", "2027-01-03T05:00:00Z"]


async def test_trigger_starts_a_run_now_and_delete_stops_the_schedule(
    rt: Runtime, clock: ManualClock
) -> None:
    await rt.register(definition({"every": "1h"}))
    run_id = await rt.client.trigger_schedule("report", "default")
    assert (await rt.state(run_id)).input["scheduled_at"] == "2027-01-03T00:00:00Z"
    await rt.client.delete_schedule("report", "default")
    assert await rt.client.schedules() == []
    await advance(rt, clock, 3 * HOUR)
    assert await run_ids(rt) == [run_id]
    await rt.register(definition({"every": "1h"}))  # the same version: stays deleted
    assert await rt.client.schedules() == []
    await rt.register(definition({"every": "1h"}, version="2"))  # a new one brings it back
    assert [r.version for r in await rt.client.schedules()] == ["2"]
    with pytest.raises(NotFound, match="no schedule 'nope' of workflow 'report'"):
        await rt.client.pause_schedule("report", "nope")


async def test_schedules_follow_the_highest_active_version(rt: Runtime, clock: ManualClock) -> None:
    await rt.register(definition([{"id": "a", "every": "1h"}, {"id": "b", "every": "2h"}]))
    await rt.register(definition([{"id": "a", "every": "30m"}], version="2"))
    assert [(r.schedule_id, r.version, r.spec.every) for r in await rt.client.schedules()] == [
        ("a", "2", 1800.0)
    ]
    await rt.client.activate("report", "2", False)
    assert [(r.schedule_id, r.version) for r in await rt.client.schedules()] == [
        ("a", "1"),
        ("b", "1"),
    ]
    await rt.client.activate("report", "1", False)
    assert await rt.client.schedules() == []


# -- daylight saving time ---------------------------------------------------------------


async def test_a_0230_slot_on_the_spring_forward_night_fires_at_0300(
    clock: ManualClock,
) -> None:
    """Europe/Paris skips 02:00-03:00 on 28 March 2027: croniter fires the 02:30 slot at
    the first instant after the gap, 03:00 CEST (01:00 UTC); the days around are 02:30."""
    clock = ManualClock(start=datetime(2027, 3, 26, 12, tzinfo=UTC).timestamp())
    async with runtime(clock) as rt:
        await rt.register(definition({"cron": "30 2 * * *", "timezone": "Europe/Paris"}))
        await advance(rt, clock, 3 * DAY)
        assert await scheduled(rt) == [
            "2027-03-27T01:30:00Z",  # 02:30 CET
            "2027-03-28T01:00:00Z",  # 03:00 CEST: 02:30 does not exist that night
            "2027-03-29T00:30:00Z",  # 02:30 CEST
        ]


# -- made through the client -------------------------------------------------------------


async def test_a_schedule_made_through_the_client_fires_and_outlives_registrations(
    rt: Runtime, clock: ManualClock
) -> None:
    await rt.register({**definition({"id": "def", "every": "1d"})})
    row = await rt.client.create_schedule("report", {"id": "extra", "every": "1h"})
    assert (row.origin, row.version) == ("client", None)
    await advance(rt, clock, 2 * HOUR)
    assert await scheduled(rt) == ["2027-01-03T01:00:00Z", "2027-01-03T02:00:00Z"]
    await rt.register(definition({"id": "def", "every": "1d"}, version="2"))
    assert [(r.schedule_id, r.version) for r in await rt.client.schedules()] == [
        ("def", "2"),
        ("extra", None),
    ]
    await rt.client.delete_schedule("report", "extra")
    assert [r.schedule_id for r in await rt.client.schedules()] == ["def"]


async def test_a_schedule_the_client_cannot_make_changes_nothing(rt: Runtime) -> None:
    from tideflow.errors import DefinitionConflict, DefinitionError, InputValidationError

    strict = definition({"id": "def", "every": "1d"})
    strict["input"] = {"type": "object", "required": ["customer"]}
    strict["schedule"]["input"] = {"customer": "acme"}
    await rt.register(strict)
    with pytest.raises(DefinitionError, match="unknown time zone 'Mars/Olympus'"):
        await rt.client.create_schedule(
            "report", {"id": "x", "cron": "* * * * *", "timezone": "Mars/Olympus"}
        )
    with pytest.raises(DefinitionError, match="needs an id"):
        await rt.client.create_schedule("report", {"every": "1h"})
    with pytest.raises(InputValidationError):
        await rt.client.create_schedule("report", {"id": "x", "every": "1h"})
    with pytest.raises(DefinitionConflict, match="schedule 'def' already"):
        await rt.client.create_schedule(
            "report", {"id": "def", "every": "1h", "input": {"customer": "b"}}
        )
    with pytest.raises(NotFound):
        await rt.client.create_schedule("nope", {"id": "x", "every": "1h"})
    assert [r.schedule_id for r in await rt.client.schedules()] == ["def"]
