"""Retries, timeouts, deadlines, on_error, run timeout, cancel and saga compensation."""

from __future__ import annotations

import pytest

from tideflow.core.retry import backoff_delay
from tideflow.model.plan import Backoff, RetryPolicy

HEAD = """
name: t
version: "1"
"""


def test_retry_exponential_until_success(harness):
    h = harness(
        HEAD
        + """
steps:
  - id: a
    type: noop
    retry: {max_attempts: 3, backoff: exponential, initial_delay: 1s, multiplier: 2}
"""
    )
    h.fail("a")
    assert h.step_status("a") == "retrying"
    assert list(h.timers.values()) == [h.now + 1]
    h.advance(1)
    assert h.tasks["a"].attempt == 2
    h.fail("a")
    assert list(h.timers.values()) == [h.now + 2]
    h.advance(2)
    h.complete("a", "ok")
    assert h.status == "succeeded"
    assert h.state.steps["a"].attempts == 3


def test_retry_exhaustion_fails_the_run(harness):
    h = harness(HEAD + "steps: [{id: a, type: noop, retry: {max_attempts: 2, backoff: 1s}}]\n")
    h.fail("a")
    h.advance(1)
    h.fail("a", "ValueError", "still bad")
    assert h.status == "failed"
    assert h.state.error.type == "ValueError"
    assert h.state.steps["a"].attempts == 2


def test_non_retryable_error_is_not_retried(harness):
    h = harness(HEAD + "steps: [{id: a, type: noop, retry: {max_attempts: 5}}]\n")
    h.fail("a", "HttpClientError", retryable=False)
    assert h.status == "failed"
    assert h.state.steps["a"].attempts == 1


def test_retry_on_limits_which_errors_retry(harness):
    h = harness(
        HEAD + "steps: [{id: a, type: noop, retry: {max_attempts: 5, retry_on: [TimeoutError]}}]\n"
    )
    h.fail("a", "TimeoutError")
    assert h.step_status("a") == "retrying"
    h.advance(60)
    h.fail("a", "KeyError")
    assert h.step_status("a") == "failed"


@pytest.mark.parametrize(
    ("backoff", "expected"),
    [
        (Backoff.FIXED, [2, 2, 2, 2]),
        (Backoff.LINEAR, [2, 4, 6, 8]),
        (Backoff.EXPONENTIAL, [2, 6, 10, 10]),
    ],
)
def test_backoff_maths_with_max_delay(backoff, expected):
    policy = RetryPolicy(
        max_attempts=9, backoff=backoff, initial_delay=2, multiplier=3, max_delay=10
    )
    assert [backoff_delay(policy, n, seed=1) for n in (1, 2, 3, 4)] == expected


def test_jitter_is_deterministic_per_seed_and_bounded():
    policy = RetryPolicy(max_attempts=9, initial_delay=8, multiplier=1, jitter=True, max_delay=8)
    delays = {backoff_delay(policy, 1, seed) for seed in range(50)}
    assert all(4 <= d <= 8 for d in delays)
    assert len(delays) > 10
    assert backoff_delay(policy, 1, 99) == backoff_delay(policy, 1, 99)


def test_attempt_timeout_fails_the_attempt_and_cancels_the_task(harness):
    h = harness(
        HEAD + "steps: [{id: a, type: noop, timeout: 5s, retry: {max_attempts: 2, backoff: 1s}}]\n"
    )
    h.advance(5)
    assert ("a", 1) in h.cancelled_tasks
    assert h.step_status("a") == "retrying"
    assert h.state.steps["a"].error.type == "TimeoutError"
    h.advance(1)
    h.complete("a", "late but fine")
    assert h.status == "succeeded"


def test_late_completion_of_a_timed_out_attempt_is_ignored(harness):
    h = harness(HEAD + "steps: [{id: a, type: noop, timeout: 5s}]\n")
    stale = h.tasks["a"]
    h.advance(5)
    assert h.status == "failed"
    from tideflow.model.events import TaskCompleted

    decision = h.apply(
        TaskCompleted(
            event_id="late",
            run_id=h.run_id,
            time=h.now,
            step_key="a",
            attempt=stale.attempt,
            output=1,
        )
    )
    assert decision.commands == [] and decision.transitions == []


def test_deadline_stops_retries(harness):
    h = harness(
        HEAD
        + """
steps:
  - {id: a, type: noop, deadline: 10s, retry: {max_attempts: 10, backoff: fixed, initial_delay: 4s}}
"""
    )
    h.fail("a")
    h.advance(4)
    h.fail("a")
    h.advance(4)
    h.fail("a")  # the next retry would start at t+12 > deadline
    assert h.step_status("a") == "failed"
    assert h.state.steps["a"].attempts == 3


def test_deadline_timer_fails_a_running_step(harness):
    h = harness(HEAD + "steps: [{id: a, type: noop, deadline: 10s}]\n")
    h.advance(10)
    assert h.state.steps["a"].error.type == "DeadlineExceeded"
    assert ("a", 1) in h.cancelled_tasks


def test_on_error_continue_lets_dependents_run_and_see_the_failure(harness):
    h = harness(
        HEAD
        + """
steps:
  - {id: a, type: noop, on_error: continue}
  - {id: b, type: noop, depends_on: [a], input: {status: "{{ steps.a.status }}", err: "{{ steps.a.error.type }}"}}
"""
    )
    h.fail("a", "ValueError")
    assert h.step_status("a") == "failed"
    assert h.tasks["b"].input == {"status": "failed", "err": "ValueError"}
    h.complete("b")
    assert h.status == "succeeded"


def test_on_error_fail_cancels_running_siblings(harness):
    h = harness(
        HEAD
        + "steps: [{id: a, type: noop}, {id: b, type: noop}, {id: c, type: noop, depends_on: [a, b]}]\n"
    )
    h.fail("a")
    assert h.status == "failed"
    assert h.step_status("b") == "cancelled"
    assert h.step_status("c") == "cancelled"
    assert ("b", 1) in h.cancelled_tasks


def test_run_timeout(harness):
    h = harness(HEAD + "timeout: 1m\nsteps: [{id: a, type: noop}]\n")
    h.advance(60)
    assert h.status == "timed_out"
    assert h.step_status("a") == "cancelled"
    assert h.finished[-1].status == "timed_out"


def test_cancel_run(harness):
    h = harness(
        HEAD + "steps: [{id: a, type: noop}, {id: w, type: wait, signal: go, timeout: 1h}]\n"
    )
    h.cancel()
    assert h.status == "cancelled"
    assert h.step_status("a") == "cancelled"
    assert h.step_status("w") == "cancelled"
    assert h.timers == {}
    assert h.cancel().transitions == []


SAGA = (
    HEAD
    + """
on_failure: compensate
steps:
  - id: reserve
    type: noop
    input: {sku: "{{ inputs.sku }}"}
    compensate: {type: noop, input: {undo: "{{ steps.reserve.output.hold }}", sku: "{{ steps.reserve.input.sku }}"}}
  - id: charge
    type: noop
    depends_on: [reserve]
    compensate: {type: noop, input: {refund: "{{ steps.charge.output }}"}, retry: {max_attempts: 2, backoff: 1s}}
  - {id: audit, type: noop, depends_on: [reserve]}
  - {id: ship, type: noop, depends_on: [charge, audit]}
"""
)


def test_saga_compensates_completed_steps_in_reverse_completion_order(harness):
    h = harness(SAGA, {"sku": "X"})
    h.complete("reserve", {"hold": "H1"})
    h.complete("audit")  # no compensate declared
    h.complete("charge", "P1")
    h.fail("ship")
    assert h.status == "compensating"
    assert h.outstanding() == ["charge:compensate"]
    assert h.tasks["charge:compensate"].input == {"refund": "P1"}
    h.complete("charge", compensation=True)
    assert h.outstanding() == ["reserve:compensate"]
    assert h.tasks["reserve:compensate"].input == {"undo": "H1", "sku": "X"}
    h.complete("reserve", compensation=True)
    assert h.status == "compensated"
    assert h.state.error.type == "RuntimeError"


def test_compensation_that_fails_ends_compensation_failed_after_the_rest_ran(harness):
    h = harness(SAGA, {"sku": "X"})
    h.complete("reserve", {"hold": "H1"})
    h.complete("audit")
    h.complete("charge", "P1")
    h.fail("ship")
    h.fail("charge", compensation=True)
    h.advance(1)
    h.fail("charge", compensation=True)
    assert h.outstanding() == ["reserve:compensate"]
    h.complete("reserve", compensation=True)
    assert h.status == "compensation_failed"
    assert h.state.compensation.failed == ["charge"]
    assert h.state.compensation.results["charge"]["attempts"] == 2


def test_step_on_error_compensate_triggers_saga_without_run_level_setting(harness):
    h = harness(
        HEAD
        + """
steps:
  - {id: a, type: noop, compensate: {type: noop}}
  - {id: b, type: noop, depends_on: [a], on_error: compensate}
"""
    )
    h.complete("a")
    h.fail("b")
    assert h.status == "compensating"
    h.complete("a", compensation=True)
    assert h.status == "compensated"


def test_failure_without_compensation_requested_just_fails(harness):
    h = harness(
        HEAD
        + "steps: [{id: a, type: noop, compensate: {type: noop}}, {id: b, type: noop, depends_on: [a]}]\n"
    )
    h.complete("a")
    h.fail("b")
    assert h.status == "failed"
    assert not any(t.compensation for t in h.dispatched)


def test_duplicate_events_change_nothing(harness):
    h = harness(HEAD + "steps: [{id: a, type: noop}, {id: w, type: wait, signal: go}]\n")
    first = h.complete("a", 1)
    assert first.transitions
    again = h.apply(h.events[-1])
    assert again.transitions == [] and again.commands == []
    h.signal("go", {"x": 1}, event_id="sig-1")
    assert h.status == "succeeded"
    assert h.signal("go", {"x": 2}, event_id="sig-1").transitions == []
    assert h.apply(h.events[0]).transitions == []


def test_a_retry_blocked_by_the_deadline_reports_deadline_exceeded(harness):
    h = harness(
        HEAD
        + "steps: [{id: a, type: noop, deadline: 5s, retry: {max_attempts: 5, backoff: 10s}}]\n"
    )
    h.fail("a", "ValueError", "nope")
    error = h.state.steps["a"].error
    assert error.type == "DeadlineExceeded"
    assert "ValueError: nope" in error.message


def test_a_step_that_succeeds_after_retries_reports_no_error(harness):
    h = harness(HEAD + "steps: [{id: a, type: noop, retry: {max_attempts: 2, backoff: 1s}}]\n")
    h.fail("a", "ValueError")
    assert h.state.steps["a"].error.type == "ValueError"
    h.advance(1)
    h.complete("a", 1)
    assert h.state.steps["a"].error is None
    assert any("ValueError" in t.cause for t in h.transitions if t.subject == "a")


def test_cancel_with_on_failure_compensate_undoes_completed_steps_then_ends_cancelled(harness):
    h = harness(SAGA, {"sku": "X"})
    h.complete("reserve", {"hold": "H1"})
    h.complete("charge", "P1")
    h.cancel()
    assert h.status == "compensating"
    assert h.step_status("audit") == "cancelled"
    assert ("audit", 1) in h.cancelled_tasks
    assert h.outstanding() == ["charge:compensate"]
    h.fail("charge", compensation=True)  # its own retry policy: 2 attempts, 1s apart
    h.advance(1)
    h.complete("charge", compensation=True)
    assert h.outstanding() == ["reserve:compensate"]
    h.complete("reserve", compensation=True)
    assert h.status == "cancelled"
    assert h.state.error.type == "Cancelled"
    assert h.finished[-1].status == "cancelled"
    assert h.state.compensation.results["charge"]["attempts"] == 2
    assert [t.new for t in h.transitions if t.subject == "run"] == [
        "running",
        "compensating",
        "cancelled",
    ]
    assert h.cancel().transitions == []


def test_cancel_whose_compensation_gives_up_ends_compensation_failed(harness):
    h = harness(SAGA, {"sku": "X"})
    h.complete("reserve", {"hold": "H1"})
    h.cancel()
    h.fail("reserve", compensation=True, retryable=False)
    assert h.status == "compensation_failed"
    assert h.state.error.type == "Cancelled"


def test_cancel_while_compensating_changes_nothing(harness):
    h = harness(SAGA, {"sku": "X"})
    h.complete("reserve", {"hold": "H1"})
    h.cancel()
    assert h.status == "compensating"
    decision = h.cancel()
    assert decision.transitions == [] and decision.commands == [] and not decision.changed


def test_cancel_with_nothing_completed_to_undo_just_ends_cancelled(harness):
    h = harness(SAGA, {"sku": "X"})
    h.cancel()
    assert h.status == "cancelled"
    assert h.state.compensation is None


def test_run_timeout_with_on_failure_compensate_compensates_then_ends_timed_out(harness):
    h = harness(
        SAGA.replace("on_failure: compensate", "on_failure: compensate\ntimeout: 1m"), {"sku": "X"}
    )
    h.complete("reserve", {"hold": "H1"})
    h.advance(60)
    assert h.status == "compensating"
    h.complete("reserve", compensation=True)
    assert h.status == "timed_out"
    assert h.state.error.type == "TimeoutError"
