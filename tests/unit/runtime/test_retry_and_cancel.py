"""`Runtime.retry` and `Runtime.cancel` on a real runtime: workers, store, history."""

from __future__ import annotations

import asyncio
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tideflow.bus.backends.local import LocalBus
from tideflow.bus.base import CancelAttempt
from tideflow.dsl import compile_definition
from tideflow.errors import RunNotRetryable
from tideflow.model.events import ErrorInfo, Event, TaskCompleted, TaskFailed, TaskStarted
from tideflow.runtime.runtime import Runtime
from tideflow.testing.waiting import step_is, wait_until
from tideflow.worker.executors.functions import register, unregister

CALLS: list[str] = []
BROKEN = {"charge": True}


@pytest.fixture(autouse=True)
def functions() -> Iterator[None]:
    CALLS.clear()
    BROKEN["charge"] = True

    @register("rc.reserve")
    def reserve() -> dict[str, str]:
        CALLS.append("reserve")
        return {"hold": "H1"}

    @register("rc.charge")
    def charge() -> str:
        CALLS.append("charge")
        if BROKEN["charge"]:
            raise ConnectionError("payments down")
        return "C1"

    @register("rc.release")
    def release(hold: str) -> None:
        CALLS.append(f"release:{hold}")

    yield
    for name in ("rc.reserve", "rc.charge", "rc.release"):
        unregister(name)


FLAKY = compile_definition(
    textwrap.dedent(
        """
        name: flaky
        version: "1"
        steps:
          - {id: reserve, type: python, function: rc.reserve}
          - {id: charge, type: python, function: rc.charge, depends_on: [reserve]}
          - {id: after, type: set, values: {done: true}, depends_on: [charge]}
        output: "{{ steps.charge.output }}"
        """
    )
)

SAGA = compile_definition(
    textwrap.dedent(
        """
        name: saga
        version: "1"
        on_failure: compensate
        steps:
          - id: reserve
            type: python
            function: rc.reserve
            compensate:
              type: python
              function: rc.release
              input: {hold: "{{ steps.reserve.output.hold }}"}
          - {id: ask, type: wait, signal: go, depends_on: [reserve]}
        """
    )
)


async def test_retry_reruns_the_failed_step_only_and_is_in_the_history() -> None:
    async with Runtime() as rt:
        failed = await rt.run(FLAKY)
        assert failed.status == "failed"
        BROKEN["charge"] = False
        status = await rt.retry(failed.run_id, "payments are back")
        assert status == "running"
        done = await rt.wait(failed.run_id, timeout=10)
        history = await rt.history(failed.run_id)
    assert done.status == "succeeded"
    assert done.output == "C1"
    assert done.steps["after"].status == "succeeded"
    assert CALLS == ["reserve", "charge", "charge"]
    retried = [e for e in history if e.kind == "run_retried"]
    assert len(retried) == 1
    assert any(t["old"] == "failed" and t["new"] == "running" for t in retried[0].transitions)


async def test_retry_of_a_run_that_did_not_fail_is_a_clear_error() -> None:
    async with Runtime() as rt:
        BROKEN["charge"] = False
        result = await rt.run(FLAKY)
        before = len(await rt.history(result.run_id))
        with pytest.raises(RunNotRetryable, match="is succeeded: only a failed or timed-out"):
            await rt.retry(result.run_id)
        assert len(await rt.history(result.run_id)) == before


async def test_a_run_failed_in_one_runtime_is_retried_by_another_on_sqlite(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path / 'runs.db'}"
    async with Runtime(store=store) as first:
        failed = await first.run(FLAKY)
    assert failed.status == "failed"
    BROKEN["charge"] = False
    async with Runtime(store=store) as second:
        await second.retry(failed.run_id)
        done = await second.wait(failed.run_id, timeout=10)
    assert done.status == "succeeded"
    async with Runtime(store=store, workers=0) as third:  # replayed from the store
        again = await third.result(failed.run_id)
    assert again.status == "succeeded" and again.output == "C1"
    assert CALLS == ["reserve", "charge", "charge"]


async def test_cancel_compensates_completed_steps_and_reports_the_outcome() -> None:
    async with Runtime() as rt:
        run_id = await rt.start_run(SAGA)
        await wait_until(rt, run_id, step_is("ask", "waiting"))
        assert await rt.cancel(run_id, "order withdrawn") == "running"
        result = await rt.wait(run_id, timeout=10)
        history = await rt.history(run_id)
        # a cancel of a run that has ended returns its status and records nothing
        assert await rt.cancel(run_id) == "cancelled"
        assert len(await rt.history(run_id)) == len(history)
    assert result.status == "cancelled"
    assert result.error is not None and "order withdrawn" in result.error["message"]
    assert result.compensation == {
        "outcome": "compensated",
        "steps": {"reserve": {"status": "succeeded", "attempts": 1, "error": None}},
    }
    assert result.to_dict()["compensation"]["outcome"] == "compensated"
    assert CALLS == ["reserve", "release:H1"]
    run_moves = [t["new"] for e in history for t in e.transitions if t["subject"] == "run"]
    assert run_moves == ["running", "compensating", "cancelled"]


class GatheringBus(LocalBus):
    """The in-process bus, with the worker settling attempts in batches as it does on a
    broker (which made the race a remembered cancel had with a retry certain)."""

    batching_pays = True


@pytest.mark.parametrize("bus", [LocalBus, GatheringBus])
async def test_a_retried_step_runs_even_if_its_cancelled_attempt_was_remembered(
    bus: type[LocalBus],
) -> None:
    async with Runtime(bus=bus()) as rt:
        failed = await rt.run(FLAKY)
        # the race the pool remembers: a cancel for an attempt that had already finished
        await rt.bus.publish_control(
            CancelAttempt(run_id=failed.run_id, step_key="charge", attempt=1)
        )
        BROKEN["charge"] = False
        await rt.retry(failed.run_id)
        done = await rt.wait(failed.run_id, timeout=10)
    assert done.status == "succeeded"


GATE: dict[str, asyncio.Event] = {}


@pytest.fixture
def gated_charge() -> Iterator[list[int]]:
    """``rc.gated`` fails its first call (round 0), then waits for ``GATE["open"]``; the
    list counts the calls."""
    GATE["open"] = asyncio.Event()
    entered: list[int] = []

    @register("rc.gated")
    async def gated() -> str:
        entered.append(len(entered))
        if len(entered) == 1:
            raise ConnectionError("payments down")  # round 0: the run fails
        await GATE["open"].wait()
        return "C1"

    yield entered
    unregister("rc.gated")


GATED = compile_definition(
    textwrap.dedent(
        """
        name: gated
        version: "1"
        steps:
          - {id: charge, type: python, function: rc.gated}
        output: "{{ steps.charge.output }}"
        """
    )
)


@pytest.mark.parametrize("late", ["completed", "failed", "started"])
async def test_a_late_outcome_of_round_0_after_a_retry_is_not_taken_for_round_1s(
    gated_charge: list[int], late: str
) -> None:
    """A worker that still ran round 0's attempt 1 when the operator retried reports it
    after round 1's attempt 1 started: that report changes nothing, round 1's outcome is
    the step's."""
    async with Runtime() as rt:
        failed = await rt.run(GATED)
        assert failed.status == "failed"
        await rt.retry(failed.run_id)
        await wait_until(
            rt, failed.run_id, lambda s: s.steps["charge"].attempt_started_at is not None
        )
        assert len(gated_charge) == 2  # round 1's attempt 1 runs
        common = {"event_id": f"late-{late}", "run_id": failed.run_id, "time": time.time()}
        attempt = {"step_key": "charge", "attempt": 1, "round": 0}
        event: Event
        if late == "completed":
            event = TaskCompleted(**common, **attempt, output="from round 0")
        elif late == "failed":
            event = TaskFailed(**common, **attempt, error=ErrorInfo(type="E", message="round 0"))
        else:
            event = TaskStarted(**common, **attempt, worker="old/1", delivery=2)
        await rt.bus.publish_events([event])
        GATE["open"].set()  # round 1's outcome comes after the late one
        done = await rt.wait(failed.run_id, timeout=10)
        history = await rt.history(failed.run_id)
    assert done.status == "succeeded" and done.output == "C1"
    assert f"late-{late}" not in [entry.event.get("event_id") for entry in history]


async def test_a_remembered_cancel_of_a_finished_action_does_not_drop_its_compensation() -> None:
    """The cancel of the action's attempt 1 came after that attempt had finished (the race
    the pool remembers); the compensation's attempt 1 is not that attempt: it runs."""
    async with Runtime() as rt:
        run_id = await rt.start_run(SAGA)
        await wait_until(rt, run_id, step_is("ask", "waiting"))
        await rt.bus.publish_control(CancelAttempt(run_id=run_id, step_key="reserve", attempt=1))
        await rt.cancel(run_id, "order withdrawn")
        result = await rt.wait(run_id, timeout=10)
    assert result.status == "cancelled"
    assert result.compensation is not None and result.compensation["outcome"] == "compensated"
    assert CALLS == ["reserve", "release:H1"]
