"""Saga compensation: undo completed steps in reverse completion order.

When a run fails with compensation requested (run ``on_failure: compensate`` or a
step's ``on_error: compensate``), or is cancelled or times out under run
``on_failure: compensate``, every step instance that *succeeded* and
declares ``compensate`` is undone, one at a time, most recent first. Each
compensation has its own retry policy and timeout, and sees the step it undoes
as ``steps.<id>`` (its input and output). A compensation that exhausts its
retries is recorded and the remaining ones still run (leaving fewer effects
behind); the run then ends ``compensation_failed`` for an operator to look at.

A compensation attempt's clocks work as an action attempt's do (``attempts``): its
``timeout`` counts from the worker's start (``TaskStarted`` with ``compensation``), not
from its dispatch, so a compensation dispatched with no worker running (``runs cancel``
on a store no engine drives) cannot time out before it ran. A started attempt whose
execution is lost (``TaskLost``) is dispatched again under the same attempt number.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tideflow.core.attempts import started_cause
from tideflow.core.retry import engine_error, retry_delay, stable_seed
from tideflow.core.tasks import cancel_task, compensation_subject, compensation_task
from tideflow.core.timers import arm, disarm, timer_id
from tideflow.errors import ExpressionEvaluationError
from tideflow.model.commands import DispatchTask
from tideflow.model.events import (
    ErrorInfo,
    TaskCompleted,
    TaskFailed,
    TaskLost,
    TaskStarted,
)
from tideflow.model.plan import Plan
from tideflow.model.run import CompensationState, RunState, TimerRef
from tideflow.model.states import RunStatus

if TYPE_CHECKING:
    from tideflow.core.decide import Decider

_WHAT = "compensation attempt"


def start(d: Decider, ends: RunStatus = RunStatus.COMPENSATED) -> None:
    """Compensate every completed step; the run then ends ``ends`` (``compensated`` after
    a failure, ``cancelled`` / ``timed_out`` after a cancel or timeout), or
    ``compensation_failed`` when a compensation gave up."""
    d.set_run(RunStatus.COMPENSATING, f"compensating {len(d.state.compensable)} completed step(s)")
    d.state.compensation = CompensationState(
        queue=list(reversed(d.state.compensable)), ends=ends.value
    )
    _next(d)


def _record(d: Decider, key: str, new: str, cause: str, attempt: int | None = None) -> None:
    comp = d.state.compensation
    assert comp is not None
    d.record(
        compensation_subject(key), comp.results.get(key, {}).get("status"), new, cause, attempt
    )
    entry = comp.results.setdefault(key, {"status": new, "attempts": 0, "error": None})
    entry["status"] = new
    if attempt is not None:
        entry["attempts"] = attempt


def _next(d: Decider) -> None:
    comp = d.state.compensation
    assert comp is not None
    while True:
        key = comp.current
        if key is None:
            _finish(d)
            return
        comp.attempt = 0
        if _dispatch(d, key):
            return


def _dispatch(d: Decider, key: str) -> bool:
    """Dispatch the next attempt of ``key``'s compensation; False if it failed to start.
    Its timeout waits for the worker's start."""
    comp = d.state.compensation
    assert comp is not None
    try:
        task = compensation_task(d.plan, d.state, key, comp.attempt + 1, d.now)
    except ExpressionEvaluationError as exc:
        _give_up(d, key, engine_error("ExpressionError", exc.message))
        return False
    comp.attempt += 1
    comp.started_at = None
    _record(d, key, "running", f"compensation attempt {comp.attempt} dispatched", comp.attempt)
    d.commands.append(task)
    return True


def running_compensation(plan: Plan, state: RunState, now: float) -> DispatchTask | None:
    """The compensation attempt dispatched but not started, if any (recovery sends it
    again; a started one is lost: see ``lost_compensation``)."""
    comp = state.compensation
    key = _running_key(state)
    if comp is None or key is None or comp.started_at is not None:
        return None
    try:
        return compensation_task(plan, state, key, comp.attempt, now)
    except ExpressionEvaluationError:
        return None


def lost_compensation(state: RunState) -> tuple[str, int, float] | None:
    """(step key, attempt, start) of the compensation attempt a worker started and that
    has no outcome, if any."""
    comp = state.compensation
    key = _running_key(state)
    if comp is None or key is None or comp.started_at is None:
        return None
    return key, comp.attempt, comp.started_at


def _running_key(state: RunState) -> str | None:
    comp = state.compensation
    if comp is None or state.status is not RunStatus.COMPENSATING:
        return None
    key = comp.current
    if key is None or comp.results.get(key, {}).get("status") != "running":
        return None
    return key


def _give_up(d: Decider, key: str, error: ErrorInfo) -> None:
    comp = d.state.compensation
    assert comp is not None
    _record(d, key, "failed", f"{error.type}: {error.message}", comp.attempt or None)
    comp.results[key]["error"] = error.to_dict()
    comp.failed.append(key)
    comp.index += 1


def _active(d: Decider, key: str, attempt: int) -> bool:
    comp = d.state.compensation
    return (
        comp is not None
        and d.state.status is RunStatus.COMPENSATING
        and comp.current == key
        and comp.attempt == attempt
        and comp.results.get(key, {}).get("status") == "running"
    )


def on_started(d: Decider, event: TaskStarted) -> None:
    """A worker started the current attempt: its timeout counts from now."""
    comp = d.state.compensation
    if not _active(d, event.step_key, event.attempt) or comp is None:
        return
    if comp.started_at is not None:
        return  # stale, or a duplicate: the first start counts
    _started(d, event.step_key, d.now, event.worker)


def _started(d: Decider, key: str, at: float, worker: str) -> None:
    comp = d.state.compensation
    assert comp is not None
    comp.started_at = at
    _record(d, key, "running", started_cause(_WHAT, comp.attempt, worker), comp.attempt)
    action = d.plan.specs[d.state.steps[key].step_id].compensate
    if action is not None and action.timeout is not None:
        arm(d, "compensation_timeout", d.state.steps[key], at + action.timeout, comp.attempt)


def on_lost(d: Decider, event: TaskLost) -> None:
    """A started attempt's execution is gone: dispatch it again, same attempt and key."""
    comp = d.state.compensation
    key = event.step_key
    if not _active(d, key, event.attempt) or comp is None or comp.started_at is None:
        return
    if event.started_at is not None and event.started_at != comp.started_at:
        return  # the loss of an earlier execution, delivered again: this one is live
    _drop_timers(d, key)
    comp.started_at = None
    cause = f"compensation attempt {comp.attempt} started but its execution was lost"
    _record(d, key, "running", f"{cause} ({event.reason}): dispatched again", comp.attempt)
    try:
        d.commands.append(compensation_task(d.plan, d.state, key, comp.attempt, d.now))
    except ExpressionEvaluationError as exc:
        _give_up(d, key, engine_error("ExpressionError", exc.message))
        _next(d)


def on_completed(d: Decider, event: TaskCompleted) -> None:
    if not _active(d, event.step_key, event.attempt):
        return
    comp = d.state.compensation
    assert comp is not None
    _ended(d, event)
    _record(d, event.step_key, "succeeded", "compensation completed", event.attempt)
    comp.index += 1
    _next(d)


def on_failed(d: Decider, event: TaskFailed) -> None:
    if not _active(d, event.step_key, event.attempt):
        return
    _ended(d, event)
    _attempt_failed(d, event.step_key, event.error, event.seed)


def _ended(d: Decider, event: TaskCompleted | TaskFailed) -> None:
    """Record the start an outcome carries (one the worker did not report on its own),
    then stop the attempt's clocks."""
    comp = d.state.compensation
    assert comp is not None
    if event.started_at is not None and comp.started_at is None:
        comp.started_at = event.started_at
        cause = started_cause(_WHAT, comp.attempt, event.worker)
        _record(d, event.step_key, "running", cause, comp.attempt)
    _drop_timers(d, event.step_key)


def _attempt_failed(d: Decider, key: str, error: ErrorInfo, seed: int) -> None:
    comp = d.state.compensation
    assert comp is not None
    action = d.plan.specs[d.state.steps[key].step_id].compensate
    assert action is not None
    delay = retry_delay(action.retry, error, comp.attempt, seed)
    if delay is not None:
        _record(
            d,
            key,
            "retrying",
            f"attempt {comp.attempt} failed: {error.type}: {error.message}",
            comp.attempt,
        )
        arm(d, "compensation_retry", d.state.steps[key], d.now + delay, comp.attempt)
        return
    _give_up(d, key, error)
    _next(d)


def on_timer(d: Decider, ref: TimerRef) -> None:
    comp = d.state.compensation
    st = d.state.steps.get(ref.step_key)
    if comp is None or st is None or comp.current != ref.step_key or comp.attempt != ref.attempt:
        return
    status = comp.results.get(ref.step_key, {}).get("status")
    if ref.kind == "compensation_retry" and status == "retrying":
        if not _dispatch(d, ref.step_key):
            _next(d)
    elif ref.kind == "compensation_timeout" and status == "running":
        d.commands.append(cancel_task(d.state, ref.step_key, ref.attempt, compensation=True))
        action = d.plan.specs[st.step_id].compensate
        limit = action.timeout if action is not None else None
        error = engine_error(
            "TimeoutError",
            f"compensation attempt {ref.attempt} exceeded its timeout of {limit}s (counted "
            "from when a worker started it)",
            retryable=True,
        )
        _attempt_failed(
            d, ref.step_key, error, stable_seed(d.state.run_id, ref.step_key, "c", str(ref.attempt))
        )


def _drop_timers(d: Decider, key: str) -> None:
    st = d.state.steps[key]
    attempt = d.state.compensation.attempt if d.state.compensation is not None else 0
    for kind in ("compensation_timeout", "compensation_retry"):
        disarm(d, st, timer_id(kind, key, attempt))


def _finish(d: Decider) -> None:
    comp = d.state.compensation
    assert comp is not None
    if comp.failed:
        d.finish_run(
            RunStatus.COMPENSATION_FAILED,
            f"compensation failed for: {', '.join(comp.failed)} (an operator must look)",
        )
    else:
        d.finish_run(RunStatus(comp.ends), f"{len(comp.queue)} compensation(s) succeeded")
