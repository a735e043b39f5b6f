"""What to redo for a run that a process was driving when it stopped.

Pure like ``decide``: from the durable state alone it lists the commands that
put the run back in motion — every armed timer, every attempt that was dispatched
but never started (re-dispatched with the same attempt number and idempotency
key; its ``schedule_to_start`` counts again from now, its ``timeout`` from its new
start), a compensation attempt dispatched but never started (the same), a sync
child run (started again idempotently), and the start of a run that was created but
never started.

An attempt (or compensation attempt) that a worker *started* but whose outcome was
never recorded is not re-dispatched here: ``lost_events`` names it, and the runtime
applies that ``TaskLost`` event, so that ``decide`` records what happens next
(dispatched again, or ``StepOutcomeUnknown`` for an ``idempotent: false`` step).
"""

from __future__ import annotations

from tideflow.core import saga
from tideflow.core.tasks import action_task, child_run, compensation_subject, render_config
from tideflow.core.timers import timer_id
from tideflow.errors import ExpressionEvaluationError
from tideflow.model.commands import Command, StartTimer
from tideflow.model.events import TaskLost
from tideflow.model.plan import Plan
from tideflow.model.run import RunState, StepState
from tideflow.model.states import StepStatus


def lost_attempts(plan: Plan, state: RunState) -> list[StepState]:
    """The step instances whose current attempt a worker started but that have no outcome."""
    if state.is_terminal:
        return []
    return [
        st
        for st in state.steps.values()
        if st.status is StepStatus.RUNNING
        and st.attempt_started_at is not None
        and plan.specs[st.step_id].is_action
    ]


def lost_events(plan: Plan, state: RunState, now: float) -> list[TaskLost]:
    """A ``TaskLost`` for each started attempt without an outcome (``lost_attempts`` and
    the compensation in flight). The id names the start it follows, so a second recovery
    before the first one's event is applied reports the same loss."""
    lost = [
        (st.key, st.attempts, st.attempt_started_at, False) for st in lost_attempts(plan, state)
    ]
    compensation = saga.lost_compensation(state)
    if compensation is not None:
        lost.append((*compensation, True))
    return [
        TaskLost(
            event_id=f"{state.run_id}:{compensation_subject(key) if comp else key}:{attempt}"
            f":lost@{started!r}",
            run_id=state.run_id,
            time=now,
            step_key=key,
            attempt=attempt,
            reason="the process running it stopped before reporting an outcome",
            compensation=comp,
            round=state.retries,
            started_at=started,
        )
        for key, attempt, started, comp in lost
    ]


def resume_commands(plan: Plan, state: RunState, now: float) -> list[Command]:
    if state.is_terminal:
        return []
    lost = {timer_id("attempt_timeout", st.key, st.attempts) for st in lost_attempts(plan, state)}
    timers = {tid: ref.fire_at for tid, ref in state.timers.items() if tid not in lost}
    out: list[Command] = []
    for st in state.steps.values():
        if st.status is not StepStatus.RUNNING:
            continue
        spec = plan.specs[st.step_id]
        if spec.is_action and st.attempt_started_at is not None:
            continue  # lost: see lost_attempts
        if spec.is_action:
            queued = timer_id("schedule_to_start", st.key, st.attempts)
            if queued in timers and spec.schedule_to_start is not None:
                timers[queued] = now + spec.schedule_to_start  # queued again from now
            # the timeout counts from the start (a state written before TaskStarted existed
            # may hold one armed at dispatch)
            timers.pop(timer_id("attempt_timeout", st.key, st.attempts), None)
            try:
                config = render_config(spec, state, st, now)
            except ExpressionEvaluationError:
                config = {}
            out.append(action_task(plan, state, st, config))
        elif spec.subflow is not None and st.child_run_id and spec.subflow.mode == "sync":
            out.append(child_run(plan, state.run_id, st))
    task = saga.running_compensation(plan, state, now)
    if task is not None:  # its timeout counts from its start (a state written before
        # compensation starts were reported may hold one armed at dispatch)
        timers.pop(timer_id("compensation_timeout", task.step_key, task.attempt), None)
        out.append(task)
    armed: list[Command] = [
        StartTimer(run_id=state.run_id, timer_id=timer_id, fire_at=fire_at)
        for timer_id, fire_at in timers.items()
    ]
    return armed + out
