"""What to redo for a run that a process was driving when it stopped.

Pure like ``decide``: from the durable state alone it lists the commands that
put the run back in motion — every armed timer, every attempt whose result was
never recorded (re-dispatched with the same attempt number and idempotency
key), a running compensation, a sync child run (started again idempotently),
and the start of a run that was created but never started.
"""

from __future__ import annotations

from tideflow.core import saga
from tideflow.core import steps as kinds
from tideflow.errors import ExpressionEvaluationError
from tideflow.model.commands import Command, StartChildRun, StartTimer
from tideflow.model.plan import Plan
from tideflow.model.run import RunState
from tideflow.model.states import StepStatus


def resume_commands(plan: Plan, state: RunState, now: float) -> list[Command]:
    if state.is_terminal:
        return []
    out: list[Command] = [
        StartTimer(run_id=state.run_id, timer_id=timer_id, fire_at=ref.fire_at)
        for timer_id, ref in state.timers.items()
    ]
    for st in state.steps.values():
        if st.status is not StepStatus.RUNNING:
            continue
        spec = plan.specs[st.step_id]
        if spec.is_action:
            try:
                config = kinds.render_config(plan, state, st, now)
            except ExpressionEvaluationError:
                config = {}
            out.append(kinds.action_task(plan, state.run_id, st, config))
        elif spec.subflow is not None and st.child_run_id and spec.subflow.mode == "sync":
            out.append(
                StartChildRun(
                    run_id=state.run_id,
                    step_key=st.key,
                    child_run_id=st.child_run_id,
                    workflow=spec.subflow.workflow,
                    version=spec.subflow.version,
                    input=st.input,
                    wait=True,
                )
            )
    task = saga.running_compensation(plan, state, now)
    if task is not None:
        out.append(task)
    return out
