"""A compensation attempt's `timeout` counts from the worker's start, as an action
attempt's does; recovery re-dispatches one not started and reports one started as lost
(pure core, no runtime)."""

from __future__ import annotations

from tideflow.core.resume import lost_events, resume_commands
from tideflow.model.codec import state_from_data, state_to_data
from tideflow.model.commands import CancelTask, DispatchTask, StartTimer
from tideflow.model.events import TaskCompleted

SAGA = """
name: t
version: "1"
on_failure: compensate
steps:
  - id: book
    type: noop
    compensate: {type: noop, timeout: 5s, retry: {max_attempts: 2, backoff: 1s}}
  - {id: wait, type: wait, signal: never, depends_on: [book]}
"""

TIMEOUT = "compensation_timeout:book:1"


def _cancelled_with_no_worker(harness):  # type: ignore[no-untyped-def]
    h = harness(SAGA, auto_start=False)
    h.started("book")
    h.complete("book", "B1")
    h.cancel()  # `runs cancel` with no engine: the compensation is only dispatched
    assert h.status == "compensating"
    assert h.outstanding() == ["book:compensate"]
    return h


def test_a_compensation_timeout_waits_for_the_start(harness):
    h = _cancelled_with_no_worker(harness)
    assert TIMEOUT not in h.timers  # no clock runs while it is only queued
    h.advance(3600)
    assert h.state.compensation.results["book"]["status"] == "running"
    h.started("book", compensation=True)
    assert h.timers[TIMEOUT] == h.now + 5
    assert h.state.compensation.started_at == h.now
    h.advance(4)
    h.complete("book", compensation=True)
    assert h.status == "cancelled"
    assert h.state.compensation.results["book"] == {
        "status": "succeeded",
        "attempts": 1,
        "error": None,
    }
    facts = [
        t.cause
        for t in h.transitions
        if t.subject == "book:compensate" and t.old == t.new == "running"
    ]
    assert facts == ["compensation attempt 1 started by test-worker"]


def test_a_compensation_that_times_out_is_cancelled_as_a_compensation(harness):
    """The cancel says it is the compensation's attempt 1, not the action's attempt 1:
    a worker tells them apart by it."""
    h = _cancelled_with_no_worker(harness)
    h.started("book", compensation=True)
    decision = h.fire(TIMEOUT)
    cancels = [c for c in decision.commands if isinstance(c, CancelTask)]
    assert cancels == [CancelTask(run_id=h.run_id, step_key="book", attempt=1, compensation=True)]


def test_a_started_compensation_still_times_out(harness):
    h = _cancelled_with_no_worker(harness)
    h.started("book", compensation=True)
    h.advance(5)
    assert ("book", 1) in h.cancelled_tasks
    assert h.state.compensation.results["book"]["status"] == "retrying"
    h.advance(1)  # the retry: attempt 2, whose clock waits for its own start
    assert h.tasks["book:compensate"].attempt == 2
    assert "compensation_timeout:book:2" not in h.timers
    h.started("book", compensation=True)
    h.advance(5)
    assert h.status == "compensation_failed"
    assert h.state.compensation.results["book"]["attempts"] == 2


def test_an_outcome_that_carries_its_start_records_it(harness):
    h = _cancelled_with_no_worker(harness)
    task = h.tasks["book:compensate"]
    h.apply(
        TaskCompleted(
            event_id="done",
            run_id=h.run_id,
            time=h.now,
            step_key="book",
            attempt=task.attempt,
            compensation=True,
            started_at=h.now - 1,
            worker="w1",
        )
    )
    assert h.status == "cancelled"
    assert h.state.compensation.started_at == h.now - 1
    assert any(t.cause == "compensation attempt 1 started by w1" for t in h.transitions)


def test_recovery_redispatches_a_compensation_not_started_without_its_clock(harness):
    h = _cancelled_with_no_worker(harness)
    h.now += 3600
    restored = state_from_data(state_to_data(h.state))
    commands = resume_commands(h.plan, restored, h.now)
    (task,) = [c for c in commands if isinstance(c, DispatchTask)]
    assert (task.step_key, task.attempt, task.compensation) == ("book", 1, True)
    assert not [c for c in commands if isinstance(c, StartTimer)]
    assert lost_events(h.plan, restored, h.now) == []


def test_a_started_compensation_whose_execution_was_lost_runs_again(harness):
    h = _cancelled_with_no_worker(harness)
    h.started("book", compensation=True)
    h.now += 3600
    commands = resume_commands(h.plan, h.state, h.now)
    assert not [c for c in commands if isinstance(c, DispatchTask)]
    (lost,) = lost_events(h.plan, h.state, h.now)
    assert (lost.step_key, lost.attempt, lost.compensation) == ("book", 1, True)
    assert lost_events(h.plan, h.state, h.now) == [lost]  # the same loss, the same id
    dispatched = len(h.dispatched)
    h.apply(lost)
    assert TIMEOUT not in h.timers  # the clock of the lost execution stopped
    assert len(h.dispatched) == dispatched + 1
    assert h.tasks["book:compensate"].attempt == 1  # same attempt, same idempotency key
    h.apply(lost)  # applied twice: nothing more
    assert len(h.dispatched) == dispatched + 1
    h.started("book", compensation=True)
    h.advance(4)
    h.complete("book", compensation=True)
    assert h.status == "cancelled"
