"""An engine starts on a store full of waiting runs without loading them: timers, leases
and waits are read from the store's rows; idle runs leave a bounded cache."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from tideflow.bus.backends.local import LocalBus
from tideflow.dsl import compile_definition
from tideflow.model.commands import DispatchTask
from tideflow.model.plan import Plan
from tideflow.model.run import new_run_state
from tideflow.runtime.runs import Plans, RunCache
from tideflow.runtime.runtime import Runtime
from tideflow.store.backends.memory import MemoryStore
from tideflow.store.backends.sqlite import SqliteStore
from tideflow.store.base import StoredRun
from tideflow.testing.clock import ManualClock
from tideflow.testing.waiting import step_is, wait_until

HOUR = 3600.0


def plan(text: str) -> Plan:
    return compile_definition(textwrap.dedent(text))


WAITER = plan(
    """
    name: waiter
    version: "1"
    steps:
      - {id: hold, type: wait, signal: order.charged}
    """
)
EMITTER = plan(
    """
    name: emitter
    version: "1"
    steps:
      - {id: tell, type: emit, event: {type: order.charged, data: {n: 1}}}
    """
)
SLEEPER = plan(
    """
    name: sleeper
    version: "1"
    steps:
      - {id: nap, type: sleep, duration: 1h}
    """
)
WORKER = plan(
    """
    name: worker
    version: "1"
    steps:
      - {id: job, type: noop}
    """
)


class CountingStore(SqliteStore):
    """The real SQLite store, remembering which runs were loaded."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.loaded: list[str] = []

    async def load_run(self, run_id: str) -> StoredRun:
        self.loaded.append(run_id)
        return await super().load_run(run_id)


class RecordingBus(LocalBus):
    def __init__(self) -> None:
        super().__init__()
        self.tasks: list[DispatchTask] = []

    async def publish_tasks(self, tasks: Sequence[DispatchTask]) -> None:
        self.tasks.extend(tasks)
        await super().publish_tasks(tasks)


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'store.db'}"


async def start_waiting(url: str, plan: Plan, count: int, **options: Any) -> list[str]:
    async with Runtime(store=url, **options) as rt:
        run_ids = [await rt.start_run(plan) for _ in range(count)]
        for run_id in run_ids:
            await wait_until(rt, run_id, step_is(next(iter(plan.specs)), "waiting"))
    return run_ids


async def test_an_engine_loads_no_waiting_run_until_an_event_arrives(url: str) -> None:
    run_ids = await start_waiting(url, WAITER, 30)
    store = CountingStore(url)
    async with Runtime(store=store) as rt:
        assert store.loaded == []
        await rt.signal(run_ids[7], "order.charged", {"by": "hand"})
        result = await rt.wait(run_ids[7], timeout=5)
        assert result.status == "succeeded"
        assert set(store.loaded) == {run_ids[7]}


async def test_emit_reaches_a_waiting_run_through_the_store_after_a_restart(url: str) -> None:
    [waiter] = await start_waiting(url, WAITER, 1)
    store = CountingStore(url)
    async with Runtime(store=store) as rt:
        assert store.loaded == []
        await rt.wait(await rt.start_run(EMITTER), timeout=5)
        result = await rt.wait(waiter, timeout=5)
    assert result.status == "succeeded"
    assert result.steps["hold"].output["type"] == "order.charged"


async def test_a_stored_timer_fires_after_a_restart_and_only_the_soonest_is_held(
    url: str,
) -> None:
    clock = ManualClock()
    async with Runtime(store=url, clock=clock) as rt:
        run_ids = []
        for _ in range(5):  # naps ending ten minutes apart
            run_ids.append(await rt.start_run(SLEEPER))
            await wait_until(rt, run_ids[-1], step_is("nap", "waiting"))
            clock.advance(600)
    store = CountingStore(url)
    again = ManualClock(start=clock.now() - 5 * 600)  # the same instant as the first start
    async with Runtime(store=store, clock=again) as rt:
        assert store.loaded == []
        assert again.pending() == [again.now() + HOUR]  # one wake-up, not five timers
        again.advance(HOUR)
        first = await rt.wait(run_ids[0], timeout=5)
        assert first.status == "succeeded"
        assert set(store.loaded) == {run_ids[0]}
        assert again.pending() == [again.now() + 600]
        again.advance(HOUR)
        for run_id in run_ids[1:]:
            assert (await rt.wait(run_id, timeout=5)).status == "succeeded"


async def test_an_expired_lease_is_dispatched_again_and_a_held_one_is_not(url: str) -> None:
    async with Runtime(store=url, workers=0) as rt:  # tasks are dispatched, nobody runs them
        held, expired = [await rt.start_run(WORKER) for _ in range(2)]
        for run_id in (held, expired):
            await wait_until(rt, run_id, step_is("job", "running"))
        now = rt.clock.now()
        other = rt.store  # a worker elsewhere claimed both; one of them stopped heartbeating
        assert await other.claim_task(held, "job", 1, owner="w1", now=now, until=now + HOUR)
        assert await other.claim_task(expired, "job", 1, owner="w2", now=now, until=now - 1)
    bus = RecordingBus()
    store = CountingStore(url)
    async with Runtime(store=store, bus=bus) as rt:
        assert [(t.run_id, t.step_key, t.attempt) for t in bus.tasks] == [(expired, "job", 1)]
        assert store.loaded == [expired]
        assert (await rt.wait(expired, timeout=5)).status == "succeeded"
        assert (await rt.result(held)).status == "running"


async def test_the_run_cache_keeps_only_its_size_of_idle_runs(url: str) -> None:
    async with Runtime(store=url, run_cache_size=4) as rt:
        run_ids = [await rt.start_run(WAITER) for _ in range(12)]
        for run_id in run_ids:  # all twelve wait (parked); the cache keeps four of them
            await wait_until(rt, run_id, step_is("hold", "waiting"))
            assert len(rt._engine.runs) <= 4
            await rt.signal(run_id, "order.charged", {"n": run_id})
        results = [await rt.wait(run_id, timeout=5) for run_id in run_ids]
    assert [r.steps["hold"].output for r in results] == [{"n": run_id} for run_id in run_ids]


async def test_the_run_cache_never_evicts_a_run_in_flight() -> None:
    store = MemoryStore()
    busy = {"a"}
    cache = RunCache(store, Plans(store), size=2, busy=busy.__contains__)
    states = {}
    for run_id in ("a", "b", "c", "d"):
        states[run_id] = new_run_state(
            run_id=run_id, workflow="w", version="1", plan_hash="h", created_at=0.0
        )
        cache.add(states[run_id])
    assert "a" in cache and "d" in cache
    assert len(cache) == 2
    busy.clear()
    cache.add(new_run_state(run_id="e", workflow="w", version="1", plan_hash="h", created_at=0))
    assert sorted(r.state.run_id for r in cache.cached()) == ["d", "e"]


def test_a_run_cache_needs_room_for_one_run() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        Runtime(run_cache_size=0)


async def test_a_recently_used_run_stays_cached() -> None:
    store = MemoryStore()
    cache = RunCache(store, Plans(store), size=2, busy=lambda _: False)
    for run_id in ("a", "b"):
        cache.add(
            new_run_state(run_id=run_id, workflow="w", version="1", plan_hash="h", created_at=0)
        )
    await cache.get("a")  # used again: now the most recent
    cache.add(new_run_state(run_id="c", workflow="w", version="1", plan_hash="h", created_at=0))
    assert "a" in cache and "b" not in cache and "c" in cache


def downgrade_to_schema_1(path: Path) -> None:
    """What a store written by schema 1 looks like: no timer, task or wait rows (nor the
    lease, inbox and token tables of schemas 3 and 5, nor what schemas 6, 7 and 10 added)."""
    tables = ("timers", "task_leases", "waits", "unindexed_runs", "engine_leases", "inbox")
    with sqlite3.connect(path) as conn:
        gateway = ("gateway_event_rows", "gateway_events")
        for table in (*tables, "api_tokens", "definition_triggers", "schedules", *gateway):
            conn.execute(f"DROP TABLE {table}")
        conn.execute("ALTER TABLE definitions DROP COLUMN active")
        conn.execute("DROP INDEX runs_pending")  # schema 11
        conn.execute("ALTER TABLE runs DROP COLUMN priority")
        conn.execute("DELETE FROM schema_version WHERE version > 1")
    conn.close()


async def test_runs_stored_before_schema_2_get_their_rows_on_the_next_start(
    tmp_path: Path, url: str
) -> None:
    clock = ManualClock()
    async with Runtime(store=url, clock=clock) as rt:
        waiter = await rt.start_run(WAITER)
        sleeper = await rt.start_run(SLEEPER)
        await wait_until(rt, waiter, step_is("hold", "waiting"))
        await wait_until(rt, sleeper, step_is("nap", "waiting"))
    downgrade_to_schema_1(tmp_path / "store.db")
    async with Runtime(store=url, clock=ManualClock(start=clock.now())) as rt:
        assert await rt.store.unindexed_runs() == []
        assert await rt.store.runs_waiting_for("order.charged") == [waiter]
        await rt.wait(await rt.start_run(EMITTER), timeout=5)
        assert (await rt.wait(waiter, timeout=5)).status == "succeeded"
        rt.clock.advance(HOUR)  # type: ignore[attr-defined]
        assert (await rt.wait(sleeper, timeout=5)).status == "succeeded"


def test_a_started_compensation_is_in_flight_for_the_stored_rows() -> None:
    """A compensation a worker started is an attempt in flight: ``index_run`` keeps its
    row, so that a second crash before its ``TaskLost`` is applied does not lose the run."""
    from tideflow.dsl import compile_definition
    from tideflow.runtime.recovery import in_flight
    from tideflow.testing.harness import CoreHarness

    plan = compile_definition(
        'name: saga\nversion: "1"\non_failure: compensate\nsteps:\n'
        "  - {id: a, type: noop, compensate: {type: noop}}\n"
        "  - {id: b, type: noop, depends_on: [a]}\n"
    )
    h = CoreHarness(plan)
    h.start({})
    h.complete("a")
    h.fail("b")
    assert h.status == "compensating"
    (lease,) = in_flight(h.plan, h.state, h.now)
    assert (lease.step_key, lease.attempt) == ("a", 1)
    assert lease.started_at is not None


class CommitsDuringRecovery(SqliteStore):
    """The real SQLite store, noting each commit made while an engine recovers."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.recovering = False
        self.during: list[str] = []
        self.committed = asyncio.Event()

    async def commit(self, batch: Any, relayed: Any = ()) -> None:
        if self.recovering:
            self.during += [type(applied.event).__name__ for applied in batch]
        await super().commit(batch, relayed)
        self.committed.set()

    async def expired_tasks(self, before: float, limit: int = 10_000) -> list[Any]:
        # Give a scheduler running beside recovery the time to apply the start it was
        # just sent (a bound, not a pause: with none running, nothing can come).
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.committed.wait(), 0.3)
        return await super().expired_tasks(before, limit)


async def test_recovery_sees_only_what_the_previous_engine_left(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run stored but never started is started by recovery; were the scheduler already
    applying events, its first attempt could be dispatched and started before recovery
    looked for lost attempts, which would then report it lost and dispatch it again
    while it ran (a step ran three times after a crash)."""
    setup = SqliteStore(url)
    await setup.open()
    await setup.save_definition(WORKER)
    pending = new_run_state(
        run_id="never-started",
        workflow="worker",
        version="1",
        plan_hash=WORKER.hash,
        created_at=0.0,
    )
    await setup.create_run(pending)
    await setup.close()
    store = CommitsDuringRecovery(url)

    from tideflow.runtime.engine import Engine

    original = Engine.recover

    async def watched(self: Engine) -> None:
        store.recovering = True
        try:
            await original(self)
        finally:
            store.recovering = False

    monkeypatch.setattr(Engine, "recover", watched)
    async with Runtime(store=store) as rt:
        assert store.during == []
        result = await rt.wait("never-started", timeout=5)
        kinds = [entry.kind for entry in await rt.history("never-started")]
    assert result.status == "succeeded"
    assert "task_lost" not in kinds
