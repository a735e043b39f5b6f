"""resume_commands: what a restarted runtime redoes, derived from the state alone."""

from __future__ import annotations

from tideflow.core.resume import resume_commands
from tideflow.model.commands import DispatchTask, StartChildRun, StartTimer

HEAD = 'name: t\nversion: "1"\n'


def test_attempts_not_started_are_redispatched_with_the_same_attempt_and_key(harness):
    h = harness(
        HEAD
        + "steps: [{id: a, type: noop, retry: {max_attempts: 3, backoff: 1s}}, {id: b, type: noop}]\n",
        auto_start=False,
    )
    h.fail("a")
    h.advance(1)
    commands = resume_commands(h.plan, h.state, h.now)
    tasks = {c.step_key: c for c in commands if isinstance(c, DispatchTask)}
    assert set(tasks) == {"a", "b"}
    assert tasks["a"].attempt == 2
    assert tasks["a"].idempotency_key == h.tasks["a"].idempotency_key


def test_timers_are_rearmed_and_waits_need_nothing(harness):
    h = harness(
        HEAD
        + "steps: [{id: s, type: sleep, duration: 1h}, {id: w, type: wait, signal: go, timeout: 2h}]\n"
    )
    commands = resume_commands(h.plan, h.state, h.now)
    assert sorted(c.fire_at - h.now for c in commands if isinstance(c, StartTimer)) == [3600, 7200]
    assert not [c for c in commands if isinstance(c, DispatchTask)]


def test_a_compensation_not_started_and_a_sync_child_are_resumed(harness):
    h = harness(
        HEAD
        + "on_failure: compensate\nsteps:\n"
        + "  - {id: a, type: noop, compensate: {type: noop, input: {undo: '{{ steps.a.output }}'}}}\n"
        + "  - {id: b, type: noop, depends_on: [a]}\n",
        auto_start=False,
    )
    h.complete("a", "A1")
    h.fail("b")
    (task,) = [c for c in resume_commands(h.plan, h.state, h.now) if isinstance(c, DispatchTask)]
    assert task.compensation
    assert task.input == {"undo": "A1"}
    assert task.attempt == h.tasks["a:compensate"].attempt

    h = harness(HEAD + "steps: [{id: c, type: subflow, workflow: other, input: {x: 1}}]\n")
    (child,) = [c for c in resume_commands(h.plan, h.state, h.now) if isinstance(c, StartChildRun)]
    assert child.child_run_id == h.children["c"].child_run_id
    assert child.input == {"x": 1}


def test_a_finished_run_needs_nothing(harness):
    h = harness(HEAD + "steps: [{id: a, type: noop}]\n")
    h.complete("a")
    assert resume_commands(h.plan, h.state, h.now) == []
