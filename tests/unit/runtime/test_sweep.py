"""The reconciliation sweep repairs what a lost notification leaves, while the engine runs:
a due timer no wheel holds, an outbox row nothing relays, a run stored pending whose start
was never published; on an idle store it repairs nothing, logs nothing and costs one
indexed query per part.

A "lost notification" is made the way the engine can lose one: a commit whose effects
were not carried out (``Engine.commit(relay=False)``, what a commit that reported a
failure but went through leaves), or a client whose bus refused the start of a run it
had stored.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import textwrap
import time
import uuid
from collections.abc import AsyncIterator, Collection, Sequence
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from tideflow.bus.backends.local import LocalBus
from tideflow.bus.base import (
    Bus,
    Control,
    Delivery,
    EventBatch,
    Message,
    QueueStats,
    RunEnded,
    Stream,
    WorkerBeat,
)
from tideflow.client import Client
from tideflow.dsl import compile_definition
from tideflow.model.commands import DispatchTask
from tideflow.model.events import Event, SignalReceived
from tideflow.model.plan import Plan
from tideflow.runtime.catalog import Catalog
from tideflow.runtime.engine import Engine
from tideflow.runtime.runtime import Runtime
from tideflow.runtime.sweep import (
    BATCH,
    DEFAULT_INTERVAL,
    STATEMENTS_PER_ROUND,
    interval_from_environment,
)
from tideflow.store import open_store
from tideflow.store.backends.memory import MemoryStore
from tideflow.store.backends.sqlite import SqliteStore
from tideflow.store.base import DueTimer, RunFilter, Store
from tideflow.store.sqlbase import list_runs_query
from tideflow.store.sqlfiles import queries
from tideflow.testing.clock import ManualClock
from tideflow.testing.waiting import step_is, wait_until
from tideflow.testing.wire import PgParser, Proxy, host_port, via
from tideflow.worker.executors.registry import ExecutorRegistry

HOUR = 3600.0
INTERVAL = DEFAULT_INTERVAL


def plan(text: str) -> Plan:
    return compile_definition(textwrap.dedent(text))


NAP_AFTER_GO = plan(
    """
    name: nap-after-go
    version: "1"
    steps:
      - {id: hold, type: wait, signal: go}
      - {id: nap, type: sleep, duration: 1h, depends_on: [hold]}
    """
)
EMIT_AFTER_GO = plan(
    """
    name: emit-after-go
    version: "1"
    steps:
      - {id: hold, type: wait, signal: go}
      - {id: tell, type: emit, event: {type: order.charged, data: {n: 1}}, depends_on: [hold]}
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
WAITER = plan(
    """
    name: waiter
    version: "1"
    steps:
      - {id: hold, type: wait, signal: order.charged}
    """
)
JOB = plan(
    """
    name: job
    version: "1"
    steps:
      - {id: work, type: noop}
    """
)
IDLE = plan(
    """
    name: idle-waiting
    version: "1"
    steps:
      - {id: hold, type: wait, signal: go}
      - {id: nap, type: sleep, duration: 30d}
    """
)


@pytest.fixture(params=["memory", "sqlite", "postgres"])
async def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[str]:
    async for url in _store_url(request, tmp_path):
        yield url


@pytest.fixture(params=["sqlite", "postgres"])
async def shared_url(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[str]:
    """A store two processes could open (a server and a client each open their own)."""
    async for url in _store_url(request, tmp_path):
        yield url


async def _store_url(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[str]:
    if request.param == "memory":
        yield "memory://"
    elif request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'store.db'}"
    else:
        base = request.getfixturevalue("postgres_url")
        schema = f"sweep_{uuid.uuid4().hex[:12]}"
        yield f"{base}?schema={schema}"
        conn = await asyncpg.connect(base)
        try:
            await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        finally:
            await conn.close()


class ClientBus(Bus):
    """A client's connection to the server's in-process bus that refuses its first
    ``refuse`` publications of events (``None``: every one), as a broker gone away does."""

    def __init__(self, target: LocalBus, refuse: int | None) -> None:
        self.target = target
        self.refuse = refuse
        self.refused = 0

    async def publish_events(self, events: Sequence[Event | Message[Event]]) -> None:
        if self.refuse is None or self.refused < self.refuse:
            self.refused += 1
            raise ConnectionError("the broker connection was reset")
        await self.target.publish_events(events)

    async def publish_tasks(self, tasks: Sequence[DispatchTask | Message[DispatchTask]]) -> None:
        await self.target.publish_tasks(tasks)

    async def publish_control(self, message: Control) -> None:
        await self.target.publish_control(message)

    async def publish_run_ends(self, ends: Sequence[RunEnded]) -> None:
        await self.target.publish_run_ends(ends)

    def consume_tasks(
        self, queues: Collection[str] | None = None, *, prefetch: int, worker: str | None = None
    ) -> Stream[Delivery[DispatchTask]]:
        return self.target.consume_tasks(queues, prefetch=prefetch, worker=worker)

    def consume_events(
        self, partitions: Collection[int] | None = None, *, max_batch: int
    ) -> Stream[EventBatch]:
        return self.target.consume_events(partitions, max_batch=max_batch)

    def consume_control(self) -> Stream[Control]:
        return self.target.consume_control()

    async def run_ends(self) -> Stream[RunEnded]:
        return await self.target.run_ends()

    async def queue_stats(self) -> list[QueueStats]:
        return await self.target.queue_stats()

    async def worker_beats(self) -> list[WorkerBeat]:
        return await self.target.worker_beats()


class RefusingBus(LocalBus):
    """The in-process bus, refusing to publish an emitted event's delivery until healed."""

    def __init__(self) -> None:
        super().__init__()
        self.healed = False

    async def publish_events(self, events: Sequence[Event | Message[Event]]) -> None:
        if not self.healed and any(
            isinstance(e, SignalReceived) and e.name == "order.charged" for e in events
        ):
            raise ConnectionError("the broker connection was reset")
        await super().publish_events(events)


async def lose_the_notification(rt: Runtime, run_id: str, signal: str) -> None:
    """Commit a signal to the run without carrying out what it unlocks (as a commit that
    reported a failure but went through leaves it): rows written, nothing armed or relayed."""
    event = SignalReceived(
        event_id=rt.new_event_id(), run_id=run_id, time=rt.clock.now(), name=signal
    )
    await rt._engine.commit([event], relay=False)


async def eventually(condition: Any, timeout: float = 10.0) -> None:
    """Wait (with a deadline) until ``condition()`` holds."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "the condition did not hold in time"
        await asyncio.sleep(0.01)


# -- due timers ------------------------------------------------------------------------


async def test_a_due_timer_no_wheel_holds_is_fired_by_the_next_sweep(
    store_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    clock = ManualClock(start=time.time())
    async with Runtime(store=store_url, clock=clock, workers=1) as rt:
        run_id = await rt.start_run(NAP_AFTER_GO)
        await wait_until(rt, run_id, step_is("hold", "waiting"))
        await lose_the_notification(rt, run_id, "go")
        [timer] = await rt.store.due_timers(float("inf"))
        assert timer.run_id == run_id and not rt._engine.timers.holds(run_id, timer.timer_id)

        clock.advance(HOUR + INTERVAL + 1)  # due for longer than one interval: no wheel fires
        assert (await rt.state(run_id)).steps["nap"].status.value == "waiting"
        with caplog.at_level(logging.INFO, logger="tideflow.sweep"):
            repairs = await rt._engine.sweep.round()
        assert (repairs.timers, repairs.outbox, repairs.starts) == (1, 0, 0)
        result = await rt.wait(run_id, timeout=10)
    assert result.status == "succeeded"
    assert [r.getMessage() for r in caplog.records if r.name == "tideflow.sweep"] == [
        "sweep repaired what lost notifications left: 1 due timer(s) fired"
    ]


async def test_a_timer_due_for_less_than_an_interval_or_held_is_left_to_the_wheel() -> None:
    clock = ManualClock(start=time.time())
    async with Runtime(clock=clock, workers=1) as rt:
        run_id = await rt.start_run(NAP_AFTER_GO)
        await wait_until(rt, run_id, step_is("hold", "waiting"))
        await lose_the_notification(rt, run_id, "go")
        sweep = rt._engine.sweep
        clock.advance(HOUR + INTERVAL - 1)  # due, but not for a whole interval yet
        assert (await sweep.round()).timers == 0
        [timer] = await rt.store.due_timers(float("inf"))
        rt._engine.timers.arm(run_id, timer.timer_id, clock.now() + 5)  # the wheel has it
        clock.advance(2)  # due for longer than an interval now, but held
        assert (await sweep.round()).timers == 0
        assert (await rt.state(run_id)).steps["nap"].status.value == "waiting"
        clock.advance(5)  # the wheel fires it
        assert (await rt.wait(run_id, timeout=10)).status == "succeeded"


async def test_the_sweep_leaves_runs_it_does_not_own_alone() -> None:
    clock = ManualClock(start=time.time())
    async with Runtime(clock=clock, workers=1) as rt:
        run_id = await rt.start_run(NAP_AFTER_GO)
        await wait_until(rt, run_id, step_is("hold", "waiting"))
        await lose_the_notification(rt, run_id, "go")
        clock.advance(HOUR + INTERVAL + 1)
        sweep = rt._engine.sweep
        sweep.owns = lambda run: run != run_id  # its partition belongs to another server
        assert not await sweep.round()
        assert (await rt.state(run_id)).steps["nap"].status.value == "waiting"
        sweep.owns = lambda run: run == run_id
        assert (await sweep.round()).timers == 1
        assert (await rt.wait(run_id, timeout=10)).status == "succeeded"


# -- the outbox ------------------------------------------------------------------------


async def test_an_outbox_row_nothing_relays_is_relayed_once_by_the_sweep(
    store_url: str,
) -> None:
    emitted: list[dict[str, Any]] = []
    async with Runtime(store=store_url, workers=1) as rt:
        rt.add_event_sink(emitted.append)
        waiter = await rt.start_run(WAITER)
        await wait_until(rt, waiter, step_is("hold", "waiting"))
        emitter = await rt.start_run(EMIT_AFTER_GO)
        await wait_until(rt, emitter, step_is("hold", "waiting"))
        await lose_the_notification(rt, emitter, "go")  # the emit and the run's end: stuck
        stuck = {item.id for item in await rt.store.pending_outbox()}
        assert stuck and (await rt.result(emitter)).status == "succeeded"

        sweep = rt._engine.sweep
        assert (await sweep.round()).outbox == 0  # first seen: it may be on its way
        assert (await sweep.round()).outbox == len(stuck)  # still there: relayed
        result = await rt.wait(waiter, timeout=10)
        assert (await sweep.round()).outbox == 0  # relayed once, never again
        assert not await sweep.round()
    assert result.status == "succeeded"
    assert result.steps["hold"].output["type"] == "order.charged"
    assert [event["type"] for event in emitted] == ["order.charged"]


async def test_an_outbox_row_the_relay_is_retrying_is_not_relayed_beside_it() -> None:
    bus = RefusingBus()
    emitted: list[dict[str, Any]] = []
    async with Runtime(bus=bus, workers=1) as rt:
        rt.add_event_sink(emitted.append)
        waiter = await rt.start_run(WAITER)
        await wait_until(rt, waiter, step_is("hold", "waiting"))
        await rt.start_run(EMITTER)
        await eventually(lambda: rt.pending_effects > 0)  # the delivery failed: retried
        assert await rt.store.pending_outbox()
        sweep = rt._engine.sweep
        for _ in range(3):  # pending at every round, but the relay answers for it
            assert (await sweep.round()).outbox == 0
        bus.healed = True
        result = await rt.wait(waiter, timeout=10)
        await eventually(lambda: rt.pending_effects == 0)
    assert result.status == "succeeded"
    assert [event["type"] for event in emitted] == ["order.charged"]


# -- runs stored but never started -----------------------------------------------------


async def test_a_run_whose_start_publish_failed_is_started_by_the_sweep(
    shared_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    clock = ManualClock(start=time.time())
    bus = LocalBus()
    async with Runtime(store=shared_url, bus=bus, clock=clock, workers=1) as rt:
        client_bus = ClientBus(bus, refuse=None)  # the broker is gone for this client
        async with Client.connect(store=shared_url, bus=client_bus, clock=clock) as client:
            await client.register(JOB)
            with caplog.at_level(logging.WARNING, logger="tideflow.client"):
                run_id = await client.start("job")
        assert client_bus.refused >= 2  # tried again before leaving it to the sweep
        assert any("is stored (pending)" in r.getMessage() for r in caplog.records)
        assert (await rt.store.get_run(run_id)).status == "pending"

        sweep = rt._engine.sweep
        assert (await sweep.round()).starts == 0  # pending for less than an interval
        clock.advance(INTERVAL + 1)
        assert (await sweep.round()).starts == 1
        result = await rt.wait(run_id, timeout=10)
        assert (await sweep.round()).starts == 0
    assert result.status == "succeeded"
    history = await _history(shared_url, run_id)
    assert history.count("run_started") == 1


async def _history(url: str, run_id: str) -> list[str]:
    store = open_store(url)
    store.compile_plan = compile_definition
    await store.open()
    try:
        return [entry.kind for entry in await store.history(run_id)]
    finally:
        await store.close()


async def test_the_client_publishes_a_start_again_when_the_bus_refuses_it_for_a_moment(
    shared_url: str,
) -> None:
    bus = LocalBus()
    async with Runtime(store=shared_url, bus=bus, workers=1, sweep_interval=0):
        client_bus = ClientBus(bus, refuse=2)
        async with Client.connect(store=shared_url, bus=client_bus) as client:
            await client.register(JOB)
            run_id = await client.start("job")
            result = await client.wait(run_id, timeout=10)
        assert client_bus.refused == 2
    assert result.status == "succeeded"


async def test_the_engine_sweeps_every_interval_on_its_own(
    shared_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    bus = LocalBus()
    caplog.set_level(logging.INFO, logger="tideflow.sweep")
    async with Runtime(store=shared_url, bus=bus, workers=1, sweep_interval=0.2) as rt:
        async with Client.connect(store=shared_url, bus=ClientBus(bus, refuse=None)) as client:
            await client.register(JOB)
            run_id = await client.start("job")
        result = await rt.wait(run_id, timeout=20)
    assert result.status == "succeeded"
    assert any(
        "1 pending run(s) whose start was lost admitted" in r.getMessage()
        for r in caplog.records
        if r.name == "tideflow.sweep"
    )


# -- cost ------------------------------------------------------------------------------


class CountingStore(MemoryStore):
    def __init__(self) -> None:
        super().__init__()
        self.due_reads = 0

    async def due_timers(
        self, before: float, limit: int = 1000, *, after: float | None = None
    ) -> list[DueTimer]:
        self.due_reads += 1
        return await super().due_timers(before, limit, after=after)


async def test_an_idle_engine_sweeps_and_logs_nothing(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="tideflow.sweep")
    store = CountingStore()
    async with Runtime(store=store, workers=1, sweep_interval=0.02) as rt:
        run_ids = [await rt.start_run(IDLE) for _ in range(5)]
        for run_id in run_ids:
            await wait_until(rt, run_id, step_is("hold", "waiting"))
        reads = store.due_reads
        await eventually(lambda: store.due_reads >= reads + 3)  # three rounds at least
    assert [r for r in caplog.records if r.name == "tideflow.sweep"] == []


async def _filled(url: str, runs: int) -> None:
    """A store with ``runs`` runs waiting on a signal and a 30-day timer, left by an engine
    that stopped cleanly (nothing to repair)."""
    async with Runtime(store=url, workers=1) as rt:
        run_ids = [await rt.start_run(IDLE) for _ in range(runs)]
        for run_id in run_ids:
            await wait_until(rt, run_id, step_is("hold", "waiting"))


def _bare_engine(store: Store) -> Engine:
    """An engine on ``store`` that is not started: only its sweep is driven, by hand."""
    clock = ManualClock(start=time.time())
    catalog = Catalog(store, ExecutorRegistry(), clock=clock)
    store.compile_plan = catalog.compile_stored
    return Engine(
        store=store,
        bus=LocalBus(),
        catalog=catalog,
        clock=clock,
        new_event_id=lambda: uuid.uuid4().hex,
        batch_size=64,
        sweep_interval=INTERVAL,
    )


async def test_a_sweep_round_on_an_idle_sqlite_store_is_three_statements(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    await _filled(url, 50)
    store = SqliteStore(url)
    engine = _bare_engine(store)
    await store.open()
    try:
        statements: list[str] = []
        store.conn.set_trace_callback(statements.append)
        for _ in range(3):
            statements.clear()
            assert not await engine.sweep.round()
            assert len(statements) == STATEMENTS_PER_ROUND, statements
    finally:
        await store.close()


async def test_a_sweep_round_on_an_idle_postgres_store_is_three_statements(
    postgres_url: str,
) -> None:
    schema = f"sweep_{uuid.uuid4().hex[:12]}"
    await _filled(f"{postgres_url}?schema={schema}", 50)
    proxy = Proxy(host_port(postgres_url, 5432), PgParser)
    try:
        async with proxy.running():
            store = open_store(f"{via(postgres_url, proxy.port)}?schema={schema}")
            engine = _bare_engine(store)
            await store.open()
            try:
                assert not await engine.sweep.round()  # the first prepares its statements
                for _ in range(3):
                    before = proxy.counter.snapshot()
                    assert not await engine.sweep.round()
                    after = proxy.counter.snapshot()
                    assert after[0] - before[0] == STATEMENTS_PER_ROUND, after[1] - before[1]
            finally:
                await store.close()
    finally:
        conn = await asyncpg.connect(postgres_url)
        try:
            await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        finally:
            await conn.close()


def test_the_sweeps_queries_read_through_indexes(tmp_path: Path) -> None:
    """SQLite's plan of each query a round sends: every table is searched or scanned
    through an index, none read whole."""
    store = SqliteStore(f"sqlite:///{tmp_path / 'store.db'}")
    asyncio.run(store.open())
    asyncio.run(store.close())
    named = queries("sqlite")
    pending, params = list_runs_query(
        RunFilter(status="pending", created_before=1.0), BATCH, None, lambda n: "?"
    )
    conn = sqlite3.connect(tmp_path / "store.db")
    try:
        for sql, args in [
            (named["due_timers"], (float("-inf"), 1.0, BATCH)),
            (named["pending_outbox"], (BATCH,)),
            (pending, tuple(params)),
        ]:
            plan_rows = [row[-1] for row in conn.execute(f"EXPLAIN QUERY PLAN {sql}", args)]
            reads = [row for row in plan_rows if row.startswith(("SCAN", "SEARCH"))]
            assert reads and all("INDEX" in row for row in reads), (sql, plan_rows)
    finally:
        conn.close()


# -- options ---------------------------------------------------------------------------


def test_the_sweep_interval_must_be_seconds_or_zero() -> None:
    with pytest.raises(ValueError, match="or 0 to turn the sweep off"):
        Runtime(sweep_interval=-1)
    with pytest.raises(ValueError, match="TIDEFLOW_SWEEP_INTERVAL='soon'"):
        interval_from_environment({"TIDEFLOW_SWEEP_INTERVAL": "soon"})
    assert interval_from_environment({}) == DEFAULT_INTERVAL
    assert interval_from_environment({"TIDEFLOW_SWEEP_INTERVAL": "0"}) == 0.0
    assert Runtime(sweep_interval=5)._engine.sweep.interval == 5.0
    assert Runtime(recover=False)._engine.sweep.interval == 0.0  # not the store's engine
