"""A worker remembers a cancel for an attempt it does not hold (its task is dropped when
it comes), and matches it by round: a retried run numbers its attempts from 1 again, so
a cancel remembered for round 0's attempt 1 must not drop round 1's, whichever of the
control channel and the task queue reaches the worker first; and by compensation: a
step's compensation numbers its attempts apart from its action. What a worker reports
about an attempt names its round too."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time

from tideflow.bus.backends.local import LocalBus
from tideflow.bus.base import CancelAttempt
from tideflow.model.commands import DispatchTask
from tideflow.model.events import Event, TaskCompleted, TaskStarted
from tideflow.worker.executors.functions import register
from tideflow.worker.executors.registry import ExecutorRegistry
from tideflow.worker.pool import WorkerPool


def task(step_key: str, *, round: int) -> DispatchTask:
    return DispatchTask(
        run_id="r",
        step_key=step_key,
        step_id=step_key,
        type="noop",
        config={},
        input=None,
        attempt=1,
        idempotency_key=f"r:{step_key}",
        timeout=None,
        round=round,
    )


async def until(check, what: str, timeout: float = 5.0) -> None:  # type: ignore[no-untyped-def]
    deadline = asyncio.get_running_loop().time() + timeout
    while not check():
        assert asyncio.get_running_loop().time() < deadline, what
        await asyncio.sleep(0.005)


async def test_a_remembered_cancel_drops_only_the_task_of_its_own_round() -> None:
    bus = LocalBus(lease=30)
    await bus.open()
    ids = itertools.count()
    pool = WorkerPool(
        bus,
        ExecutorRegistry(),
        concurrency=2,
        clock=time.time,
        new_event_id=lambda: f"e{next(ids)}",
    )
    pool.start()
    await bus.publish_control(CancelAttempt(run_id="r", step_key="old", attempt=1))  # round 0
    await bus.publish_control(CancelAttempt(run_id="r", step_key="new", attempt=1, round=1))
    await until(lambda: len(pool._cancelled) == 2, "both cancels are remembered")
    # after the retry, round 1's tasks come: "new" was cancelled in round 1, "old" only
    # in round 0; "new" goes first on the queue, so it is settled when "old" is done
    await bus.publish_tasks([task("new", round=1), task("old", round=1)])
    outcomes: list[Event] = []
    async with contextlib.aclosing(bus.consume_events(max_batch=100)) as events:
        async with asyncio.timeout(5):
            async for batch in events:
                outcomes += [e for e in batch.events if not isinstance(e, TaskStarted)]
                await batch.ack()
                if outcomes:
                    break
    assert [(type(e), e.step_key) for e in outcomes] == [(TaskCompleted, "old")]  # type: ignore[attr-defined]
    async with asyncio.timeout(5):  # "new" was dropped and acknowledged, "old" acknowledged
        while sum(s.depth + s.held for s in await bus.queue_stats()):  # noqa: ASYNC110
            await asyncio.sleep(0.005)
    assert len(pool._cancelled) == 1  # round 0's cancel stays (bounded), harmless
    await pool.close()
    await bus.close()


RELEASE: list[asyncio.Event] = []
"""The event the blocker waits on: a new one per test, since an event belongs to the loop
it was first awaited in (each test has its own, asyncio's or uvloop)."""
ENTERED: list[int] = []


@register("cancels_test_blocker")
async def blocker(round: int) -> int:
    ENTERED.append(round)
    await RELEASE[0].wait()
    return round


async def test_a_late_cancel_of_an_earlier_round_leaves_the_running_attempt_alone() -> None:
    """What made the race certain once outcomes were gathered: the cancel of round 0's
    attempt 1 reached the worker after round 1's attempt 1 had started, and stopped it."""
    ENTERED.clear()
    RELEASE[:] = [asyncio.Event()]
    bus = LocalBus(lease=30)
    await bus.open()
    ids = itertools.count()
    pool = WorkerPool(
        bus,
        ExecutorRegistry(),
        concurrency=2,
        clock=time.time,
        new_event_id=lambda: f"e{next(ids)}",
    )
    pool.start()
    running = DispatchTask(
        run_id="r",
        step_key="s",
        step_id="s",
        type="python",
        config={"function": "cancels_test_blocker"},
        input={"round": 1},
        attempt=1,
        idempotency_key="r:s",
        timeout=None,
        round=1,
    )
    await bus.publish_tasks([running])
    await until(lambda: ENTERED == [1], "round 1's attempt runs")
    await bus.publish_control(CancelAttempt(run_id="r", step_key="s", attempt=1))  # round 0
    await until(lambda: len(pool._cancelled) == 1, "the cancel came and was remembered")
    assert pool.running == 1
    RELEASE[0].set()
    outcomes: list[Event] = []
    async with contextlib.aclosing(bus.consume_events(max_batch=100)) as events:
        async with asyncio.timeout(5):
            async for batch in events:
                outcomes += [e for e in batch.events if not isinstance(e, TaskStarted)]
                await batch.ack()
                if outcomes:
                    break
    assert [(type(e), e.output) for e in outcomes] == [(TaskCompleted, 1)]  # type: ignore[attr-defined]
    await pool.close()
    await bus.close()


def compensation(step_key: str) -> DispatchTask:
    return DispatchTask(
        run_id="r",
        step_key=step_key,
        step_id=step_key,
        type="noop",
        config={},
        input=None,
        attempt=1,
        idempotency_key=f"r:{step_key}:compensate",
        timeout=None,
        compensation=True,
    )


async def outcomes_of(bus: LocalBus, count: int) -> list[Event]:
    """The next ``count`` outcomes the workers report (starts too, when they are sent on
    their own, in ``starts``)."""
    seen: list[Event] = []
    async with contextlib.aclosing(bus.consume_events(max_batch=100)) as events:
        async with asyncio.timeout(5):
            async for batch in events:
                seen += batch.events
                await batch.ack()
                if sum(not isinstance(e, TaskStarted) for e in seen) >= count:
                    return seen
    return seen


async def test_a_remembered_cancel_of_an_action_attempt_leaves_the_compensation_alone() -> None:
    """A step's compensation numbers its attempts apart from its action: a cancel of the
    action's attempt 1 that came after it had finished (remembered, since no task is there
    to stop) must not drop the compensation's attempt 1 when the run is compensated."""
    bus = LocalBus(lease=30)
    await bus.open()
    ids = itertools.count()
    pool = WorkerPool(
        bus,
        ExecutorRegistry(),
        concurrency=2,
        clock=time.time,
        new_event_id=lambda: f"e{next(ids)}",
    )
    pool.start()
    await bus.publish_control(CancelAttempt(run_id="r", step_key="a", attempt=1))
    await bus.publish_control(CancelAttempt(run_id="r", step_key="b", attempt=1, compensation=True))
    await until(lambda: len(pool._cancelled) == 2, "both cancels are remembered")
    # "b"'s compensation was cancelled, "a"'s action only: "b" goes first on the queue
    await bus.publish_tasks([compensation("b"), compensation("a")])
    events = await outcomes_of(bus, 1)
    done = [e for e in events if isinstance(e, TaskCompleted)]
    assert [(e.step_key, e.compensation) for e in done] == [("a", True)]
    await pool.close()
    await bus.close()


GATE: dict[str, asyncio.Event] = {}
GATE_ENTERED: list[int] = []


@register("cancels_test_gate")
async def gate(round: int) -> int:
    GATE_ENTERED.append(round)
    await GATE["open"].wait()
    return round


async def test_what_a_worker_reports_about_an_attempt_names_its_round() -> None:
    """Round 0's attempt 1 of a step still running when round 1's attempt 1 comes (the
    operator retried the run meanwhile): each start and outcome says which round it is."""
    GATE_ENTERED.clear()
    GATE["open"] = asyncio.Event()
    bus = LocalBus(lease=30)
    await bus.open()
    ids = itertools.count()
    pool = WorkerPool(
        bus,
        ExecutorRegistry(),
        concurrency=2,
        clock=time.time,
        new_event_id=lambda: f"e{next(ids)}",
    )
    pool.start()
    attempts = [
        DispatchTask(
            run_id="r",
            step_key="s",
            step_id="s",
            type="python",
            config={"function": "cancels_test_gate"},
            input={"round": round_},
            attempt=1,
            idempotency_key="r:s",
            timeout=None,
            round=round_,
        )
        for round_ in (0, 1)
    ]
    await bus.publish_tasks(attempts)
    await until(lambda: sorted(GATE_ENTERED) == [0, 1], "both rounds' attempts run")
    await asyncio.sleep(0.05)  # their starts go out on their own
    GATE["open"].set()
    events = await outcomes_of(bus, 2)
    starts = sorted(e.round for e in events if isinstance(e, TaskStarted))
    assert starts == [0, 1]
    ends = sorted((e.round, e.output) for e in events if isinstance(e, TaskCompleted))
    assert ends == [(0, 0), (1, 1)]
    await pool.close()
    await bus.close()
