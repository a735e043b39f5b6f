"""What a fired timer does: time the run out, retry, time out, end a sleep or a wait,
start the next loop turn, or move a compensation on."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tideflow.core import attempts, saga
from tideflow.core import steps as kinds
from tideflow.core.retry import engine_error
from tideflow.core.scope import iso
from tideflow.core.tasks import cancel_task
from tideflow.core.timers import fired
from tideflow.model.events import TimerFired
from tideflow.model.run import StepState, TimerRef
from tideflow.model.states import RunStatus, StepStatus

if TYPE_CHECKING:
    from tideflow.core.decide import Decider

_RUNNING = StepStatus.RUNNING
_RETRYING = StepStatus.RETRYING
_WAITING = StepStatus.WAITING


def on_timer(d: Decider, event: TimerFired) -> None:
    ref = fired(d, event.timer_id)
    if ref is None:
        return
    d.touched = True  # consumed, even when it finds nothing to do: its stored row goes too
    if ref.kind == "run_timeout":
        d.end_run_early(RunStatus.TIMED_OUT, "the run's timeout passed")
    elif ref.kind.startswith("compensation"):
        saga.on_timer(d, ref)
    else:
        fire_step_timer(d, d.state.steps[ref.step_key], ref)


def fire_step_timer(d: Decider, st: StepState, ref: TimerRef) -> None:
    kind = ref.kind
    if kind == "retry" and st.status is _RETRYING:
        attempts.dispatch(d, st, d.plan.specs[st.step_id], None)
    elif kind == "schedule_to_start" and st.status is _RUNNING and st.attempts == ref.attempt:
        attempts.schedule_to_start_passed(d, st)
    elif kind == "attempt_timeout" and st.status is _RUNNING and st.attempts == ref.attempt:
        attempts.timed_out(d, st)
    elif kind == "deadline" and st.status in (_RUNNING, _RETRYING):
        if st.status is _RUNNING:
            d.commands.append(cancel_task(d.state, st.key, st.attempts))
        deadline = d.plan.specs[st.step_id].deadline
        d.fail_step(
            st, engine_error("DeadlineExceeded", f"the step's deadline of {deadline}s passed")
        )
    elif kind == "step_timeout" and st.status in (_RUNNING, _WAITING):
        d.stop_inner_work(st, "the step's timeout passed")
        timeout = d.plan.specs[st.step_id].timeout
        d.fail_step(st, engine_error("TimeoutError", f"the step did not finish within {timeout}s"))
    elif kind == "wait_timeout" and st.status is _WAITING:
        kinds.wait_timed_out(d, st)
    elif kind == "sleep" and st.status is _WAITING:
        d.succeed(st, {"until": iso(ref.fire_at)}, "sleep finished")
    elif kind == "loop_delay" and st.status is _RUNNING:
        kinds.start_iteration(d, st, ref.attempt)
