"""An attempt's clocks: `timeout` from the worker's start, `schedule_to_start` from the
dispatch; lost executions and `idempotent: false` (pure core, no runtime)."""

from __future__ import annotations

from tideflow.core.resume import lost_events, resume_commands
from tideflow.core.retry import may_retry
from tideflow.model.commands import CancelTask, DispatchTask, StartTimer
from tideflow.model.events import ErrorInfo
from tideflow.model.plan import RetryPolicy
from tideflow.model.states import STEP_TRANSITIONS, StepStatus

HEAD = 'name: t\nversion: "1"\n'


def test_the_timeout_counts_from_the_start_not_from_the_dispatch(harness):
    h = harness(HEAD + "steps: [{id: a, type: noop, timeout: 5s}]\n", auto_start=False)
    assert h.timers == {}  # dispatched: no clock runs yet
    h.advance(3600)  # an hour queued (no engine, no worker): nothing times out
    assert h.step_status("a") == "running"
    h.started("a")
    assert h.timers == {"attempt_timeout:a:1": h.now + 5}
    assert h.state.steps["a"].attempt_started_at == h.now
    h.advance(4.9)
    h.complete("a", "ok")
    assert h.status == "succeeded"
    assert h.state.steps["a"].output == "ok"


def test_a_started_attempt_still_times_out_after_its_timeout(harness):
    h = harness(HEAD + "steps: [{id: a, type: noop, timeout: 5s}]\n", auto_start=False)
    h.advance(100)
    h.started("a")
    h.advance(5)
    assert h.step_status("a") == "failed"
    assert h.state.steps["a"].error.type == "TimeoutError"
    assert ("a", 1) in h.cancelled_tasks


def test_a_signal_recorded_without_an_engine_then_a_late_resume_succeeds(harness):
    """The issue's scenario: a signal unlocks a step with a 5s timeout while no engine
    runs; an hour later a resume re-dispatches it and it finishes in 1s."""
    h = harness(
        HEAD
        + "steps:\n  - {id: ask, type: wait, signal: go}\n"
        + "  - {id: act, type: noop, timeout: 5s, depends_on: [ask]}\n",
        auto_start=False,
    )
    h.signal("go")
    assert h.step_status("act") == "running"
    h.now += 3600
    commands = resume_commands(h.plan, h.state, h.now)
    assert [c.step_key for c in commands if isinstance(c, DispatchTask)] == ["act"]
    assert not [c for c in commands if isinstance(c, StartTimer)]
    assert lost_events(h.plan, h.state, h.now) == []
    h.started("act")
    h.advance(1)
    h.complete("act")
    assert h.status == "succeeded"
    started = [t for t in h.transitions if t.subject == "act" and t.old == t.new == "running"]
    assert [t.cause for t in started] == ["attempt 1 started by test-worker"]


def test_a_duplicate_or_stale_start_changes_nothing(harness):
    h = harness(
        HEAD + "steps: [{id: a, type: noop, timeout: 5s, retry: {max_attempts: 2, backoff: 1s}}]\n",
        auto_start=False,
    )
    first = h.started("a")
    assert first.changed
    fire_at = h.timers["attempt_timeout:a:1"]
    h.now += 2
    again = h.started("a")
    assert not again.changed and again.transitions == [] and again.commands == []
    assert h.timers["attempt_timeout:a:1"] == fire_at  # the first start counts
    old_start = h.events[-1]
    h.fail("a")
    h.advance(1)  # attempt 2 dispatched
    stale = h.apply(old_start)
    assert not stale.changed
    assert h.state.steps["a"].attempt_started_at is None
    h.complete("a")
    assert not h.started("a").changed  # the step has ended


def test_schedule_to_start_fails_an_attempt_no_worker_took_and_it_is_retried(harness):
    h = harness(
        HEAD
        + "steps: [{id: a, type: noop, timeout: 5s, schedule_to_start: 30s, "
        + "retry: {max_attempts: 2, backoff: 1s}}]\n",
        auto_start=False,
    )
    assert h.timers == {"schedule_to_start:a:1": h.now + 30}
    h.advance(30)
    assert ("a", 1) in h.cancelled_tasks
    assert h.step_status("a") == "retrying"
    assert h.state.steps["a"].error.type == "ScheduleToStartTimeout"
    h.advance(1)
    assert h.tasks["a"].attempt == 2
    h.advance(29)
    h.started("a")  # in time: the queue clock stops, the timeout starts
    assert set(h.timers) == {"attempt_timeout:a:2"}
    h.advance(4)
    h.complete("a")
    assert h.status == "succeeded"


def test_schedule_to_start_without_retries_fails_the_step(harness):
    h = harness(HEAD + "steps: [{id: a, type: noop, schedule_to_start: 1m}]\n", auto_start=False)
    h.advance(60)
    assert h.step_status("a") == "failed"
    assert h.state.error.type == "ScheduleToStartTimeout"
    assert "within 60.0s of its dispatch" in h.state.error.message


def test_deadlines_still_count_from_when_the_step_began(harness):
    h = harness(
        HEAD + "steps: [{id: a, type: noop, timeout: 1h, deadline: 10s}]\n", auto_start=False
    )
    h.advance(10)  # never started: the deadline does not wait for a worker
    assert h.step_status("a") == "failed"
    assert h.state.steps["a"].error.type == "DeadlineExceeded"


def test_a_completion_without_a_start_is_still_accepted(harness):
    h = harness(HEAD + "steps: [{id: a, type: noop, schedule_to_start: 1m}]\n", auto_start=False)
    h.complete("a", 1)
    assert h.status == "succeeded"
    assert h.timers == {}


def test_a_lost_idempotent_attempt_is_dispatched_again_and_times_out_from_its_new_start(harness):
    h = harness(HEAD + "steps: [{id: a, type: noop, timeout: 5s}]\n", auto_start=False)
    h.started("a")
    h.now += 600  # the process died; recovery ten minutes later
    (lost,) = lost_events(h.plan, h.state, h.now)
    assert (lost.step_key, lost.attempt) == ("a", 1)
    assert not [c for c in resume_commands(h.plan, h.state, h.now) if isinstance(c, StartTimer)]
    before = len(h.dispatched)
    decision = h.apply(lost)
    (again,) = h.dispatched[before:]
    assert again.attempt == 1 and again.idempotency_key == "run-1:a"
    assert h.timers == {} and h.state.steps["a"].attempt_started_at is None
    assert "execution was lost" in decision.transitions[0].cause
    assert not h.apply(lost).changed  # the same loss reported twice
    h.started("a")
    assert h.timers == {"attempt_timeout:a:1": h.now + 5}
    h.complete("a")
    assert h.status == "succeeded"


def test_a_lost_started_attempt_of_a_non_idempotent_step_fails_with_outcome_unknown(harness):
    h = harness(
        HEAD + "steps: [{id: pay, type: noop, idempotent: false, retry: {max_attempts: 3}}]\n",
        auto_start=False,
    )
    h.started("pay")
    (lost,) = lost_events(h.plan, h.state, h.now)
    before = len(h.dispatched)
    h.apply(lost)
    assert h.dispatched[before:] == []  # not run again blindly, retries or not
    assert h.step_status("pay") == "failed"
    error = h.state.steps["pay"].error
    assert error.type == "StepOutcomeUnknown"
    assert "idempotent: false" in error.message
    assert h.status == "failed"


def test_outcome_unknown_is_retried_when_retry_on_names_it(harness):
    h = harness(
        HEAD
        + "steps: [{id: pay, type: noop, idempotent: false, "
        + "retry: {max_attempts: 2, backoff: 1s, retry_on: [StepOutcomeUnknown]}}]\n",
        auto_start=False,
    )
    h.started("pay")
    h.lost("pay")
    assert h.step_status("pay") == "retrying"
    h.advance(1)
    assert h.tasks["pay"].attempt == 2 and not h.tasks["pay"].idempotent


def test_a_lost_attempt_that_never_started_is_dispatched_again_even_if_not_idempotent(harness):
    h = harness(
        HEAD + "steps: [{id: pay, type: noop, idempotent: false}]\n",
        auto_start=False,
    )
    assert lost_events(h.plan, h.state, h.now) == []
    (task,) = [c for c in resume_commands(h.plan, h.state, h.now) if isinstance(c, DispatchTask)]
    assert (task.step_key, task.attempt, task.idempotent) == ("pay", 1, False)
    assert not h.lost("pay").changed  # nothing ran, nothing was lost


def test_recovery_queues_a_dispatched_attempt_again_from_now():
    from tests.unit.core.conftest import plan_of

    from tideflow.testing.harness import CoreHarness

    h = CoreHarness(
        plan_of(HEAD + "steps: [{id: a, type: noop, schedule_to_start: 30s}]\n"), auto_start=False
    )
    h.start()
    h.now += 3600
    (timer,) = [c for c in resume_commands(h.plan, h.state, h.now) if isinstance(c, StartTimer)]
    assert (timer.timer_id, timer.fire_at) == ("schedule_to_start:a:1", h.now + 30)


def test_only_a_retry_on_that_names_it_retries_an_opt_in_error():
    error = ErrorInfo(type="StepOutcomeUnknown", message="?", only_if_named=True)
    assert not may_retry(RetryPolicy(max_attempts=3), error, 1)
    assert not may_retry(RetryPolicy(max_attempts=3, retry_on=("TimeoutError",)), error, 1)
    assert may_retry(RetryPolicy(max_attempts=3, retry_on=("StepOutcomeUnknown",)), error, 1)


def test_started_is_a_fact_on_the_running_state_in_the_table():
    assert StepStatus.RUNNING in STEP_TRANSITIONS[StepStatus.RUNNING]
    for status, targets in STEP_TRANSITIONS.items():
        if status is not StepStatus.RUNNING:
            assert status not in targets


def test_cancel_while_queued_cancels_the_task(harness):
    h = harness(HEAD + "steps: [{id: a, type: noop, schedule_to_start: 1m}]\n", auto_start=False)
    decision = h.cancel()
    assert CancelTask(run_id="run-1", step_key="a", attempt=1) in decision.commands
    assert h.timers == {}


def test_an_outcome_that_carries_its_start_records_it(harness):
    from tideflow.model.events import TaskCompleted

    h = harness(HEAD + "steps: [{id: a, type: noop, timeout: 5s}]\n", auto_start=False)
    decision = h.apply(
        TaskCompleted(
            event_id="done",
            run_id="run-1",
            time=h.now + 1,
            step_key="a",
            attempt=1,
            output=3,
            started_at=h.now + 0.5,
            worker="w1",
        )
    )
    moves = [(t.old, t.new, t.cause) for t in decision.transitions if t.subject == "a"]
    assert moves[:2] == [
        ("running", "running", "attempt 1 started by w1"),
        ("running", "succeeded", "task completed"),
    ]
    assert h.state.steps["a"].attempt_started_at == h.now + 0.5
    assert h.timers == {} and h.status == "succeeded"


def _redelivered(h, key, worker, delivery):
    from tideflow.model.events import TaskStarted

    task = h._task(key, False)
    return h.apply(
        TaskStarted(
            **h._common(), step_key=key, attempt=task.attempt, worker=worker, delivery=delivery
        )
    )


def test_a_start_of_a_redelivered_task_is_recorded_not_dropped(harness):
    """A worker died holding the task (its lease expired): the bus delivers it again and
    the next worker's start says so in the history; the first start's clock counts."""
    h = harness(HEAD + "steps: [{id: a, type: noop, timeout: 5s}]\n", auto_start=False)
    h.started("a", "host/1")
    fire_at = h.timers["attempt_timeout:a:1"]
    h.now += 2
    again = _redelivered(h, "a", "host/2", 2)
    assert again.changed and again.commands == []
    (fact,) = again.transitions
    assert (fact.subject, fact.old, fact.new, fact.attempt) == ("a", "running", "running", 1)
    assert "started again by host/2" in fact.cause and "lease_expired" in fact.cause
    assert h.timers["attempt_timeout:a:1"] == fire_at
    h.complete("a", "ok")
    assert h.status == "succeeded"


def test_a_redelivered_start_of_a_non_idempotent_step_changes_nothing(harness):
    """Its durable start is refused (the pool then reports the execution lost)."""
    h = harness(HEAD + "steps: [{id: a, type: noop, idempotent: false}]\n", auto_start=False)
    h.started("a", "host/1")
    assert not _redelivered(h, "a", "host/2", 2).changed
    h.lost("a")
    assert h.step_status("a") == "failed"
    assert h.state.steps["a"].error.type == "StepOutcomeUnknown"


def test_a_redelivered_start_that_the_bus_delivers_twice_is_recorded_once(harness):
    """The bus is at least once: the start of delivery 2 may come twice (the deterministic
    simulation found it applied twice, one event id twice in the history). The first
    delivery's start coming late changes nothing either; a third delivery is news."""
    h = harness(HEAD + "steps: [{id: a, type: noop}]\n", auto_start=False)
    h.started("a", "host/1")
    assert _redelivered(h, "a", "host/2", 2).changed
    assert not _redelivered(h, "a", "host/2", 2).changed
    assert not _redelivered(h, "a", "host/1", 1).changed
    assert _redelivered(h, "a", "host/3", 3).changed
    h.complete("a", "ok")
    assert h.status == "succeeded"


def test_the_first_start_reported_may_be_a_redelivery_and_its_copy_is_a_duplicate(harness):
    """The first delivery's start never got out (its worker died): delivery 2 starts the
    attempt, and the same event delivered again is a duplicate, not a restart."""
    h = harness(HEAD + "steps: [{id: a, type: noop}]\n", auto_start=False)
    assert _redelivered(h, "a", "host/2", 2).changed
    assert not _redelivered(h, "a", "host/2", 2).changed


def test_a_loss_delivered_again_after_the_attempt_started_anew_changes_nothing(harness):
    """At least once: recovery's TaskLost came twice, the second copy after the attempt
    it re-dispatched had started again; it took that live execution for lost and
    dispatched the attempt a third time (the deterministic simulation found it: one event
    id twice in a run's history)."""
    h = harness(HEAD + "steps: [{id: a, type: noop}]\n", auto_start=False)
    h.started("a")
    h.now += 600
    (lost,) = lost_events(h.plan, h.state, h.now)
    assert lost.started_at == h.state.steps["a"].attempt_started_at
    assert h.apply(lost).changed
    h.now += 1
    h.started("a")
    before = len(h.dispatched)
    assert not h.apply(lost).changed
    assert h.dispatched[before:] == []
    h.complete("a", "ok")
    assert h.status == "succeeded"
