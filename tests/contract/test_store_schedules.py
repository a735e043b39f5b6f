"""The Store port's schedule rows, on every backend (memory, sqlite, postgres)."""

from __future__ import annotations

import dataclasses
import math

import pytest

from tideflow.errors import StateFormatError
from tideflow.model.schedules import Catchup, Overlap, ScheduleOrigin, ScheduleRow, ScheduleSpec
from tideflow.store.base import Store

from .conftest import Backend
from .scenarios import UNDO_SCHEMA_7, UNDO_SCHEMA_8, Driver, short_plan

SPEC = ScheduleSpec(
    id="morning",
    cron="0 6 * * 1-5",
    timezone="Europe/Paris",
    overlap=Overlap.BUFFER_ONE,
    catchup=Catchup.ALL,
    jitter=5.0,
    start_at=1_700_000_000.0,
    input={"full": True, "n": [1, 2]},
)


def row(workflow: str = "report", schedule_id: str = "morning", **fields: object) -> ScheduleRow:
    values: dict[str, object] = {
        "version": "1",
        "origin": ScheduleOrigin.DEFINITION,
        "spec": dataclasses.replace(SPEC, id=schedule_id),
        "next_slot": 2_000.0,
        "fire_at": 2_003.5,
    }
    values.update(fields)
    return ScheduleRow(workflow=workflow, schedule_id=schedule_id, **values)  # type: ignore[arg-type]


def same(a: ScheduleRow, b: ScheduleRow) -> bool:
    return dataclasses.replace(a, updated_at=0.0) == dataclasses.replace(b, updated_at=0.0)


async def test_an_inserted_row_reads_back_as_written(store: Store) -> None:
    written = row(last_slot=1_000.0, last_run_id="r1", buffered_slot=1_500.0, paused=True)
    assert await store.insert_schedule(written)
    [read] = await store.list_schedules()
    assert same(read, written) and read.revision == 0 and read.updated_at > 0
    assert read.spec == SPEC


async def test_a_second_insert_of_the_same_schedule_changes_nothing(store: Store) -> None:
    assert await store.insert_schedule(row())
    assert not await store.insert_schedule(row(version="2", next_slot=1.0))
    [read] = await store.list_schedules()
    assert read.version == "1" and read.next_slot == 2_000.0


async def test_list_is_by_workflow_then_id_and_filters_by_workflow(store: Store) -> None:
    for workflow, sid in [("b", "x"), ("a", "z"), ("a", "y")]:
        await store.insert_schedule(row(workflow, sid))
    assert [r.key for r in await store.list_schedules()] == [("a", "y"), ("a", "z"), ("b", "x")]
    assert [r.key for r in await store.list_schedules("a")] == [("a", "y"), ("a", "z")]
    assert await store.list_schedules("nope") == []


async def test_an_update_wins_only_at_the_revision_it_read(store: Store) -> None:
    await store.insert_schedule(row())
    [read] = await store.list_schedules()
    advanced = dataclasses.replace(read, next_slot=3_000.0, fire_at=3_000.0, last_slot=2_000.0)
    assert await store.update_schedule(advanced)
    assert not await store.update_schedule(dataclasses.replace(read, next_slot=9.0))  # stale
    [now] = await store.list_schedules()
    assert now.revision == 1 and now.next_slot == 3_000.0 and now.last_slot == 2_000.0
    assert not await store.update_schedule(row("other"))  # no such row


async def test_due_schedules_are_live_rows_in_the_window_soonest_first(store: Store) -> None:
    await store.insert_schedule(row("a", "late", fire_at=30.0))
    await store.insert_schedule(row("a", "soon", fire_at=10.0))
    await store.insert_schedule(row("a", "paused", fire_at=5.0, paused=True))
    await store.insert_schedule(row("a", "deleted", fire_at=5.0, deleted=True))
    await store.insert_schedule(row("a", "ended", fire_at=None, next_slot=None))
    assert [r.schedule_id for r in await store.due_schedules(30.0)] == ["soon", "late"]
    assert [r.schedule_id for r in await store.due_schedules(29.0)] == ["soon"]
    assert [r.schedule_id for r in await store.due_schedules(math.inf, 1, after=10.0)] == ["late"]
    assert [r.schedule_id for r in await store.due_schedules(math.inf, 1)] == ["soon"]


async def test_remove_drops_the_row(store: Store) -> None:
    await store.insert_schedule(row())
    assert await store.remove_schedule("report", "morning")
    assert not await store.remove_schedule("report", "morning")
    assert await store.list_schedules() == []


async def test_a_spec_this_tideflow_cannot_read_is_named(sql_backend: Backend) -> None:
    store = await sql_backend.open()
    await store.insert_schedule(row())
    await sql_backend.raw("""UPDATE schedules SET spec = '{"id": "morning", "overlap": "x"}'""")
    with pytest.raises(StateFormatError, match=r"schedule report/morning.*'x'"):
        await store.list_schedules()
    await store.insert_schedule(row("other"))
    # the timers skip it (logged) rather than hold up every other schedule
    assert [r.workflow for r in await store.due_schedules(math.inf)] == ["other"]


async def test_a_store_at_schema_6_upgrades_to_hold_schedules(sql_backend: Backend) -> None:
    """Migration 7 on a store an older tideflow wrote: its runs are kept, schedules work."""
    store = await sql_backend.open()
    driver = Driver(store)
    h = await driver.new_run(short_plan(), "kept")
    await driver.play([lambda: h.start()])
    await store.close()
    upgraded = await sql_backend.upgraded_from(
        6, (*UNDO_SCHEMA_8[sql_backend.name], *UNDO_SCHEMA_7)
    )
    assert (await upgraded.load_run("kept")).last_seq == 2
    assert await upgraded.insert_schedule(row())
    assert [r.key for r in await upgraded.due_schedules(math.inf)] == [("report", "morning")]
