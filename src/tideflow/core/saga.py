"""Saga compensation: undo completed steps in reverse completion order.

When a run fails with compensation requested (run ``on_failure: compensate`` or a
step's ``on_error: compensate``), or is cancelled or times out under run
``on_failure: compensate``, every step instance that *succeeded* and
declares ``compensate`` is undone, one at a time, most recent first. Each
compensation has its own retry policy and timeout, and sees the step it undoes
as ``steps.<id>`` (its input and output). A compensation that exhausts its
retries is recorded and the remaining ones still run (leaving fewer effects
behind); the run then ends ``compensation_failed`` for an operator to look at.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tideflow.core.retry import backoff_delay, may_retry, stable_seed
from tideflow.core.scope import build_scope
from tideflow.errors import ExpressionEvaluationError
from tideflow.model.commands import CancelTask, DispatchTask
from tideflow.model.events import ErrorInfo, TaskCompleted, TaskFailed, Transition
from tideflow.model.plan import Plan
from tideflow.model.run import CompensationState, RunState, TimerRef
from tideflow.model.states import RunStatus

if TYPE_CHECKING:
    from tideflow.core.decide import Decider


def subject(key: str) -> str:
    """The history subject of a step's compensation."""
    return f"{key}:compensate"


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
    old = comp.results.get(key, {}).get("status")
    d.transitions.append(
        Transition(subject=subject(key), old=old, new=new, time=d.now, cause=cause, attempt=attempt)
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
    """Dispatch the next attempt of ``key``'s compensation; False if it failed to start."""
    comp = d.state.compensation
    assert comp is not None
    try:
        task = compensation_task(d.plan, d.state, key, comp.attempt + 1, d.now)
    except ExpressionEvaluationError as exc:
        _give_up(d, key, ErrorInfo(type="ExpressionError", message=exc.message, retryable=False))
        return False
    comp.attempt += 1
    _record(d, key, "running", f"compensation attempt {comp.attempt} dispatched", comp.attempt)
    d.commands.append(task)
    if task.timeout is not None:
        d.arm("compensation_timeout", d.state.steps[key], d.now + task.timeout, comp.attempt)
    return True


def compensation_task(
    plan: Plan, state: RunState, key: str, attempt: int, now: float
) -> DispatchTask:
    """The task that runs attempt ``attempt`` of the compensation of step instance ``key``."""
    st = state.steps[key]
    spec = plan.specs[st.step_id]
    action = spec.compensate
    assert action is not None
    scope = build_scope(state, st.scope, now, instance=f"{key}:compensate")
    secrets = sorted(action.config.secret_references() | action.input.secret_references())
    return DispatchTask(
        run_id=state.run_id,
        step_key=key,
        step_id=st.step_id,
        type=action.type,
        config=action.config.render(scope),
        input=action.input.render(scope),
        attempt=attempt,
        idempotency_key=f"{state.run_id}:{key}:compensate",
        timeout=action.timeout,
        queue=spec.queue,
        priority=spec.priority,
        compensation=True,
        secrets=tuple(secrets),
    )


def running_compensation(plan: Plan, state: RunState, now: float) -> DispatchTask | None:
    """The compensation attempt in flight, if any (for recovery)."""
    comp = state.compensation
    key = comp.current if comp is not None else None
    if comp is None or key is None or comp.results.get(key, {}).get("status") != "running":
        return None
    try:
        return compensation_task(plan, state, key, comp.attempt, now)
    except ExpressionEvaluationError:
        return None


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


def on_completed(d: Decider, event: TaskCompleted) -> None:
    if not _active(d, event.step_key, event.attempt):
        return
    comp = d.state.compensation
    assert comp is not None
    _drop_timers(d, event.step_key)
    _record(d, event.step_key, "succeeded", "compensation completed", event.attempt)
    comp.index += 1
    _next(d)


def on_failed(d: Decider, event: TaskFailed) -> None:
    if not _active(d, event.step_key, event.attempt):
        return
    _drop_timers(d, event.step_key)
    _attempt_failed(d, event.step_key, event.error, event.seed)


def _attempt_failed(d: Decider, key: str, error: ErrorInfo, seed: int) -> None:
    comp = d.state.compensation
    assert comp is not None
    action = d.plan.specs[d.state.steps[key].step_id].compensate
    assert action is not None
    if may_retry(action.retry, error, comp.attempt):
        delay = backoff_delay(action.retry, comp.attempt, seed)
        if error.retry_after is not None:
            delay = max(delay, error.retry_after)
        _record(
            d,
            key,
            "retrying",
            f"attempt {comp.attempt} failed: {error.type}: {error.message}",
            comp.attempt,
        )
        d.arm("compensation_retry", d.state.steps[key], d.now + delay, comp.attempt)
        return
    _give_up(d, key, error)
    _next(d)


def on_timer(d: Decider, ref: TimerRef) -> None:
    comp = d.state.compensation
    st = d.state.steps.get(ref.step_key)
    if comp is None or st is None or comp.current != ref.step_key or comp.attempt != ref.attempt:
        return
    timer_id = f"{ref.kind}:{ref.step_key}:{ref.attempt}"
    if timer_id in st.timers:
        st.timers.remove(timer_id)
    status = comp.results.get(ref.step_key, {}).get("status")
    if ref.kind == "compensation_retry" and status == "retrying":
        if not _dispatch(d, ref.step_key):
            _next(d)
    elif ref.kind == "compensation_timeout" and status == "running":
        d.commands.append(
            CancelTask(run_id=d.state.run_id, step_key=ref.step_key, attempt=ref.attempt)
        )
        error = ErrorInfo(type="TimeoutError", message="compensation attempt exceeded its timeout")
        _attempt_failed(
            d, ref.step_key, error, stable_seed(d.state.run_id, ref.step_key, "c", str(ref.attempt))
        )


def _drop_timers(d: Decider, key: str) -> None:
    st = d.state.steps[key]
    for timer_id in [t for t in st.timers if t.startswith("compensation")]:
        d.disarm(st, timer_id)


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
