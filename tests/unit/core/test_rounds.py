"""A late report of an earlier round's attempt changes nothing.

An operator retry numbers attempts from 1 again in the next round (``RunState.retries``):
a worker that still ran round 0's attempt 1 when the run was retried (its cancel was
lost, or came too late) reports that attempt's start or outcome after round 1's attempt
1 was dispatched. The report carries its round, so the core takes it for what it is:
stale. Round 1's own reports are applied. An event of a version before rounds (no
``round``: None) is taken for the current round, as that version took it.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from tideflow.core.resume import lost_events
from tideflow.core.timers import timer_id
from tideflow.model.events import (
    AttemptEvent,
    ErrorInfo,
    TaskCompleted,
    TaskFailed,
    TaskLost,
    TaskStarted,
)
from tideflow.model.run import RunState
from tideflow.testing.harness import CoreHarness

HEAD = """
name: t
version: "1"
"""

TIMED = (
    HEAD
    + """
timeout: 1m
steps:
  - {id: a, type: noop, retry: {max_attempts: 3, backoff: 1s}}
output: "{{ steps.a.output }}"
"""
)
"""A run whose timeout passes while ``a``'s attempt 1 runs: the operator retries it."""

TIMEOUT = timer_id("attempt_timeout", "a", 1)
_ids = itertools.count(1)


def report(h: CoreHarness, kind: str, *, round: int | None, **fields: Any) -> AttemptEvent:
    """What a worker reports about ``a``'s attempt 1 of ``round``."""
    common: dict[str, Any] = {
        "event_id": f"late-{next(_ids)}",
        "run_id": h.run_id,
        "time": h.now,
        "step_key": "a",
        "attempt": 1,
        "round": round,
        **fields,
    }
    if kind == "started":
        return TaskStarted(**common, worker="old-worker/1")
    if kind == "completed":
        return TaskCompleted(**common, output="from round 0")
    if kind == "failed":
        return TaskFailed(**common, error=ErrorInfo(type="RuntimeError", message="round 0"))
    return TaskLost(**common)


def retried_while_running(harness: Any, started: bool) -> CoreHarness:
    """Round 0's attempt 1 of ``a`` started, the run timed out, the operator retried:
    round 1's attempt 1 is dispatched (and started when ``started``)."""
    h: CoreHarness = harness(TIMED, auto_start=False)
    h.started("a")
    h.advance(60)
    assert h.status == "timed_out"
    h.retry()
    assert (h.tasks["a"].attempt, h.tasks["a"].round) == (1, 1)
    if started:
        h.started("a", worker="new-worker/2")
    return h


def snapshot(state: RunState) -> tuple[Any, ...]:
    st = state.steps["a"]
    return (state.status, st.status, st.attempts, st.attempt_started_at, st.output, st.error)


@pytest.mark.parametrize("kind", ["started", "completed", "failed", "lost"])
@pytest.mark.parametrize("started", [False, True])
def test_a_late_report_of_round_0_after_a_retry_changes_nothing(harness, kind, started):
    h = retried_while_running(harness, started)
    before = snapshot(h.state)
    decision = h.apply(report(h, kind, round=0))
    assert not decision.changed
    assert decision.transitions == [] and decision.commands == []
    assert snapshot(h.state) == before
    # round 1's attempt goes on: its own start and outcome are applied
    if not started:
        assert h.started("a", worker="new-worker/2").changed
        assert h.state.steps["a"].attempt_started_at == h.now
    h.complete("a", "from round 1")
    assert h.status == "succeeded"
    assert h.state.output == "from round 1"


def test_a_late_start_of_round_0_does_not_take_the_place_of_round_1s(harness):
    """Without rounds the late start counted as round 1's: the real one was then dropped
    as a duplicate, and the timeout counted from the wrong moment."""
    h = harness(
        HEAD + "timeout: 1m\nsteps: [{id: a, type: noop, timeout: 10s}]\n", auto_start=False
    )
    h.started("a")
    h.advance(60)
    h.retry()
    h.apply(report(h, "started", round=0))
    assert TIMEOUT not in h.timers
    h.advance(5)
    h.started("a")
    assert h.timers[TIMEOUT] == h.now + 10
    assert [t.cause for t in h.transitions if t.subject == "a"][-1].startswith("attempt 1 started")


def test_a_late_lost_report_of_round_0_does_not_dispatch_round_1s_attempt_again(harness):
    h = retried_while_running(harness, started=True)
    dispatched = len(h.dispatched)
    assert not h.apply(report(h, "lost", round=0)).changed
    assert len(h.dispatched) == dispatched
    h.lost("a")  # round 1's own loss is dispatched again
    assert len(h.dispatched) == dispatched + 1
    assert (h.dispatched[-1].attempt, h.dispatched[-1].round) == (1, 1)


def test_a_report_of_a_later_round_is_stale_too(harness):
    h = harness(HEAD + "steps: [{id: a, type: noop}]\n", auto_start=False)
    assert not h.apply(report(h, "completed", round=1)).changed
    assert h.step_status("a") == "running"


def test_recovery_reports_a_lost_attempt_in_the_runs_round(harness):
    h = retried_while_running(harness, started=True)
    (lost,) = lost_events(h.plan, h.state, h.now)
    assert (lost.attempt, lost.round) == (1, 1)
    assert h.apply(lost).changed  # dispatched again


@pytest.mark.parametrize("kind", ["started", "completed", "failed", "lost"])
def test_an_event_of_a_version_before_rounds_is_taken_for_the_current_round(harness, kind):
    """A history an older version wrote for a retried run replays as it was applied: its
    task events (decoded without ``round``: None) count for the round they came in."""
    h = retried_while_running(harness, started=kind == "lost")
    assert h.apply(report(h, kind, round=None)).changed


def compensating_after_a_retry(harness: Any) -> CoreHarness:
    h: CoreHarness = harness(
        HEAD
        + "steps:\n"
        + "  - {id: a, type: noop, compensate: {type: noop, timeout: 5s}}\n"
        + "  - {id: x, type: noop, depends_on: [a]}\n"
        + "  - {id: b, type: noop, depends_on: [x], on_error: compensate}\n",
        auto_start=False,
    )
    h.started("a")
    h.complete("a")
    h.started("x")
    h.fail("x", retryable=False)
    h.retry()
    h.started("x")
    h.complete("x")
    h.started("b")
    h.fail("b", retryable=False)
    assert h.status == "compensating"
    assert (h.tasks["a:compensate"].attempt, h.tasks["a:compensate"].round) == (1, 1)
    return h


@pytest.mark.parametrize("kind", ["started", "completed", "failed", "lost"])
def test_a_compensation_report_of_an_earlier_round_changes_nothing(harness, kind):
    h = compensating_after_a_retry(harness)
    if kind == "lost":
        h.started("a", compensation=True)
    comp = h.state.compensation
    assert comp is not None
    before = (h.status, comp.attempt, comp.started_at, dict(comp.results["a"]))
    decision = h.apply(report(h, kind, round=0, compensation=True))
    assert not decision.changed
    assert (h.status, comp.attempt, comp.started_at, dict(comp.results["a"])) == before
    if kind != "lost":
        h.started("a", compensation=True)
    h.complete("a", compensation=True)
    assert h.status == "compensated"
