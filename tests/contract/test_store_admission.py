"""The admission queue (``Store.pending_runs``, ``Store.count_pending``) on every store:
pending runs in the order an engine admits them (runtime/admission.py), and a run's
priority kept with it."""

from __future__ import annotations

from tideflow.model.plan import Priority
from tideflow.store.base import PendingRun, Store

from .conftest import Backend
from .scenarios import T0, Driver, short_plan


async def queued(store: Store, limit: int = 100, after: PendingRun | None = None) -> list[str]:
    return [run.run_id for run in await store.pending_runs(limit, after)]


async def test_pending_runs_come_by_priority_then_age_then_id(store: Store) -> None:
    driver = Driver(store)
    plan = short_plan()
    await driver.new_run(plan, "n-late", now=T0 + 2)
    await driver.new_run(plan, "low", now=T0, priority=Priority.LOW)
    await driver.new_run(plan, "n-b", now=T0 + 1)
    await driver.new_run(plan, "n-a", now=T0 + 1)  # same age: by run id
    await driver.new_run(plan, "high", now=T0 + 5, priority=Priority.HIGH)
    assert await queued(store) == ["high", "n-a", "n-b", "n-late", "low"]
    first = await store.pending_runs(2)
    assert [(r.run_id, r.priority, r.created_at) for r in first] == [
        ("high", Priority.HIGH, T0 + 5),
        ("n-a", Priority.NORMAL, T0 + 1),
    ]
    assert await queued(store, 2, first[-1]) == ["n-b", "n-late"]
    assert await queued(store, 10, (await store.pending_runs(5))[-1]) == []


async def test_a_run_leaves_the_queue_when_it_starts_or_is_cancelled(store: Store) -> None:
    driver = Driver(store)
    plan = short_plan()
    started = await driver.new_run(plan, "started", now=T0)
    cancelled = await driver.new_run(plan, "cancelled", now=T0 + 1)
    await driver.new_run(plan, "waits", now=T0 + 2)
    started.start()
    cancelled.cancel()
    await driver.flush()
    assert await queued(store) == ["waits"]
    assert await store.count_pending() == 1


async def test_count_pending_counts_the_runs_ahead_of_one(store: Store) -> None:
    driver = Driver(store)
    plan = short_plan()
    for n in range(5):
        await driver.new_run(plan, f"r{n}", now=T0 + n)
    urgent = await driver.new_run(plan, "urgent", now=T0 + 9, priority=Priority.HIGH)
    assert await store.count_pending() == 6
    assert await store.count_pending("urgent") == 0
    assert await store.count_pending("r0") == 1  # the urgent one goes first
    assert await store.count_pending("r4") == 5
    assert await store.count_pending("no-such-run") == 0
    urgent.start()
    await driver.flush()
    assert await store.count_pending("r4") == 4


async def test_a_run_keeps_its_priority(store: Store) -> None:
    driver = Driver(store)
    h = await driver.new_run(short_plan(), "low", priority=Priority.LOW)
    h.start()
    await driver.flush()
    assert (await store.load_run("low")).snapshot.priority is Priority.LOW


async def test_runs_stored_before_schema_11_are_queued_as_normal(sql_backend: Backend) -> None:
    store = await sql_backend.open()
    await store.save_definition(short_plan())
    driver = Driver(store)
    await driver.new_run(short_plan(), "old", now=T0 + 1)
    await store.close()
    upgraded = await sql_backend.upgraded_from(10, [])
    await Driver(upgraded).new_run(short_plan(), "new-low", now=T0, priority=Priority.LOW)
    await Driver(upgraded).new_run(short_plan(), "new-high", now=T0 + 2, priority=Priority.HIGH)
    found = await upgraded.pending_runs(10)
    assert [(r.run_id, r.priority) for r in found] == [
        ("new-high", Priority.HIGH),
        ("old", Priority.NORMAL),
        ("new-low", Priority.LOW),
    ]
