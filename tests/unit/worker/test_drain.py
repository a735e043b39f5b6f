"""The worker pool's drain (SIGTERM of `tideflow worker`) and its redelivered tasks, on
the in-process bus: what has not started is handed back at once, what runs past the
grace is cancelled and handed back, and the next delivery says it is one."""

from __future__ import annotations

import asyncio
import itertools
import time

from tideflow import register
from tideflow.bus.backends.local import LocalBus
from tideflow.core.decide import Decision
from tideflow.dsl import compile_definition
from tideflow.model import codec
from tideflow.model.commands import DispatchTask
from tideflow.model.events import Event, TaskStarted
from tideflow.store.base import HistoryEntry
from tideflow.testing.harness import CoreHarness
from tideflow.worker.executors.registry import ExecutorRegistry
from tideflow.worker.pool import WorkerPool
from tideflow.worker.process import start_verdict

RELEASE: list[asyncio.Event] = []
"""The event the blocker waits on: a new one per test, since an event belongs to the loop
it was first awaited in (each test has its own, asyncio's or uvloop)."""
ENTERED: list[str] = []


@register("drain_test_blocker")
async def blocker(name: str) -> str:
    ENTERED.append(name)
    await RELEASE[0].wait()
    return name


def task(run_id: str) -> DispatchTask:
    return DispatchTask(
        run_id=run_id,
        step_key="s",
        step_id="s",
        type="python",
        config={"function": "drain_test_blocker"},
        input={"name": run_id},
        attempt=1,
        idempotency_key=f"{run_id}:s",
        timeout=None,
    )


def pool(bus: LocalBus, *, concurrency: int, prefetch: int) -> WorkerPool:
    ids = itertools.count()
    return WorkerPool(
        bus,
        ExecutorRegistry(),
        concurrency=concurrency,
        prefetch=prefetch,
        clock=time.time,
        new_event_id=lambda: f"e{next(ids)}",
    )


async def until(check, what: str, timeout: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not check():
        assert asyncio.get_running_loop().time() < deadline, what
        await asyncio.sleep(0.005)


async def test_drain_hands_back_what_waits_and_what_outlives_the_grace():
    ENTERED.clear()
    RELEASE[:] = [asyncio.Event()]
    bus = LocalBus(lease=30)
    await bus.open()
    first = pool(bus, concurrency=1, prefetch=2)
    first.start()
    await bus.publish_tasks([task("r1"), task("r2")])
    await until(lambda: ENTERED == ["r1"] and first.running == 2, "one runs, one waits")
    assert await first.drain(0.05) == 1  # r1 still running after the grace

    second = pool(bus, concurrency=2, prefetch=2)
    events = bus.consume_events(max_batch=100)
    second.start()
    await until(lambda: sorted(ENTERED) == ["r1", "r1", "r2"], "both come again")
    RELEASE[0].set()
    starts: list[TaskStarted] = []
    async with asyncio.timeout(5):
        async for batch in events:
            starts += [e for e in batch.events if isinstance(e, TaskStarted)]
            await batch.ack()
            if {e.run_id for e in starts} == {"r1", "r2"}:
                break
    await events.aclose()
    deliveries = {e.run_id: e.delivery for e in starts}
    assert deliveries["r1"] == 2
    assert deliveries["r2"] >= 2  # the draining pool may take it once more, and hand it back
    await second.close()
    await bus.close()


def entry(event: dict, transitions: list[dict]) -> HistoryEntry:
    return HistoryEntry(run_id="r", seq=1, time=0.0, kind="x", event=event, transitions=transitions)


def test_a_durable_start_is_known_by_its_event_or_made_moot_by_the_history():
    mine = TaskStarted(event_id="me", run_id="r", time=0.0, step_key="s", attempt=2)
    dispatched = entry(
        {"event_id": "d"},
        [
            {
                "subject": "s",
                "old": "pending",
                "new": "running",
                "attempt": 2,
                "cause": "attempt 2 dispatched",
            },
        ],
    )
    assert start_verdict([dispatched], mine) is None  # not applied yet
    assert start_verdict([dispatched, entry({"event_id": "me"}, [])], mine) is True
    other = entry(
        {"event_id": "o"},
        [
            {
                "subject": "s",
                "old": "running",
                "new": "running",
                "attempt": 2,
                "cause": "attempt 2 started by h/9",
            },
        ],
    )
    assert start_verdict([dispatched, other], mine) is False
    ended = entry(
        {"event_id": "c"},
        [
            {"subject": "run", "old": "running", "new": "cancelled", "attempt": None, "cause": "x"},
        ],
    )
    assert start_verdict([dispatched, ended], mine) is False


def test_a_durable_start_in_a_retried_run_is_judged_by_its_own_round():
    """Round 0's attempt 1 started and the run timed out; the operator retried: round 1's
    attempt 1 may start (round 0's start and end say nothing about it), round 0's may
    not (the run was retried since)."""
    history: list[HistoryEntry] = []

    def record(event: Event, decision: Decision) -> None:
        if decision.changed:  # what the store keeps of it
            history.append(
                HistoryEntry(
                    run_id=event.run_id,
                    seq=len(history) + 1,
                    time=event.time,
                    kind=codec.event_kind(event),
                    event=codec.event_to_data(event),
                    transitions=[codec.transition_to_data(t) for t in decision.transitions],
                )
            )

    plan = compile_definition(
        "name: t\nversion: '1'\ntimeout: 1m\nsteps: [{id: s, type: noop, idempotent: false}]\n"
    )
    h = CoreHarness(plan, auto_start=False, on_decision=record)
    h.start()
    h.started("s")
    h.advance(60)
    h.retry()
    assert h.state.retries == 1 and h.tasks["s"].round == 1
    common = {"run_id": h.run_id, "time": h.now, "step_key": "s", "attempt": 1}
    mine = TaskStarted(event_id="me", **common, round=1)
    late = TaskStarted(event_id="late", **common, round=0)
    assert start_verdict(history, mine) is None  # not applied yet
    assert start_verdict(history, late) is False  # the run was retried since
    h.apply(mine)
    assert start_verdict(history, mine) is True
    assert start_verdict(history, TaskStarted(event_id="again", **common, round=1)) is False
