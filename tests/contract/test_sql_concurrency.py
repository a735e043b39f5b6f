"""Several processes on one SQL store: two appliers never both advance a run, and
stores opened together agree on one schema."""

from __future__ import annotations

import asyncio

import pytest

from tideflow.model.events import SignalReceived
from tideflow.store.base import AppliedEvent, ConcurrencyConflict
from tideflow.store.sqlfiles import migrations

from .conftest import Backend
from .scenarios import T0, Driver, loaded_state, order_plan, order_script, same_state


async def test_two_appliers_never_both_advance_a_run(sql_backend: Backend) -> None:
    first, second = await sql_backend.open(), await sql_backend.open()
    plan = order_plan()
    driver = Driver(first)
    h = await driver.new_run(plan, "contested")
    await driver.play(order_script(h)[:2])
    for round_ in range(5):
        seq = (await first.load_run("contested")).last_seq + 1
        attempts = [
            AppliedEvent(
                event=SignalReceived(
                    event_id=f"{who}-{round_}", run_id="contested", time=T0, name="s"
                ),
                state=h.state,
                transitions=[],
                commands=[],
                seq=seq,
            )
            for who in ("first", "second")
        ]
        outcomes = await asyncio.gather(
            first.commit([attempts[0]]), second.commit([attempts[1]]), return_exceptions=True
        )
        conflicts = [o for o in outcomes if isinstance(o, ConcurrencyConflict)]
        assert len(conflicts) == 1, outcomes
        assert [o for o in outcomes if o is not None and o not in conflicts] == []
        assert (await second.load_run("contested")).last_seq == seq
        assert len(await first.history("contested")) == seq


async def test_stores_opened_together_migrate_once(sql_backend: Backend) -> None:
    stores = await asyncio.gather(*(sql_backend.open() for _ in range(4)))
    for store in stores:
        assert await store.schema_version() == migrations(sql_backend.name)[-1].version
    rows = await sql_backend.raw("SELECT count(*) FROM schema_version")
    assert rows[0][0] == len(migrations(sql_backend.name))
    driver = Driver(stores[0])
    plan = order_plan()
    h = await driver.new_run(plan, "shared")
    await driver.play(order_script(h))
    for store in stores[1:]:
        assert same_state(await loaded_state(store, plan, "shared"), h.state)


@pytest.mark.parametrize("batch_size", [1, 16])
async def test_interleaved_appliers_on_different_runs_all_commit(
    sql_backend: Backend, batch_size: int
) -> None:
    plan = order_plan()
    stores = [await sql_backend.open() for _ in range(2)]
    drivers = [Driver(store, batch_size=batch_size) for store in stores]
    harnesses = [
        [await d.new_run(plan, f"{index}-{n}") for n in range(4)] for index, d in enumerate(drivers)
    ]
    await asyncio.gather(
        *(d.play(*(order_script(h) for h in hs)) for d, hs in zip(drivers, harnesses, strict=True))
    )
    for hs in harnesses:
        for h in hs:
            assert same_state(await loaded_state(stores[0], plan, h.run_id), h.state)
