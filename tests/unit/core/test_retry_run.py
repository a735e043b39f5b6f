"""Operator retry (`RunRetried`): a failed or timed-out run goes on from what did not succeed."""

from __future__ import annotations

import pytest

from tideflow.core.resume import resume_commands
from tideflow.model import codec
from tideflow.model.commands import CancelTask, DispatchTask

HEAD = """
name: t
version: "1"
"""

CHAIN = (
    HEAD
    + """
steps:
  - {id: a, type: noop, retry: {max_attempts: 2, backoff: 1s}}
  - {id: b, type: noop, depends_on: [a], retry: {max_attempts: 2, backoff: 1s}}
  - {id: side, type: noop, depends_on: [a]}
  - {id: c, type: noop, depends_on: [b, side]}
  - {id: never, type: noop, depends_on: [c], when: "{{ false }}"}
"""
)


def _fail_b(h) -> None:  # type: ignore[no-untyped-def]
    h.complete("a", "A")
    h.fail("b", retryable=False)


def test_retry_runs_failed_and_cancelled_steps_again_and_keeps_completed_ones(harness):
    h = harness(CHAIN)
    _fail_b(h)
    assert h.status == "failed"
    assert h.step_status("side") == "cancelled"
    dispatched = len(h.dispatched)
    decision = h.retry("fixed the payment service")
    assert decision.changed
    assert h.status == "running"
    assert h.state.error is None
    again = [t.step_key for t in h.dispatched[dispatched:]]
    assert sorted(again) == ["b", "side"]  # `a` keeps its output and is not run again
    assert h.tasks["b"].attempt == 1  # a fresh attempt count
    h.fail("b")  # its retry policy applies afresh
    assert h.step_status("b") == "retrying"
    h.advance(1)
    h.complete("b", "B")
    h.complete("side")
    h.complete("c", "C")
    assert h.status == "succeeded"
    assert h.step_status("never") == "skipped"
    assert h.state.steps["a"].attempts == 1
    assert h.state.retries == 1
    run_moves = [(t.old, t.new) for t in h.transitions if t.subject == "run"]
    assert ("failed", "running") in run_moves
    assert any(t.subject == "b" and t.old == "failed" and t.new == "pending" for t in h.transitions)


@pytest.mark.parametrize("end", ["succeed", "cancel"])
def test_only_failed_and_timed_out_runs_can_be_retried(harness, end):
    h = harness(HEAD + "steps: [{id: a, type: noop}]\n")
    if end == "succeed":
        h.complete("a")
    else:
        h.cancel()
    before = h.status
    decision = h.retry()
    assert not decision.changed and decision.transitions == [] and decision.commands == []
    assert h.status == before


def test_a_running_run_is_not_retried(harness):
    h = harness(HEAD + "steps: [{id: a, type: noop}]\n")
    assert not h.retry().changed


def test_a_timed_out_run_retried_gets_a_fresh_run_timeout(harness):
    h = harness(
        HEAD + "timeout: 1m\nsteps: [{id: a, type: noop}, {id: b, type: noop, depends_on: [a]}]\n"
    )
    h.complete("a")
    h.advance(60)
    assert h.status == "timed_out"
    h.retry()
    assert h.status == "running"
    assert h.timers["run_timeout"] == h.now + 60
    h.complete("b")
    assert h.status == "succeeded"


def test_a_duplicate_retry_event_changes_nothing(harness):
    h = harness(CHAIN)
    _fail_b(h)
    h.retry()
    again = h.apply(h.events[-1])
    assert again.transitions == [] and again.commands == []


def test_retry_goes_on_with_the_failed_loop_iteration(harness):
    h = harness(
        HEAD
        + """
steps:
  - id: poll
    type: loop
    max_iterations: 5
    until: "{{ steps.check.output == 'done' }}"
    steps:
      - {id: fetch, type: noop}
      - {id: check, type: noop, depends_on: [fetch]}
"""
    )
    h.complete("poll@0/fetch")
    h.complete("poll@0/check", "again")
    h.complete("poll@1/fetch")
    h.fail("poll@1/check", retryable=False)
    assert h.status == "failed"
    dispatched = len(h.dispatched)
    h.retry()
    assert [t.step_key for t in h.dispatched[dispatched:]] == ["poll@1/check"]
    h.complete("poll@1/check", "done")
    assert h.status == "succeeded"
    assert h.state.steps["poll"].output == {"fetch": None, "check": "done"}


def test_retry_of_a_map_runs_only_the_items_that_did_not_succeed(harness):
    h = harness(
        HEAD
        + """
steps:
  - id: each
    type: map
    items: [1, 2, 3, 4]
    max_concurrency: 2
    step: {id: work, type: noop}
output: "{{ steps.each.output }}"
"""
    )
    h.complete("each[0]", "r0")
    h.fail("each[1]", retryable=False)  # fails the map; each[2] is running and cancelled
    assert h.status == "failed"
    assert h.step_status("each[2]") == "cancelled"
    dispatched = len(h.dispatched)
    h.retry()
    assert sorted(t.step_key for t in h.dispatched[dispatched:]) == ["each[1]", "each[2]"]
    h.complete("each[1]", "r1")
    h.complete("each[2]", "r2")
    h.complete("each[3]", "r3")
    assert h.status == "succeeded"
    assert h.state.output == ["r0", "r1", "r2", "r3"]
    assert h.state.steps["each[0]"].attempts == 1


def test_a_retried_sync_subflow_starts_a_new_child_run(harness):
    h = harness(HEAD + "steps: [{id: sub, type: subflow, workflow: child}]\n")
    first = h.children["sub"].child_run_id
    h.child_finished("sub", "failed")
    assert h.status == "failed"
    h.retry()
    second = h.children["sub"].child_run_id
    assert second != first
    h.child_finished("sub", "succeeded", {"ok": True})
    assert h.status == "succeeded"


def test_retry_replays_the_same_from_the_stored_state(harness):
    h = harness(CHAIN)
    _fail_b(h)
    h.retry()
    restored = codec.loads(codec.dumps(h.state))
    assert codec.state_to_data(restored) == codec.state_to_data(h.state)
    assert restored.retries == 1 and restored.status.value == "running"


def test_a_retried_run_names_its_attempts_and_their_cancels_by_round(harness):
    """A retry numbers attempts from 1 again: the round tells round 1's attempt 1 from
    round 0's, in its task, in its re-dispatch on recovery and in a cancel of it."""
    h = harness(HEAD + "steps: [{id: a, type: noop}]\n", auto_start=False)
    assert (h.tasks["a"].attempt, h.tasks["a"].round) == (1, 0)
    h.fail("a", retryable=False)
    h.retry()
    assert (h.tasks["a"].attempt, h.tasks["a"].round) == (1, 1)
    (again,) = [c for c in resume_commands(h.plan, h.state, h.now) if isinstance(c, DispatchTask)]
    assert (again.attempt, again.round) == (1, 1)
    cancels = [c for c in h.cancel().commands if isinstance(c, CancelTask)]
    assert cancels == [CancelTask(run_id=h.state.run_id, step_key="a", attempt=1, round=1)]


def test_a_compensation_in_a_retried_run_is_named_by_its_round(harness):
    h = harness(
        HEAD
        + "steps:\n"
        + "  - {id: a, type: noop, compensate: {type: noop}}\n"
        + "  - {id: x, type: noop, depends_on: [a]}\n"
        + "  - {id: b, type: noop, depends_on: [x], on_error: compensate}\n"
    )
    h.complete("a")
    h.fail("x", retryable=False)  # b never ran: nothing asked for compensation
    assert h.status == "failed"
    h.retry()
    h.complete("x")
    h.fail("b", retryable=False)
    assert h.status == "compensating"
    assert (h.tasks["a:compensate"].attempt, h.tasks["a:compensate"].round) == (1, 1)
