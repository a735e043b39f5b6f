"""Operator retry: re-open a failed or timed-out run from the steps that did not succeed.

``RunRetried`` moves the run back to ``running``. In the top-level scope, step
instances that succeeded keep their outputs and never run again; every other
instance (failed, cancelled, skipped) goes back to ``pending`` with a fresh
attempt count and is decided anew: readiness is rebuilt by letting each
succeeded step notify its dependents once more, so a step whose `when` is still
false, or whose join still cannot be met, is skipped again. A loop that had
started resumes its current iteration the same way; a map runs again only the
items that did not succeed. Succeeded, cancelled and compensated runs cannot
be retried (``RUN_RETRYABLE``, model/states.py); a ``RunRetried`` for one changes nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tideflow.core import joins
from tideflow.core import steps as kinds
from tideflow.core.timers import arm
from tideflow.model.events import RunRetried
from tideflow.model.run import ScopeState, StepState
from tideflow.model.states import RUN_RETRYABLE, RunStatus, StepStatus

if TYPE_CHECKING:
    from tideflow.core.decide import Decider


def retry_run(d: Decider, event: RunRetried) -> None:
    state = d.state
    if state.status not in RUN_RETRYABLE:
        return
    state.retries += 1
    state.error = None
    state.output = None
    state.finished_at = None
    state.compensate_requested = False
    d.set_run(RunStatus.RUNNING, f"retried: {event.reason}")
    if d.plan.timeout is not None:  # a fresh run timeout: the old one has passed
        arm(d, "run_timeout", None, d.now + d.plan.timeout)
    top = state.scopes.get("")
    if top is None:  # failed before it started (its input was refused)
        state.started_at = d.now
        d.open_scope("", None, None, "top", {}, d.plan.graph)
    else:
        reopen_scope(d, top)


def reopen_scope(d: Decider, scope: ScopeState) -> None:
    """Run again every step instance of ``scope`` that did not succeed."""
    steps = d.state.steps
    scope.closing = False
    kept: list[str] = []
    again: list[StepState] = []
    resumed: list[StepState] = []
    for key in scope.keys:
        st = steps[key]
        if st.status is StepStatus.SUCCEEDED:
            kept.append(key)
        elif kinds.resumable(d, st):
            resumed.append(st)
        else:
            _reset(d, st)
            again.append(st)
    scope.remaining = len(again) + len(resumed)
    for st in resumed:
        kinds.resume(d, st)
    for st in again:
        if not d.plan.specs[st.step_id].depends_on:
            d.mark_ready(st, "retried")
    for key in kept:  # each dependency that succeeded tells its dependents once more
        joins.propagate(d, key)


def _reset(d: Decider, st: StepState) -> None:
    d.set_step(st, StepStatus.PENDING, "retried")
    st.attempts = 0
    st.input = st.output = st.error = None
    st.started_at = st.finished_at = st.deadline_at = None
    st.deps_done = st.deps_ok = st.deps_skipped = 0
    st.map = None
    st.iteration = 0
    st.child_run_id = None
