"""The Store port's timers, task leases and waits: rows every commit keeps current, on
every backend (memory, sqlite, postgres)."""

from __future__ import annotations

import math
from typing import Any

from tideflow.dsl import compile_definition
from tideflow.store.base import Store, TaskLease

from .conftest import Backend
from .scenarios import (
    T0,
    UNDO_SCHEMA_8,
    UNDO_SCHEMA_9,
    Driver,
    loaded_state,
    order_plan,
    order_script,
    same_state,
)

WAITER: dict[str, Any] = {
    "name": "waiter",
    "version": "1",
    "steps": [
        {"id": "work", "type": "noop", "timeout": "30s", "retry": {"max_attempts": 3}},
        {"id": "hold", "type": "wait", "signal": "go", "depends_on": ["work"], "timeout": "1h"},
        {"id": "nap", "type": "sleep", "duration": "2h", "depends_on": ["work"]},
    ],
}


def timers_of(rows: list[Any], run_id: str) -> dict[str, float]:
    return {t.timer_id: t.fire_at for t in rows if t.run_id == run_id}


async def test_armed_timers_are_rows_soonest_first(store: Store) -> None:
    plan = compile_definition(WAITER)
    driver = Driver(store)
    h = await driver.new_run(plan, "w")
    h.start()
    h.complete("work")
    await driver.flush()
    due = await store.due_timers(math.inf)
    assert [(t.run_id, t.timer_id) for t in due] == [
        ("w", "wait_timeout:hold:0"),
        ("w", "sleep:nap:0"),
    ]
    assert [t.fire_at for t in due] == [T0 + 3600, T0 + 7200]
    assert await store.due_timers(T0 + 3599) == []
    assert [t.timer_id for t in await store.due_timers(T0 + 3600)] == ["wait_timeout:hold:0"]
    assert [t.timer_id for t in await store.due_timers(math.inf, 1)] == ["wait_timeout:hold:0"]
    later = await store.due_timers(math.inf, after=T0 + 3600)
    assert [t.timer_id for t in later] == ["sleep:nap:0"]

    h.signal("go", {"ok": 1})  # the wait ends: its timeout is cancelled
    await driver.flush()
    assert timers_of(await store.due_timers(math.inf), "w") == {"sleep:nap:0": T0 + 7200}
    h.advance(7200)  # the sleep fires: its row is consumed, the run ends
    await driver.flush()
    assert h.state.is_terminal
    assert await store.due_timers(math.inf) == []


async def test_a_retry_timer_replaces_the_attempt_timer(store: Store) -> None:
    plan = order_plan()
    driver = Driver(store, batch_size=100)  # one commit: the net change of the batch counts
    h = await driver.new_run(plan, "o")
    await driver.play(order_script(h)[:3])  # start, fetch done, charge failed once
    assert list(timers_of(await store.due_timers(math.inf), "o")) == ["retry:charge:1"]


async def test_attempts_in_flight_are_rows_until_their_outcome(store: Store) -> None:
    plan = compile_definition(WAITER)
    driver = Driver(store)
    h = await driver.new_run(plan, "t")
    h.auto_start = False  # the worker reports the start below
    h.start()
    await driver.flush()
    [lease] = await store.expired_tasks(math.inf)
    assert (lease.run_id, lease.step_key, lease.attempt) == ("t", "work", 1)
    assert (lease.dispatched_at, lease.started_at, lease.owner, lease.lease_until) == (
        T0,
        None,
        None,
        0.0,
    )
    h.started("work")
    await driver.flush()
    [lease] = await store.expired_tasks(math.inf)
    assert lease.started_at == T0
    h.fail("work")  # retried after a backoff: nothing in flight meanwhile
    await driver.flush()
    assert await store.expired_tasks(math.inf) == []
    h.advance(60)
    await driver.flush()
    [lease] = await store.expired_tasks(math.inf)
    assert (lease.attempt, lease.started_at) == (2, None)
    h.complete("work")
    await driver.flush()
    assert await store.expired_tasks(math.inf) == []


async def test_tasks_in_flight_are_the_busy_runs_by_run_then_step(store: Store) -> None:
    plan = compile_definition(WAITER)
    driver = Driver(store)
    harnesses = [await driver.new_run(plan, run_id) for run_id in ("c", "a", "b")]
    for h in harnesses:
        h.start()
    await driver.flush()
    keys = [(t.run_id, t.step_key, t.attempt) for t in await store.tasks_in_flight()]
    assert keys == [("a", "work", 1), ("b", "work", 1), ("c", "work", 1)]
    first = await store.tasks_in_flight(None, 2)
    assert [t.run_id for t in first] == ["a", "b"]
    assert [t.run_id for t in await store.tasks_in_flight(("b", "work"), 2)] == ["c"]
    harnesses[2].complete("work")  # b only waits now (a signal, a sleep): it is parked
    await driver.flush()
    assert [t.run_id for t in await store.tasks_in_flight()] == ["a", "c"]


async def test_a_child_run_in_flight_is_not_a_task_in_flight(store: Store) -> None:
    driver = Driver(store)
    h = await driver.new_run(order_plan(), "o")
    await driver.play(order_script(h)[:5])  # the child run `invoice` is in flight
    assert ("o", "invoice") in {(t.run_id, t.step_key) for t in await store.expired_tasks(math.inf)}
    assert ("o", "invoice") not in {(t.run_id, t.step_key) for t in await store.tasks_in_flight()}


async def test_a_task_lease_is_claimed_extended_and_expires(store: Store) -> None:
    plan = compile_definition(WAITER)
    driver = Driver(store)
    h = await driver.new_run(plan, "l")
    h.start()
    await driver.flush()
    claim = store.claim_task
    assert await claim("l", "work", 2, owner="w1", now=T0, until=T0 + 10) is False  # no such
    assert await claim("l", "work", 1, owner="w1", now=T0, until=T0 + 10) is True
    assert await claim("l", "work", 1, owner="w2", now=T0 + 5, until=T0 + 15) is False
    assert await store.expired_tasks(T0 + 10) == []
    assert await store.extend_task("l", "work", 1, owner="w2", until=T0 + 99) is False
    assert await store.extend_task("l", "work", 1, owner="w1", until=T0 + 20) is True
    assert await store.expired_tasks(T0 + 15) == []
    [expired] = await store.expired_tasks(T0 + 21)
    assert (expired.owner, expired.lease_until) == ("w1", T0 + 20)
    assert await claim("l", "work", 1, owner="w2", now=T0 + 21, until=T0 + 40) is True
    assert await store.extend_task("l", "work", 1, owner="w1", until=T0 + 60) is False
    h.complete("work")
    await driver.flush()
    assert await store.extend_task("l", "work", 1, owner="w2", until=T0 + 60) is False
    assert await store.expired_tasks(math.inf) == []


async def test_a_start_recorded_after_a_claim_keeps_the_claim(store: Store) -> None:
    plan = compile_definition(WAITER)
    driver = Driver(store)
    h = await driver.new_run(plan, "c")
    h.auto_start = False
    h.start()
    await driver.flush()
    assert await store.claim_task("c", "work", 1, owner="w1", now=T0, until=T0 + 10)
    h.advance(3)
    h.started("work")
    await driver.flush()
    [lease] = await store.expired_tasks(math.inf)
    assert lease == TaskLease(
        run_id="c",
        step_key="work",
        attempt=1,
        dispatched_at=T0,
        started_at=T0 + 3,
        owner="w1",
        lease_until=T0 + 10,
    )


async def test_a_store_at_schema_7_keeps_its_attempts_in_flight(sql_backend: Backend) -> None:
    """Migration 8 (task_leases in fewer pages) on a store an older tideflow wrote with an
    attempt in flight, claimed: the row, its lease and every query on it are kept."""
    store = await sql_backend.open()
    driver = Driver(store)
    h = await driver.new_run(compile_definition(WAITER), "old")
    h.start()
    await driver.flush()
    assert await store.claim_task("old", "work", 1, owner="w1", now=T0, until=T0 + 10)
    await store.close()
    upgraded = await sql_backend.upgraded_from(7, UNDO_SCHEMA_8[sql_backend.name])
    assert await upgraded.expired_tasks(T0 + 9) == []
    [kept] = await upgraded.expired_tasks(T0 + 11)
    assert (kept.run_id, kept.step_key, kept.attempt, kept.owner, kept.lease_until) == (
        "old",
        "work",
        1,
        "w1",
        T0 + 10,
    )
    assert await upgraded.claim_task("old", "work", 1, owner="w2", now=T0 + 11, until=T0 + 30)
    driver.store = upgraded
    h.complete("work")
    await driver.flush()
    assert await upgraded.expired_tasks(math.inf) == []
    if sql_backend.name == "sqlite":  # one B-tree, keyed by run and step
        [(sql,)] = await sql_backend.raw(
            "SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'task_leases'"
        )
        assert "WITHOUT ROWID" in sql
        indexes = "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'task_leases'"
    else:
        indexes = "SELECT indexname FROM pg_indexes WHERE tablename = 'task_leases'"
        indexes += " AND schemaname = current_schema()"
    assert "task_leases_until" not in {row[0] for row in await sql_backend.raw(indexes)}


async def test_a_store_at_schema_8_keeps_its_history(sql_backend: Backend) -> None:
    """Migration 9 (history without its index on event_id) on a store an older tideflow
    left with runs half done and one finished: every event is kept, in order, and the
    runs go on."""
    store = await sql_backend.open()
    plan = order_plan()
    driver = Driver(store, batch_size=3)
    done, half = await driver.new_run(plan, "done"), await driver.new_run(plan, "half")
    await driver.play(order_script(done))
    script = order_script(half)
    await driver.play(script[:4])
    before = {run_id: await store.history(run_id) for run_id in ("done", "half")}
    await store.close()
    upgraded = await sql_backend.upgraded_from(8, UNDO_SCHEMA_9[sql_backend.name])
    assert {run_id: await upgraded.history(run_id) for run_id in before} == before
    driver.store = upgraded
    await driver.play(script[4:])
    assert same_state(await loaded_state(upgraded, plan, "half"), half.state)
    assert (await upgraded.get_run("half")).status == "succeeded"
    after = await upgraded.history("half")
    assert after[: len(before["half"])] == before["half"]
    assert [entry.seq for entry in after] == list(range(1, driver.seqs["half"] + 1))
    if sql_backend.name == "sqlite":
        indexes = "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'history'"
    else:
        indexes = "SELECT indexname FROM pg_indexes WHERE tablename = 'history'"
        indexes += " AND schemaname = current_schema()"
    assert len(await sql_backend.raw(indexes)) == 1  # the primary key's: (run_id, seq)


async def test_runs_waiting_for_a_signal(store: Store) -> None:
    plan = compile_definition(WAITER)
    driver = Driver(store, batch_size=10)
    runs = [await driver.new_run(plan, f"r{i}") for i in range(3)]
    for h in runs:
        h.start()
        h.complete("work")
    await driver.flush()
    assert await store.runs_waiting_for("go") == ["r0", "r1", "r2"]
    assert await store.runs_waiting_for("stop") == []
    runs[1].signal("go")
    runs[2].cancel()
    await driver.flush()
    assert await store.runs_waiting_for("go") == ["r0"]


async def test_a_run_that_ends_leaves_no_rows(store: Store) -> None:
    plan = compile_definition(WAITER)
    driver = Driver(store)
    h = await driver.new_run(plan, "c")
    h.start()
    await driver.flush()
    h.complete("work")
    h.cancel()
    await driver.flush()
    assert h.state.is_terminal
    assert await store.due_timers(math.inf) == []
    assert await store.expired_tasks(math.inf) == []
    assert await store.runs_waiting_for("go") == []


async def test_rows_survive_a_reopen(sql_backend: Backend) -> None:
    store = await sql_backend.open()
    plan = compile_definition(WAITER)
    await store.save_definition(plan)
    driver = Driver(store)
    h = await driver.new_run(plan, "k")
    h.start()
    await driver.flush()
    await store.claim_task("k", "work", 1, owner="w1", now=T0, until=T0 + 5)
    h.complete("work")
    await driver.flush()
    await store.close()
    reopened = await sql_backend.open()
    assert await reopened.runs_waiting_for("go") == ["k"]
    assert len(await reopened.due_timers(math.inf)) == 2
    assert await reopened.expired_tasks(math.inf) == []


async def test_index_run_rewrites_a_runs_rows_from_its_state(store: Store) -> None:
    plan = compile_definition(WAITER)
    driver = Driver(store)
    h = await driver.new_run(plan, "x")
    h.start()
    h.complete("work")
    await driver.flush()
    assert await store.unindexed_runs() == []
    lease = TaskLease(run_id="x", step_key="work", attempt=9, dispatched_at=T0, started_at=T0)
    await store.index_run(h.state, [lease])
    assert await store.expired_tasks(math.inf) == [lease]
    assert await store.runs_waiting_for("go") == ["x"]
    assert timers_of(await store.due_timers(math.inf), "x") == {
        "wait_timeout:hold:0": T0 + 3600,
        "sleep:nap:0": T0 + 7200,
    }


STALE_TIMEOUT: dict[str, Any] = {
    "name": "stale",
    "version": "1",
    "timeout": "1m",
    "on_failure": "compensate",
    "steps": [
        {"id": "book", "type": "noop", "compensate": {"type": "noop"}},
        {"id": "pay", "type": "noop", "depends_on": ["book"]},
    ],
}


async def test_a_timer_that_fires_with_nothing_left_to_do_leaves_no_row(store: Store) -> None:
    plan = compile_definition(STALE_TIMEOUT)
    driver = Driver(store)
    h = await driver.new_run(plan, "s")
    h.start()
    h.complete("book")
    h.fail("pay")  # the run compensates; its timeout stays armed
    await driver.flush()
    assert h.status == "compensating"
    assert "run_timeout" in timers_of(await store.due_timers(math.inf), "s")
    h.fire("run_timeout")  # too late to time out a compensating run: nothing happens
    await driver.flush()
    assert h.status == "compensating"
    assert "run_timeout" not in timers_of(await store.due_timers(math.inf), "s")
