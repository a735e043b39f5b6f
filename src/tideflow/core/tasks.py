"""Task construction: the ``DispatchTask`` for an attempt of an action or of a
compensation, and the ``StartChildRun`` of a subflow step, built the same way at
dispatch and on recovery.

A re-dispatch (recovery, a lost execution) sends the same attempt number and
idempotency key; its templates draw from a random stream of their own, so every
rendering of one attempt yields the same ``uuid()``s.
"""

from __future__ import annotations

from typing import Any

from tideflow.core.scope import build_scope, redraw
from tideflow.model.commands import CancelTask, DispatchTask, StartChildRun
from tideflow.model.plan import Plan, StepSpec
from tideflow.model.run import RunState, StepState


def compensation_subject(key: str) -> str:
    """The history subject (and draw instance) of step instance ``key``'s compensation."""
    return f"{key}:compensate"


def render_config(
    spec: StepSpec, state: RunState, st: StepState, now: float, scope: dict[str, Any] | None = None
) -> Any:
    """An action's config for its current attempt (``spec``: its step's); it draws from a
    stream of its own, so every attempt, and a re-dispatch on recovery, renders the same
    ``uuid()``s."""
    config = spec.config
    if config is None:
        return {}
    if config.is_constant:
        return config.render(_EMPTY)
    instance = f"{st.key}:config"
    if scope is None:
        return config.render(build_scope(state, st.scope, now, instance=instance))
    return config.render(redraw(scope, state.run_id, instance))


_EMPTY: dict[str, Any] = {}


def action_task(plan: Plan, state: RunState, st: StepState, config: Any) -> DispatchTask:
    """The task message for the current attempt of action step instance ``st``."""
    spec = plan.specs[st.step_id]
    run_id = state.run_id
    return DispatchTask(
        run_id=run_id,
        step_key=st.key,
        step_id=st.step_id,
        type=spec.type,
        config=config,
        input=st.input,
        attempt=st.attempts,
        idempotency_key=f"{run_id}:{st.key}",
        timeout=spec.timeout,
        queue=spec.queue,
        priority=spec.priority,
        sensitive=spec.sensitive,
        secrets=spec.secrets,
        idempotent=spec.idempotent,
        round=state.retries,
    )


def compensation_task(
    plan: Plan, state: RunState, key: str, attempt: int, now: float
) -> DispatchTask:
    """The task that runs attempt ``attempt`` of the compensation of step instance ``key``."""
    st = state.steps[key]
    spec = plan.specs[st.step_id]
    action = spec.compensate
    assert action is not None
    subject = compensation_subject(key)
    scope = build_scope(state, st.scope, now, instance=subject)
    return DispatchTask(
        run_id=state.run_id,
        step_key=key,
        step_id=st.step_id,
        type=action.type,
        config=action.config.render(scope),
        input=action.input.render(scope),
        attempt=attempt,
        idempotency_key=f"{state.run_id}:{subject}",
        timeout=action.timeout,
        queue=spec.queue,
        priority=spec.priority,
        compensation=True,
        secrets=spec.compensation_secrets,
        round=state.retries,
    )


def cancel_task(
    state: RunState, key: str, attempt: int, *, compensation: bool = False
) -> CancelTask:
    """The command that stops attempt ``attempt`` of step instance ``key`` (of its
    compensation when ``compensation``) in the run's current round (an attempt number
    alone is ambiguous once an operator retried)."""
    return CancelTask(
        run_id=state.run_id,
        step_key=key,
        attempt=attempt,
        round=state.retries,
        compensation=compensation,
    )


def child_run(plan: Plan, run_id: str, st: StepState) -> StartChildRun:
    """The command that starts the child run of subflow step instance ``st`` (its id and
    input already chosen: ``st.child_run_id``, ``st.input``)."""
    sub = plan.specs[st.step_id].subflow
    assert sub is not None and st.child_run_id is not None
    return StartChildRun(
        run_id=run_id,
        step_key=st.key,
        child_run_id=st.child_run_id,
        workflow=sub.workflow,
        version=sub.version,
        input=st.input,
        wait=sub.mode == "sync",
    )
